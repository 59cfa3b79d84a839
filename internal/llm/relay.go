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
	"github.com/sheepfold/sheepfold/internal/backoff"
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
	// MaxTokens and MaxCompletionTokens (OpenAI's newer name) bound the
	// completion; the server reserves quota and credits for them.
	MaxTokens           *int64 `json:"max_tokens"`
	MaxCompletionTokens *int64 `json:"max_completion_tokens"`
}

// Token bounds of one call.
const (
	// DefaultReservedCompletion is the completion tokens reserved for a
	// call that sets no max_tokens.
	DefaultReservedCompletion = 4096
	// MaxCallTokens bounds the prompt and the completion tokens metered
	// of one call: no model's context is larger, so a provider reporting
	// more is not believed.
	MaxCallTokens = 10_000_000
)

// Reservation is the tokens a call may use, for the quota and credits
// held while it runs: the prompt's estimate (a quarter of the request's
// bytes) and max_tokens (or max_completion_tokens, or
// DefaultReservedCompletion), each at most MaxCallTokens.
func (r Request) Reservation(body []byte) Usage {
	c := int64(DefaultReservedCompletion)
	for _, m := range []*int64{r.MaxCompletionTokens, r.MaxTokens} {
		if m != nil && *m > 0 {
			c = *m
			break
		}
	}
	return Usage{PromptTokens: promptEstimate(body), CompletionTokens: min(c, MaxCallTokens)}
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
// and its tokens (as reported, checked by meter).
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
		Choices []choiceText `json:"choices"`
		Usage   *Usage       `json:"usage"`
	}
	if err := json.Unmarshal(b, &parsed); err != nil || parsed.Choices == nil {
		if err == nil {
			err = errors.New("no choices")
		}
		return nil, apierr.Wrap(err, apierr.Provider, "provider %q answered with something that is not a chat completion", p.Name)
	}
	var text int64
	for _, c := range parsed.Choices {
		text += c.bytes
	}
	est := Usage{PromptTokens: promptEstimate(body), CompletionTokens: completionEstimate(text, 0)}
	return &Response{Body: b, Usage: r.meter(p, parsed.Usage, est)}, nil
}

// promptEstimate guesses a request's prompt tokens: a quarter of its
// bytes (about four bytes a token of text; more than the tokens of the
// JSON around it).
func promptEstimate(body []byte) int64 { return int64(len(body)+3) / 4 }

// completionEstimate guesses the completion tokens of text bytes of
// answer (message or delta content, reasoning, refusal, tool calls'
// names and arguments) that came in chunks pieces: a token is about four
// bytes of text, and a provider streams about one token a chunk.
func completionEstimate(text, chunks int64) int64 { return max((text+3)/4, chunks) }

// meter returns the tokens to meter of a call: what the provider
// reported, or est when it reported nothing. A count that is negative
// (or not a number) is replaced by the estimate and one above
// MaxCallTokens cut to it, and logged: a provider's bug must not hand
// out credits or drain them.
func (r *Relay) meter(p *provider, reported *Usage, est Usage) Usage {
	if reported == nil {
		return est
	}
	u := *reported
	fix := func(n *int64, e int64) bool {
		switch {
		case *n < 0:
			*n = e
		case *n > MaxCallTokens:
			*n = MaxCallTokens
		default:
			return false
		}
		return true
	}
	if a, b := fix(&u.PromptTokens, est.PromptTokens), fix(&u.CompletionTokens, est.CompletionTokens); a || b {
		r.log.Warn("provider reported token usage that is not believed; metering it clamped", "provider", p.Name,
			"prompt_tokens", reported.PromptTokens, "completion_tokens", reported.CompletionTokens,
			"metered_prompt_tokens", u.PromptTokens, "metered_completion_tokens", u.CompletionTokens)
	}
	return u
}

// Stream sends a streamed chat completion request and passes each event's
// data (a JSON chunk, then "[DONE]") to emit as it comes. The provider is
// always asked for the usage chunk (stream_options.include_usage), which
// is kept from emit unless the caller asked for it too. An error after
// emit has been called is to be sent to the client in the stream itself.
//
// The usage returned is what was delivered, also when the stream ends
// early (the caller went away, emit failed, the provider broke off): the
// provider's usage chunk if it came, else an estimate from the request
// and the text passed to emit (promptEstimate, completionEstimate).
func (r *Relay) Stream(ctx context.Context, req Request, body []byte, emit func(data []byte) error) (Usage, error) {
	p := r.byModel[req.Model]
	if p == nil {
		return Usage{}, errUnknownModel(req.Model)
	}
	prompt := promptEstimate(body)
	body, withhold := withUsageOption(body, req.StreamOptions)
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
	var reported *Usage
	var text, chunks int64 // of what was passed to emit
	usage := func() Usage {
		return r.meter(p, reported, Usage{PromptTokens: prompt, CompletionTokens: completionEstimate(text, chunks)})
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), maxChunk)
	for {
		timer.Reset(timeout)
		if ctx.Err() != nil || !sc.Scan() {
			break // what was read but not yet passed on is not delivered
		}
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue // blank lines, comments, other fields
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			return usage(), emit(data)
		}
		var chunk struct {
			Choices []choiceText `json:"choices"`
			Usage   *Usage       `json:"usage"`
			Error   *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(data, &chunk); err != nil {
			return usage(), apierr.Wrap(err, apierr.Provider, "provider %q sent a stream chunk that is not JSON", p.Name)
		}
		if chunk.Error != nil {
			return usage(), apierr.New(apierr.Provider, "provider %q failed during the stream: %s", p.Name, clip(chunk.Error.Message))
		}
		if chunk.Usage != nil {
			reported = chunk.Usage
			if withhold && len(chunk.Choices) == 0 {
				continue // asked for by the relay, not the caller
			}
		}
		for _, c := range chunk.Choices {
			if c.bytes > 0 {
				text += c.bytes
				chunks++
			}
		}
		if err := emit(data); err != nil {
			return usage(), err
		}
	}
	err = sc.Err()
	switch {
	case idle.Load() && parent.Err() == nil:
		return usage(), apierr.Wrap(err, apierr.ProviderTimeout, "provider %q sent nothing for %s during the stream", p.Name, timeout)
	case parent.Err() != nil:
		return usage(), parent.Err()
	case errors.Is(err, bufio.ErrTooLong):
		return usage(), apierr.Wrap(err, apierr.Provider, "provider %q sent a stream line longer than %d bytes", p.Name, maxChunk)
	}
	return usage(), apierr.Wrap(err, apierr.Provider, "provider %q ended the stream before it was complete", p.Name)
}

// choiceText reads the size of the text of one choice of a completion or
// a stream chunk (message or delta): content, reasoning, refusal, tool
// calls' names and arguments. It never fails: a choice of another shape
// counts the bytes of its JSON.
type choiceText struct{ bytes int64 }

// UnmarshalJSON implements json.Unmarshaler.
func (c *choiceText) UnmarshalJSON(b []byte) error {
	type part struct {
		Content          textSize `json:"content"`
		ReasoningContent textSize `json:"reasoning_content"`
		Reasoning        textSize `json:"reasoning"`
		Refusal          textSize `json:"refusal"`
		ToolCalls        []struct {
			Function struct {
				Name      textSize `json:"name"`
				Arguments textSize `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	}
	var v struct {
		Delta   *part `json:"delta"`
		Message *part `json:"message"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		c.bytes = int64(len(b))
		return nil
	}
	for _, m := range []*part{v.Delta, v.Message} {
		if m == nil {
			continue
		}
		c.bytes += int64(m.Content + m.ReasoningContent + m.Reasoning + m.Refusal)
		for _, t := range m.ToolCalls {
			c.bytes += int64(t.Function.Name + t.Function.Arguments)
		}
	}
	return nil
}

// textSize reads the length of a JSON string; null is 0, and any other
// value the length of its JSON.
type textSize int

// UnmarshalJSON implements json.Unmarshaler.
func (n *textSize) UnmarshalJSON(b []byte) error {
	var s string
	switch {
	case string(b) == "null":
		*n = 0
	case json.Unmarshal(b, &s) == nil:
		*n = textSize(len(s))
	default:
		*n = textSize(len(b))
	}
	return nil
}

// withUsageOption makes body ask the provider for the usage chunk
// (stream_options.include_usage), and reports whether the caller had not
// (its chunk is then withheld). A body whose stream_options is not an
// object is left as it is (the provider refuses it or reports no usage,
// which is then estimated).
func withUsageOption(body []byte, opts json.RawMessage) ([]byte, bool) {
	if len(opts) == 0 {
		// Absent: append it without decoding the body.
		b := bytes.TrimRight(body, " \t\r\n")
		if len(b) < 2 || b[len(b)-1] != '}' {
			return body, false
		}
		out := make([]byte, 0, len(b)+48)
		out = append(out, b[:len(b)-1]...)
		out = append(out, `,"stream_options":{"include_usage":true}}`...)
		return out, true
	}
	o := map[string]json.RawMessage{}
	if string(opts) != "null" {
		if err := json.Unmarshal(opts, &o); err != nil || o == nil {
			return body, false
		}
	}
	if string(o["include_usage"]) == "true" {
		return body, false
	}
	o["include_usage"] = json.RawMessage("true")
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return body, false
	}
	m["stream_options"], _ = json.Marshal(o)
	out, err := json.Marshal(m)
	if err != nil {
		return body, false
	}
	return out, true
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
		if wait <= 0 { // no Retry-After: a doubling, jittered wait
			wait = backoff.Delay(r.backoff, 0, attempt+1)
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
