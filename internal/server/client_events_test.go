package server_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/server"
)

// TestGoSDKEvents drives the Go SDK's events and webhooks calls.
func TestGoSDKEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{WebhookAllowCIDRs: []string{"127.0.0.0/8"}}) // the receiver is on loopback
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := client.New(e.url, e.keyA)

	type delivery struct {
		body      []byte
		ts, sig   string
		eventType string
	}
	got := make(chan delivery, 10)
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- delivery{b, r.Header.Get("Sheepfold-Timestamp"), r.Header.Get("Sheepfold-Signature"), r.Header.Get("Sheepfold-Event-Type")}
	}))
	defer rc.Close()
	hook, err := c.CreateWebhook(ctx, rc.URL, "sandbox.created")
	if err != nil || hook.Secret == "" || len(hook.Types) != 1 {
		t.Fatalf("CreateWebhook = %+v, %v", hook, err)
	}

	// The account stream, live.
	live := make(chan client.Event, 20)
	sctx, stop := context.WithCancel(ctx)
	streamErr := make(chan error, 1)
	go func() {
		streamErr <- c.StreamEvents(sctx, client.EventQuery{}, func(ev client.Event) error { live <- ev; return nil })
	}()
	// The stream is subscribed once its first event can arrive: create
	// sandboxes until one is seen (the first may come before it listens).
	var sb *client.Sandbox
	for sb == nil {
		s, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case ev := <-live:
			if ev.Type != "sandbox.created" || ev.SandboxID != s.ID {
				t.Fatalf("live event %+v", ev)
			}
			sb = s
		case <-time.After(2 * time.Second):
		}
	}
	if _, err := c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "1+1"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"execution.started", "execution.finished", "sandbox.stopped"} {
		if ev := <-live; ev.Type != want || ev.SandboxID != sb.ID {
			t.Fatalf("live %+v, want %s", ev, want)
		}
	}
	stop()
	if err := <-streamErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("StreamEvents ended with %v", err)
	}

	// The sandbox's stream replays and ends at the stop.
	var types []string
	if err := c.StreamEvents(ctx, client.EventQuery{SandboxID: sb.ID}, func(ev client.Event) error {
		types = append(types, ev.Type)
		return nil
	}); err != nil || len(types) != 4 || types[3] != "sandbox.stopped" {
		t.Fatalf("sandbox stream %v, %v", types, err)
	}
	// Listing, paged.
	page, err := c.ListEvents(ctx, client.EventQuery{SandboxID: sb.ID, Limit: 3})
	if err != nil || len(page.Events) != 3 || page.NextCursor == "" || page.Events[0].Type != "sandbox.created" {
		t.Fatalf("page 1 %+v, %v", page, err)
	}
	page, err = c.ListEvents(ctx, client.EventQuery{SandboxID: sb.ID, Cursor: page.NextCursor})
	if err != nil || len(page.Events) != 1 || page.NextCursor != "" || page.Events[0].Type != "sandbox.stopped" {
		t.Fatalf("page 2 %+v, %v", page, err)
	}
	page, err = c.ListEvents(ctx, client.EventQuery{Types: []string{"execution.finished"}})
	if err != nil || len(page.Events) != 1 || page.Events[0].Details["status"] != "success" {
		t.Fatalf("typed listing %+v, %v", page, err)
	}

	// The webhook got the creates, signed.
	d := <-got
	if d.eventType != "sandbox.created" || client.VerifyWebhook(hook.Secret, d.ts, d.sig, d.body, 0) != nil {
		t.Fatalf("delivery %+v does not verify", d)
	}
	if client.VerifyWebhook("wrong", d.ts, d.sig, d.body, 0) == nil || client.VerifyWebhook(hook.Secret, "1", d.sig, d.body, 0) == nil {
		t.Fatal("VerifyWebhook accepts a wrong secret or an old timestamp")
	}
	hooks, err := c.ListWebhooks(ctx)
	if err != nil || len(hooks) != 1 || hooks[0].Secret != "" {
		t.Fatalf("ListWebhooks = %+v, %v", hooks, err)
	}
	var ds []client.WebhookDelivery
	for deadline := time.Now().Add(10 * time.Second); len(ds) == 0 && time.Now().Before(deadline); {
		if ds, _, err = c.ListWebhookDeliveries(ctx, hook.ID, "", 0); err != nil {
			t.Fatal(err)
		}
	}
	if len(ds) == 0 || !ds[0].Succeeded || ds[0].Attempt != 1 || ds[0].EventType != "sandbox.created" {
		t.Fatalf("deliveries %+v", ds)
	}
	if err := c.DeleteWebhook(ctx, hook.ID); err != nil {
		t.Fatal(err)
	}
	var apiErr *client.Error
	if err := c.DeleteWebhook(ctx, hook.ID); !errors.As(err, &apiErr) || apiErr.Code != "ERR_NOT_FOUND" {
		t.Fatalf("second delete: %v", err)
	}
}
