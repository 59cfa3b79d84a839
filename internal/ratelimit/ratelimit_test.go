package ratelimit

import (
	"testing"
	"time"
)

// TestBucket: a minute's tokens at once, then one every 60/limit seconds.
func TestBucket(t *testing.T) {
	t.Parallel()
	var b Bucket
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := 0; i < 60; i++ {
		if r := b.Take(t0, 60); !r.Allowed || r.Remaining != int64(59-i) {
			t.Fatalf("take %d: %+v", i, r)
		}
	}
	r := b.Take(t0, 60)
	if r.Allowed || r.RetryAfter != time.Second || r.Reset != time.Minute {
		t.Fatalf("empty bucket: %+v", r)
	}
	if r := b.Take(t0.Add(999*time.Millisecond), 60); r.Allowed {
		t.Fatalf("a token before its second: %+v", r)
	}
	if r := b.Take(t0.Add(time.Second), 60); !r.Allowed {
		t.Fatalf("no token after a second: %+v", r)
	}
}

func TestUnlimited(t *testing.T) {
	t.Parallel()
	var b Bucket
	for i := 0; i < 1000; i++ {
		if r := b.Take(time.Time{}, 0); !r.Allowed {
			t.Fatalf("take %d refused with no limit: %+v", i, r)
		}
	}
}
