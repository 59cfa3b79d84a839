package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
)

// AddTokenUsage implements store.Store.
func (d *DB) AddTokenUsage(ctx context.Context, deltas []store.TokenDelta) error {
	if len(deltas) == 0 {
		return nil
	}
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	stmt, err := tx.PrepareContext(ctx, `INSERT INTO token_hours
		(account_id, model, hour, requests, prompt_tokens, completion_tokens, cost_micros)
		VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (account_id, model, hour) DO UPDATE SET
			requests = requests + excluded.requests,
			prompt_tokens = prompt_tokens + excluded.prompt_tokens,
			completion_tokens = completion_tokens + excluded.completion_tokens,
			cost_micros = cost_micros + excluded.cost_micros`)
	if err != nil {
		return err
	}
	defer stmt.Close()
	for _, t := range deltas {
		if _, err := stmt.ExecContext(ctx, t.Account, t.Model, fmtTime(t.Hour.UTC().Truncate(time.Hour)),
			t.Requests, t.PromptTokens, t.CompletionTokens, t.CostMicros); err != nil {
			return storeErr("add token usage", err)
		}
	}
	return tx.Commit()
}

// QueryTokenUsage implements store.Store.
func (d *DB) QueryTokenUsage(ctx context.Context, f store.TokenFilter) ([]store.TokenDelta, error) {
	q := `SELECT account_id, model, sum(requests), sum(prompt_tokens), sum(completion_tokens), sum(cost_micros)
		FROM token_hours WHERE 1 = 1`
	var args []any
	if f.Account != "" {
		q += ` AND account_id = ?`
		args = append(args, f.Account)
	}
	if f.Model != "" {
		q += ` AND model = ?`
		args = append(args, f.Model)
	}
	if !f.From.IsZero() {
		q += ` AND hour >= ?`
		args = append(args, fmtTime(f.From))
	}
	if !f.To.IsZero() {
		q += ` AND hour < ?`
		args = append(args, fmtTime(f.To))
	}
	q += ` GROUP BY account_id, model ORDER BY model, account_id`
	rows, err := d.rd.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.TokenDelta{}
	for rows.Next() {
		var t store.TokenDelta
		if err := rows.Scan(&t.Account, &t.Model, &t.Requests, &t.PromptTokens, &t.CompletionTokens, &t.CostMicros); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// PutSession implements store.Store.
func (d *DB) PutSession(ctx context.Context, s store.Session) error {
	_, err := d.db.ExecContext(ctx, `INSERT INTO sessions (id, owner, model, created_at) VALUES (?, ?, ?, ?)`,
		s.ID, s.Owner, s.Model, fmtTime(s.CreatedAt))
	if err != nil {
		return storeErr("put session", err)
	}
	return nil
}

// GetSession implements store.Store.
func (d *DB) GetSession(ctx context.Context, id string) (store.Session, error) {
	var s store.Session
	var created string
	err := d.rd.QueryRowContext(ctx, `SELECT id, owner, model, created_at FROM sessions WHERE id = ?`, id).
		Scan(&s.ID, &s.Owner, &s.Model, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return s, store.ErrNotFound
	}
	if err != nil {
		return s, err
	}
	s.CreatedAt, err = parseTime(created)
	return s, err
}
