package events

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Store keeps the bus's events (the server adapts internal/store's
// EventStore to it; this package imports no other of ours, so that the
// engine, which emits, stays apart from persistence).
type Store interface {
	// AddEvents stores events in order and sets their IDs, which only grow.
	AddEvents(ctx context.Context, evs []Event) error
	// ListEvents returns stored events, oldest (lowest ID) first.
	ListEvents(ctx context.Context, q Query) ([]Event, error)
	// DeleteEventsBefore removes events older than t.
	DeleteEventsBefore(ctx context.Context, t time.Time) (int, error)
}

// Query selects stored events.
type Query struct {
	Filter
	Since   time.Time // zero: no lower bound on time
	AfterID int64     // only IDs above this (a cursor, Last-Event-ID)
	UpToID  int64     // only IDs up to this; 0: no bound
	Limit   int       // 0: all
}

// BusConfig configures a Bus. Zero fields take the defaults in brackets.
type BusConfig struct {
	// Retention is how long events (and webhook deliveries) are kept
	// [7 days]; negative keeps them forever.
	Retention time.Duration
	// SubscriberBuffer is how many events a live subscriber may fall
	// behind before it is dropped as lagged [256].
	SubscriberBuffer int
	// MaxPending bounds events emitted but not yet stored; past it new
	// events are dropped and logged, never blocking the emitter [100000].
	MaxPending int
	// FlushDelay is how long the writer waits, once an event is pending,
	// for more to share its transaction (group commit) [20ms]: each
	// execution emits two events a few milliseconds apart, and one SQLite
	// transaction each cost about 0.2 ms of CPU. Sync (so Query), Close
	// and a full batch cut the wait short. Live subscribers and hooks see
	// an event up to this much later. Negative: write each wake-up at once.
	FlushDelay time.Duration
	Logger     *slog.Logger
}

func (c *BusConfig) setDefaults() {
	if c.Retention == 0 {
		c.Retention = 7 * 24 * time.Hour
	}
	if c.SubscriberBuffer <= 0 {
		c.SubscriberBuffer = 256
	}
	if c.MaxPending <= 0 {
		c.MaxPending = 100000
	}
	if c.FlushDelay == 0 {
		c.FlushDelay = 20 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Bus is the server's Sink: it stores every event, then fans it out to
// live subscribers and to the hooks (webhooks). Emit never blocks on I/O:
// events queue in memory and one goroutine writes them to the store in
// batches, waiting up to FlushDelay for a batch to fill unless a reader
// needs the events now (Sync). Only stored events (with their IDs) are
// fanned out, in ID order, which is what makes Subscribe's resume exact
// (see Subscribe).
type Bus struct {
	cfg    BusConfig
	store  Store
	log    *slog.Logger
	wake   chan struct{} // capacity 1: "pending is not empty"
	urgent chan struct{} // capacity 1: "write pending now" (Sync, a full batch)
	quit   chan struct{} // closed by Close
	done   sync.WaitGroup

	// hookMu guards hooks.
	hookMu sync.RWMutex
	hooks  []func(Event)

	// mu guards the fields below.
	mu        sync.Mutex
	pending   []Event
	subs      map[*Subscription]struct{}
	lastID    int64 // the highest ID fanned out
	closed    bool
	dropped   int64         // events dropped because pending was full
	emitted   int64         // events accepted by Emit
	published int64         // events fanned out
	progress  chan struct{} // closed (and replaced) at each fan-out
}

var _ Sink = (*Bus)(nil)

// NewBus returns a running Bus over st. Close stops it.
func NewBus(st Store, cfg BusConfig) *Bus {
	cfg.setDefaults()
	b := &Bus{cfg: cfg, store: st, log: cfg.Logger, wake: make(chan struct{}, 1), urgent: make(chan struct{}, 1),
		quit: make(chan struct{}), subs: map[*Subscription]struct{}{}, progress: make(chan struct{})}
	b.done.Add(1)
	go b.run()
	if cfg.Retention > 0 {
		b.done.Add(1)
		go b.expire()
	}
	return b
}

// Emit implements Sink. It sets Time when zero, Source to SourceHost
// when empty, and returns at once.
func (b *Bus) Emit(e Event) {
	if e.Timestamp.IsZero() {
		e.Timestamp = time.Now()
	}
	if e.Source == "" {
		e.Source = SourceHost
	}
	b.mu.Lock()
	if b.closed || len(b.pending) >= b.cfg.MaxPending {
		b.dropped++
		n := b.dropped
		b.mu.Unlock()
		if n == 1 || n%1000 == 0 {
			b.log.Error("event dropped: the event queue is full or closed", "type", e.Type, "sandbox", e.SandboxID, "dropped", n)
		}
		return
	}
	b.pending = append(b.pending, e)
	b.emitted++
	full := len(b.pending) >= maxBatch
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
	if full {
		b.hurry()
	}
}

// hurry asks the writer to stop waiting for more events and write now. A
// request it finds after writing cuts its next wait short: harmless.
func (b *Bus) hurry() {
	select {
	case b.urgent <- struct{}{}:
	default:
	}
}

// Sync waits until every event emitted before it was called has been
// stored and fanned out (to subscriptions; hooks may still be running).
// It has the writer write at once, without waiting FlushDelay.
func (b *Bus) Sync(ctx context.Context) error {
	b.mu.Lock()
	target := b.emitted
	if b.published < target {
		b.hurry()
	}
	for b.published < target {
		ch := b.progress
		b.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-b.quit:
			return nil
		}
		b.mu.Lock()
	}
	b.mu.Unlock()
	return nil
}

// OnEvent adds a hook called, in order, with every stored event, from the
// bus's goroutine: it must not block (queue the work instead).
func (b *Bus) OnEvent(f func(Event)) {
	b.hookMu.Lock()
	b.hooks = append(b.hooks, f)
	b.hookMu.Unlock()
}

// maxBatch bounds the events written in one transaction.
const maxBatch = 512

func (b *Bus) run() {
	defer b.done.Done()
	var linger *time.Timer
	if b.cfg.FlushDelay > 0 {
		linger = time.NewTimer(b.cfg.FlushDelay)
		linger.Stop()
	}
	for {
		select {
		case <-b.wake:
		case <-b.quit:
			b.flush() // what was emitted before Close
			return
		}
		if linger != nil {
			// Group commit: let the batch fill, unless someone waits.
			linger.Reset(b.cfg.FlushDelay)
			select {
			case <-linger.C:
			case <-b.urgent:
				linger.Stop()
			case <-b.quit:
				linger.Stop()
			}
		}
		b.flush()
	}
}

// flush stores and fans out everything pending.
func (b *Bus) flush() {
	for {
		b.mu.Lock()
		n := min(len(b.pending), maxBatch)
		batch := make([]Event, n)
		copy(batch, b.pending)
		b.pending = b.pending[n:]
		if len(b.pending) == 0 {
			b.pending = nil // let the backing array go
		}
		b.mu.Unlock()
		if n == 0 {
			return
		}
		b.publish(b.persist(batch))
	}
}

// persist stores a batch and returns it with IDs. If the store fails the
// events are still fanned out live, without IDs.
func (b *Bus) persist(batch []Event) []Event {
	if err := b.store.AddEvents(context.Background(), batch); err != nil {
		b.log.Error("store events", "count", len(batch), "err", err)
		for i := range batch {
			batch[i].ID = 0
		}
	}
	return batch
}

func (b *Bus) publish(batch []Event) {
	b.mu.Lock()
	for _, e := range batch {
		if e.ID > b.lastID {
			b.lastID = e.ID
		}
		for s := range b.subs {
			if !s.f.match(e) {
				continue
			}
			select {
			case s.ch <- e:
			default:
				// Never wait for a slow subscriber: drop it, and let it
				// resume from the store with its last ID.
				s.lagged = true
				delete(b.subs, s)
				close(s.ch)
			}
		}
	}
	b.published += int64(len(batch))
	close(b.progress)
	b.progress = make(chan struct{})
	b.mu.Unlock()
	b.hookMu.RLock()
	hooks := b.hooks
	b.hookMu.RUnlock()
	for _, e := range batch {
		for _, h := range hooks {
			h(e)
		}
	}
}

// expire deletes events older than the retention period, at start and
// then every tenth of it (at most hourly).
func (b *Bus) expire() {
	defer b.done.Done()
	every := min(b.cfg.Retention/10, time.Hour)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if n, err := b.store.DeleteEventsBefore(context.Background(), time.Now().Add(-b.cfg.Retention)); err != nil {
			b.log.Error("delete expired events", "err", err)
		} else if n > 0 {
			b.log.Info("deleted expired events", "count", n, "retention", b.cfg.Retention)
		}
		select {
		case <-b.quit:
			return
		case <-t.C:
		}
	}
}

// Close stores what is pending (at once, without waiting FlushDelay),
// ends every subscription and stops the bus. Events emitted afterwards
// are dropped.
func (b *Bus) Close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	b.mu.Unlock()
	close(b.quit)
	b.done.Wait()
	b.mu.Lock()
	for s := range b.subs {
		delete(b.subs, s)
		close(s.ch)
	}
	b.mu.Unlock()
}

// Filter selects events for a subscriber or a query.
type Filter struct {
	Owner     string // required: events of other owners never match
	SandboxID string // "" for every sandbox of the owner
	Types     []Type // empty for every type
}

func (f Filter) match(e Event) bool {
	if e.Owner != f.Owner || f.SandboxID != "" && e.SandboxID != f.SandboxID {
		return false
	}
	if len(f.Types) == 0 {
		return true
	}
	for _, t := range f.Types {
		if t == e.Type {
			return true
		}
	}
	return false
}

// Subscription receives the live events matching its filter.
type Subscription struct {
	// From is the ID of the last event fanned out before the subscription
	// began: every later event (ID > From) arrives on C, every earlier
	// one is in the store. A resuming reader replays the store's events
	// in (its last ID, From] and then reads C: no gap, no duplicate.
	From int64

	b      *Bus
	f      Filter
	ch     chan Event
	lagged bool // set (under b.mu) when dropped for falling behind
}

// Subscribe starts a live subscription; Close ends it.
func (b *Bus) Subscribe(f Filter) *Subscription {
	s := &Subscription{b: b, f: f, ch: make(chan Event, b.cfg.SubscriberBuffer)}
	b.mu.Lock()
	defer b.mu.Unlock()
	s.From = b.lastID
	if b.closed {
		close(s.ch)
		return s
	}
	b.subs[s] = struct{}{}
	return s
}

// C delivers the events. It is closed when the subscriber fell behind
// (Lagged), the bus closed, or Close was called.
func (s *Subscription) C() <-chan Event { return s.ch }

// Lagged reports whether the subscription was dropped for falling behind.
func (s *Subscription) Lagged() bool {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	return s.lagged
}

// Close ends the subscription.
func (s *Subscription) Close() {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if _, ok := s.b.subs[s]; ok {
		delete(s.b.subs, s)
		close(s.ch)
	}
}

// Query returns stored events.
func (b *Bus) Query(ctx context.Context, q Query) ([]Event, error) {
	if err := b.Sync(ctx); err != nil {
		return nil, err
	}
	return b.store.ListEvents(ctx, q)
}
