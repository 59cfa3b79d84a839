package events_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/events"
)

// memStore is an events.Store in memory (the SQLite one is tested through
// the server).
type memStore struct {
	mu     sync.Mutex
	evs    []events.Event
	nextID int64
}

func openStore(*testing.T) *memStore { return &memStore{} }

func (m *memStore) AddEvents(_ context.Context, evs []events.Event) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range evs {
		m.nextID++
		evs[i].ID = m.nextID
		m.evs = append(m.evs, evs[i])
	}
	return nil
}

func (m *memStore) ListEvents(_ context.Context, q events.Query) ([]events.Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := []events.Event{}
	for _, e := range m.evs {
		if e.Owner != q.Owner || q.SandboxID != "" && e.SandboxID != q.SandboxID ||
			len(q.Types) > 0 && !slices.Contains(q.Types, e.Type) || e.Timestamp.Before(q.Since) ||
			e.ID <= q.AfterID || q.UpToID > 0 && e.ID > q.UpToID {
			continue
		}
		if out = append(out, e); q.Limit > 0 && len(out) == q.Limit {
			break
		}
	}
	return out, nil
}

func (m *memStore) DeleteEventsBefore(_ context.Context, t time.Time) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := len(m.evs)
	m.evs = slices.DeleteFunc(m.evs, func(e events.Event) bool { return e.Timestamp.Before(t) })
	return n - len(m.evs), nil
}

func query(b *events.Bus, owner string, after, upTo int64) []events.Event {
	l, _ := b.Query(context.Background(), events.Query{Filter: events.Filter{Owner: owner}, AfterID: after, UpToID: upTo})
	return l
}

func recv(t *testing.T, s *events.Subscription) events.Event {
	t.Helper()
	select {
	case e, ok := <-s.C():
		if !ok {
			t.Fatal("subscription closed")
		}
		return e
	case <-time.After(5 * time.Second):
		t.Fatal("no event within 5s")
	}
	return events.Event{}
}

func TestBusStoresAndFansOut(t *testing.T) {
	t.Parallel()
	db := openStore(t)
	b := events.NewBus(db, events.BusConfig{})
	defer b.Close()
	mine := b.Subscribe(events.Filter{Owner: "o1"})
	box := b.Subscribe(events.Filter{Owner: "o1", SandboxID: "a", Types: []events.Type{events.ExecutionFinished}})
	other := b.Subscribe(events.Filter{Owner: "o2"})
	defer mine.Close()
	defer box.Close()
	defer other.Close()

	b.Emit(events.Event{Type: events.SandboxCreated, SandboxID: "a", Owner: "o1", Details: map[string]any{"template": "python"}})
	b.Emit(events.Event{Type: events.ExecutionFinished, SandboxID: "b", Owner: "o1"})
	b.Emit(events.Event{Type: events.ExecutionFinished, SandboxID: "a", Owner: "o1", ExecutionID: "x",
		Details: map[string]any{"status": "success"}})

	e1, e2, e3 := recv(t, mine), recv(t, mine), recv(t, mine)
	if e1.Type != events.SandboxCreated || e1.ID == 0 || e1.Timestamp.IsZero() || !(e1.ID < e2.ID && e2.ID < e3.ID) {
		t.Fatalf("owner stream: %+v %+v %+v", e1, e2, e3)
	}
	if e := recv(t, box); e.ID != e3.ID || e.ExecutionID != "x" {
		t.Fatalf("filtered stream got %+v, want event %d", e, e3.ID)
	}
	select {
	case e := <-other.C():
		t.Fatalf("another owner saw %+v", e)
	default:
	}
	stored := query(b, "o1", 0, 0)
	if len(stored) != 3 || stored[2].Details["status"] != "success" || stored[0].Details["template"] != "python" {
		t.Fatalf("stored: %+v", stored)
	}
}

// A subscriber that does not read is dropped as lagged; emitters never
// wait for it, and the others still get everything.
func TestBusSlowSubscriberIsDroppedNotWaitedFor(t *testing.T) {
	t.Parallel()
	b := events.NewBus(openStore(t), events.BusConfig{SubscriberBuffer: 4})
	defer b.Close()
	slow := b.Subscribe(events.Filter{Owner: "o"})
	defer slow.Close()
	fast := b.Subscribe(events.Filter{Owner: "o"})
	defer fast.Close()
	const n = 50
	var emitting time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		b.Emit(events.Event{Type: events.ExecutionStarted, SandboxID: "s", Owner: "o"})
		emitting += time.Since(t0)
		if e := recv(t, fast); e.Type != events.ExecutionStarted {
			t.Fatalf("fast subscriber got %+v", e)
		}
	}
	if emitting > 100*time.Millisecond {
		t.Fatalf("emitting %d events took %s", n, emitting)
	}
	for range slow.C() { // drains the buffer, then ends: the channel was closed
	}
	if !slow.Lagged() {
		t.Fatal("the slow subscriber was not marked lagged")
	}
	if fast.Lagged() {
		t.Fatal("the fast subscriber was marked lagged")
	}
}

// A reader resuming from any ID, while events keep coming, sees every
// later event exactly once: the store's (last, From] and then the live
// channel.
func TestBusResumeHasNoGapNoDuplicate(t *testing.T) {
	t.Parallel()
	b := events.NewBus(openStore(t), events.BusConfig{SubscriberBuffer: 10000})
	defer b.Close()
	f := events.Filter{Owner: "o"}
	const total = 400
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < total; i++ {
			b.Emit(events.Event{Type: events.ExecutionStarted, SandboxID: "s", Owner: "o"})
			if i%50 == 0 {
				time.Sleep(time.Millisecond) // let batches of different sizes form
			}
		}
	}()
	// Wait for some events to be stored, then resume from the middle.
	var last int64
	for {
		if l := query(b, "o", 0, 0); len(l) >= 50 {
			last = l[24].ID
			break
		}
		time.Sleep(time.Millisecond)
	}
	sub := b.Subscribe(f)
	defer sub.Close()
	replay := query(b, "o", last, sub.From)
	seen := []int64{}
	for _, e := range replay {
		seen = append(seen, e.ID)
	}
	wg.Wait()
	for len(seen) < total-25 {
		seen = append(seen, recv(t, sub).ID)
	}
	all := query(b, "o", last, 0)
	if len(all) != len(seen) {
		t.Fatalf("saw %d events after %d, the store has %d", len(seen), last, len(all))
	}
	for i := range all {
		if all[i].ID != seen[i] {
			t.Fatalf("event %d: saw id %d, want %d", i, seen[i], all[i].ID)
		}
	}
}

func TestBusCloseStoresPendingAndEndsSubscriptions(t *testing.T) {
	t.Parallel()
	db := openStore(t)
	b := events.NewBus(db, events.BusConfig{})
	sub := b.Subscribe(events.Filter{Owner: "o"})
	for i := 0; i < 100; i++ {
		b.Emit(events.Event{Type: events.SandboxStopped, SandboxID: "s", Owner: "o"})
	}
	b.Close()
	n := 0
	for range sub.C() {
		n++
	}
	if sub.Lagged() {
		t.Fatal("closing the bus is not lagging")
	}
	if l := query(b, "o", 0, 0); len(l) != 100 {
		t.Fatalf("%d of 100 events stored at close", len(l))
	}
	b.Emit(events.Event{Type: events.SandboxStopped, SandboxID: "s", Owner: "o"}) // dropped, no panic
}

func TestBusRetention(t *testing.T) {
	t.Parallel()
	db := openStore(t)
	old := []events.Event{{Timestamp: time.Now().Add(-2 * time.Hour), Type: events.SandboxCreated, Owner: "o"}}
	if err := db.AddEvents(context.Background(), old); err != nil {
		t.Fatal(err)
	}
	b := events.NewBus(db, events.BusConfig{Retention: time.Hour})
	b.Emit(events.Event{Type: events.SandboxCreated, Owner: "o"})
	b.Close() // the expiry pass at start ran before Close returned
	if l := query(b, "o", 0, 0); len(l) != 1 || l[0].ID == old[0].ID {
		t.Fatalf("after retention: %+v", l)
	}
}

// After Sync, what was emitted before it is stored and in the
// subscribers' channels.
func TestBusSync(t *testing.T) {
	t.Parallel()
	b := events.NewBus(openStore(t), events.BusConfig{SubscriberBuffer: 1000})
	defer b.Close()
	sub := b.Subscribe(events.Filter{Owner: "o"})
	defer sub.Close()
	for i := 0; i < 300; i++ {
		b.Emit(events.Event{Type: events.ExecutionStarted, SandboxID: "s", Owner: "o"})
	}
	if err := b.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(query(b, "o", 0, 0)); n != 300 {
		t.Fatalf("%d of 300 stored after Sync", n)
	}
	if n := len(sub.C()); n != 300 {
		t.Fatalf("%d of 300 fanned out after Sync", n)
	}
}

// countingStore counts the store's transactions (AddEvents calls).
type countingStore struct {
	memStore
	calls atomic.Int64
}

func (c *countingStore) AddEvents(ctx context.Context, evs []events.Event) error {
	c.calls.Add(1)
	return c.memStore.AddEvents(ctx, evs)
}

// The writer waits FlushDelay for more events before it writes (group
// commit), so events emitted apart share one transaction; Sync, and so
// Query, writes them at once: a reader sees what was emitted before it.
func TestBusGroupCommitKeepsReadYourWrites(t *testing.T) {
	t.Parallel()
	st := &countingStore{}
	b := events.NewBus(st, events.BusConfig{FlushDelay: time.Hour, SubscriberBuffer: 1000})
	defer b.Close()
	sub := b.Subscribe(events.Filter{Owner: "o"})
	defer sub.Close()
	b.Emit(events.Event{Type: events.ExecutionStarted, SandboxID: "s", Owner: "o"})
	// Nothing is written while the batch may still fill (without the
	// wait, the first event is written as soon as the writer wakes).
	for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if n := st.calls.Load(); n != 0 {
			t.Fatalf("the writer wrote %d batches before its delay or a Sync", n)
		}
	}
	for i := 1; i < 100; i++ {
		b.Emit(events.Event{Type: events.ExecutionFinished, SandboxID: "s", Owner: "o"})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := b.Query(ctx, events.Query{Filter: events.Filter{Owner: "o"}})
	if err != nil {
		t.Fatalf("Query did not cut the writer's delay short: %v", err)
	}
	if len(got) != 100 {
		t.Fatalf("Query saw %d of the 100 events emitted before it", len(got))
	}
	if n := st.calls.Load(); n != 1 {
		t.Fatalf("100 events took %d transactions, want 1", n)
	}
	if n := len(sub.C()); n != 100 {
		t.Fatalf("%d of 100 fanned out after Query", n)
	}
	// Once written, the next event waits for its own batch again.
	b.Emit(events.Event{Type: events.ExecutionStarted, SandboxID: "s", Owner: "o"})
	if err := b.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(query(b, "o", 0, 0)); n != 101 {
		t.Fatalf("%d of 101 stored after Sync", n)
	}
}

// A clean shutdown loses nothing: Close writes what is pending at once,
// whatever the delay, and a batch that fills is written without waiting.
func TestBusCloseWritesPendingWithoutWaiting(t *testing.T) {
	t.Parallel()
	st := &countingStore{}
	b := events.NewBus(st, events.BusConfig{FlushDelay: time.Hour})
	const n = 1500 // more than two full batches
	var wg sync.WaitGroup
	for g := 0; g < 3; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < n/3; i++ {
				b.Emit(events.Event{Type: events.ExecutionStarted, SandboxID: "s", Owner: "o"})
			}
		}()
	}
	wg.Wait()
	// Full batches do not wait for the delay.
	for deadline := time.Now().Add(time.Minute); st.calls.Load() < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("full batches were not written: %d transactions", st.calls.Load())
		}
	}
	closed := make(chan struct{})
	go func() { b.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(time.Minute):
		t.Fatal("Close waited for the flush delay")
	}
	ids := map[int64]bool{}
	for _, e := range st.evs {
		ids[e.ID] = true
	}
	if len(st.evs) != n || len(ids) != n {
		t.Fatalf("%d events stored (%d distinct), want %d", len(st.evs), len(ids), n)
	}
}
