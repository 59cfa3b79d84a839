package store

import (
	"context"
	"encoding/json"
	"time"
)

// Event is the record of one sandbox event (internal/events.Event as
// kept). IDs are assigned by AddEvents, only grow, and are never reused.
type Event struct {
	ID          int64
	Time        time.Time
	Type        string
	Source      string // who recorded it (internal/events Source*); "" before it was kept
	SandboxID   string
	Owner       string
	ExecutionID string
	Details     json.RawMessage // a JSON object; nil is {}
}

// EventFilter selects events of one owner, oldest (lowest ID) first.
type EventFilter struct {
	Owner     string    // required
	SandboxID string    // "" for every sandbox
	Types     []string  // empty for every type
	Since     time.Time // zero for no lower bound on time
	AfterID   int64     // only IDs above this (a cursor)
	UpToID    int64     // only IDs up to this; 0 for no bound
	Limit     int       // at most this many; 0 for all
}

// Webhook is an owner's registered event receiver. Secret signs the
// deliveries, so it is kept as given (it is shown to its owner once, at
// creation).
type Webhook struct {
	ID        string
	Owner     string
	URL       string
	Secret    string
	Types     []string // event types delivered; empty for all
	CreatedAt time.Time
}

// WebhookDelivery is one attempt to deliver an event to a webhook.
type WebhookDelivery struct {
	ID         int64
	WebhookID  string
	EventID    int64
	EventType  string
	Attempt    int // 1 for the first try
	StatusCode int // 0 when no response came
	Error      string
	Succeeded  bool
	Time       time.Time
	DurationMS float64
}

// EventStore keeps events, webhooks and their delivery log.
type EventStore interface {
	// AddEvents stores events in order and sets their IDs.
	AddEvents(ctx context.Context, evs []Event) error
	ListEvents(ctx context.Context, f EventFilter) ([]Event, error)
	// DeleteEventsBefore removes events and webhook deliveries older than
	// t and returns how many events went.
	DeleteEventsBefore(ctx context.Context, t time.Time) (int, error)

	CreateWebhook(ctx context.Context, w Webhook) error
	// ListWebhooks returns an owner's webhooks ("" for every owner's),
	// oldest first.
	ListWebhooks(ctx context.Context, owner string) ([]Webhook, error)
	// DeleteWebhook removes an owner's webhook and its delivery log;
	// ErrNotFound when the owner has no such webhook.
	DeleteWebhook(ctx context.Context, owner, id string) error
	AddDelivery(ctx context.Context, d WebhookDelivery) error
	// ListDeliveries returns a webhook's deliveries with IDs above
	// afterID, oldest first, at most limit (0: all).
	ListDeliveries(ctx context.Context, webhookID string, afterID int64, limit int) ([]WebhookDelivery, error)
}
