package server_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/server"
)

// floodFor sends key's requests from 16 clients, each as soon as its
// last was answered, for d; it returns the answers by status and how
// long the flood lasted.
func (e *env) floodFor(key string, d time.Duration) (map[int]int64, time.Duration) {
	return e.floodUntil(key, d, nil)
}

// floodUntil is floodFor, ended early once enough (given the answers so
// far and the time since the start) says so.
func (e *env) floodUntil(key string, d time.Duration, enough func(ok int64, took time.Duration) bool) (map[int]int64, time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var mu sync.Mutex
	got := map[int]int64{}
	var wg sync.WaitGroup
	start := time.Now()
	for range 16 {
		wg.Go(func() {
			for ctx.Err() == nil {
				r := e.do("GET", "/v1/sandboxes", key, nil)
				mu.Lock()
				got[r.status]++
				if enough != nil && enough(got[http.StatusOK], time.Since(start)) {
					cancel()
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return got, time.Since(start)
}

// pacedMost is the most answers a flood paced to pace a second may get
// in took: the bucket's burst (a tenth of a second's worth), then the
// pace; the last place of each client may be granted as the flood ends.
func pacedMost(pace int64, took time.Duration) int64 {
	return int64(float64(pace)*took.Seconds()) + pace/10 + 16
}

// TestPacedFlood: one tenant's 16 clients, each sending its next request
// as soon as the last is answered, get their answers at the account's
// pace (50 a second here), none refused; another tenant is answered
// meanwhile. The count is a bound the pace sets whatever the host's
// speed: a slow host answers fewer.
func TestPacedFlood(t *testing.T) {
	const pace = 50
	e := newEnv(t, server.Config{PacePerAccount: pace})
	var other atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 10 {
			if r := e.do("GET", "/v1/sandboxes", e.keyB, nil); r.status == http.StatusOK {
				other.Add(1)
			}
		}
	}()
	got, took := e.floodFor(e.keyA, 2*time.Second)
	<-done
	most := pacedMost(pace, took)
	t.Logf("paced to %d/s: %v in %v (at most %d), the other tenant's 10 reads: %d answered", pace, got, took.Round(time.Millisecond), most, other.Load())
	if got[http.StatusOK] > most || len(got) != 1 {
		t.Fatalf("the flood got %v in %v: want only 200s, at most %d", got, took, most)
	}
	if got[http.StatusOK] < pace {
		t.Fatalf("the flood got %v in %v: want about %d a second", got, took, pace)
	}
	if other.Load() != 10 {
		t.Fatalf("the other tenant's reads: %d of 10 answered", other.Load())
	}
}

// TestUnpacedFloodControl is TestPacedFlood's control: without a pace,
// the same clients get more answers than TestPacedFlood's pace would
// allow in the same time (on this host, several times more; a loaded
// host, under -race, answers slower, so the flood runs until it passes
// the paced bound, for up to 10 s).
func TestUnpacedFloodControl(t *testing.T) {
	const pace = 50 // TestPacedFlood's
	e := newEnv(t, server.Config{PacePerAccount: -1})
	passed := func(ok int64, took time.Duration) bool { return took > time.Second && ok > 2*pacedMost(pace, took) }
	got, took := e.floodUntil(e.keyA, 10*time.Second, passed)
	t.Logf("unpaced: %v in %v (a pace of %d allows at most %d)", got, took.Round(time.Millisecond), pace, pacedMost(pace, took))
	if !passed(got[http.StatusOK], took) {
		t.Fatalf("unpaced, the flood got only %v in %v: no more than a pace of %d would give", got, took, pace)
	}
}

// TestPaceRefusesFarPlaces: a request whose place in its account's pace
// is further than the longest wait is refused at once with 429
// ERR_RATE_LIMITED and a Retry-After; the others wait theirs; another
// account is answered at once.
func TestPaceRefusesFarPlaces(t *testing.T) {
	defer server.SetMaxPaceWait(300 * time.Millisecond)()
	e := newEnv(t, server.Config{PacePerAccount: 10})
	var wg sync.WaitGroup
	res := make(chan resp, 30)
	start := time.Now()
	for range 30 {
		wg.Go(func() { res <- e.do("GET", "/v1/sandboxes", e.keyA, nil) })
	}
	wg.Wait()
	took := time.Since(start)
	close(res)
	var ok, refused int
	for r := range res {
		switch r.status {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
			if code := r.errCode(t); code != "ERR_RATE_LIMITED" || r.header.Get("Retry-After") == "" {
				t.Fatalf("refused with %s, Retry-After %q", code, r.header.Get("Retry-After"))
			}
			refused++
		default:
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
	// One at once (the burst), then one every 100 ms while the requests
	// arrive and for 300 ms more.
	most := 2 + int(10*took.Seconds())
	t.Logf("%d answered, %d refused in %v (at most %d answered)", ok, refused, took.Round(time.Millisecond), most)
	if ok < 1 || ok > most || refused == 0 || ok+refused != 30 {
		t.Fatalf("%d answered, %d refused in %v: want 1 to %d answered, the rest refused", ok, refused, took, most)
	}
	want(t, e.do("GET", "/v1/sandboxes", e.keyB, nil), http.StatusOK, "")
}
