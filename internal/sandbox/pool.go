package sandbox

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/backoff"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

// The warm pool keeps Config.PoolSize sandboxes of each template in
// Config.PoolTemplates started ahead: the runtime has created them, the
// agent answers, and the default Python context runs with
// Config.PoolPreload imported into sys.modules (and their first-use paths
// warmed) by the kernel's preload request, which binds no name in the
// user's namespace and is not counted as an execution. Manager.Create hands
// a member out when the request asks for nothing a started sandbox cannot
// take on, and a filler refills the pool in the background, one sandbox at
// a time so that refilling takes at most about one core. While members are
// left, the refill waits until no member has been taken for refillQuiet:
// starting a member costs about a CPU-second (the imports), which on a small
// machine would otherwise slow the first requests of the sandbox just
// handed out. An empty pool refills at once.
//
// A member is invisible until it is handed out: it is not in the Manager's
// table, so Get, List, Kill, the idle stop and MaxSandboxes do not see it
// (the pool's own size bounds it). At hand-out it gets the caller's
// metadata, its Created time, its deadline and its lifetime timer, and
// from then on it is an ordinary sandbox: it is never returned to the pool.
//
// A runtime whose sandboxes run on several nodes (a runtime.Placer: the
// kubernetes runtime) gets Config.PoolSize members of each template on
// every node it names, refreshed every nodeRefresh: a node that leaves the
// list (NotReady, cordoned, tainted, deleted) has its members destroyed,
// one that joins gets its own. A hand-out takes the member on the node
// running the fewest of this engine's sandboxes, so that creates spread
// and a node's loss takes as few as can be. A node where a member failed
// to start is passed over for nodeCooldown. Until the runtime first names
// its nodes (listing them may be forbidden), members are placed by the
// runtime and Config.PoolSize counts them all.
//
// What a hand-out cannot change, because it is fixed when the container
// starts, makes the request a miss: a template without a pool, limits other
// than Config.DefaultLimits, a read-only root, and any sandbox-wide
// environment variable (the agent's environment is set at container start).

// DefaultPoolPreload is what pool members import when Config.PoolPreload
// is nil.
var DefaultPoolPreload = []string{"numpy", "pandas", "matplotlib", "matplotlib.pyplot", "matplotlib.backends.backend_agg"}

// DefaultPoolSize sizes the pool to the machine: one sandbox per CPU, at
// most one per 2 GiB of memory, and at most 8. A member costs about a
// sandbox with pandas, numpy and matplotlib loaded (≈ 100 MiB).
func DefaultPoolSize() int {
	n := goruntime.NumCPU()
	if mem := HostMemory(); mem > 0 {
		n = min(n, int(mem/(2<<30)))
	}
	return max(0, min(n, 8))
}

// HostMemory reads MemTotal from /proc/meminfo in bytes (0 if unknown).
func HostMemory() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// PoolStats describes the warm pool.
type PoolStats struct {
	Size   int    `json:"size"`            // members wanted per pooled template (per node, with Nodes)
	Nodes  int    `json:"nodes,omitempty"` // nodes the members are kept on (a runtime.Placer's)
	Ready  int    `json:"ready"`           // members ready now, over all templates and nodes
	Hits   uint64 `json:"hits"`            // creates served from the pool
	Misses uint64 `json:"misses"`          // creates that started a sandbox themselves
}

// preloadTimeout bounds one member's preload (a cold pandas import takes
// about a second on an idle core).
const preloadTimeout = 2 * time.Minute

// refillQuiet is how long the refill of a pool that still has members
// waits after the last hand-out.
const refillQuiet = time.Second

// poolLease is the lifetime a member's agent is given while it waits in
// the pool, renewed every poolLease/4: a member outlives a crashed engine
// by at most this long. Its agent starts with it (runtime.Spec.Lifetime),
// before the first ping repeats it: an engine that dies while a member
// starts leaves no agent without a deadline. At hand-out the agent gets the caller's lifetime.
// A shared engine's members (Pods, which no restart of this engine
// reaps: the other replicas' collectors spare warm members) get
// sharedPoolLease, so that a crashed replica's last at most a minute.
const (
	poolLease       = 10 * time.Minute
	sharedPoolLease = time.Minute
)

// nodeRefresh is how often a Placer's nodes are listed (a variable for
// the tests), and nodeCooldown how long a node where a member failed to
// start is passed over.
var nodeRefresh = 10 * time.Second

const nodeCooldown = 30 * time.Second

// lease is the pool's member lease.
func (p *pool) lease() time.Duration {
	if p.m.cfg.Shared {
		return sharedPoolLease
	}
	return poolLease
}

type pool struct {
	m         *Manager
	size      int
	templates []string
	preload   []string

	ctx    context.Context // cancelled by close: aborts a fill in progress
	cancel context.CancelFunc
	wake   chan struct{} // a member was taken: refill
	done   chan struct{} // closed when the filler has returned

	hits, misses atomic.Uint64

	placer   runtime.Placer // nil: the runtime places members
	nodesErr string         // the last error listing the nodes, logged once

	// mu guards ready, lastTake, closed, nodes and failed.
	mu       sync.Mutex
	ready    map[string][]*Sandbox // by template, oldest first
	lastTake time.Time
	closed   bool
	nodes    []string             // the placer's nodes; nil until first listed
	failed   map[string]time.Time // node → when a member last failed to start there
}

func newPool(m *Manager) *pool {
	ctx, cancel := context.WithCancel(context.Background())
	p := &pool{
		m: m, size: m.cfg.PoolSize, templates: m.cfg.PoolTemplates, preload: m.cfg.PoolPreload,
		ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1), done: make(chan struct{}),
		ready: map[string][]*Sandbox{}, failed: map[string]time.Time{},
	}
	p.placer, _ = m.cfg.Runtime.(runtime.Placer)
	go p.fill()
	return p
}

// fill keeps every pooled template at its size, one new member at a time.
func (p *pool) fill() {
	defer close(p.done)
	renew := time.NewTicker(p.lease() / 4)
	defer renew.Stop()
	var nodes <-chan time.Time
	if p.placer != nil {
		p.refreshNodes()
		t := time.NewTicker(nodeRefresh)
		defer t.Stop()
		nodes = t.C
	}
	retry := backoff.Backoff{Base: time.Second, Max: 30 * time.Second}
	for {
		tmpl, node, wait := p.wanting()
		if tmpl == "" || wait > 0 {
			var quiet <-chan time.Time
			if wait > 0 {
				quiet = time.After(wait)
			}
			select {
			case <-p.ctx.Done():
				return
			case <-p.wake:
			case <-quiet:
			case <-renew.C:
				p.renewLeases()
			case <-nodes:
				p.refreshNodes()
			}
			continue
		}
		s, err := p.start(tmpl, node)
		if err != nil {
			if p.ctx.Err() != nil {
				return
			}
			if node != "" {
				p.mu.Lock()
				p.failed[node] = time.Now()
				p.mu.Unlock()
			}
			wait := retry.Next()
			p.m.log.Warn("warm pool: could not start a sandbox", "template", tmpl, "node", node, "err", err, "retry_in", wait)
			select {
			case <-p.ctx.Done():
				return
			case <-time.After(wait):
			}
			continue
		}
		retry.Reset()
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			p.m.destroy(s, reasonShutdown)
			return
		}
		p.ready[tmpl] = append(p.ready[tmpl], s)
		p.mu.Unlock()
	}
}

// wanting returns a template whose pool is short of members, or "", the
// node to start its next member on ("" where the runtime places it), and
// how long to wait before starting it.
func (p *pool) wanting() (tmpl, node string, wait time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	quiet := max(0, refillQuiet-time.Since(p.lastTake))
	var cooling time.Duration // the soonest a short node's cooldown ends
	for _, t := range p.templates {
		members := p.ready[t]
		if len(members) > 0 {
			wait = quiet
		} else {
			wait = 0
		}
		if p.nodes == nil {
			if len(members) < p.size {
				return t, "", wait
			}
			continue
		}
		for _, n := range p.nodes {
			if countOn(members, n) >= p.size {
				continue
			}
			if c := nodeCooldown - time.Since(p.failed[n]); c > 0 {
				if cooling == 0 || c < cooling {
					cooling = c
				}
				continue
			}
			return t, n, wait
		}
	}
	return "", "", cooling
}

// countOn counts the members on node.
func countOn(members []*Sandbox, node string) int {
	n := 0
	for _, s := range members {
		if s.node == node {
			n++
		}
	}
	return n
}

// refreshNodes lists the placer's nodes and destroys the members on
// nodes no longer listed. When listing fails the last list stands.
func (p *pool) refreshNodes() {
	ctx, cancel := context.WithTimeout(p.ctx, nodeRefresh)
	nodes, err := p.placer.Nodes(ctx)
	cancel()
	if err != nil {
		if p.ctx.Err() == nil && err.Error() != p.nodesErr {
			p.m.log.Warn("warm pool: could not list the nodes to keep members on", "err", err)
		}
		p.nodesErr = err.Error()
		return
	}
	p.nodesErr = ""
	if nodes == nil {
		nodes = []string{}
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.nodes = nodes
	var gone []*Sandbox
	for t, members := range p.ready {
		p.ready[t] = slices.DeleteFunc(members, func(s *Sandbox) bool {
			if s.node != "" && !slices.Contains(nodes, s.node) {
				gone = append(gone, s)
				return true
			}
			return false
		})
	}
	p.mu.Unlock()
	for _, s := range gone {
		p.m.log.Info("warm pool: member's node left", "sandbox", s.ID, "node", s.node)
		_ = p.m.destroy(s, reasonShutdown)
	}
}

// start creates one member, on node unless that is "": the sandbox, its
// agent, its preloaded kernel.
func (p *pool) start(tmpl, node string) (*Sandbox, error) {
	m := p.m
	rootfs, err := m.cfg.Templates.RootFS(tmpl)
	if err != nil {
		return nil, err
	}
	start, err := m.templateStart(tmpl)
	if err != nil {
		return nil, err
	}
	s := &Sandbox{ID: newID(), Template: tmpl, Limits: m.cfg.DefaultLimits, m: m, state: StateStarting, pooled: true,
		node: node, created: make(chan struct{})}
	s.project = newProject(start, rootfs, nil)
	// Logged before the runtime makes anything: a member whose engine
	// dies before it is ready is still named in some log.
	m.log.Info("warm pool: starting a member", "sandbox", s.ID, "template", tmpl, "node", node)
	inst, err := m.cfg.Runtime.Create(p.ctx, runtimeSpec(s, rootfs, p.lease()))
	close(s.created)
	if err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	s.agent, s.inst = newAgentClient(inst, m.agentCall, m.log.With("sandbox", inst.ID)), inst
	if inst.Node != "" {
		s.node = inst.Node
	}
	if err := s.waitAgent(p.ctx, m.cfg.AgentTimeout, p.lease()); err != nil {
		m.destroy(s, reasonFailed)
		return nil, fmt.Errorf("agent: %w", err)
	}
	if len(p.preload) > 0 {
		if err := s.preloadModules(p.ctx, p.preload); err != nil {
			if p.ctx.Err() != nil || errors.Is(err, errAgentGone) {
				m.destroy(s, reasonFailed)
				return nil, fmt.Errorf("preload: %w", err)
			}
			// The kernel runs; only an import failed (a template
			// without pandas, say). The member is still a fresh
			// sandbox, only a slower one.
			m.log.Warn("warm pool: preload failed", "template", tmpl, "err", err)
		}
	}
	// A template's start command runs and is ready before the member
	// joins the pool: a hit pays nothing for it.
	if err := s.runTemplateStart(p.ctx, start, m.cfg.StartTimeout); err != nil {
		m.destroy(s, reasonFailed)
		return nil, fmt.Errorf("start command: %w", err)
	}
	m.log.Debug("warm pool: sandbox ready", "sandbox", s.ID, "template", tmpl, "node", s.node)
	return s, nil
}

// runtimeSpec is what the runtime is asked to start for a pool member.
// Its agent starts with the member's lease as its lifetime, the one its
// first ping gives: a member whose engine dies before that ping (a
// replica killed while the member's Pod started) ends at the lease's end
// like any other, and the collectors, which spare live warm members,
// then take it.
func runtimeSpec(s *Sandbox, rootfs string, lease time.Duration) runtime.Spec {
	return runtime.Spec{ID: s.ID, Template: s.Template, RootFS: rootfs, Limits: s.Limits, ReadOnly: s.ReadOnly, Env: threadEnv(s.Limits, nil),
		Pool: true, Node: s.node, Lifetime: lease + lifetimeGrace}
}

// threadVars size the thread pools of numerical libraries.
var threadVars = []string{"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"}

// threadEnv sizes numerical libraries' thread pools to the sandbox's CPU
// limit (rounded up), except where the caller set the variable. OpenBLAS
// otherwise starts a worker per host CPU, and idle workers spin: under a
// one-CPU quota a matplotlib savefig took twice as long, the spinning
// worker eating half the quota. Every sandbox gets the same, pooled or not.
// It also says the sandbox's memory limit (kernel.MemoryEnv), which the
// Java kernel gives its JVM as the machine's memory: the sandbox has no
// cgroup files to read it from, and a JVM sizing its heap from the host's
// memory grew past the limit and was killed rather than collect.
func threadEnv(l runtime.Limits, user map[string]string) []string {
	var out []string
	if l.MemoryBytes > 0 {
		out = append(out, memoryEnv+"="+strconv.FormatInt(l.MemoryBytes, 10))
	}
	if l.CPUs <= 0 {
		return out
	}
	n := strconv.Itoa(int(math.Ceil(l.CPUs)))
	for _, v := range threadVars {
		if _, ok := user[v]; !ok {
			out = append(out, v+"="+n)
		}
	}
	return out
}

// memoryEnv is kernel.MemoryEnv (the engine does not import the agent's
// packages).
const memoryEnv = "SHEEPFOLD_MEMORY_BYTES"

// preloadModules starts the default Python context and imports modules
// into it without touching the user's namespace or execution count.
func (s *Sandbox) preloadModules(ctx context.Context, modules []string) error {
	ctx, cancel := context.WithTimeout(ctx, preloadTimeout)
	defer cancel()
	var execErr *agentproto.ExecError
	done, err := s.agent.call(ctx, agentproto.Request{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{
		Language: "python", Preload: modules, TimeoutMS: preloadTimeout.Milliseconds(),
	}}, nil, agentproto.Handlers{Event: func(ev agentproto.Event) error {
		if ev.Type == agentproto.EventError {
			execErr = ev.Error
		}
		return nil
	}}, callOptions{})
	if err != nil {
		return err
	}
	if done.Status != agentproto.StatusOK {
		if execErr != nil {
			return fmt.Errorf("%s: %s: %s", done.Status, execErr.Name, execErr.Value)
		}
		return fmt.Errorf("preload ended with status %s", done.Status)
	}
	return nil
}

// renewLeases renews every ready member's lease, dropping members whose
// agent no longer answers.
func (p *pool) renewLeases() {
	p.mu.Lock()
	var all []*Sandbox
	for _, members := range p.ready {
		all = append(all, members...)
	}
	p.mu.Unlock()
	dead := false
	for _, s := range all {
		if err := s.renewLease(p.ctx); err != nil && p.ctx.Err() == nil {
			p.m.log.Warn("warm pool: member lost", "sandbox", s.ID, "err", err)
			_ = p.m.destroy(s, reasonFailed)
			dead = true
		}
	}
	if dead {
		p.mu.Lock()
		for t, members := range p.ready {
			p.ready[t] = slices.DeleteFunc(members, func(s *Sandbox) bool { return s.State() != StateStarting })
		}
		p.mu.Unlock()
	}
}

// renewLease renews a member's lease unless it has been handed out.
func (s *Sandbox) renewLease(ctx context.Context) error {
	s.lifeMu.Lock()
	defer s.lifeMu.Unlock()
	if s.State() != StateStarting {
		return nil
	}
	return s.tellLifetime(ctx, s.m.pool.lease())
}

// poolable reports whether a sandbox started ahead can serve opt.
func (p *pool) poolable(tmpl string, limits runtime.Limits, opt CreateOptions) bool {
	if opt.ReadOnly || len(opt.Env) > 0 || limits != p.m.cfg.DefaultLimits {
		return false
	}
	for _, t := range p.templates {
		if t == tmpl {
			return true
		}
	}
	return false
}

// take removes a ready member of tmpl from the pool, or returns nil: the
// oldest on the node with the fewest sandboxes by load (nil: the oldest).
func (p *pool) take(tmpl string, load map[string]int) *Sandbox {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	members := slices.DeleteFunc(p.ready[tmpl], func(s *Sandbox) bool { return s.State() != StateStarting })
	best := -1
	for i, s := range members {
		if best < 0 || load[s.node] < load[members[best].node] {
			best = i
		}
	}
	if best < 0 {
		p.ready[tmpl] = members
		return nil
	}
	s := members[best]
	p.ready[tmpl] = slices.Delete(members, best, best+1)
	p.lastTake = time.Now()
	p.signal()
	return s
}

// giveBack returns a member that was taken but never shown to anyone.
func (p *pool) giveBack(s *Sandbox) {
	p.mu.Lock()
	if !p.closed {
		p.ready[s.Template] = append([]*Sandbox{s}, p.ready[s.Template]...)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	p.m.destroy(s, reasonShutdown)
}

func (p *pool) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *pool) stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := PoolStats{Size: p.size, Nodes: len(p.nodes), Hits: p.hits.Load(), Misses: p.misses.Load()}
	for _, members := range p.ready {
		st.Ready += len(members)
	}
	return st
}

// close stops the filler and destroys every member.
func (p *pool) close() error {
	p.mu.Lock()
	p.closed = true
	var all []*Sandbox
	for _, members := range p.ready {
		all = append(all, members...)
	}
	p.ready = map[string][]*Sandbox{}
	p.mu.Unlock()
	p.cancel()
	<-p.done
	var wg sync.WaitGroup
	errs := make([]error, len(all))
	for i, s := range all {
		wg.Go(func() { errs[i] = p.m.destroy(s, reasonShutdown) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// fromPool hands out a pooled sandbox for opt, or reports a miss (ok
// false). limits are opt's limits with the defaults filled in.
func (m *Manager) fromPool(ctx context.Context, opt CreateOptions, limits runtime.Limits, pol policyState) (s *Sandbox, ok bool, err error) {
	p := m.pool
	if p == nil {
		return nil, false, nil
	}
	if p.poolable(opt.Template, limits, opt) {
		var load map[string]int
		if p.placer != nil {
			load = m.nodeLoad()
		}
		s = p.take(opt.Template, load)
	}
	if s == nil {
		p.misses.Add(1)
		return nil, false, nil
	}
	s, ok, err = m.handOut(ctx, s, opt, pol, p.giveBack)
	if !ok || err != nil {
		return s, ok, err
	}
	p.hits.Add(1)
	return s, true, nil
}

// handOut makes s, a member of a pool (the warm pool's or a snapshot's)
// taken for opt, the caller's sandbox; giveBack returns it to its pool
// when the engine cannot take it. ok false: it was stopped in the pool
// meanwhile (a miss).
func (m *Manager) handOut(ctx context.Context, s *Sandbox, opt CreateOptions, pol policyState, giveBack func(*Sandbox)) (*Sandbox, bool, error) {
	// lifeMu orders the agent's lifetime after a lease renewal in flight,
	// and any SetTimeout after it; it is released once the agent knows.
	s.lifeMu.Lock()
	m.mu.Lock()
	switch {
	case m.closed:
		m.mu.Unlock()
		s.lifeMu.Unlock()
		giveBack(s)
		return nil, true, apierr.New(apierr.Capacity, "the engine is shutting down")
	case len(m.sandboxes) >= m.cfg.MaxSandboxes:
		m.mu.Unlock()
		s.lifeMu.Unlock()
		giveBack(s)
		return nil, true, &apierr.Error{Code: apierr.Capacity, RetryAfter: time.Second,
			Message: fmt.Sprintf("all %d sandbox slots are in use", m.cfg.MaxSandboxes)}
	}
	// Until it is in the table the member is ours alone: its life as the
	// caller's sandbox starts now.
	s.Metadata, s.Env, s.owner = opt.Metadata, opt.Env, opt.Owner
	s.Created = createdNow()
	s.mu.Lock()
	s.pol = pol
	s.mu.Unlock()
	if !s.startLife(opt.Timeout) {
		m.mu.Unlock()
		s.lifeMu.Unlock()
		return nil, false, nil // stopped in the pool meanwhile: a miss
	}
	m.sandboxes[s.ID] = s
	// The agent learns its lifetime after the hand-out, off the caller's
	// path (a round trip of its own). A member that died in the pool is
	// stopped then.
	go func() {
		defer s.lifeMu.Unlock()
		if err := s.tellLifetime(context.WithoutCancel(ctx), opt.Timeout); err != nil {
			m.log.Warn("warm pool: could not give a handed-out sandbox its lifetime", "sandbox", s.ID, "err", err)
		}
	}()
	m.mu.Unlock()
	m.log.Info("sandbox created", "sandbox", s.ID, "template", s.Template, "pool", "hit")
	s.announce(true)
	return s, true, nil
}

// nodeLoad counts the sandboxes running on each node.
func (m *Manager) nodeLoad() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	load := map[string]int{}
	for _, s := range m.sandboxes {
		load[s.node]++
	}
	return load
}

// PoolStats reports the warm pool; the zero value when it is off.
func (m *Manager) PoolStats() PoolStats {
	if m.pool == nil {
		return PoolStats{}
	}
	return m.pool.stats()
}

// FromPool reports whether the sandbox was handed out by the warm pool.
func (s *Sandbox) FromPool() bool { return s.pooled }
