package integration

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/client"
)

// TestEventsGoSDK: a real sandbox's events, streamed live and resumed,
// listed, and delivered to a webhook on loopback, signed.
func TestEventsGoSDK(t *testing.T) {
	s := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := client.New(s.url, s.key)

	type delivery struct {
		ts, sig string
		body    []byte
	}
	got := make(chan delivery, 100)
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- delivery{r.Header.Get("Sheepfold-Timestamp"), r.Header.Get("Sheepfold-Signature"), b}
	}))
	defer rc.Close()
	hook, err := c.CreateWebhook(ctx, rc.URL, "execution.finished")
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteWebhook(ctx, hook.ID)

	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// The sandbox's stream, read live while the sandbox works.
	evs := make(chan client.Event, 100)
	done := make(chan error, 1)
	go func() {
		done <- c.StreamEvents(ctx, client.EventQuery{SandboxID: sb.ID}, func(ev client.Event) error { evs <- ev; return nil })
	}()
	if ev := <-evs; ev.Type != "sandbox.created" {
		t.Fatalf("first event %+v", ev)
	}
	if _, err := c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "import time\ntime.sleep(2)", Timeout: 500 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	close(evs)
	var types []string
	var finished client.Event
	for ev := range evs {
		types = append(types, ev.Type)
		if ev.Type == "execution.finished" {
			finished = ev
		}
	}
	if strings.Join(types, " ") != "execution.started execution.finished resource_exceeded sandbox.stopped" {
		t.Fatalf("stream %v", types)
	}
	if finished.Details["status"] != "timeout" || finished.Details["cpu_time_ms"] == nil {
		t.Fatalf("execution.finished %+v", finished)
	}
	// Resumed after the first event, the stream gives the rest once.
	first, err := c.ListEvents(ctx, client.EventQuery{SandboxID: sb.ID, Limit: 1})
	if err != nil || len(first.Events) != 1 {
		t.Fatalf("first page %+v, %v", first, err)
	}
	var resumed []string
	if err := c.StreamEvents(ctx, client.EventQuery{SandboxID: sb.ID, Cursor: first.NextCursor}, func(ev client.Event) error {
		resumed = append(resumed, ev.Type)
		return nil
	}); err != nil || strings.Join(resumed, " ") != strings.Join(types, " ") {
		t.Fatalf("resumed %v, %v", resumed, err)
	}

	for d := range got {
		if !strings.Contains(string(d.body), sb.ID) {
			continue // another test's sandbox
		}
		if err := client.VerifyWebhook(hook.Secret, d.ts, d.sig, d.body, 0); err != nil {
			t.Fatalf("delivery %s: %v", d.body, err)
		}
		break
	}
}
