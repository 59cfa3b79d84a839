package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/store"
)

func (s *Server) eventRoutes(add addFunc) {
	add("GET /v1/sandboxes/{id}/events", true, s.sandboxEvents)
	add("GET /v1/events", true, s.ownerEvents)
}

// Paging of event listings.
const (
	defaultEventPage = 100
	maxEventPage     = 1000
	// sseHeartbeat is how often a quiet event stream sends a comment, so
	// that proxies and clients see the connection alive.
	sseHeartbeat = 15 * time.Second
)

// eventQuery is what a listing or a stream asks for.
type eventQuery struct {
	filter events.Filter
	since  time.Time
	after  int64 // cursor, or Last-Event-ID
	resume bool  // after was given
	limit  int
}

// parseEventQuery reads type (repeated or comma-separated), since
// (RFC 3339), cursor, limit and, when allowSandbox, sandbox.
func parseEventQuery(r *http.Request, own string, allowSandbox bool) (eventQuery, error) {
	q := r.URL.Query()
	eq := eventQuery{filter: events.Filter{Owner: own}, limit: defaultEventPage}
	for _, v := range q["type"] {
		for _, t := range strings.Split(v, ",") {
			t = strings.TrimSpace(t)
			if t == "" {
				continue
			}
			if !events.Known(events.Type(t)) {
				return eq, apierr.New(apierr.BadRequest, "unknown event type %q", t)
			}
			eq.filter.Types = append(eq.filter.Types, events.Type(t))
		}
	}
	if v := q.Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return eq, apierr.New(apierr.BadRequest, "since must be an RFC 3339 time, like 2026-01-02T15:04:05Z")
		}
		eq.since = t
	}
	cursor := q.Get("cursor")
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		cursor = id
	}
	if cursor != "" {
		n, err := strconv.ParseInt(cursor, 10, 64)
		if err != nil || n < 0 {
			return eq, apierr.New(apierr.BadRequest, "cursor (or Last-Event-ID) must be an event id")
		}
		eq.after, eq.resume = n, true
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxEventPage {
			return eq, apierr.New(apierr.BadRequest, "limit must be between 1 and %d", maxEventPage)
		}
		eq.limit = n
	}
	if v := q.Get("sandbox"); v != "" {
		if !allowSandbox {
			return eq, apierr.New(apierr.BadRequest, "sandbox is given in the path here")
		}
		eq.filter.SandboxID = v
	}
	return eq, nil
}

type eventListJSON struct {
	Events     []events.Event `json:"events"`
	NextCursor *string        `json:"next_cursor"`
}

// listEvents answers a page of stored events.
func (s *Server) listEvents(w http.ResponseWriter, r *http.Request, eq eventQuery) error {
	l, err := s.bus.Query(r.Context(), events.Query{Filter: eq.filter, Since: eq.since, AfterID: eq.after, Limit: eq.limit + 1})
	if err != nil {
		return err
	}
	out := eventListJSON{Events: l}
	if len(l) > eq.limit {
		out.Events = l[:eq.limit]
		c := strconv.FormatInt(out.Events[eq.limit-1].ID, 10)
		out.NextCursor = &c
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// sandboxEvents lists or streams one sandbox's events. The caller's own
// stopped sandboxes keep theirs (until the retention period ends). A
// stream replays the sandbox's history (from Last-Event-ID or cursor when
// given) and ends after sandbox.stopped.
func (s *Server) sandboxEvents(w http.ResponseWriter, r *http.Request) error {
	own, id := owner(r), r.PathValue("id")
	rec, err := s.store.GetSandbox(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) || err == nil && rec.Owner != own {
		return notFound(id)
	}
	if err != nil {
		return err
	}
	eq, err := parseEventQuery(r, own, false)
	if err != nil {
		return err
	}
	eq.filter.SandboxID = id
	if wantStream(r, streamNone) != streamSSE {
		return s.listEvents(w, r, eq)
	}
	stopped := func() bool {
		rec, err := s.store.GetSandbox(r.Context(), id)
		return err == nil && rec.State == store.SandboxStopped
	}
	return s.streamEvents(w, r, eq, true, stopped)
}

// ownerEvents lists or streams every event of the caller's sandboxes. A
// stream starts with what is new unless Last-Event-ID, cursor or since
// asks for a replay.
func (s *Server) ownerEvents(w http.ResponseWriter, r *http.Request) error {
	eq, err := parseEventQuery(r, owner(r), true)
	if err != nil {
		return err
	}
	if wantStream(r, streamNone) != streamSSE {
		return s.listEvents(w, r, eq)
	}
	return s.streamEvents(w, r, eq, eq.resume || !eq.since.IsZero(), nil)
}

// streamEvents writes events as SSE (id, event, data): the stored ones
// after eq.after first when replay, then live ones, without a gap or a
// duplicate (events.Subscription.From). A subscriber that falls behind
// gets a last "lagged" event naming the last id it was sent, and resumes
// by reconnecting with Last-Event-ID; one the server's drain cuts off
// gets a last "failure" event (ERR_SHUTTING_DOWN) naming it too. With stopped set, the stream is
// one sandbox's and ends after its sandbox.stopped event (or after the
// replay, when stopped reports the sandbox gone without one).
func (s *Server) streamEvents(w http.ResponseWriter, r *http.Request, eq eventQuery, replay bool, stopped func() bool) error {
	sub := s.bus.Subscribe(eq.filter)
	defer sub.Close()
	// Every write has the stream write deadline: a client that stops
	// reading ends its stream (and its subscription) instead of pinning
	// them for as long as it keeps the connection.
	dw := &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w)}
	defer dw.end()
	w = dw
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, ": stream\n\n")
	rc.Flush()

	last := eq.after
	send := func(e events.Event) error {
		b, err := json.Marshal(e)
		if err != nil {
			return err
		}
		if e.ID > 0 {
			fmt.Fprintf(w, "id: %d\n", e.ID)
			last = e.ID
		}
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", e.Type, b); err != nil {
			return err
		}
		return rc.Flush()
	}
	if replay {
		for {
			page, err := s.bus.Query(r.Context(), events.Query{Filter: eq.filter, Since: eq.since, AfterID: last,
				UpToID: sub.From, Limit: maxEventPage})
			if err != nil {
				s.log.Error("replay events", "request_id", requestIDFrom(r.Context()), "err", err)
				return nil // the headers are out; the client resumes from its last id
			}
			for _, e := range page {
				if err := send(e); err != nil {
					return nil
				}
				if stopped != nil && e.Type == events.SandboxStopped {
					return nil
				}
			}
			if len(page) < maxEventPage {
				break
			}
		}
	}
	if stopped != nil && stopped() {
		// The sandbox has stopped: its sandbox.stopped event, if it has one
		// (not after a crash or restart), was emitted before and is now
		// either replayed above or, once the bus has caught up, waiting on
		// the subscription.
		if err := s.bus.Sync(r.Context()); err != nil {
			return nil
		}
		for {
			select {
			case e, ok := <-sub.C():
				if !ok {
					return nil
				}
				if e.ID != 0 && e.ID <= last {
					continue
				}
				if send(e) != nil || e.Type == events.SandboxStopped {
					return nil
				}
			default:
				return nil
			}
		}
	}
	beat := time.NewTicker(sseHeartbeat)
	defer beat.Stop()
	for {
		select {
		case e, ok := <-sub.C():
			if !ok {
				if sub.Lagged() {
					b, _ := json.Marshal(map[string]int64{"last_event_id": last})
					fmt.Fprintf(w, "event: lagged\ndata: %s\n\n", b)
					rc.Flush()
				}
				return nil
			}
			if e.ID != 0 && e.ID <= last {
				continue
			}
			if err := send(e); err != nil {
				return nil
			}
			if stopped != nil && e.Type == events.SandboxStopped {
				return nil
			}
		case <-beat.C:
			if _, err := fmt.Fprint(w, ": ping\n\n"); err != nil || rc.Flush() != nil {
				return nil
			}
		case <-r.Context().Done():
			if cutByDrain(r.Context()) {
				s.endByDrain(w, r, last)
			}
			return nil
		case <-s.streamsDone:
			s.endByDrain(w, r, last)
			return nil
		}
	}
}

// endByDrain ends an event stream the server's drain cuts off with a
// failure event: the usual error object (ERR_SHUTTING_DOWN) and the id
// of the last event sent, to resume from (Last-Event-ID) on another
// server or after the restart.
func (s *Server) endByDrain(w http.ResponseWriter, r *http.Request, last int64) {
	_, body := s.errorJSON(r, errCut)
	b, _ := json.Marshal(map[string]any{"error": body, "last_event_id": last})
	fmt.Fprintf(w, "event: failure\ndata: %s\n\n", b)
	http.NewResponseController(w).Flush()
}

// EventStore adapts the store's events table to the bus (events.Store).
func EventStore(st store.EventStore) events.Store { return eventStore{st} }

type eventStore struct{ st store.EventStore }

func (a eventStore) AddEvents(ctx context.Context, evs []events.Event) error {
	recs := make([]store.Event, len(evs))
	for i, e := range evs {
		recs[i] = store.Event{Time: e.Timestamp, Type: string(e.Type), Source: e.Source, SandboxID: e.SandboxID, Owner: e.Owner,
			ExecutionID: e.ExecutionID}
		if len(e.Details) > 0 {
			b, err := json.Marshal(e.Details)
			if err != nil {
				return fmt.Errorf("event %s details: %w", e.Type, err)
			}
			recs[i].Details = b
		}
	}
	if err := a.st.AddEvents(ctx, recs); err != nil {
		return err
	}
	for i := range evs {
		evs[i].ID = recs[i].ID
	}
	return nil
}

func (a eventStore) ListEvents(ctx context.Context, q events.Query) ([]events.Event, error) {
	types := make([]string, len(q.Types))
	for i, t := range q.Types {
		types[i] = string(t)
	}
	recs, err := a.st.ListEvents(ctx, store.EventFilter{Owner: q.Owner, SandboxID: q.SandboxID, Types: types,
		Since: q.Since, AfterID: q.AfterID, UpToID: q.UpToID, Limit: q.Limit})
	if err != nil {
		return nil, err
	}
	out := make([]events.Event, len(recs))
	for i, r := range recs {
		out[i] = events.Event{ID: r.ID, Timestamp: r.Time, Type: events.Type(r.Type), Source: r.Source, SandboxID: r.SandboxID,
			Owner: r.Owner, ExecutionID: r.ExecutionID}
		if len(r.Details) > 0 && string(r.Details) != "{}" {
			if err := json.Unmarshal(r.Details, &out[i].Details); err != nil {
				return nil, fmt.Errorf("event %d details: %w", r.ID, err)
			}
		}
	}
	return out, nil
}

func (a eventStore) DeleteEventsBefore(ctx context.Context, t time.Time) (int, error) {
	return a.st.DeleteEventsBefore(ctx, t)
}
