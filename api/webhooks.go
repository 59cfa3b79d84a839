package api

import "time"

// Webhook is a webhook as its owner sees it (schema Webhook).
type Webhook struct {
	ID        string    `json:"id"`
	URL       string    `json:"url"`
	Types     []string  `json:"types"`
	CreatedAt time.Time `json:"created_at"`
	// Secret signs deliveries; only the answer of its creation carries it.
	Secret string `json:"secret,omitempty"`
}

// WebhookRequest is the body of POST /v1/webhooks (schema
// WebhookRequest): types empty is every type.
type WebhookRequest struct {
	URL   string   `json:"url"`
	Types []string `json:"types,omitempty"`
}

// WebhookDelivery is one attempt of a webhook's delivery log as its
// owner sees it: of a failed one, only that it failed (schema
// WebhookDelivery).
type WebhookDelivery struct {
	ID         int64     `json:"id"`
	EventID    int64     `json:"event_id"`
	EventType  string    `json:"event_type"`
	Attempt    int       `json:"attempt"`
	StatusCode int       `json:"status_code"` // the receiver's 2xx when delivered
	Error      string    `json:"error,omitempty"`
	Succeeded  bool      `json:"succeeded"`
	Timestamp  time.Time `json:"timestamp"`
	DurationMS float64   `json:"duration_ms"`
}
