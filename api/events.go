package api

import "time"

// Event is one thing that happened to a sandbox (schema Event): what the
// event bus (internal/events) records, fans out and stores, and what the
// API sends (GET /v1/events, the SSE stream, webhooks).
type Event struct {
	ID        int64     `json:"id,omitempty"`
	Timestamp time.Time `json:"timestamp"`
	Type      string    `json:"type"`
	// Source says who recorded it: "host" (the server), "gateway" (the
	// egress gateway), "agent" (the agent in the sandbox, which saw it
	// itself) or "sandbox" (the code in the sandbox said so, and could
	// have written it itself).
	Source    string `json:"source,omitempty"`
	SandboxID string `json:"sandbox_id,omitempty"`
	// Owner is the owning key or account, which the server's bus fans
	// out by; never sent (empty in what a client reads).
	Owner       string         `json:"-"`
	ExecutionID string         `json:"execution_id,omitempty"`
	Details     map[string]any `json:"details,omitempty"`
}
