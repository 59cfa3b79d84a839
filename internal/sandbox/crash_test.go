package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/runtime/fake"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// stubborn is the fake runtime with destroys that fail or hang, and
// creates that can be held, as a crashed or overloaded host does.
type stubborn struct {
	*fake.Runtime

	// mu guards the fields below.
	mu       sync.Mutex
	failures map[string]int           // destroys of an id that fail before one succeeds
	hang     map[string]chan struct{} // destroys of an id wait until the channel is closed
	hold     chan struct{}            // when set, Create waits for it to close, ignoring ctx
	entered  chan struct{}            // receives when a held Create has begun
}

var errStubborn = errors.New("device or resource busy")

func (r *stubborn) Destroy(ctx context.Context, id string) error {
	r.mu.Lock()
	hang := r.hang[id]
	fail := r.failures[id] > 0
	if fail {
		r.failures[id]--
	}
	r.mu.Unlock()
	if hang != nil {
		<-hang
	}
	if fail {
		return errStubborn
	}
	return r.Runtime.Destroy(ctx, id)
}

func (r *stubborn) Create(ctx context.Context, s runtime.Spec) (*runtime.Instance, error) {
	r.mu.Lock()
	hold, entered := r.hold, r.entered
	r.mu.Unlock()
	if hold != nil {
		entered <- struct{}{}
		<-hold // like runc, which finishes what it began
	}
	return r.Runtime.Create(ctx, s)
}

func newStubborn(t *testing.T) *stubborn {
	return &stubborn{
		Runtime:  &fake.Runtime{AgentBin: testutil.AgentBin(t), Dir: testutil.ShortTempDir(t)},
		failures: map[string]int{}, hang: map[string]chan struct{}{},
	}
}

func stubbornEngine(t *testing.T, rt *stubborn, cfg sandbox.Config) *sandbox.Manager {
	t.Helper()
	cfg.Runtime = rt
	cfg.Templates = sandbox.TemplatesFunc(func(string) (string, error) { return "/", nil })
	if cfg.RetryInterval == 0 {
		cfg.RetryInterval = 20 * time.Millisecond
	}
	m, err := sandbox.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New must not fail on leftovers: %v", err)
	}
	t.Cleanup(func() { m.Close(context.Background()) })
	return m
}

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func ids(t *testing.T, rt runtime.Runtime) []string {
	t.Helper()
	l, err := rt.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(l)
	return l
}

// TestStartDoesNotWaitForStubbornLeftovers: leftovers of a crash that
// cannot be destroyed at once (one fails twice, one hangs) neither fail
// New nor hold it up past a few seconds; they are reported by Leftovers
// and destroyed in the background.
func TestStartDoesNotWaitForStubbornLeftovers(t *testing.T) {
	t.Parallel()
	rt := newStubborn(t)
	for _, id := range []string{"failing", "hanging", "plain"} {
		if _, err := rt.Runtime.Create(context.Background(), runtime.Spec{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	rt.failures["failing"] = 2
	release := make(chan struct{})
	rt.hang["hanging"] = release

	start := time.Now()
	m := stubbornEngine(t, rt, sandbox.Config{})
	if took := time.Since(start); took > 8*time.Second {
		t.Fatalf("New took %s", took)
	}
	if got := m.Leftovers(); !slices.Contains(got, "hanging") {
		t.Fatalf("Leftovers = %v, want the hanging one reported", got)
	}
	// The engine serves meanwhile.
	s, err := m.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Execute(context.Background(), sandbox.ExecuteRequest{Language: "bash", Code: "true"}, nil); err != nil {
		t.Fatal(err)
	}
	close(release)
	waitFor(t, "every leftover destroyed", func() bool {
		return len(m.Leftovers()) == 0 && slices.Equal(ids(t, rt), []string{s.ID})
	})
}

// TestFailedDestroyIsRetried: a destroy that fails while the engine runs
// is retried in the background until the sandbox is gone, not forgotten.
func TestFailedDestroyIsRetried(t *testing.T) {
	t.Parallel()
	rt := newStubborn(t)
	m := stubbornEngine(t, rt, sandbox.Config{})
	s, err := m.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rt.mu.Lock()
	rt.failures[s.ID] = 3
	rt.mu.Unlock()
	if err := m.Kill(context.Background(), s.ID); err == nil {
		t.Fatal("Kill hid a failed destroy")
	}
	if s.State() != sandbox.StateStopped || s.Info().StopReason != "killed" {
		t.Fatalf("after a failed destroy: %+v", s.Info())
	}
	if got := m.Leftovers(); !slices.Equal(got, []string{s.ID}) {
		t.Fatalf("Leftovers = %v", got)
	}
	waitFor(t, "the retried destroy", func() bool { return len(m.Leftovers()) == 0 && len(ids(t, rt)) == 0 })
}

// TestCreateRacingCloseLeavesNothing: Close while the runtime is still
// creating a sandbox (and finishes regardless, as runc does) fails that
// create and leaves nothing running.
func TestCreateRacingCloseLeavesNothing(t *testing.T) {
	t.Parallel()
	rt := newStubborn(t)
	m, err := sandbox.New(context.Background(), sandbox.Config{Runtime: rt,
		Templates: sandbox.TemplatesFunc(func(string) (string, error) { return "/", nil })})
	if err != nil {
		t.Fatal(err)
	}
	hold := make(chan struct{})
	rt.hold, rt.entered = hold, make(chan struct{}, 1)
	created := make(chan error, 1)
	go func() {
		_, err := m.Create(context.Background(), sandbox.CreateOptions{})
		created <- err
	}()
	<-rt.entered
	closed := make(chan error, 1)
	go func() { closed <- m.Close(context.Background()) }()
	waitFor(t, "Close to stop the starting sandbox", func() bool {
		l := m.List()
		return len(l) == 0 || l[0].State != sandbox.StateStarting
	})
	close(hold)
	if err := <-created; err == nil {
		t.Fatal("a create finished by a closed engine succeeded")
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if left := ids(t, rt); len(left) != 0 {
		t.Fatalf("sandboxes left running after Close: %v", left)
	}
}

// TestLifetimeEndMidExecution: when the lifetime ends during an
// execution, the caller's error and the sandbox's stop reason agree.
func TestLifetimeEndMidExecution(t *testing.T) {
	t.Parallel()
	m, _ := fakeEngine(t, sandbox.Config{})
	s, err := m.Create(context.Background(), sandbox.CreateOptions{Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Execute(context.Background(), sandbox.ExecuteRequest{Language: "bash", Code: "sleep 20"}, nil)
	wantCode(t, err, apierr.SandboxTimeout)
	if r := s.Info().StopReason; r != "timed out" {
		t.Fatalf("stop reason %q", r)
	}
}

// TestSetTimeoutMovesTheAgentsDeadline: the agent is told the new
// lifetime, so an extension outlives the first deadline, and a sandbox
// whose agent ends it at its deadline is recorded as timed out.
func TestSetTimeoutMovesTheAgentsDeadline(t *testing.T) {
	t.Parallel()
	m, _ := fakeEngine(t, sandbox.Config{})
	ctx := context.Background()
	s, err := m.Create(ctx, sandbox.CreateOptions{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	first := s.Info().Deadline
	if err := s.SetTimeout(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	// Past the first lifetime and the agent's grace (2 s), the agent
	// still answers: it kept the extension. Waiting out that time is
	// what is tested.
	time.Sleep(time.Until(first.Add(2*time.Second + 500*time.Millisecond)))
	if _, err := s.Execute(ctx, sandbox.ExecuteRequest{Language: "bash", Code: "true"}, nil); err != nil {
		t.Fatalf("after the first deadline: %v", err)
	}
}

// fullRuntime is a runtime whose host has no room left.
type fullRuntime struct{ *fake.Runtime }

func (fullRuntime) Create(context.Context, runtime.Spec) (*runtime.Instance, error) {
	return nil, fmt.Errorf("%w: every id range is in use", runtime.ErrCapacity)
}

// TestFullHostIsCapacity: a runtime out of a per-host resource answers
// ERR_CAPACITY (503, retry later), not ERR_INTERNAL, and leaves nothing.
func TestFullHostIsCapacity(t *testing.T) {
	t.Parallel()
	rt := &fake.Runtime{AgentBin: testutil.AgentBin(t), Dir: testutil.ShortTempDir(t)}
	m, err := sandbox.New(context.Background(), sandbox.Config{Runtime: fullRuntime{rt},
		Templates: sandbox.TemplatesFunc(func(string) (string, error) { return "/", nil })})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	_, err = m.Create(context.Background(), sandbox.CreateOptions{})
	wantCode(t, err, apierr.Capacity)
	if l := m.List(); len(l) != 0 {
		t.Fatalf("a refused create is listed: %+v", l)
	}
}

// unableRuntime cannot do what the create asks (as the Kubernetes
// runtime refuses a network).
type unableRuntime struct{ *fake.Runtime }

func (unableRuntime) Create(context.Context, runtime.Spec) (*runtime.Instance, error) {
	return nil, fmt.Errorf("%w: network egress is not available for Pods yet", runtime.ErrUnsupported)
}

// TestUnsupportedIsBadRequest: what the runtime cannot do is the caller's
// to change (ERR_BAD_REQUEST naming it), not ERR_INTERNAL.
func TestUnsupportedIsBadRequest(t *testing.T) {
	t.Parallel()
	rt := &fake.Runtime{AgentBin: testutil.AgentBin(t), Dir: testutil.ShortTempDir(t)}
	m, err := sandbox.New(context.Background(), sandbox.Config{Runtime: unableRuntime{rt},
		Templates: sandbox.TemplatesFunc(func(string) (string, error) { return "/", nil })})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	_, err = m.Create(context.Background(), sandbox.CreateOptions{})
	wantCode(t, err, apierr.BadRequest)
	if !strings.Contains(err.Error(), "not available for Pods") {
		t.Fatalf("the message does not say what: %v", err)
	}
	if l := m.List(); len(l) != 0 {
		t.Fatalf("a refused create is listed: %+v", l)
	}
}
