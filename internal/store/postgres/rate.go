package postgres

import (
	"context"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
)

// takeRate is one bucket's take in one statement: the upsert locks the
// key's row (or inserts it) and computes the outcome from the row as it
// is then, so that takes of every server sharing the database serialise
// on it. $1 key, $2 now, $3 the take's cost and $4 the latest time the
// bucket may be full again after it (now + limit * interval), all in
// nanoseconds. A row whose time has passed counts as full: greatest().
const takeRate = `INSERT INTO rate_buckets (key, full_at, allowed)
	VALUES ($1, CASE WHEN $2::bigint + $3::bigint <= $4::bigint THEN $2::bigint + $3::bigint ELSE $2::bigint END,
		$2::bigint + $3::bigint <= $4::bigint)
	ON CONFLICT (key) DO UPDATE SET
		full_at = CASE WHEN greatest(rate_buckets.full_at, $2::bigint) + $3::bigint <= $4::bigint
			THEN greatest(rate_buckets.full_at, $2::bigint) + $3::bigint ELSE rate_buckets.full_at END,
		allowed = greatest(rate_buckets.full_at, $2::bigint) + $3::bigint <= $4::bigint
	RETURNING full_at, allowed`

// TakeRate implements store.RateStore.
func (s *Store) TakeRate(ctx context.Context, key string, n, limit int64, interval time.Duration, now time.Time) (store.RateTake, error) {
	if err := store.CheckRate(key, n, limit, interval); err != nil {
		return store.RateTake{}, err
	}
	at := now.UnixNano()
	var full int64
	var t store.RateTake
	err := s.pool.QueryRow(ctx, takeRate, key, at, n*int64(interval), at+limit*int64(interval)).Scan(&full, &t.Allowed)
	if err != nil {
		return store.RateTake{}, storeErr("take rate", err)
	}
	t.Full = time.Unix(0, full).UTC()
	return t, nil
}

// DeleteRatesBefore implements store.RateStore.
func (s *Store) DeleteRatesBefore(ctx context.Context, t time.Time) (int, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM rate_buckets WHERE full_at < $1`, t.UnixNano())
	if err != nil {
		return 0, storeErr("delete rates", err)
	}
	return int(tag.RowsAffected()), nil
}
