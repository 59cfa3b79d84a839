package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
)

// AddEvents implements store.EventStore: one transaction for the batch.
func (d *DB) AddEvents(ctx context.Context, evs []store.Event) error {
	if len(evs) == 0 {
		return nil
	}
	// The server's one event writer (its bus) takes its turns as the
	// events' own.
	give, err := d.turns.take(ctx, "\x00events")
	if err != nil {
		return storeErr("add events", err)
	}
	defer give()
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return storeErr("add events", err)
	}
	defer tx.Rollback()
	stmt, err := tx.PrepareContext(ctx, `INSERT INTO events (time, type, sandbox_id, owner, execution_id, details, source)
		VALUES (?, ?, ?, ?, ?, ?, ?)`)
	if err != nil {
		return storeErr("add events", err)
	}
	defer stmt.Close()
	for i := range evs {
		e := &evs[i]
		res, err := stmt.ExecContext(ctx, fmtTime(e.Time), e.Type, e.SandboxID, e.Owner, e.ExecutionID, jsonText(e.Details), e.Source)
		if err != nil {
			return storeErr("add event", err)
		}
		if e.ID, err = res.LastInsertId(); err != nil {
			return storeErr("add event", err)
		}
	}
	for _, owner := range ownersOf(evs) {
		if _, err := d.trim(ctx, tx, owner, store.KindEvents); err != nil {
			return trimErr(store.KindEvents, owner, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return storeErr("add events", err)
	}
	return nil
}

// ListEvents implements store.EventStore.
func (d *DB) ListEvents(ctx context.Context, f store.EventFilter) ([]store.Event, error) {
	q := `SELECT id, time, type, sandbox_id, owner, execution_id, details, source FROM events WHERE owner = ?`
	args := []any{f.Owner}
	if f.SandboxID != "" {
		q += ` AND sandbox_id = ?`
		args = append(args, f.SandboxID)
	}
	if len(f.Types) > 0 {
		q += ` AND type IN (?` + strings.Repeat(`, ?`, len(f.Types)-1) + `)`
		for _, t := range f.Types {
			args = append(args, t)
		}
	}
	if !f.Since.IsZero() {
		q += ` AND time >= ?`
		args = append(args, fmtTime(f.Since))
	}
	if f.AfterID > 0 {
		q += ` AND id > ?`
		args = append(args, f.AfterID)
	}
	if f.UpToID > 0 {
		q += ` AND id <= ?`
		args = append(args, f.UpToID)
	}
	q += ` ORDER BY id`
	if f.Limit > 0 {
		q += fmt.Sprintf(` LIMIT %d`, f.Limit)
	}
	rows, err := d.rd.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, storeErr("list events", err)
	}
	defer rows.Close()
	out := []store.Event{}
	for rows.Next() {
		var e store.Event
		var at, details string
		if err := rows.Scan(&e.ID, &at, &e.Type, &e.SandboxID, &e.Owner, &e.ExecutionID, &details, &e.Source); err != nil {
			return nil, err
		}
		if e.Time, err = parseTime(at); err != nil {
			return nil, err
		}
		e.Details = json.RawMessage(details)
		out = append(out, e)
	}
	return out, rows.Err()
}

// DeleteEventsBefore implements store.EventStore.
func (d *DB) DeleteEventsBefore(ctx context.Context, t time.Time) (int, error) {
	res, err := d.db.ExecContext(ctx, `DELETE FROM events WHERE time < ?`, fmtTime(t))
	if err != nil {
		return 0, storeErr("delete events", err)
	}
	if _, err := d.db.ExecContext(ctx, `DELETE FROM webhook_deliveries WHERE time < ?`, fmtTime(t)); err != nil {
		return 0, storeErr("delete webhook deliveries", err)
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// CreateWebhook implements store.EventStore.
func (d *DB) CreateWebhook(ctx context.Context, w store.Webhook) error {
	types, _ := json.Marshal(append([]string{}, w.Types...))
	_, err := d.db.ExecContext(ctx, `INSERT INTO webhooks (id, owner, url, secret, types, created_at) VALUES (?, ?, ?, ?, ?, ?)`,
		w.ID, w.Owner, w.URL, w.Secret, string(types), fmtTime(w.CreatedAt))
	if err != nil {
		return storeErr("create webhook", err)
	}
	return nil
}

// ListWebhooks implements store.EventStore.
func (d *DB) ListWebhooks(ctx context.Context, owner string) ([]store.Webhook, error) {
	q := `SELECT id, owner, url, secret, types, created_at FROM webhooks`
	var args []any
	if owner != "" {
		q += ` WHERE owner = ?`
		args = append(args, owner)
	}
	rows, err := d.rd.QueryContext(ctx, q+` ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, storeErr("list webhooks", err)
	}
	defer rows.Close()
	out := []store.Webhook{}
	for rows.Next() {
		var w store.Webhook
		var types, created string
		if err := rows.Scan(&w.ID, &w.Owner, &w.URL, &w.Secret, &types, &created); err != nil {
			return nil, err
		}
		if err := json.Unmarshal([]byte(types), &w.Types); err != nil {
			return nil, fmt.Errorf("webhook %s types: %w", w.ID, err)
		}
		if w.CreatedAt, err = parseTime(created); err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	return out, rows.Err()
}

// DeleteWebhook implements store.EventStore.
func (d *DB) DeleteWebhook(ctx context.Context, owner, id string) error {
	res, err := d.db.ExecContext(ctx, `DELETE FROM webhooks WHERE owner = ? AND id = ?`, owner, id)
	if err != nil {
		return storeErr("delete webhook", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// AddDelivery implements store.EventStore: the delivery is its webhook's
// owner's record (none is kept of a webhook deleted meanwhile), and the
// owner's oldest deliveries past its bound go.
func (d *DB) AddDelivery(ctx context.Context, w store.WebhookDelivery) error {
	// Its turn is its webhook's, which is one account's.
	give, err := d.turns.take(ctx, "\x00webhook "+w.WebhookID)
	if err != nil {
		return storeErr("add webhook delivery", err)
	}
	defer give()
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return storeErr("add webhook delivery", err)
	}
	defer tx.Rollback()
	var owner string
	err = tx.QueryRowContext(ctx, `INSERT INTO webhook_deliveries
		(webhook_id, event_id, event_type, attempt, status_code, error, succeeded, time, duration_ms, owner)
		SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, owner FROM webhooks WHERE id = ? RETURNING owner`,
		w.WebhookID, w.EventID, w.EventType, w.Attempt, w.StatusCode, w.Error, w.Succeeded, fmtTime(w.Time), w.DurationMS,
		w.WebhookID).Scan(&owner)
	if errors.Is(err, sql.ErrNoRows) {
		return store.ErrNotFound
	}
	if err != nil {
		return storeErr("add webhook delivery", err)
	}
	if _, err := d.trim(ctx, tx, owner, store.KindDeliveries); err != nil {
		return trimErr(store.KindDeliveries, owner, err)
	}
	return storeErr("add webhook delivery", tx.Commit())
}

// ListDeliveries implements store.EventStore.
func (d *DB) ListDeliveries(ctx context.Context, webhookID string, afterID int64, limit int) ([]store.WebhookDelivery, error) {
	q := `SELECT id, webhook_id, event_id, event_type, attempt, status_code, error, succeeded, time, duration_ms
		FROM webhook_deliveries WHERE webhook_id = ? AND id > ? ORDER BY id`
	if limit > 0 {
		q += fmt.Sprintf(` LIMIT %d`, limit)
	}
	rows, err := d.rd.QueryContext(ctx, q, webhookID, afterID)
	if err != nil {
		return nil, storeErr("list webhook deliveries", err)
	}
	defer rows.Close()
	out := []store.WebhookDelivery{}
	for rows.Next() {
		var w store.WebhookDelivery
		var at string
		var ok sql.NullBool
		if err := rows.Scan(&w.ID, &w.WebhookID, &w.EventID, &w.EventType, &w.Attempt, &w.StatusCode, &w.Error, &ok,
			&at, &w.DurationMS); err != nil {
			return nil, err
		}
		w.Succeeded = ok.Bool
		if w.Time, err = parseTime(at); err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	return out, rows.Err()
}
