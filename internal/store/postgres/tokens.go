package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sheepfold/sheepfold/internal/store"
)

// AddTokenUsage implements store.Store.
func (s *Store) AddTokenUsage(ctx context.Context, deltas []store.TokenDelta) error {
	if len(deltas) == 0 {
		return nil
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return storeErr("add token usage", err)
	}
	defer tx.Rollback(ctx)
	for _, t := range deltas {
		if _, err := tx.Exec(ctx, `INSERT INTO token_hours AS t
			(account_id, model, hour, requests, prompt_tokens, completion_tokens, cost_micros)
			VALUES ($1, $2, $3, $4, $5, $6, $7)
			ON CONFLICT (account_id, model, hour) DO UPDATE SET
				requests = t.requests + excluded.requests,
				prompt_tokens = t.prompt_tokens + excluded.prompt_tokens,
				completion_tokens = t.completion_tokens + excluded.completion_tokens,
				cost_micros = t.cost_micros + excluded.cost_micros`,
			t.Account, t.Model, t.Hour.UTC().Truncate(time.Hour),
			t.Requests, t.PromptTokens, t.CompletionTokens, t.CostMicros); err != nil {
			return storeErr("add token usage", err)
		}
	}
	return storeErr("add token usage", tx.Commit(ctx))
}

// QueryTokenUsage implements store.Store.
func (s *Store) QueryTokenUsage(ctx context.Context, f store.TokenFilter) ([]store.TokenDelta, error) {
	// sum of bigint is numeric: back to bigint.
	q := `SELECT account_id, model, sum(requests)::bigint, sum(prompt_tokens)::bigint, sum(completion_tokens)::bigint,
		sum(cost_micros) FROM token_hours WHERE true`
	var a args
	if f.Account != "" {
		q += ` AND account_id = ` + a.add(f.Account)
	}
	if f.Model != "" {
		q += ` AND model = ` + a.add(f.Model)
	}
	if !f.From.IsZero() {
		q += ` AND hour >= ` + a.add(dbTime(f.From))
	}
	if !f.To.IsZero() {
		q += ` AND hour < ` + a.add(dbTime(f.To))
	}
	q += ` GROUP BY account_id, model ORDER BY model, account_id`
	rows, err := s.pool.Query(ctx, q, a...)
	if err != nil {
		return nil, storeErr("query token usage", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.TokenDelta, error) {
		var t store.TokenDelta
		err := row.Scan(&t.Account, &t.Model, &t.Requests, &t.PromptTokens, &t.CompletionTokens, &t.CostMicros)
		return t, err
	})
	return out, storeErr("query token usage", err)
}

// PutSession implements store.Store.
func (s *Store) PutSession(ctx context.Context, sess store.Session) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO sessions (id, owner, model, created_at) VALUES ($1, $2, $3, $4)`,
		sess.ID, sess.Owner, sess.Model, dbTime(sess.CreatedAt))
	return storeErr("put session", err)
}

// GetSession implements store.Store.
func (s *Store) GetSession(ctx context.Context, id string) (store.Session, error) {
	var sess store.Session
	err := s.pool.QueryRow(ctx, `SELECT id, owner, model, created_at FROM sessions WHERE id = $1`, id).
		Scan(&sess.ID, &sess.Owner, &sess.Model, &sess.CreatedAt)
	sess.CreatedAt = sess.CreatedAt.UTC()
	return sess, notFound("get session", err)
}
