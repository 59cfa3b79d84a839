package client

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/api"
)

// Event is something that happened to a sandbox: sandbox.created,
// sandbox.stopped, execution.started, execution.finished,
// security_violation, resource_exceeded, policy.changed.
type Event = api.Event

// EventQuery selects events. Zero fields select everything.
type EventQuery struct {
	SandboxID string    // one sandbox's events
	Types     []string  // only these types
	Since     time.Time // only events at or after this time
	Cursor    string    // only events after this one (EventPage.NextCursor, or an event's ID)
	Limit     int       // page size for ListEvents (server default 100, at most 1000)
}

func (q EventQuery) path() string {
	if q.SandboxID != "" {
		return sandboxPath(q.SandboxID, "events")
	}
	return "/v1/events"
}

func (q EventQuery) values() url.Values {
	v := url.Values{}
	if len(q.Types) > 0 {
		v.Set("type", strings.Join(q.Types, ","))
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if q.Cursor != "" {
		v.Set("cursor", q.Cursor)
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	return v
}

// EventPage is one page of events, oldest first.
type EventPage struct {
	Events []Event
	// NextCursor continues the listing (EventQuery.Cursor); empty on the
	// last page.
	NextCursor string
}

// ListEvents returns a page of stored events: one sandbox's with
// q.SandboxID, else every event of the caller's sandboxes.
func (c *Client) ListEvents(ctx context.Context, q EventQuery) (*EventPage, error) {
	var body struct {
		Events     []Event `json:"events"`
		NextCursor *string `json:"next_cursor"`
	}
	if err := c.call(ctx, request{method: "GET", path: q.path(), query: q.values()}, &body); err != nil {
		return nil, err
	}
	p := &EventPage{Events: body.Events}
	if body.NextCursor != nil {
		p.NextCursor = *body.NextCursor
	}
	return p, nil
}

// StreamEvents calls fn with each event as it happens (Server-Sent
// Events). A sandbox's stream (q.SandboxID) first replays its events
// (after q.Cursor when set) and ends, returning nil, after sandbox.stopped.
// The account's stream starts with new events unless q.Cursor or q.Since
// asks for a replay, and runs until ctx ends or fn returns an error. When
// the server drops the stream because this reader fell behind, it is
// resumed after the last event seen, so nothing is missed or repeated.
// When the server cuts the stream off (it is shutting down), the stream
// ends with an *Error (ERR_SHUTTING_DOWN): resume it, from another
// server or after the restart, with q.Cursor set to the last event's ID.
func (c *Client) StreamEvents(ctx context.Context, q EventQuery, fn func(Event) error) error {
	q.Limit = 0
	for {
		lagged, last, err := c.streamEventsOnce(ctx, q, fn)
		if err != nil || !lagged {
			return err
		}
		if last != "" {
			q.Cursor = last
		}
	}
}

func (c *Client) streamEventsOnce(ctx context.Context, q EventQuery, fn func(Event) error) (lagged bool, last string, err error) {
	last = q.Cursor
	res, err := c.do(ctx, request{method: "GET", path: q.path(), query: q.values(), accept: "text/event-stream"})
	if err != nil {
		return false, last, err
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	var typ, data, id string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if typ == "" {
				continue
			}
			if typ == "lagged" {
				return true, last, nil
			}
			if typ == "failure" {
				// The server cut the stream off (its drain:
				// ERR_SHUTTING_DOWN); resume with q.Cursor = last.
				var eb api.Error
				if err := json.Unmarshal([]byte(data), &eb); err != nil {
					return false, last, fmt.Errorf("sheepfold: bad failure event: %w", err)
				}
				return false, last, apiError(eb, 0)
			}
			var ev Event
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				return false, last, fmt.Errorf("sheepfold: bad event: %w", err)
			}
			if id != "" {
				last = id
			}
			if err := fn(ev); err != nil {
				return false, last, err
			}
			typ, data, id = "", "", ""
		case strings.HasPrefix(line, "event: "):
			typ = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			data = line[len("data: "):]
		case strings.HasPrefix(line, "id: "):
			id = line[len("id: "):]
		}
	}
	if err := sc.Err(); err != nil {
		if ctx.Err() != nil {
			return false, last, ctx.Err()
		}
		return false, last, err
	}
	if q.SandboxID == "" {
		if ctx.Err() != nil {
			return false, last, ctx.Err()
		}
		return false, last, io.ErrUnexpectedEOF // the server went away
	}
	return false, last, nil
}

// Webhook is a registered event receiver.
type Webhook = api.Webhook

// CreateWebhook registers url to receive the caller's events (of types,
// or every type). Keep the returned Secret: it is not shown again.
func (c *Client) CreateWebhook(ctx context.Context, url string, types ...string) (*Webhook, error) {
	var w Webhook
	body := map[string]any{"url": url}
	if len(types) > 0 {
		body["types"] = types
	}
	if err := c.call(ctx, request{method: "POST", path: "/v1/webhooks", json: body}, &w); err != nil {
		return nil, err
	}
	return &w, nil
}

// ListWebhooks returns the caller's webhooks (without secrets).
func (c *Client) ListWebhooks(ctx context.Context) ([]Webhook, error) {
	var body struct {
		Webhooks []Webhook `json:"webhooks"`
	}
	if err := c.call(ctx, request{method: "GET", path: "/v1/webhooks"}, &body); err != nil {
		return nil, err
	}
	return body.Webhooks, nil
}

// DeleteWebhook removes a webhook and its delivery log.
func (c *Client) DeleteWebhook(ctx context.Context, id string) error {
	return c.call(ctx, request{method: "DELETE", path: "/v1/webhooks/" + url.PathEscape(id)}, nil)
}

// WebhookDelivery is one attempt to deliver an event. A failed attempt
// says only that: StatusCode 0, Error "not delivered", DurationMS 0 (why
// is in the server's log).
type WebhookDelivery = api.WebhookDelivery

// ListWebhookDeliveries returns a page of a webhook's delivery log, oldest
// first, after cursor ("" for the start); next is "" on the last page.
func (c *Client) ListWebhookDeliveries(ctx context.Context, id, cursor string, limit int) (ds []WebhookDelivery, next string, err error) {
	q := url.Values{}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var body struct {
		Deliveries []WebhookDelivery `json:"deliveries"`
		NextCursor *string           `json:"next_cursor"`
	}
	if err := c.call(ctx, request{method: "GET", path: "/v1/webhooks/" + url.PathEscape(id) + "/deliveries", query: q}, &body); err != nil {
		return nil, "", err
	}
	if body.NextCursor != nil {
		next = *body.NextCursor
	}
	return body.Deliveries, next, nil
}

// ErrBadSignature reports a webhook delivery whose signature or timestamp
// does not check.
var ErrBadSignature = errors.New("sheepfold: webhook signature does not match, or the timestamp is too old")

// VerifyWebhook checks a delivery received by a webhook: signature is the
// Sheepfold-Signature header, timestamp the Sheepfold-Timestamp header,
// body the raw request body. A timestamp further than tolerance from now
// is refused (replays); tolerance 0 means 5 minutes.
func VerifyWebhook(secret, timestamp, signature string, body []byte, tolerance time.Duration) error {
	if tolerance <= 0 {
		tolerance = 5 * time.Minute
	}
	sec, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return ErrBadSignature
	}
	if d := time.Since(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return ErrBadSignature
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(timestamp + "."))
	mac.Write(body)
	want := "v1=" + hex.EncodeToString(mac.Sum(nil))
	if !hmac.Equal([]byte(want), []byte(signature)) {
		return ErrBadSignature
	}
	return nil
}
