package server_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
)

// A reader that falls behind is dropped with a "lagged" event, never
// waited for; the SDK then resumes from the store with Last-Event-ID and
// sees every event exactly once, in order.
func TestEventStreamLagResumes(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	bus := events.NewBus(server.EventStore(st), events.BusConfig{SubscriberBuffer: 2, Logger: log})
	defer bus.Close()
	srv := server.New(server.Config{Events: bus}, st, nil, log)
	hs := httptest.NewServer(srv)
	defer func() { hs.Close(); srv.Shutdown(ctx) }()
	_, key, err := auth.Create(ctx, st, auth.CreateOptions{Owner: "acct"})
	if err != nil {
		t.Fatal(err)
	}

	emit := func(k int) {
		for i := 0; i < k; i++ {
			bus.Emit(events.Event{Type: events.ExecutionStarted, SandboxID: "s", Owner: "acct"})
		}
	}

	// The raw stream: once its headers are in, the subscription exists; a
	// burst overflows its buffer of 2 and the stream ends with "lagged".
	req, _ := http.NewRequestWithContext(ctx, "GET", hs.URL+"/v1/events", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Accept", "text/event-stream")
	res, err := hs.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	go emit(500)
	body, err := io.ReadAll(res.Body) // ends: the server closed the stream
	res.Body.Close()
	if err != nil || !strings.Contains(string(body), "event: lagged\ndata: {\"last_event_id\":") {
		t.Fatalf("no lagged event (%v):\n%.2000s", err, body)
	}

	// The SDK resumes after each lag: from the start, with a second burst
	// while it reads, it sees every event once, in order.
	calls := &countingTransport{rt: hs.Client().Transport}
	c := client.New(hs.URL, key, client.WithHTTPClient(&http.Client{Transport: calls}))
	var ids []int64
	err = c.StreamEvents(ctx, client.EventQuery{Cursor: "0"}, func(ev client.Event) error {
		ids = append(ids, ev.ID)
		if len(ids) == 1 {
			go emit(500)
		}
		if len(ids) == 1000 {
			return io.EOF // all there
		}
		return nil
	})
	if err != io.EOF {
		t.Fatalf("StreamEvents: %v after %d events", err, len(ids))
	}
	if calls.n.Load() < 2 {
		t.Fatalf("the SDK's stream never lagged and resumed (%d requests)", calls.n.Load())
	}
	for i := 1; i < len(ids); i++ {
		if ids[i] != ids[i-1]+1 {
			t.Fatalf("event %d: id %d after %d (a gap or a repeat)", i, ids[i], ids[i-1])
		}
	}
}

type countingTransport struct {
	rt http.RoundTripper
	n  atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.rt.RoundTrip(r)
}
