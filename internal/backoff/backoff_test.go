package backoff

import (
	"context"
	"testing"
	"time"
)

// TestBackoff: Next doubles to the cap, Reset starts again from Base.
func TestBackoff(t *testing.T) {
	t.Parallel()
	b := Backoff{Base: 10 * time.Millisecond, Max: 40 * time.Millisecond}
	for i, want := range []time.Duration{10, 20, 40, 40, 40} {
		want *= time.Millisecond
		if d := b.Next(); d < want/2 || d > want {
			t.Fatalf("wait %d = %v, want within [%v, %v]", i+1, d, want/2, want)
		}
	}
	b.Reset()
	if d := b.Next(); d > 10*time.Millisecond {
		t.Fatalf("after Reset: %v", d)
	}
}

// TestWait: Wait returns true after its wait, false at once when its
// context ends first.
func TestWait(t *testing.T) {
	t.Parallel()
	b := Backoff{Base: time.Millisecond, Max: time.Millisecond}
	if !b.Wait(context.Background()) {
		t.Fatal("Wait with a live context returned false")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	long := Backoff{Base: time.Hour}
	done := make(chan bool)
	go func() { done <- long.Wait(ctx) }()
	if <-done {
		t.Fatal("Wait with an ended context returned true")
	}
}

// TestDelay: each attempt's wait lies in [d/2, d] of the doubled,
// capped d, and the draws differ (the jitter is there).
func TestDelay(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		base, max time.Duration
		attempt   int
		want      time.Duration // the un-jittered d
	}{
		{time.Second, 30 * time.Second, 1, time.Second},
		{time.Second, 30 * time.Second, 2, 2 * time.Second},
		{time.Second, 30 * time.Second, 5, 16 * time.Second},
		{time.Second, 30 * time.Second, 6, 30 * time.Second},
		{time.Second, 30 * time.Second, 1000, 30 * time.Second},
		{time.Second, 0, 6, 32 * time.Second},
		{time.Second, 0, 200, 1 << 62}, // saturates, no overflow
		{50 * time.Millisecond, 2 * time.Second, 0, 50 * time.Millisecond},
	} {
		seen := map[time.Duration]bool{}
		for range 200 {
			d := Delay(tc.base, tc.max, tc.attempt)
			if d < tc.want/2 || d > tc.want {
				t.Fatalf("Delay(%v, %v, %d) = %v, want within [%v, %v]", tc.base, tc.max, tc.attempt, d, tc.want/2, tc.want)
			}
			seen[d] = true
		}
		if len(seen) < 10 {
			t.Errorf("Delay(%v, %v, %d): %d distinct waits in 200 draws: no jitter", tc.base, tc.max, tc.attempt, len(seen))
		}
	}
}
