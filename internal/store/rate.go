package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// RateStore keeps per-minute rate limits where every server sharing the
// store counts them at once (internal/ratelimit's Bucket counts for one
// server). A key's bucket holds up to limit tokens and gets one back every
// interval, continuously, as ratelimit.Bucket; it is kept as one number,
// the time at which it is full again (the "theoretical arrival time" of
// the generic cell rate algorithm): at or before now it is full, and each
// interval after now is one token missing. A key without a row is a full
// bucket, so a row whose time has passed carries nothing and may go
// (DeleteRatesBefore).
//
// Times are the callers' clocks: servers sharing a store keep their
// clocks in step (NTP); one whose clock is s ahead of the others' finds
// their buckets up to s/interval tokens fuller than they do.
type RateStore interface {
	// TakeRate takes n tokens at now from key's bucket of limit tokens
	// that refills one every interval, in one atomic step among every
	// server sharing the store: allowed when the bucket holds n tokens
	// (then taken), refused otherwise (the bucket unchanged).
	// n, limit and interval must be positive, n * interval and
	// limit * interval at most MaxRateSpan (ErrBadRate otherwise).
	TakeRate(ctx context.Context, key string, n, limit int64, interval time.Duration, now time.Time) (RateTake, error)
	// DeleteRatesBefore deletes the buckets full again before t (what
	// they say no longer counts) and says how many went.
	DeleteRatesBefore(ctx context.Context, t time.Time) (int, error)
}

// RateTake is the outcome of RateStore.TakeRate.
type RateTake struct {
	Allowed bool
	// Full is when the bucket is full again, after this take; at or
	// before now, it is full now.
	Full time.Time
}

// ErrBadRate reports TakeRate arguments out of range.
var ErrBadRate = errors.New("store: bad rate limit")

// MaxRateSpan bounds the time a bucket takes to refill (limit * interval)
// and a take's cost (n * interval), so that the stores' sums of
// nanoseconds never overflow.
const MaxRateSpan = 366 * 24 * time.Hour

// CheckRate checks TakeRate's arguments (for implementations).
func CheckRate(key string, n, limit int64, interval time.Duration) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: no key", ErrBadRate)
	case n <= 0 || limit <= 0 || interval <= 0:
		return fmt.Errorf("%w: n %d, limit %d and interval %v must be positive", ErrBadRate, n, limit, interval)
	case max(n, limit) > int64(MaxRateSpan/interval):
		return fmt.Errorf("%w: %d tokens of %v are more than %v", ErrBadRate, max(n, limit), interval, MaxRateSpan)
	}
	return nil
}
