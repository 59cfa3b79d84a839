package llm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
)

// Bounds of what a provider may send.
const (
	maxResponse  = 32 << 20 // a non-streamed completion
	maxChunk     = 4 << 20  // one line of a stream
	maxErrorBody = 64 << 10 // an error response read for its message
)

// Request is what the relay reads of a chat completion request; the rest
// of the body is passed on unread.
type Request struct {
	Model         string          `json:"model"`
	Stream        bool            `json:"stream"`
	StreamOptions json.RawMessage `json:"stream_options"`
}

// ParseRequest reads a request body's model and streaming options. The
// body must be a JSON object naming a model.
func ParseRequest(body []byte) (Request, error) {
	var req Request
	if err := json.Unmarshal(body, &req); err != nil {
		return req, apierr.Wrap(err, apierr.BadRequest, "the request body must be a chat completion request (a JSON object): %v", err)
	}
	if req.Model == "" {
		return req, apierr.New(apierr.BadRequest, "model is required")
	}
	return req, nil
}

// SetModel returns body with its model replaced (a quota's fallback).
func SetModel(body []byte, model string) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	m["model"], _ = json.Marshal(model)
	return json.Marshal(m)
}

// Response is a non-streamed completion: the provider's body as sent,
// and the tokens it reported.
type Response struct {
	Body  []byte
	Usage Usage
}

// errUnknownModel is the error of a model no provider serves.
func errUnknownModel(model string) error {
	return apierr.New(apierr.ModelNotFound, "model %q is not served by this server; GET /v1/models lists the models that are", model)
}

// Complete sends a non-streamed chat completion request for req.Model
// and returns the provider's answer, checked to be a chat completion.
func (r *Relay) Complete(ctx context.Context, req Request, body []byte) (*Response, error) {
	p := r.byModel[req.Model]
	if p == nil {
		return nil, errUnknownModel(req.Model)
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, p.Timeout())
	defer cancel()
	resp, err := r.send(ctx, parent, p, body, false)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse+1))
	if err != nil {
		return nil, p.cutOff(ctx, parent, err)
	}
	if len(b) > maxResponse {
		return nil, apierr.New(apierr.Provider, "provider %q answered with more than %d bytes", p.Name, maxResponse)
	}
	var parsed struct {
		Choices []json.RawMessage `json:"choices"`
		Usage   *Usage            `json:"usage"`
	}
	if err := json.Unmarshal(b, &parsed); err != nil || parsed.Choices == nil {
		if err == nil {
			err = errors.New("no choices")
		}
		return nil, apierr.Wrap(err, apierr.Provider, "provider %q answered with something that is not a chat completion", p.Name)
	}
	out := &Response{Body: b}
	if parsed.Usage != nil {
		out.Usage = *parsed.Usage
	} else {
		out.Usage = estimate(body, int64(len(b)))
	}
	return out, nil
}

// estimate guesses the tokens of a call whose provider reported none
// (about four bytes a token of text, ten of JSON chunks), so that
// quotas and credits still count something.
func estimate(request []byte, responseBytes int64) Usage {
	return Usage{PromptTokens: int64(len(request)) / 4, CompletionTokens: responseBytes / 10}
}

// Stream sends a streamed chat completion request and passes each event's
// data (a JSON chunk, then "[DONE]") to emit as it comes. When the caller
// did not set stream_options, the provider is asked for the usage chunk,
// which is then kept from emit. An error after emit has been called is
// to be sent to the client in the stream itself.
func (r *Relay) Stream(ctx context.Context, req Request, body []byte, emit func(data []byte) error) (Usage, error) {
	p := r.byModel[req.Model]
	if p == nil {
		return Usage{}, errUnknownModel(req.Model)
	}
	inject := len(req.StreamOptions) == 0 || string(req.StreamOptions) == "null"
	if inject {
		body = withUsageOption(body)
	}
	// One timer bounds the request (retries included), then each wait for
	// a line of the stream.
	parent := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	timeout := p.Timeout()
	var idle atomic.Bool
	timer := time.AfterFunc(timeout, func() { idle.Store(true); cancel(context.DeadlineExceeded) })
	defer timer.Stop()
	resp, err := r.send(ctx, parent, p, body, true)
	if err != nil {
		return Usage{}, err
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		return Usage{}, apierr.New(apierr.Provider, "provider %q answered a streamed request with %q, not an event stream", p.Name, ct)
	}
	var usage *Usage
	var sent int64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), maxChunk)
	for {
		timer.Reset(timeout)
		if !sc.Scan() {
			break
		}
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue // blank lines, comments, other fields
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			if usage == nil {
				u := estimate(body, sent)
				usage = &u
			}
			return *usage, emit(data)
		}
		var chunk struct {
			Choices []json.RawMessage `json:"choices"`
			Usage   *Usage            `json:"usage"`
			Error   *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(data, &chunk); err != nil {
			return usageOr(usage), apierr.Wrap(err, apierr.Provider, "provider %q sent a stream chunk that is not JSON", p.Name)
		}
		if chunk.Error != nil {
			return usageOr(usage), apierr.New(apierr.Provider, "provider %q failed during the stream: %s", p.Name, clip(chunk.Error.Message))
		}
		if chunk.Usage != nil {
			usage = chunk.Usage
			if inject && len(chunk.Choices) == 0 {
				continue // asked for by the relay, not the caller
			}
		}
		sent += int64(len(data))
		if err := emit(data); err != nil {
			return usageOr(usage), err
		}
	}
	err = sc.Err()
	switch {
	case idle.Load() && parent.Err() == nil:
		return usageOr(usage), apierr.Wrap(err, apierr.ProviderTimeout, "provider %q sent nothing for %s during the stream", p.Name, timeout)
	case parent.Err() != nil:
		return usageOr(usage), parent.Err()
	case errors.Is(err, bufio.ErrTooLong):
		return usageOr(usage), apierr.Wrap(err, apierr.Provider, "provider %q sent a stream line longer than %d bytes", p.Name, maxChunk)
	}
	return usageOr(usage), apierr.Wrap(err, apierr.Provider, "provider %q ended the stream before it was complete", p.Name)
}

func usageOr(u *Usage) Usage {
	if u == nil {
		return Usage{}
	}
	return *u
}

// withUsageOption adds "stream_options":{"include_usage":true} to a JSON
// object's bytes without decoding it.
func withUsageOption(body []byte) []byte {
	b := bytes.TrimRight(body, " \t\r\n")
	if len(b) < 2 || b[len(b)-1] != '}' {
		return body
	}
	out := make([]byte, 0, len(b)+48)
	out = append(out, b[:len(b)-1]...)
	out = append(out, `,"stream_options":{"include_usage":true}}`...)
	return out
}

// send posts body to the provider until it answers 200, retrying 429,
// 5xx and failed connections with backoff while ctx allows. parent is the
// caller's context: its end is not the provider's fault.
func (r *Relay) send(ctx, parent context.Context, p *provider, body []byte, stream bool) (*http.Response, error) {
	retries := p.Retries()
	for attempt := 0; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.endpoint, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		if stream {
			req.Header.Set("Accept", "text/event-stream")
		} else {
			req.Header.Set("Accept", "application/json")
		}
		req.Header.Set("User-Agent", "sheepfold")
		if p.key != "" {
			req.Header.Set("Authorization", "Bearer "+p.key)
		}
		resp, err := r.client.Do(req)
		var failure error
		var wait time.Duration
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return nil, p.cutOff(ctx, parent, err)
			}
			failure = apierr.Wrap(err, apierr.Provider, "could not reach provider %q", p.Name)
		case resp.StatusCode == http.StatusOK:
			return resp, nil
		default:
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
			resp.Body.Close()
			failure = p.statusError(resp.StatusCode, msg, resp.Header.Get("Retry-After"))
			if !(resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500) {
				return nil, failure
			}
			wait = retryAfter(resp.Header.Get("Retry-After"))
		}
		if attempt >= retries {
			return nil, failure
		}
		if wait <= 0 {
			wait = r.backoff << attempt
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return nil, failure // no time left to retry
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, p.cutOff(ctx, parent, failure)
		}
	}
}

// cutOff is the error of a call ended by its context: the caller's going
// away, or the provider's timeout.
func (p *provider) cutOff(ctx, parent context.Context, err error) error {
	if parent.Err() != nil {
		return parent.Err()
	}
	if ctx.Err() != nil {
		return apierr.Wrap(err, apierr.ProviderTimeout, "provider %q did not answer within %s", p.Name, p.Timeout())
	}
	return apierr.Wrap(err, apierr.Provider, "the connection to provider %q broke", p.Name)
}

// statusError is the error of a provider's non-200 answer.
func (p *provider) statusError(status int, body []byte, retryAfterHeader string) error {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	msg := ""
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		msg = ": " + clip(e.Error.Message)
	}
	cause := fmt.Errorf("provider %s: HTTP %d: %s", p.Name, status, clip(string(body)))
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return apierr.Wrap(cause, apierr.Provider, "provider %q refused the server's credentials (HTTP %d); the operator should check its api_key_env", p.Name, status)
	case status == http.StatusTooManyRequests:
		return &apierr.Error{Code: apierr.RateLimited, Err: cause, RetryAfter: max(retryAfter(retryAfterHeader), time.Second),
			Message: fmt.Sprintf("provider %q is rate limiting requests (HTTP 429)%s", p.Name, msg)}
	case status >= 400 && status < 500:
		return apierr.Wrap(cause, apierr.BadRequest, "provider %q refused the request (HTTP %d)%s", p.Name, status, msg)
	}
	return apierr.Wrap(cause, apierr.Provider, "provider %q failed (HTTP %d)%s", p.Name, status, msg)
}

// retryAfter reads a Retry-After of seconds (at most a minute).
func retryAfter(h string) time.Duration {
	n, err := strconv.Atoi(strings.TrimSpace(h))
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(min(n, 60)) * time.Second
}

// clip shortens a provider's text for an error message.
func clip(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}
