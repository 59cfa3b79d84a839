package server

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Readiness and the drain.
//
// /readyz answers 503 when the store does not answer (store.Pinger; the
// verdict is kept for Config.ReadyCheckInterval, so that probes cost the
// database one ping a second however many arrive), and from the moment a
// shutdown begins (Drain).
//
// Shutdown drains in this order:
//  1. /readyz answers 503 ERR_SHUTTING_DOWN (Drain, at the first signal),
//     and new sandboxes are refused;
//  2. for Config.DrainDelay the listener stays open and every request is
//     served as before, so that load balancers and Kubernetes, which ask
//     /readyz every few seconds, stop sending new ones before the
//     listener closes (skipped when nothing has asked /readyz since the
//     start: then nothing is watching);
//  3. event streams end with a failure event (ERR_SHUTTING_DOWN, with the
//     last event id to resume from), the listener closes and requests in
//     flight run until the caller's deadline;
//  4. at that deadline, what still runs is cut: every request's context
//     is canceled with errCut as its cause, so that executions, commands
//     and streams stop their work and end with ERR_SHUTTING_DOWN (a
//     failure event, an E2B error line and end_of_execution, a Connect
//     error); their handlers get cutGrace to say so, then the connections
//     close.

// DefaultDrainDelay is Config.DrainDelay's default.
const DefaultDrainDelay = 5 * time.Second

// errCut is the cause of the contexts of requests a drain cuts off.
var errCut = apierr.New(apierr.ShuttingDown, "the server is shutting down; the request was cut off")

// cutGrace is how long handlers cut off by a drain have to write their
// last event before their connections close.
const cutGrace = 2 * time.Second

// readyStoreTimeout bounds /readyz's ping of the store.
const readyStoreTimeout = time.Second

// cutByDrain reports whether ctx (a request's) was canceled by a drain.
func cutByDrain(ctx context.Context) bool {
	return ctx.Err() != nil && errors.Is(context.Cause(ctx), errCut)
}

// clientGone reports whether ctx (a request's) was canceled because its
// client went away (its connection closed), not by a drain.
func clientGone(ctx context.Context) bool {
	return ctx.Err() != nil && !cutByDrain(ctx)
}

// readyCheck keeps the store's last verdict for /readyz.
type readyCheck struct {
	// mu guards the fields below, and is held during a ping: callers
	// meanwhile wait for its verdict.
	mu  sync.Mutex
	at  time.Time
	err error
}

// storeReady pings the store, at most once per ReadyCheckInterval.
func (s *Server) storeReady(ctx context.Context) error {
	p, ok := s.store.(store.Pinger)
	if !ok {
		return nil
	}
	c := &s.readyStore
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < s.cfg.ReadyCheckInterval {
		return c.err
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readyStoreTimeout)
	defer cancel()
	c.err, c.at = p.Ping(pctx), time.Now()
	return c.err
}

// inflight counts the requests being served, for the drain to wait on:
// an atomic count on the request path, a channel only while someone
// waits.
type inflight struct {
	n atomic.Int64

	// mu guards zero.
	mu   sync.Mutex
	zero chan struct{} // made by wait, closed when n falls to 0
}

func (f *inflight) add() { f.n.Add(1) }

func (f *inflight) done() {
	if f.n.Add(-1) != 0 {
		return
	}
	f.mu.Lock()
	if f.zero != nil {
		close(f.zero)
		f.zero = nil
	}
	f.mu.Unlock()
}

// wait waits until no request is served, or ctx ends.
func (f *inflight) wait(ctx context.Context) error {
	for {
		f.mu.Lock()
		if f.n.Load() == 0 {
			f.mu.Unlock()
			return nil
		}
		if f.zero == nil {
			f.zero = make(chan struct{})
		}
		z := f.zero
		f.mu.Unlock()
		select {
		case <-z: // (then look again: a request may have begun since)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// drainDelay is how long Shutdown keeps serving after Drain: the
// configured delay, or none when nothing has asked /readyz.
func (s *Server) drainDelay() time.Duration {
	if !s.readyAsked.Load() {
		return 0
	}
	return s.cfg.DrainDelay
}

// DrainDelay is how long Shutdown will keep the listener open after the
// drain begins (Config.DrainDelay; 0 while nothing has asked /readyz).
// serve gives Shutdown this long on top of its own timeout.
func (s *Server) DrainDelay() time.Duration { return s.drainDelay() }
