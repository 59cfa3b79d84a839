package sandbox_test

import (
	"context"
	"errors"
	"net"
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

// poolConfig is a pool of n over the fake runtime. The host's python has
// no pandas: members preload a standard module the driver itself does not
// import.
func poolConfig(n int) sandbox.Config {
	return sandbox.Config{PoolSize: n, PoolPreload: []string{"fractions"}}
}

// waitReady waits until the pool holds n ready members.
func waitReady(t *testing.T, m *sandbox.Manager, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for m.PoolStats().Ready != n {
		if time.Now().After(deadline) {
			t.Fatalf("pool never had %d ready members: %+v", n, m.PoolStats())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func runtimeIDs(t *testing.T, rt *fake.Runtime) []string {
	t.Helper()
	ids, err := rt.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	return ids
}

// probe is Python that shows what a user would see of a warm start: the
// preloaded module, the names bound in the namespace, and (raising) the
// cell number in the traceback.
const probe = "'fractions' in __import__('sys').modules, sorted(k for k in globals() if not k.startswith('__'))"

func TestPoolHitLooksFresh(t *testing.T) {
	t.Parallel()
	m, _ := fakeEngine(t, poolConfig(1))
	waitReady(t, m, 1)
	// The member was started before now: a handed-out sandbox must say it
	// was created at its hand-out, not then.
	ctx := context.Background()
	before := time.Now()
	s, err := m.Create(ctx, sandbox.CreateOptions{Timeout: time.Minute, Metadata: map[string]string{"ticket": "7"}})
	if err != nil {
		t.Fatal(err)
	}
	if !s.FromPool() {
		t.Fatal("a create with default options missed a full pool")
	}
	if st := m.PoolStats(); st.Hits != 1 || st.Misses != 0 {
		t.Fatalf("stats after a hit: %+v", st)
	}
	info := s.Info()
	if info.State != sandbox.StateRunning || info.Metadata["ticket"] != "7" || info.Created.Before(before) {
		t.Fatalf("handed-out sandbox: %+v", info)
	}
	if left := info.Deadline.Sub(before); left < time.Minute {
		t.Fatalf("the lifetime started before the hand-out: %s left of 1m", left)
	}
	ex, err := s.Execute(ctx, sandbox.ExecuteRequest{Code: probe}, nil)
	if err != nil || len(ex.Results) != 1 || ex.Results[0].Text != "(True, [])" {
		t.Fatalf("pooled sandbox: %v %+v", err, ex)
	}
	ex, err = s.Execute(ctx, sandbox.ExecuteRequest{Code: "raise ValueError"}, nil)
	if err != nil || ex.Error == nil || !strings.Contains(ex.Error.Traceback, "<cell-2>") {
		t.Fatalf("the user's second execution is not cell 2: %v %+v", err, ex.Error)
	}

	// The control: a sandbox that missed the pool has not imported the
	// module, so the probe tells a preloaded kernel from a plain one.
	miss, err := m.Create(ctx, sandbox.CreateOptions{Env: map[string]string{"A": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	ex, err = miss.Execute(ctx, sandbox.ExecuteRequest{Code: probe}, nil)
	if err != nil || len(ex.Results) != 1 || ex.Results[0].Text != "(False, [])" {
		t.Fatalf("fresh sandbox: %v %+v", err, ex)
	}
}

func TestPoolMisses(t *testing.T) {
	t.Parallel()
	m, _ := fakeEngine(t, poolConfig(1))
	waitReady(t, m, 1)
	ctx := context.Background()
	tests := []struct {
		name string
		opt  sandbox.CreateOptions
	}{
		{"env", sandbox.CreateOptions{Env: map[string]string{"TOKEN": "x"}}},
		{"limits", sandbox.CreateOptions{Limits: runtime.Limits{MemoryBytes: 256 << 20}}},
		{"read-only", sandbox.CreateOptions{ReadOnly: true}},
	}
	for i, tt := range tests {
		s, err := m.Create(ctx, tt.opt)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if s.FromPool() {
			t.Errorf("%s: a sandbox started without %s was handed out", tt.name, tt.name)
		}
		if st := m.PoolStats(); st.Misses != uint64(i+1) || st.Hits != 0 || st.Ready != 1 {
			t.Errorf("%s: stats %+v", tt.name, st)
		}
		if tt.opt.Env != nil {
			ex, err := s.Execute(ctx, sandbox.ExecuteRequest{Code: "import os; os.environ['TOKEN']"}, nil)
			if err != nil || len(ex.Results) != 1 || ex.Results[0].Text != "'x'" {
				t.Errorf("env of a missed create: %v %+v", err, ex)
			}
		}
	}
}

func TestPoolRefillsAndNeverReuses(t *testing.T) {
	t.Parallel()
	m, rt := fakeEngine(t, poolConfig(1))
	ctx := context.Background()
	seen := map[string]bool{}
	for i := 0; i < 3; i++ {
		waitReady(t, m, 1)
		s, err := m.Create(ctx, sandbox.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !s.FromPool() || seen[s.ID] {
			t.Fatalf("create %d: pooled %v, reused %v", i, s.FromPool(), seen[s.ID])
		}
		seen[s.ID] = true
		if _, err := s.Execute(ctx, sandbox.ExecuteRequest{Code: "x = 1"}, nil); err != nil {
			t.Fatal(err)
		}
		if err := m.Kill(ctx, s.ID); err != nil {
			t.Fatal(err)
		}
		if slices.Contains(runtimeIDs(t, rt), s.ID) {
			t.Fatalf("killed sandbox %s is still in the runtime", s.ID)
		}
	}
	waitReady(t, m, 1)
	if st := m.PoolStats(); st.Hits != 3 || st.Misses != 0 || st.Size != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestPoolCloseDestroysMembers(t *testing.T) {
	t.Parallel()
	m, rt := fakeEngine(t, poolConfig(2))
	waitReady(t, m, 2)
	if ids := runtimeIDs(t, rt); len(ids) != 2 {
		t.Fatalf("runtime holds %v, want the 2 members", ids)
	}
	if err := m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ids := runtimeIDs(t, rt); len(ids) != 0 {
		t.Fatalf("members left after Close: %v", ids)
	}
	if st := m.PoolStats(); st.Ready != 0 {
		t.Fatalf("stats after Close: %+v", st)
	}
	_, err := m.Create(context.Background(), sandbox.CreateOptions{})
	wantCode(t, err, apierr.Capacity)
}

func TestPoolMembersAreNotIdleNorListed(t *testing.T) {
	t.Parallel()
	m, rt := fakeEngine(t, sandbox.Config{PoolSize: 1, PoolPreload: []string{"fractions"}, IdleTimeout: 200 * time.Millisecond})
	waitReady(t, m, 1)
	member := runtimeIDs(t, rt)
	if len(member) != 1 || len(m.List()) != 0 {
		t.Fatalf("runtime %v, listed %+v", member, m.List())
	}
	_, err := m.Get(member[0])
	wantCode(t, err, apierr.SandboxNotFound)
	// A listed sandbox made at the same time (a pool miss: it has its own
	// env) idles out: the idle stop has run past the limit since.
	listed, err := m.Create(context.Background(), sandbox.CreateOptions{Env: map[string]string{"MISS": "1"}})
	if err != nil || listed.FromPool() {
		t.Fatalf("a pool miss: %v", err)
	}
	waitFor(t, "the listed sandbox to idle out", func() bool { return listed.State() == sandbox.StateStopped })
	if got := runtimeIDs(t, rt); !slices.Equal(got, member) {
		t.Fatalf("the idle stop reaped a pool member: runtime %v, had %v", got, member)
	}
	s, err := m.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s.ID != member[0] {
		t.Fatalf("handed out %s, not the waiting member %s", s.ID, member[0])
	}
	// Handed out, it is the user's sandbox, and idles out like any other.
	deadline := time.Now().Add(5 * time.Second)
	for s.State() != sandbox.StateStopped {
		if time.Now().After(deadline) {
			t.Fatalf("a handed-out sandbox was not stopped when idle: %+v", s.Info())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestPoolDoesNotCountAgainstMaxSandboxes(t *testing.T) {
	t.Parallel()
	m, _ := fakeEngine(t, sandbox.Config{PoolSize: 1, PoolPreload: []string{"fractions"}, MaxSandboxes: 1})
	waitReady(t, m, 1)
	s, err := m.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil || !s.FromPool() {
		t.Fatalf("first create with a full pool and one free slot: %v", err)
	}
	waitReady(t, m, 1)
	_, err = m.Create(context.Background(), sandbox.CreateOptions{})
	wantCode(t, err, apierr.Capacity)
	// The refused create left the waiting member in the pool.
	if st := m.PoolStats(); st.Ready != 1 || st.Hits != 1 {
		t.Fatalf("stats after a refused create: %+v", st)
	}
}

func TestPoolSizeZeroIsOff(t *testing.T) {
	t.Parallel()
	m, rt := fakeEngine(t, sandbox.Config{})
	s, err := m.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A pool would have started its member at New, before this create.
	if ids := runtimeIDs(t, rt); len(ids) != 1 || ids[0] != s.ID {
		t.Fatalf("a pool of 0 started sandboxes: %v", ids)
	}
	if s.FromPool() {
		t.Fatal("a sandbox was handed out by a pool of 0")
	}
	if st := m.PoolStats(); st != (sandbox.PoolStats{}) {
		t.Fatalf("stats without a pool: %+v", st)
	}
}

// TestPoolRefillWaitsForQuiet checks that a pool with members left does
// not start a new one right after a hand-out (its imports would compete
// with the new sandbox's first requests), but does soon after.
func TestPoolRefillWaitsForQuiet(t *testing.T) {
	t.Parallel()
	m, rt := fakeEngine(t, poolConfig(2))
	waitReady(t, m, 2)
	members := map[string]bool{}
	for _, id := range runtimeIDs(t, rt) {
		members[id] = true
	}
	took := time.Now()
	s, err := m.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !s.FromPool() {
		t.Fatal("the create missed the pool")
	}
	waitReady(t, m, 2)
	held, err := rt.Inventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	refilled := false
	for _, h := range held {
		if members[h.ID] || !h.Pool {
			continue
		}
		refilled = true
		if d := h.Created.Sub(took); d < sandbox.RefillQuiet {
			t.Fatalf("the pool refilled %v after a hand-out, within the quiet time of %v", d, sandbox.RefillQuiet)
		}
	}
	if !refilled {
		t.Fatalf("no new member after the hand-out: %+v", held)
	}
}

// TestThreadEnv checks that numerical libraries' thread pools are sized to
// the CPU limit, the caller's own setting wins, and a pooled sandbox gets
// what a fresh one gets.
func TestThreadEnv(t *testing.T) {
	t.Parallel()
	m, _ := fakeEngine(t, poolConfig(1))
	waitReady(t, m, 1)
	ctx := context.Background()
	const code = "import os; os.environ.get('OPENBLAS_NUM_THREADS'), os.environ.get('OMP_NUM_THREADS')"
	tests := []struct {
		name   string
		opt    sandbox.CreateOptions
		pooled bool
		want   string
	}{
		{"pooled", sandbox.CreateOptions{}, true, "('1', '1')"},
		{"1.5 CPUs", sandbox.CreateOptions{Limits: runtime.Limits{CPUs: 1.5}}, false, "('2', '2')"},
		{"caller's own", sandbox.CreateOptions{Env: map[string]string{"OPENBLAS_NUM_THREADS": "4"}}, false, "('4', '1')"},
	}
	for _, tt := range tests {
		s, err := m.Create(ctx, tt.opt)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if s.FromPool() != tt.pooled {
			t.Fatalf("%s: pooled %v", tt.name, s.FromPool())
		}
		ex, err := s.Execute(ctx, sandbox.ExecuteRequest{Code: code}, nil)
		if err != nil || len(ex.Results) != 1 || ex.Results[0].Text != tt.want {
			t.Errorf("%s: %v %+v, want %s", tt.name, err, ex, tt.want)
		}
	}
}

// placedRuntime is the fake runtime as a runtime.Placer: its nodes can
// change, and a create on a node in broken fails.
type placedRuntime struct {
	*fake.Runtime
	mu     sync.Mutex
	nodes  []string
	broken string
	placed map[string]string // sandbox id → Spec.Node
	tries  map[string]int    // node → creates asked of it
}

func (r *placedRuntime) Nodes(context.Context) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.nodes), nil
}

func (r *placedRuntime) setNodes(nodes ...string) {
	r.mu.Lock()
	r.nodes = nodes
	r.mu.Unlock()
}

func (r *placedRuntime) Create(ctx context.Context, s runtime.Spec) (*runtime.Instance, error) {
	r.mu.Lock()
	r.tries[s.Node]++
	broken := s.Node == r.broken
	r.mu.Unlock()
	if broken {
		return nil, errors.New("node " + s.Node + " does not start pods")
	}
	inst, err := r.Runtime.Create(ctx, s)
	if err != nil {
		return nil, err
	}
	inst.Node = s.Node
	r.mu.Lock()
	r.placed[s.ID] = s.Node
	r.mu.Unlock()
	return inst, nil
}

func (r *placedRuntime) node(id string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.placed[id]
}

// membersOn counts the runtime's sandboxes on each node.
func (r *placedRuntime) membersOn(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, id := range runtimeIDs(t, r.Runtime) {
		out[r.node(id)]++
	}
	return out
}

// TestPoolPerNode: over a runtime with nodes the pool keeps its size on
// each node, hands out the member on the node running the fewest
// sandboxes, destroys the members of a node that leaves, fills one that
// joins, and passes over a node where members fail to start.
func TestPoolPerNode(t *testing.T) {
	t.Parallel()
	rt := &placedRuntime{Runtime: &fake.Runtime{AgentBin: testutil.AgentBin(t), Dir: testutil.ShortTempDir(t)},
		nodes: []string{"a", "b", "c"}, broken: "c", placed: map[string]string{}, tries: map[string]int{}}
	cfg := poolConfig(1)
	cfg.Runtime = rt
	cfg.Templates = sandbox.TemplatesFunc(func(string) (string, error) { return "/", nil })
	m := startEngine(t, cfg, rt.Runtime)
	waitReady(t, m, 2)
	if got := rt.membersOn(t); got["a"] != 1 || got["b"] != 1 || len(got) != 2 {
		t.Fatalf("members on nodes %v, want one on a and one on b", got)
	}
	if st := m.PoolStats(); st.Nodes != 3 || st.Size != 1 {
		t.Fatalf("stats %+v", st)
	}

	// Two creates: each a hit, on different nodes.
	ctx := context.Background()
	var nodes []string
	for range 2 {
		s, err := m.Create(ctx, sandbox.CreateOptions{Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if !s.FromPool() {
			t.Fatal("a create missed the pool")
		}
		nodes = append(nodes, rt.node(s.ID))
	}
	if slices.Sort(nodes); !slices.Equal(nodes, []string{"a", "b"}) {
		t.Fatalf("handed out on nodes %v, want one on each", nodes)
	}

	// Node b leaves: its member (refilled meanwhile or not) goes, and no
	// new one is started there; node d joins and gets one.
	waitReady(t, m, 2)
	rt.setNodes("a", "c", "d")
	waitReady(t, m, 2)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := rt.membersOn(t)
		// the two handed out are on a and b
		if got["a"] == 2 && got["b"] == 1 && got["d"] == 1 && len(got) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandboxes on nodes %v, want a: 2 (one handed out), b: 1 (handed out), d: 1", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
	rt.mu.Lock()
	tries := rt.tries["c"]
	rt.mu.Unlock()
	if tries != 1 {
		t.Fatalf("%d creates on the broken node c, want 1 (then its cooldown)", tries)
	}
}

// diesAfterCreate plays an engine killed between the runtime's Create
// and the agent's first ping: the sandbox runs, the engine is told
// nothing was made, and nobody destroys it (a replica killed while a
// warm pool member's Pod started). noLifetime drops Spec.Lifetime, the
// runtime as it was before it had one: the control.
type diesAfterCreate struct {
	*fake.Runtime
	noLifetime bool
	mu         sync.Mutex
	lost       []string
}

func (r *diesAfterCreate) Create(ctx context.Context, s runtime.Spec) (*runtime.Instance, error) {
	if r.noLifetime {
		s.Lifetime = 0
	}
	if _, err := r.Runtime.Create(ctx, s); err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.lost = append(r.lost, s.ID)
	r.mu.Unlock()
	return nil, errors.New("the engine died")
}

// Destroy destroys nothing: the engine that would have is dead.
func (r *diesAfterCreate) Destroy(context.Context, string) error { return nil }

func (r *diesAfterCreate) lostOne(t *testing.T) string {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.lost) != 1 {
		t.Fatalf("%d sandboxes lost, want 1", len(r.lost))
	}
	return r.lost[0]
}

// agentListens reports whether sandbox id's agent still accepts connections.
func agentListens(rt *fake.Runtime, id string) bool {
	inst, err := rt.Attach(context.Background(), id)
	if err != nil {
		return false
	}
	c, err := net.Dial("unix", inst.Socket)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// TestSandboxEndsWithoutItsEngine: every sandbox's agent starts with the
// lifetime its first ping would give it (runtime.Spec.Lifetime): a warm
// pool member its lease, a created sandbox its timeout, each plus the
// grace. One whose engine died between the runtime's Create and that
// ping ends at that lifetime all the same; the control, whose agent was
// not given it (as before), runs on with no deadline. (The Kubernetes
// e2e test's TestSandboxesAsPods left such a warm pool member's Pod,
// Running with no deadline, when replica A was killed while it started;
// the collectors spare live warm members, which end themselves.)
func TestSandboxEndsWithoutItsEngine(t *testing.T) {
	t.Parallel()
	m, rt := fakeEngine(t, poolConfig(1))
	waitReady(t, m, 1)
	member := runtimeIDs(t, rt)[0]
	if got := rt.Spec(member).Lifetime; got != sandbox.PoolLease+sandbox.LifetimeGrace {
		t.Errorf("a warm pool member's agent starts with a lifetime of %v, want its lease %v", got, sandbox.PoolLease+sandbox.LifetimeGrace)
	}
	// Environment variables: a miss, made now.
	s, err := m.Create(context.Background(), sandbox.CreateOptions{Timeout: time.Minute, Env: map[string]string{"A": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := rt.Spec(s.ID).Lifetime; got != time.Minute+sandbox.LifetimeGrace {
		t.Errorf("a created sandbox's agent starts with a lifetime of %v, want its timeout %v", got, time.Minute+sandbox.LifetimeGrace)
	}

	engine := func(noLifetime bool) (*diesAfterCreate, string) {
		rt := &fake.Runtime{AgentBin: testutil.AgentBin(t), Dir: testutil.ShortTempDir(t)}
		dies := &diesAfterCreate{Runtime: rt, noLifetime: noLifetime}
		cfg := sandbox.Config{Runtime: dies, Templates: sandbox.TemplatesFunc(func(string) (string, error) { return "/", nil })}
		m := startEngine(t, cfg, rt)
		if _, err := m.Create(context.Background(), sandbox.CreateOptions{Timeout: time.Second}); err == nil {
			t.Fatal("a create whose engine died succeeded")
		}
		id := dies.lostOne(t)
		t.Cleanup(func() { rt.Destroy(context.Background(), id) })
		return dies, id
	}
	control, controlID := engine(true)
	dies, id := engine(false)
	start := time.Now()
	for agentListens(dies.Runtime, id) {
		if time.Since(start) > 20*time.Second {
			t.Fatal("a sandbox whose engine died before its first ping still runs 20 s later")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !agentListens(control.Runtime, controlID) {
		t.Fatal("the control, whose agent had no lifetime, ended too: the test proves nothing")
	}
}
