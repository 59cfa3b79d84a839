package api

import "time"

// Secret is what the API shows of a secret: never its value (schema
// Secret).
type Secret struct {
	Name       string            `json:"name"`
	Metadata   map[string]string `json:"metadata"`
	Version    int64             `json:"version"` // 1 when created, one more at each new value
	CreatedAt  time.Time         `json:"created_at"`
	UpdatedAt  time.Time         `json:"updated_at"`   // when the current version was stored
	LastUsedAt *time.Time        `json:"last_used_at"` // when the egress gateway last put the value into a request
	// UseCount is how many requests the egress gateway put the value
	// into (the uses recorded with outcome "injected").
	UseCount int64 `json:"use_count"`
}

// SecretUse is one use of a secret at the egress gateway: a request it
// put the value into (Outcome "injected"), or one it refused for the
// secret's sake ("misdirected": its placeholder sent where it is not
// substituted; "unavailable": the value could not be resolved) (schema
// SecretUse).
type SecretUse struct {
	ID        int64     `json:"id"`
	SandboxID string    `json:"sandbox_id"`
	Host      string    `json:"host"`
	Method    string    `json:"method"`
	Path      string    `json:"path"`
	Outcome   string    `json:"outcome"`
	At        time.Time `json:"at"`
}

// SecretRequest is the body of POST /v1/secrets (schema SecretRequest).
type SecretRequest struct {
	Name     string            `json:"name"`
	Value    string            `json:"value"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// SecretVersionRequest is the body of PUT /v1/secrets/{name}: a new
// value, and metadata that replaces the old when given (schema
// SecretVersionRequest).
type SecretVersionRequest struct {
	Value    string            `json:"value"`
	Metadata map[string]string `json:"metadata,omitempty"`
}
