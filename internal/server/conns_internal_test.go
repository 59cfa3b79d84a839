package server

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"
)

// TestStreamsRelease: a stream's release gives its place back once,
// however often it is called.
func TestStreamsRelease(t *testing.T) {
	t.Parallel()
	st := newStreams(2, 3, 4)
	r1, err := st.acquire("k", "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.acquire("k", "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.acquire("k", "a"); err == nil {
		t.Fatal("a third stream of a key with a share of 2")
	}
	r1()
	r1()
	if st.open() != 1 || len(st.keys) != 1 || st.keys["k"] != 1 || st.accounts["a"] != 1 {
		t.Fatalf("after a double release: open %d, keys %v, accounts %v", st.open(), st.keys, st.accounts)
	}
}

// BenchmarkStreamAcquire: what a stream's place costs a request (taken
// and given back).
func BenchmarkStreamAcquire(b *testing.B) {
	st := newStreams(DefaultMaxStreamsPerKey, DefaultMaxStreamsPerAccount, 1000)
	b.ReportAllocs()
	for b.Loop() {
		release, err := st.acquire("key_0123456789abcdef", "acct")
		if err != nil {
			b.Fatal(err)
		}
		release()
	}
}

// BenchmarkTrack: what counting a request in flight costs.
func BenchmarkTrack(b *testing.B) {
	s := &Server{}
	h := s.track(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r := httptest.NewRequest("GET", "/", nil)
	b.ReportAllocs()
	for b.Loop() {
		h.ServeHTTP(nil, r)
	}
}

// TestInflightWait: wait returns once the last request in flight is
// done, and not before.
func TestInflightWait(t *testing.T) {
	t.Parallel()
	var f inflight
	if err := f.wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.add()
	f.add()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := f.wait(ctx); err == nil {
		t.Fatal("wait returned with requests in flight")
	}
	done := make(chan error, 1)
	go func() { done <- f.wait(context.Background()) }()
	f.done()
	select {
	case err := <-done:
		t.Fatalf("wait returned with a request in flight: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	f.done()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestStreamRoutesExist: every route the stream table names is one the
// server registers (a renamed route would silently stop being counted).
func TestStreamRoutesExist(t *testing.T) {
	t.Parallel()
	s := New(Config{}, nil, nil, nil)
	defer s.Shutdown(context.Background())
	for pattern := range streamRoutes {
		if !slices.Contains(s.Routes(), pattern) {
			t.Errorf("streamRoutes names %q, which is no route", pattern)
		}
	}
}

// quietConn is a connection whose Close is only noted: net/http reports
// StateClosed for it later, as it does for a real one.
type quietConn struct {
	net.Conn
	closed bool
}

func (c *quietConn) Close() error { c.closed = true; return nil }

// TestShedConnsNotPastTheBound: while the connections it closed are not
// yet reported closed, each new connection past the bound closes one
// more, the oldest quiet one, and no other: 25 new connections on a
// bound of 20 close the 5 oldest. Before, a victim still counted as open
// until net/http reported it closed, so every new one closed all the
// excess again (15 of 25 here, newer ones among them: a flake of
// TestQuietConnectionsShed, whose newest quiet connection was closed).
func TestShedConnsNotPastTheBound(t *testing.T) {
	t.Parallel()
	c := newShedConns(20)
	conns := make([]*quietConn, 25)
	for i := range conns {
		conns[i] = &quietConn{}
		c.state(conns[i], http.StateNew)
		// Distinct times of arrival: the next comes once the clock has
		// moved past this one's.
		for at := time.Now(); !time.Now().After(at); {
		}
	}
	for i, conn := range conns {
		if want := i < 5; conn.closed != want {
			t.Errorf("connection %d closed %v, want %v", i, conn.closed, want)
		}
	}
	if c.shedCount() != 5 {
		t.Errorf("%d shed, want 5", c.shedCount())
	}
	// Once net/http reports the victims closed, the count is back at the
	// bound: the next connection closes one more.
	for _, conn := range conns[:5] {
		c.state(conn, http.StateClosed)
	}
	next := &quietConn{}
	c.state(next, http.StateNew)
	if !conns[5].closed || conns[6].closed || next.closed || c.shedCount() != 6 {
		t.Errorf("after the victims' close: 5th closed %v, 6th %v, new %v, shed %d", conns[5].closed, conns[6].closed, next.closed, c.shedCount())
	}
}
