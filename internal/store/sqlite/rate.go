package sqlite

import (
	"context"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
)

// takeRate is one bucket's take in one statement (one writer at a time):
// postgres/rate.go's, with SQLite's max() for greatest(). ?1 key, ?2 now,
// ?3 the take's cost and ?4 the latest time the bucket may be full again
// after it (now + limit * interval), all in nanoseconds.
const takeRate = `INSERT INTO rate_buckets (key, full_at, allowed)
	VALUES (?1, CASE WHEN ?2 + ?3 <= ?4 THEN ?2 + ?3 ELSE ?2 END, ?2 + ?3 <= ?4)
	ON CONFLICT (key) DO UPDATE SET
		full_at = CASE WHEN max(rate_buckets.full_at, ?2) + ?3 <= ?4
			THEN max(rate_buckets.full_at, ?2) + ?3 ELSE rate_buckets.full_at END,
		allowed = max(rate_buckets.full_at, ?2) + ?3 <= ?4
	RETURNING full_at, allowed`

// TakeRate implements store.RateStore.
func (d *DB) TakeRate(ctx context.Context, key string, n, limit int64, interval time.Duration, now time.Time) (store.RateTake, error) {
	if err := store.CheckRate(key, n, limit, interval); err != nil {
		return store.RateTake{}, err
	}
	at := now.UnixNano()
	var full int64
	var t store.RateTake
	err := d.db.QueryRowContext(ctx, takeRate, key, at, n*int64(interval), at+limit*int64(interval)).Scan(&full, &t.Allowed)
	if err != nil {
		return store.RateTake{}, storeErr("take rate", err)
	}
	t.Full = time.Unix(0, full).UTC()
	return t, nil
}

// DeleteRatesBefore implements store.RateStore.
func (d *DB) DeleteRatesBefore(ctx context.Context, t time.Time) (int, error) {
	res, err := d.db.ExecContext(ctx, `DELETE FROM rate_buckets WHERE full_at < ?`, t.UnixNano())
	if err != nil {
		return 0, storeErr("delete rates", err)
	}
	n, err := res.RowsAffected()
	return int(n), storeErr("delete rates", err)
}
