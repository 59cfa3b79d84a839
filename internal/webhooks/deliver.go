package webhooks

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/sheepfold/sheepfold/internal/backoff"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/store"
)

// hookQueue is one account's deliveries; guarded by Service.qmu.
type hookQueue struct {
	pending []delivery // first in, first out
	active  int        // deliveries running
	ready   bool       // in Service.ready
}

// delivery is one attempt to make.
type delivery struct {
	hook    store.Webhook
	event   events.Event
	body    []byte
	attempt int
}

// enqueue is the bus hook: it queues a delivery per matching webhook and
// never blocks (a full queue drops, logged).
func (w *Service) enqueue(e events.Event) {
	w.mu.RLock()
	hooks := w.hooks[e.Owner]
	w.mu.RUnlock()
	if len(hooks) == 0 || e.ID == 0 {
		return
	}
	body, err := json.Marshal(e)
	if err != nil {
		w.log.Error("webhook event", "event", e.ID, "err", err)
		return
	}
	for _, h := range hooks {
		if len(h.Types) > 0 && !slices.Contains(h.Types, string(e.Type)) {
			continue
		}
		w.push(delivery{hook: h, event: e, body: body, attempt: 1})
	}
}

// push queues a delivery in its account's queue and starts what may start.
func (w *Service) push(d delivery) {
	own := d.hook.Owner
	w.qmu.Lock()
	defer w.qmu.Unlock()
	if w.closed {
		return
	}
	q := w.queues[own]
	if q == nil {
		q = &hookQueue{}
		w.queues[own] = q
	}
	if len(q.pending) >= webhookAccountQueue || w.queued >= webhookQueue {
		w.log.Error("webhook delivery dropped: the queue is full", "owner", own, "webhook", d.hook.ID, "event", d.event.ID,
			"account_queued", len(q.pending), "queued", w.queued)
		return
	}
	q.pending = append(q.pending, d)
	w.queued++
	w.markReady(own, q)
	w.dispatch()
}

// markReady puts an account in turn when it has work waiting and a slot
// of its own free; w.qmu is held.
func (w *Service) markReady(own string, q *hookQueue) {
	if !q.ready && len(q.pending) > 0 && q.active < w.per {
		q.ready = true
		w.ready = append(w.ready, own)
	}
}

// dispatch starts deliveries while slots are free, taking the accounts
// in turn, one delivery each; w.qmu is held.
func (w *Service) dispatch() {
	for w.inflight < w.workers && len(w.ready) > 0 {
		own := w.ready[0]
		w.ready[0] = ""
		w.ready = w.ready[1:]
		q := w.queues[own]
		q.ready = false
		d := q.pending[0]
		q.pending[0] = delivery{}
		q.pending = q.pending[1:]
		w.queued--
		q.active++
		w.inflight++
		w.markReady(own, q) // to the back of the turn
		w.wg.Add(1)
		go w.run(own, q, d)
	}
}

// run makes one delivery in its slot and gives the slot back.
func (w *Service) run(own string, q *hookQueue, d delivery) {
	defer w.wg.Done()
	w.send(d)
	w.qmu.Lock()
	defer w.qmu.Unlock()
	q.active--
	w.inflight--
	if w.closed {
		return
	}
	w.markReady(own, q)
	if q.active == 0 && len(q.pending) == 0 && w.queues[own] == q {
		delete(w.queues, own)
	}
	w.dispatch()
}

// deliver makes one attempt, logs it, and schedules the next one when it
// failed: after base, 2·base, 4·base ... until Config.MaxAttempts. A
// failed attempt returns only once its whole timeout has passed (see
// the package comment: the tenant learns nothing from its timing).
func (w *Service) deliver(d delivery) {
	if !w.registered(d.hook) {
		return // deleted meanwhile
	}
	start := time.Now()
	status, err := w.post(d)
	rec := store.WebhookDelivery{WebhookID: d.hook.ID, EventID: d.event.ID, EventType: string(d.event.Type),
		Attempt: d.attempt, Succeeded: err == nil, Time: start}
	if err == nil {
		rec.StatusCode, rec.DurationMS = status, float64(time.Since(start).Microseconds())/1000
	} else {
		rec.Error = notDelivered
		w.log.Debug("webhook delivery attempt failed", "owner", d.hook.Owner, "webhook", d.hook.ID, "event", d.event.ID,
			"attempt", d.attempt, "status", status, "err", err)
		t := time.NewTimer(time.Until(start.Add(w.timeout)))
		select {
		case <-t.C:
		case <-w.quit:
			t.Stop()
			return
		}
	}
	if serr := w.store.AddDelivery(context.Background(), rec); serr != nil && w.registered(d.hook) {
		w.log.Error("record webhook delivery", "webhook", d.hook.ID, "err", serr)
	}
	if err == nil || d.attempt >= w.cfg.MaxAttempts {
		if err != nil {
			w.log.Warn("webhook delivery failed for good", "owner", d.hook.Owner, "webhook", d.hook.ID, "event", d.event.ID,
				"attempts", d.attempt, "status", status, "err", err)
		}
		return
	}
	wait := backoff.Delay(w.cfg.RetryBase, 0, d.attempt)
	d.attempt++
	time.AfterFunc(wait, func() { w.push(d) }) // dropped by push after stop
}

// post sends one delivery; an error unless the receiver answered 2xx.
func (w *Service) post(d delivery) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
	defer cancel()
	go func() {
		select {
		case <-w.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.hook.URL, bytes.NewReader(d.body))
	if err != nil {
		return 0, err
	}
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "sheepfold-webhooks/1")
	req.Header.Set(headerTimestamp, ts)
	req.Header.Set(headerSignature, Sign(d.hook.Secret, ts, d.body))
	req.Header.Set(headerEventID, strconv.FormatInt(d.event.ID, 10))
	req.Header.Set(headerEventType, string(d.event.Type))
	req.Header.Set(headerWebhookID, d.hook.ID)
	res, err := w.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	if res.StatusCode < 200 || res.StatusCode > 299 {
		return res.StatusCode, fmt.Errorf("the receiver answered %d", res.StatusCode)
	}
	return res.StatusCode, nil
}
