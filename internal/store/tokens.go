package store

import (
	"context"
	"time"
)

// TokenDelta is model tokens of one account and model in one hour, added
// to what is stored. CostMicros is what they cost at the provider's
// prices.
type TokenDelta struct {
	Account          string
	Model            string
	Hour             time.Time // the start of the hour, UTC
	Requests         int64
	PromptTokens     int64
	CompletionTokens int64
	CostMicros       float64
}

// Add adds d's figures to t's; t's keys stay as they are.
func (t *TokenDelta) Add(d TokenDelta) {
	t.Requests += d.Requests
	t.PromptTokens += d.PromptTokens
	t.CompletionTokens += d.CompletionTokens
	t.CostMicros += d.CostMicros
}

// TokenFilter selects token buckets of hours in [From, To); zero times
// leave that end open, "" fields select every value.
type TokenFilter struct {
	Account  string
	Model    string
	From, To time.Time
}

// Session is the record of a model session: a model bound to a sandbox
// whose id it shares.
type Session struct {
	ID        string // the sandbox's id
	Owner     string
	Model     string
	CreatedAt time.Time
}

// ModelStore persists model tokens and sessions.
type ModelStore interface {
	AddTokenUsage(ctx context.Context, deltas []TokenDelta) error
	// QueryTokenUsage sums the selected buckets per account and model
	// (Hour is zero), ordered by model.
	QueryTokenUsage(ctx context.Context, f TokenFilter) ([]TokenDelta, error)

	PutSession(ctx context.Context, s Session) error
	// GetSession returns ErrNotFound for an unknown id.
	GetSession(ctx context.Context, id string) (Session, error)
}
