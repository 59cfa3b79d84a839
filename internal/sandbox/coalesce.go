package sandbox

import (
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/sheepfold/sheepfold/internal/events"
)

// Events the sandbox's code can cause at will, and as fast as it likes:
// the egress gateway's refusals and exceeded limits (a loop over random
// host names or addresses makes one each), the agent's seccomp reports
// and the code's own reports (already bounded per execution and minute,
// reports.go). Every one is a row in the store all tenants share, a
// message to every webhook and, for the grave kinds, an alert. So the
// engine coalesces them at their source, before they reach the bus: per
// sandbox, source, type and kind (a violation's "kind", an exceeded
// limit's "resource"), a token bucket lets EventRate.Burst through and
// then EventRate.PerMinute; past it, the events of that key are counted
// and dropped, and one event stands for them as soon as the bucket has a
// token again (or when the sandbox stops): the last of them, with
// "count" the number of occurrences it stands for and "first_at" when the
// first of them happened. Nothing is lost but the details of the ones in
// between; the host's own events (lifecycle, executions, its checks) are
// never coalesced.

// EventRate bounds the events of one sandbox's key (source, type, kind).
// Zero fields take the defaults in brackets.
type EventRate struct {
	Burst     int   // let through at once [DefaultEventBurst]
	PerMinute int64 // then, a minute [DefaultEventsPerMinute]
}

// Defaults of EventRate.
const (
	DefaultEventBurst      = 20
	DefaultEventsPerMinute = 60
)

func (r EventRate) withDefaults() EventRate {
	if r.Burst <= 0 {
		r.Burst = DefaultEventBurst
	}
	if r.PerMinute <= 0 {
		r.PerMinute = DefaultEventsPerMinute
	}
	return r
}

// knownKinds are the kinds and resources that make keys of their own; a
// report of any other (the code's reports may say anything) shares one
// key, so that a sandbox's keys stay few.
var knownKinds = map[string]bool{
	events.KindModuleBlocked: true, events.KindSubprocessDenied: true, events.KindNetworkDenied: true,
	events.KindDNSDenied: true, events.KindPathDenied: true, events.KindSyscallDenied: true,
	events.ResourceCPUTime: true, events.ResourceWallTime: true, events.ResourceMemory: true, events.ResourceDisk: true,
	events.ResourceOutput: true, events.ResourceNetworkRequests: true, events.ResourceNetworkFlows: true,
	events.ResourcePids: true, events.ResourceReports: true,
}

// coalesceKey is what an event is coalesced by, beside its sandbox.
type coalesceKey struct {
	source string
	typ    events.Type
	kind   string
}

func keyOf(e events.Event) coalesceKey {
	k := coalesceKey{source: e.Source, typ: e.Type}
	kind, _ := e.Details["kind"].(string)
	if e.Type == events.ResourceExceeded {
		kind, _ = e.Details["resource"].(string)
	}
	if !knownKinds[kind] {
		kind = "other"
	}
	k.kind = kind
	return k
}

// coalescer is a sandbox's buckets, made at its first coalesced event.
type coalescer struct {
	s    *Sandbox
	rate EventRate
	out  events.Sink // where a coalesced event goes (past the sink's checks, which its events passed)

	// mu guards the fields below.
	mu   sync.Mutex
	keys map[coalesceKey]*coalesced
	done bool // the sandbox stopped: flushed, and nothing more is held
}

// coalesced is one key's bucket and what it holds back.
type coalesced struct {
	lim     *rate.Limiter
	held    *events.Event // the last event dropped, nil when none
	count   int64         // the occurrences dropped since the last one let through
	firstAt time.Time     // when the first of them happened
	timer   *time.Timer   // sends held once a token is back
}

// coalescer returns the sandbox's coalescer.
func (s *Sandbox) coalescer() *coalescer {
	s.coalesceOnce.Do(func() {
		s.coalesce = &coalescer{s: s, rate: s.m.cfg.EventRate, out: s.m.out, keys: map[coalesceKey]*coalesced{}}
	})
	return s.coalesce
}

// occurrences is how many things an event reports: its "count" (the
// agent coalesces repeated refusals itself), or one.
func occurrences(e events.Event) int64 {
	switch n := e.Details["count"].(type) {
	case int64:
		return max(n, 1)
	case int:
		return int64(max(n, 1))
	case float64:
		return max(int64(n), 1)
	}
	return 1
}

// admit reports whether e goes on now; when not, it is held (counted)
// and sent, coalesced with the others of its key, once the key's bucket
// has a token again.
func (c *coalescer) admit(e events.Event) bool {
	k := keyOf(e)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return true // the sandbox stopped: what still comes is rare and the host's to bound
	}
	b := c.keys[k]
	if b == nil {
		b = &coalesced{lim: rate.NewLimiter(rate.Limit(float64(c.rate.PerMinute)/60), c.rate.Burst)}
		c.keys[k] = b
	}
	now := time.Now()
	if b.held == nil && b.lim.AllowN(now, 1) {
		return true
	}
	// Held: the events of this key wait for the one that stands for them.
	if b.held == nil {
		b.firstAt = e.Timestamp
		if b.firstAt.IsZero() {
			b.firstAt = now
		}
	}
	held := e
	b.held = &held
	b.count += occurrences(e)
	if b.timer == nil {
		wait := b.lim.ReserveN(now, 1).DelayFrom(now)
		b.timer = time.AfterFunc(wait, func() { c.release(k) })
	}
	return false
}

// release sends what key holds, as one event (its bucket's token was
// reserved when the wait began).
func (c *coalescer) release(k coalesceKey) {
	c.mu.Lock()
	b := c.keys[k]
	var e *events.Event
	if b != nil && !c.done {
		e = b.take()
	}
	c.mu.Unlock()
	if e != nil {
		c.out.Emit(*e)
	}
}

// take returns the event that stands for what b holds, and empties it.
func (b *coalesced) take() *events.Event {
	if b.held == nil {
		return nil
	}
	e := *b.held
	d := make(map[string]any, len(e.Details)+2)
	for k, v := range e.Details {
		d[k] = v
	}
	d["count"] = b.count
	d["first_at"] = b.firstAt.UTC().Format(time.RFC3339Nano)
	e.Details = d
	e.Timestamp = time.Now()
	b.held, b.count, b.timer = nil, 0, nil
	return &e
}

// flush sends everything held at once and stops holding: the sandbox is
// stopping. It is called before sandbox.stopped is emitted, so that the
// sandbox's last events come before it.
func (c *coalescer) flush() {
	c.mu.Lock()
	var out []events.Event
	for _, b := range c.keys {
		if b.timer != nil {
			b.timer.Stop()
		}
		if e := b.take(); e != nil {
			out = append(out, *e)
		}
	}
	c.done = true
	c.mu.Unlock()
	for _, e := range out {
		c.out.Emit(e)
	}
}

// flushEvents flushes the sandbox's coalescer.
func (s *Sandbox) flushEvents() { s.coalescer().flush() }
