package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sheepfold/sheepfold/internal/store"
)

// AddEvents implements store.EventStore: one transaction for the batch,
// its ids in commit order (inIDOrder).
func (s *Store) AddEvents(ctx context.Context, evs []store.Event) error {
	if len(evs) == 0 {
		return nil
	}
	err := s.inIDOrder(ctx, eventsLock, func(b *pgx.Batch) {
		for i := range evs {
			e := &evs[i]
			b.Queue(`INSERT INTO events (time, type, sandbox_id, owner, execution_id, details, source)
				VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id`,
				dbTime(e.Time), e.Type, e.SandboxID, e.Owner, e.ExecutionID, jsonText(e.Details), e.Source).
				QueryRow(func(row pgx.Row) error { return row.Scan(&e.ID) })
		}
	}, func(tx pgx.Tx) error {
		for _, owner := range ownersOf(evs) {
			if _, err := s.trim(ctx, tx, owner, store.KindEvents); err != nil {
				return trimErr(store.KindEvents, owner, err)
			}
		}
		return nil
	})
	return storeErr("add events", err)
}

// inIDOrder runs the statements queue queues in one transaction that
// first takes the advisory lock key, then after (when not nil), and
// commits it.
//
// Readers page events and deliveries by "ids after the last one seen", so
// an id must never become visible after a larger one; but a sequence
// gives ids in the order transactions draw them, not the order they
// commit. Under the lock, writers draw and commit one at a time (as
// SQLite's single writer does); a transaction lock is released only after
// its commit is visible.
func (s *Store) inIDOrder(ctx context.Context, key int64, queue func(b *pgx.Batch), after func(tx pgx.Tx) error) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	b := &pgx.Batch{}
	b.Queue(`SELECT pg_advisory_xact_lock($1)`, key)
	queue(b)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	if after != nil {
		if err := after(tx); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// ListEvents implements store.EventStore.
func (s *Store) ListEvents(ctx context.Context, f store.EventFilter) ([]store.Event, error) {
	var a args
	q := `SELECT id, time, type, sandbox_id, owner, execution_id, details, source FROM events WHERE owner = ` + a.add(f.Owner)
	if f.SandboxID != "" {
		q += ` AND sandbox_id = ` + a.add(f.SandboxID)
	}
	if len(f.Types) > 0 {
		q += ` AND type = ANY(` + a.add(f.Types) + `)`
	}
	if !f.Since.IsZero() {
		q += ` AND time >= ` + a.add(dbTime(f.Since))
	}
	if f.AfterID > 0 {
		q += ` AND id > ` + a.add(f.AfterID)
	}
	if f.UpToID > 0 {
		q += ` AND id <= ` + a.add(f.UpToID)
	}
	q += ` ORDER BY id`
	if f.Limit > 0 {
		q += ` LIMIT ` + a.add(f.Limit)
	}
	rows, err := s.pool.Query(ctx, q, a...)
	if err != nil {
		return nil, storeErr("list events", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Event, error) {
		var e store.Event
		var details string
		err := row.Scan(&e.ID, &e.Time, &e.Type, &e.SandboxID, &e.Owner, &e.ExecutionID, &details, &e.Source)
		e.Time, e.Details = e.Time.UTC(), json.RawMessage(details)
		return e, err
	})
	return out, storeErr("list events", err)
}

// DeleteEventsBefore implements store.EventStore.
func (s *Store) DeleteEventsBefore(ctx context.Context, t time.Time) (int, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM events WHERE time < $1`, dbTime(t))
	if err != nil {
		return 0, storeErr("delete events", err)
	}
	if _, err := s.pool.Exec(ctx, `DELETE FROM webhook_deliveries WHERE time < $1`, dbTime(t)); err != nil {
		return 0, storeErr("delete webhook deliveries", err)
	}
	return int(tag.RowsAffected()), nil
}

// CreateWebhook implements store.EventStore.
func (s *Store) CreateWebhook(ctx context.Context, w store.Webhook) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO webhooks (id, owner, url, secret, types, created_at) VALUES ($1, $2, $3, $4, $5, $6)`,
		w.ID, w.Owner, w.URL, w.Secret, append([]string{}, w.Types...), dbTime(w.CreatedAt))
	return storeErr("create webhook", err)
}

// ListWebhooks implements store.EventStore.
func (s *Store) ListWebhooks(ctx context.Context, owner string) ([]store.Webhook, error) {
	var a args
	q := `SELECT id, owner, url, secret, types, created_at FROM webhooks`
	if owner != "" {
		q += ` WHERE owner = ` + a.add(owner)
	}
	rows, err := s.pool.Query(ctx, q+` ORDER BY created_at, id`, a...)
	if err != nil {
		return nil, storeErr("list webhooks", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Webhook, error) {
		var w store.Webhook
		err := row.Scan(&w.ID, &w.Owner, &w.URL, &w.Secret, &w.Types, &w.CreatedAt)
		w.CreatedAt = w.CreatedAt.UTC()
		return w, err
	})
	return out, storeErr("list webhooks", err)
}

// DeleteWebhook implements store.EventStore; its deliveries go with it
// (ON DELETE CASCADE).
func (s *Store) DeleteWebhook(ctx context.Context, owner, id string) error {
	tag, err := s.pool.Exec(ctx, `DELETE FROM webhooks WHERE owner = $1 AND id = $2`, owner, id)
	if err != nil {
		return storeErr("delete webhook", err)
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNotFound
	}
	return nil
}

// AddDelivery implements store.EventStore. Several workers deliver at
// once, and the delivery log is paged by id: ids in commit order
// (inIDOrder). The delivery is its webhook's owner's record (none is
// kept of a webhook deleted meanwhile), and the owner's oldest
// deliveries past its bound go.
func (s *Store) AddDelivery(ctx context.Context, w store.WebhookDelivery) error {
	var owner string
	err := s.inIDOrder(ctx, deliveriesLock, func(b *pgx.Batch) {
		b.Queue(`INSERT INTO webhook_deliveries
			(webhook_id, event_id, event_type, attempt, status_code, error, succeeded, time, duration_ms, owner)
			SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, owner FROM webhooks WHERE id = $1 RETURNING owner`,
			w.WebhookID, w.EventID, w.EventType, w.Attempt, w.StatusCode, w.Error, w.Succeeded, dbTime(w.Time), w.DurationMS).
			QueryRow(func(row pgx.Row) error { return row.Scan(&owner) })
	}, func(tx pgx.Tx) error {
		_, err := s.trim(ctx, tx, owner, store.KindDeliveries)
		return trimErr(store.KindDeliveries, owner, err)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return store.ErrNotFound
	}
	return storeErr("add webhook delivery", err)
}

// ListDeliveries implements store.EventStore.
func (s *Store) ListDeliveries(ctx context.Context, webhookID string, afterID int64, limit int) ([]store.WebhookDelivery, error) {
	var a args
	q := `SELECT id, webhook_id, event_id, event_type, attempt, status_code, error, succeeded, time, duration_ms
		FROM webhook_deliveries WHERE webhook_id = ` + a.add(webhookID) + ` AND id > ` + a.add(afterID) + ` ORDER BY id`
	if limit > 0 {
		q += ` LIMIT ` + a.add(limit)
	}
	rows, err := s.pool.Query(ctx, q, a...)
	if err != nil {
		return nil, storeErr("list webhook deliveries", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.WebhookDelivery, error) {
		var w store.WebhookDelivery
		err := row.Scan(&w.ID, &w.WebhookID, &w.EventID, &w.EventType, &w.Attempt, &w.StatusCode, &w.Error, &w.Succeeded,
			&w.Time, &w.DurationMS)
		w.Time = w.Time.UTC()
		return w, err
	})
	return out, storeErr("list webhook deliveries", err)
}
