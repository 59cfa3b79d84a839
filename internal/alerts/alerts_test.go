package alerts_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/alerts"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/store"
)

// kept is a Store of alerts by dedupe key, which says when one is stored.
type kept struct {
	mu     sync.Mutex
	byKey  map[string]store.Alert
	stored chan store.Alert
}

func (k *kept) CreateAlert(_ context.Context, a store.Alert) (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, dup := k.byKey[a.DedupeKey]; dup && a.DedupeKey != "" {
		return false, nil
	}
	k.byKey[a.DedupeKey] = a
	k.stored <- a
	return true, nil
}

// ids numbers alerts.
func ids() func() string {
	var mu sync.Mutex
	n := 0
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		n++
		return fmt.Sprintf("alert_%d", n)
	}
}

// noAccounts are no loaded accounts, under a configuration.
type noAccounts struct{ cfg account.Config }

func (noAccounts) Each(func(*account.Account)) {}
func (n noAccounts) Config() account.Config    { return n.cfg }

func TestRaiseOncePerKey(t *testing.T) {
	t.Parallel()
	st := &kept{byKey: map[string]store.Alert{}, stored: make(chan store.Alert, 4)}
	var emitted []events.Event
	al := alerts.New(alerts.Config{Store: st, Accounts: noAccounts{}, Emit: func(e events.Event) { emitted = append(emitted, e) }})
	a := store.Alert{ID: "alert_1", Account: "acct", Severity: "high", Kind: "quota", Message: "m", DedupeKey: "k"}
	for i, want := range []bool{true, false} {
		if ok, err := al.Raise(context.Background(), a); ok != want || err != nil {
			t.Fatalf("raise %d: %v %v, want %v", i, ok, err, want)
		}
	}
	if len(emitted) != 1 || emitted[0].Type != events.AlertCreated || emitted[0].Owner != "acct" || emitted[0].Details["alert_id"] != a.ID {
		t.Fatalf("events %+v", emitted)
	}
	if !alerts.Severity("critical") || alerts.Severity("urgent") || alerts.Severity("") {
		t.Fatal("Severity")
	}
}

func TestSecurityAlerts(t *testing.T) {
	t.Parallel()
	st := &kept{byKey: map[string]store.Alert{}, stored: make(chan store.Alert, 8)}
	al := alerts.New(alerts.Config{Store: st, Accounts: noAccounts{account.Config{SecurityAlertSeverity: "high"}}, NewID: ids()})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { al.Run(stop); close(done) }()
	defer func() { close(stop); <-done }()

	violation := func(id int64, kind string) events.Event {
		return events.Event{ID: id, Type: events.SecurityViolation, Owner: "acct", SandboxID: "sbx",
			Details: map[string]any{"kind": kind, "target": "t"}}
	}
	al.OnEvent(violation(1, events.KindModuleBlocked))                             // medium: under the threshold
	al.OnEvent(events.Event{ID: 2, Type: events.ExecutionFinished, Owner: "acct"}) // not a violation
	al.OnEvent(violation(3, events.KindSubprocessDenied))                          // high
	al.OnEvent(violation(4, "something new"))                                      // unknown kinds are high
	for _, want := range []string{"event:3", "event:4"} {
		a := <-st.stored
		if a.DedupeKey != want || a.Severity != "high" || a.Kind != "security_violation" || a.SandboxID != "sbx" {
			t.Fatalf("stored %+v, want %s", a, want)
		}
	}
	select {
	case a := <-st.stored:
		t.Fatalf("also stored %+v", a)
	default:
	}
}
