package sqlite

import (
	"context"
	"sync"
)

// turns orders the writers of the busiest paths, each naming whose write
// it is (an account, a webhook, "" for the server's own): SQLite runs one
// writer at a time, and queued on the write handle alone a tenant with
// many writes in flight would have the others wait behind all of them.
// Here the turn goes round the names that wait, one write each, first
// come first served within a name: a write waits for at most one write
// of each other name waiting.
type turns struct {
	// mu guards the fields below.
	mu    sync.Mutex
	busy  bool                       // a writer holds the turn
	queue map[string][]chan struct{} // each name's waiting writers, in order
	ring  []string                   // the names waiting, in the order they came
	next  int                        // where in ring the next turn starts
}

func newTurns() *turns { return &turns{queue: map[string][]chan struct{}{}} }

// take waits for a turn for name; the caller calls give once its write is
// done. An error (ctx ended) means no turn was taken.
func (t *turns) take(ctx context.Context, name string) (give func(), err error) {
	t.mu.Lock()
	if !t.busy {
		t.busy = true
		t.mu.Unlock()
		return t.give, nil
	}
	ch := make(chan struct{})
	if len(t.queue[name]) == 0 {
		t.ring = append(t.ring, name)
	}
	t.queue[name] = append(t.queue[name], ch)
	t.mu.Unlock()
	select {
	case <-ch:
		return t.give, nil
	case <-ctx.Done():
	}
	t.mu.Lock()
	q := t.queue[name]
	for i, c := range q {
		if c == ch {
			t.queue[name] = append(q[:i:i], q[i+1:]...)
			if len(t.queue[name]) == 0 {
				t.drop(name)
			}
			t.mu.Unlock()
			return nil, ctx.Err()
		}
	}
	t.mu.Unlock()
	// The turn came as the context ended: pass it on.
	<-ch
	t.give()
	return nil, ctx.Err()
}

// give ends a turn: the next name in the ring that waits gets it.
func (t *turns) give() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.ring) == 0 {
		t.busy = false
		return
	}
	if t.next >= len(t.ring) {
		t.next = 0
	}
	name := t.ring[t.next]
	q := t.queue[name]
	ch := q[0]
	t.queue[name] = q[1:]
	if len(t.queue[name]) == 0 {
		t.drop(name)
	} else {
		t.next++
	}
	close(ch) // busy stays set: the turn is handed over
}

// drop removes name, which waits no more, from the ring (under mu).
func (t *turns) drop(name string) {
	delete(t.queue, name)
	for i, n := range t.ring {
		if n == name {
			t.ring = append(t.ring[:i:i], t.ring[i+1:]...)
			if i < t.next {
				t.next--
			}
			return
		}
	}
}
