package sandbox

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
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
// take on, and a filler refills the pool in the background. While at least
// half its members are left, the refill waits until no member has been
// taken for refillQuiet: starting a member costs about a CPU-second (the
// imports), which on a small machine would otherwise slow the first
// requests of the sandbox just handed out. A pool less than half full
// refills at once. Above Config.PoolSize the pools follow demand (see "The
// adaptive pool" below).
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
// than Config.DefaultLimits (unless the pools follow demand, which then
// keep a pool of that shape), a read-only root, and any sandbox-wide
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
	Size   int    `json:"size"`            // the floor: members always kept per pooled template (per node, with Nodes)
	Max    int    `json:"max"`             // the most members one pool grows to on demand (Size: it does not)
	Wanted int    `json:"wanted"`          // members the pools aim to hold now, over all of them
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

// poolKey names one pool: a template and the resource shape its members
// are started with.
type poolKey struct {
	template string
	limits   runtime.Limits
}

// demand is what one pool's recent creates ask of it.
type demand struct {
	target  int       // members wanted now (on each node, with nodes)
	lastUse time.Time // the last create that could have been served by it
}

type pool struct {
	m        *Manager
	floor    int   // Config.PoolSize: members of each default pool, always
	max      int   // Config.PoolMax: the most any pool grows to on demand
	budget   int64 // Config.PoolMemory: members above their floors, all pools together
	shrink   time.Duration
	defaults runtime.Limits
	preload  []string

	ctx    context.Context // cancelled by close: aborts the starts in progress
	cancel context.CancelFunc
	wake   chan struct{} // a member was taken or a start ended: look again
	done   chan struct{} // closed when the filler and its starts have returned

	hits, misses atomic.Uint64

	placer   runtime.Placer // nil: the runtime places members
	nodesErr string         // the last error listing the nodes, logged once

	// mu guards the fields below.
	mu       sync.Mutex
	keys     []poolKey              // every pool, the default ones first in Config.PoolTemplates' order
	ready    map[poolKey][]*Sandbox // oldest first
	starting map[poolKey][]string   // the nodes of the members being started
	demand   map[poolKey]*demand    // by pool
	lastTake time.Time              // the last hand-out
	retryAt  time.Time              // after a failed start: no new start before
	retry    backoff.Backoff        // the wait after a failed start
	closed   bool
	nodes    []string             // the placer's nodes; nil until first listed
	failed   map[string]time.Time // node → when a member last failed to start there
}

// The adaptive pool. Each pooled template has a pool of the default
// resource shape (Config.DefaultLimits) holding at least Config.PoolSize
// members, its floor. When Config.PoolMax is above the floor the pools
// follow demand: a create that finds its pool empty raises that pool's
// target by one, up to PoolMax, so that a burst leaves the pool sized for
// the next one; a create asking for another shape (other limits) of a
// pooled template makes a pool of that shape, floor 0, the same way; a
// pool that no create has asked of for Config.PoolShrinkAfter goes back
// to its floor, its extra members destroyed. Members above the floors
// count against Config.PoolMemory at poolMemberBytes each: past it the
// pools stop growing (the floors are the operator's and always kept).
// A pool less than half full starts two members at once on a machine of
// more than one CPU, so that it refills faster after a burst; otherwise
// one at a time, so that refilling takes at most about one core.

// poolMemberBytes is what a member is reckoned to hold: a Python with
// pandas, numpy and matplotlib imported (≈ 100 MiB) and its agent.
const poolMemberBytes = 128 << 20

// DefaultPoolShrinkAfter is how long a pool above its floor waits
// unused before it shrinks back when Config.PoolShrinkAfter is 0.
const DefaultPoolShrinkAfter = 2 * time.Minute

// DefaultPoolMemory is the members' memory budget above their floors
// when Config.PoolMemory is 0: an eighth of the host's memory.
func DefaultPoolMemory() int64 { return HostMemory() / 8 }

func newPool(m *Manager) *pool {
	ctx, cancel := context.WithCancel(context.Background())
	p := &pool{
		m: m, floor: m.cfg.PoolSize, max: max(m.cfg.PoolSize, m.cfg.PoolMax), budget: m.cfg.PoolMemory,
		shrink: m.cfg.PoolShrinkAfter, defaults: m.cfg.DefaultLimits, preload: m.cfg.PoolPreload,
		ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1), done: make(chan struct{}),
		ready: map[poolKey][]*Sandbox{}, starting: map[poolKey][]string{}, demand: map[poolKey]*demand{},
		failed: map[string]time.Time{}, retry: backoff.Backoff{Base: time.Second, Max: 30 * time.Second},
	}
	for _, t := range m.cfg.PoolTemplates {
		k := poolKey{t, p.defaults}
		p.keys = append(p.keys, k)
		p.demand[k] = &demand{target: p.floor}
	}
	p.placer, _ = m.cfg.Runtime.(runtime.Placer)
	go p.fill()
	return p
}

// adaptive reports whether the pools follow demand.
func (p *pool) adaptive() bool { return p.max > p.floor }

// floorOf is a pool's floor: Config.PoolSize for the default shape, 0
// for the others.
func (p *pool) floorOf(k poolKey) int {
	if k.limits == p.defaults {
		return p.floor
	}
	return 0
}

// fill keeps every pool at its target, starting members in the
// background, and shrinks the pools no create has asked of.
func (p *pool) fill() {
	var starts sync.WaitGroup
	defer func() {
		starts.Wait()
		close(p.done)
	}()
	renew := time.NewTicker(p.lease() / 4)
	defer renew.Stop()
	var nodes, shrink <-chan time.Time
	if p.placer != nil {
		p.refreshNodes()
		t := time.NewTicker(nodeRefresh)
		defer t.Stop()
		nodes = t.C
	}
	if p.adaptive() {
		t := time.NewTicker(max(p.shrink/4, 10*time.Millisecond))
		defer t.Stop()
		shrink = t.C
	}
	for {
		k, node, wait := p.wanting()
		if wait == 0 {
			starts.Go(func() { p.startOne(k, node) })
			continue
		}
		var later <-chan time.Time
		if wait > 0 {
			later = time.After(wait)
		}
		select {
		case <-p.ctx.Done():
			return
		case <-p.wake:
		case <-later:
		case <-renew.C:
			p.renewLeases()
		case <-nodes:
			p.refreshNodes()
		case <-shrink:
			p.shrinkIdle()
		}
	}
}

// startOne starts a member of k on node, booked in p.starting by wanting,
// and puts it in its pool.
func (p *pool) startOne(k poolKey, node string) {
	s, err := p.start(k, node)
	p.mu.Lock()
	if i := slices.Index(p.starting[k], node); i >= 0 {
		p.starting[k] = slices.Delete(p.starting[k], i, i+1)
	}
	switch {
	case err != nil:
		if node != "" {
			p.failed[node] = time.Now()
		}
		wait := p.retry.Next()
		p.retryAt = time.Now().Add(wait)
		p.mu.Unlock()
		if p.ctx.Err() == nil {
			p.m.log.Warn("warm pool: could not start a sandbox", "template", k.template, "node", node, "err", err, "retry_in", wait)
		}
	case p.closed:
		p.mu.Unlock()
		p.m.destroy(s, reasonShutdown)
	default:
		p.retry.Reset()
		p.ready[k] = append(p.ready[k], s)
		p.mu.Unlock()
	}
	p.signal()
}

// wanting books the start of a member of a pool short of its target and
// returns the pool, the node to start it on ("" where the runtime places
// it) and a zero wait; or, when nothing is to be started now, how long
// to wait before looking again (-1: until woken).
func (p *pool) wanting() (k poolKey, node string, wait time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if p.closed {
		return poolKey{}, "", -1
	}
	if d := p.retryAt.Sub(now); d > 0 {
		return poolKey{}, "", d
	}
	inflight, above := 0, 0
	for _, k := range p.keys {
		inflight += len(p.starting[k])
		above += max(0, len(p.ready[k])+len(p.starting[k])-p.floorOf(k)*len(p.nodesFor()))
	}
	quiet := max(0, refillQuiet-now.Sub(p.lastTake))
	wait = -1
	for _, k := range p.keys {
		target := p.demand[k].target
		for _, n := range p.nodesFor() {
			have := countOn(p.ready[k], n) + countStarting(p.starting[k], n)
			if have >= target {
				continue
			}
			if n != "" {
				if c := nodeCooldown - now.Sub(p.failed[n]); c > 0 {
					wait = soonest(wait, c)
					continue
				}
			}
			// Past the floor a member is paid for from the budget.
			if have >= p.floorOf(k) && int64(above+1)*poolMemberBytes > p.budget {
				continue
			}
			// A pool with members left refills once hand-outs pause; a
			// pool less than half full refills at once, two at a time
			// where there is more than one CPU.
			parallel, w := 1, time.Duration(0)
			if 2*countOn(p.ready[k], n) < target {
				parallel = min(2, goruntime.NumCPU())
			} else if countOn(p.ready[k], n) > 0 {
				w = quiet
			}
			if inflight >= parallel {
				continue // a start ending wakes the filler
			}
			if w > 0 {
				wait = soonest(wait, w)
				continue
			}
			p.starting[k] = append(p.starting[k], n)
			return k, n, 0
		}
	}
	return poolKey{}, "", wait
}

// nodesFor is the nodes members are kept on: the placer's, or one ""
// where the runtime places them.
func (p *pool) nodesFor() []string {
	if p.nodes == nil {
		return []string{""}
	}
	return p.nodes
}

// soonest is the shorter of a wait (-1: none yet) and d.
func soonest(wait, d time.Duration) time.Duration {
	if wait < 0 || d < wait {
		return d
	}
	return wait
}

// countOn counts the members on node ("": all of them, where the runtime
// places members).
func countOn(members []*Sandbox, node string) int {
	n := 0
	for _, s := range members {
		if node == "" || s.node == node {
			n++
		}
	}
	return n
}

// countStarting counts the starts in progress on node ("": all).
func countStarting(nodes []string, node string) int {
	n := 0
	for _, o := range nodes {
		if node == "" || o == node {
			n++
		}
	}
	return n
}

// maxShapes bounds the resource shapes the pools track at once: a
// caller asking for ever new shapes makes no more pools than this.
const maxShapes = 16

// asked records a create that a pool of k could serve: it is in use, and
// when it had nothing to give (hit false) an adaptive pool grows by one.
// A shape not pooled yet is only noted at its first miss and pooled from
// its second within Config.PoolShrinkAfter: a shape asked for once costs
// no member.
func (p *pool) asked(k poolKey, hit bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.demand[k]
	if d == nil {
		if !p.adaptive() || len(p.keys) >= len(p.m.cfg.PoolTemplates)+maxShapes {
			return
		}
		p.demand[k] = &demand{lastUse: time.Now()}
		p.keys = append(p.keys, k)
		return
	}
	d.lastUse = time.Now()
	if !hit && d.target < p.max {
		d.target++
		p.signal()
	}
}

// shrinkIdle takes every pool no create has asked of for p.shrink back to
// its floor, destroying its extra members (the oldest first), and forgets
// an idle shape's pool once it is empty.
func (p *pool) shrinkIdle() {
	var gone []*Sandbox
	p.mu.Lock()
	for _, k := range p.keys {
		d := p.demand[k]
		if time.Since(d.lastUse) < p.shrink {
			continue
		}
		d.target = p.floorOf(k)
		for _, n := range p.nodesFor() {
			extra := countOn(p.ready[k], n) - d.target
			p.ready[k] = slices.DeleteFunc(p.ready[k], func(s *Sandbox) bool {
				if extra > 0 && (n == "" || s.node == n) {
					extra--
					gone = append(gone, s)
					return true
				}
				return false
			})
		}
	}
	p.keys = slices.DeleteFunc(p.keys, func(k poolKey) bool {
		if p.floorOf(k) > 0 || p.demand[k].target > 0 || len(p.ready[k])+len(p.starting[k]) > 0 {
			return false
		}
		delete(p.demand, k)
		delete(p.ready, k)
		return true
	})
	p.mu.Unlock()
	for _, s := range gone {
		p.m.log.Info("warm pool: shrinking an idle pool", "sandbox", s.ID, "template", s.Template)
		_ = p.m.destroy(s, reasonShutdown)
	}
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
	for k, members := range p.ready {
		p.ready[k] = slices.DeleteFunc(members, func(s *Sandbox) bool {
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

// start creates one member of k, on node unless that is "": the sandbox,
// its agent, its preloaded kernel.
func (p *pool) start(k poolKey, node string) (*Sandbox, error) {
	m := p.m
	tmpl := k.template
	rootfs, err := m.cfg.Templates.RootFS(tmpl)
	if err != nil {
		return nil, err
	}
	start, err := m.templateStart(tmpl)
	if err != nil {
		return nil, err
	}
	s := &Sandbox{ID: newID(), Template: tmpl, Limits: k.limits, m: m, state: StateStarting, pooled: true,
		node: node, created: make(chan struct{})}
	s.project = newProject(start, rootfs, nil)
	// Logged before the runtime makes anything: a member whose engine
	// dies before it is ready is still named in some log.
	m.log.Info("warm pool: starting a member", "sandbox", s.ID, "template", tmpl, "node", node)
	s.root, s.startUser, s.startUserKnown = rootfs, start.User, true
	if err := m.holdRoot(s.ID, rootfs); err != nil {
		close(s.created)
		return nil, err
	}
	inst, err := m.cfg.Runtime.Create(p.ctx, runtimeSpec(s, rootfs, start, p.lease()))
	close(s.created)
	if err != nil {
		m.releaseRoot(s.ID) // the runtime's Create undid what it made
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
func runtimeSpec(s *Sandbox, rootfs string, start TemplateStart, lease time.Duration) runtime.Spec {
	return runtime.Spec{ID: s.ID, Template: s.Template, RootFS: rootfs, Limits: s.Limits, ReadOnly: s.ReadOnly, Env: sandboxEnv(start.Env, s.Limits, nil),
		Pool: true, Node: s.node, Lifetime: lease + lifetimeGrace, User: start.User, WorkDir: start.WorkDir}
}

// sandboxEnv is the environment a sandbox's agent starts with, and so
// every process in it: the template's ENV (tmpl, "K=V"), the thread pools'
// and memory's (threadEnv) where neither the template nor the create set
// them, then the create's own variables; each name once, the create's
// over the template's. (A name given twice would be read as its first
// value by glibc's getenv and Go's, its last by others.)
func sandboxEnv(tmpl []string, l runtime.Limits, user map[string]string) []string {
	set := map[string]string{}
	var order []string
	add := func(k, v string) {
		if _, ok := set[k]; !ok {
			order = append(order, k)
		}
		set[k] = v
	}
	for _, kv := range tmpl {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			add(k, v)
		}
	}
	given := maps.Clone(user)
	if given == nil {
		given = map[string]string{}
	}
	for k, v := range set {
		given[k] = v
	}
	for _, kv := range threadEnv(l, given) {
		k, v, _ := strings.Cut(kv, "=")
		add(k, v)
	}
	for _, k := range slices.Sorted(maps.Keys(user)) {
		add(k, user[k])
	}
	out := make([]string, len(order))
	for i, k := range order {
		out[i] = k + "=" + set[k]
	}
	return out
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
		for k, members := range p.ready {
			p.ready[k] = slices.DeleteFunc(members, func(s *Sandbox) bool { return s.State() != StateStarting })
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

// poolable reports whether a sandbox started ahead, of a pooled template
// and the shape limits, can serve opt: a shape other than the default
// only when the pools follow demand.
func (p *pool) poolable(tmpl string, limits runtime.Limits, opt CreateOptions) bool {
	if opt.ReadOnly || len(opt.Env) > 0 || (limits != p.defaults && !p.adaptive()) {
		return false
	}
	return slices.Contains(p.m.cfg.PoolTemplates, tmpl)
}

// take removes a ready member of k's pool, or returns nil: the oldest on
// the node with the fewest sandboxes by load (nil: the oldest).
func (p *pool) take(k poolKey, load map[string]int) *Sandbox {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	members := slices.DeleteFunc(p.ready[k], func(s *Sandbox) bool { return s.State() != StateStarting })
	best := -1
	for i, s := range members {
		if best < 0 || load[s.node] < load[members[best].node] {
			best = i
		}
	}
	if best < 0 {
		p.ready[k] = members
		return nil
	}
	s := members[best]
	p.ready[k] = slices.Delete(members, best, best+1)
	p.lastTake = time.Now()
	p.signal()
	return s
}

// giveBack returns a member that was taken but never shown to anyone.
func (p *pool) giveBack(s *Sandbox) {
	p.mu.Lock()
	if !p.closed {
		k := poolKey{s.Template, s.Limits}
		p.ready[k] = append([]*Sandbox{s}, p.ready[k]...)
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
	st := PoolStats{Size: p.floor, Max: p.max, Nodes: len(p.nodes), Hits: p.hits.Load(), Misses: p.misses.Load()}
	nodes := len(p.nodesFor())
	above := 0 // wanted above the floors, which the budget bounds
	for _, k := range p.keys {
		st.Ready += len(p.ready[k])
		target := p.demand[k].target
		st.Wanted += min(target, p.floorOf(k)) * nodes
		above += max(0, target-p.floorOf(k)) * nodes
	}
	st.Wanted += min(above, int(p.budget/poolMemberBytes))
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
	p.ready = map[poolKey][]*Sandbox{}
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
	k := poolKey{opt.Template, limits}
	poolable := p.poolable(opt.Template, limits, opt)
	if poolable {
		var load map[string]int
		if p.placer != nil {
			load = m.nodeLoad()
		}
		s = p.take(k, load)
		p.asked(k, s != nil)
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
