// Package metering measures what every sandbox uses, per second: wall
// seconds alive, CPU-seconds from the cgroup's own counter, GB-seconds of
// memory reserved (limit × time) and used (the integral of the cgroup's
// usage), the disk high-water mark, executions, commands, and the egress
// gateway's requests and bytes each way. A background
// loop samples each sandbox every SampleInterval and writes the deltas to
// the store's per-hour buckets every FlushInterval (and at stop), in one
// transaction with the cost they add to the credit ledger and, on one
// box, each sandbox's meter point: since only deltas are written, a
// restart never counts a second twice, and after a crash the next start
// charges each sandbox left running what its cgroup counted past its
// point (recover.go), so that a crash loses only the counts of the last
// interval (executions, commands, egress requests). On the request path
// run Count, an atomic add, AddTokens (model tokens, tokens.go), a map
// update, and a create's or a kill's Start and Stop.
//
// No lock of the meter is held while a sandbox is read: a reading asks
// the runtime or, for a Pod, the sandbox's agent, and an agent that is
// slow or gone (its Pod deleted by another replica, its node lost)
// delays its own sandbox's sample, by at most readTimeout, never another
// sandbox's, a create or a kill.
//
// A GB is 2^30 bytes. A sample's delta goes to the hour the sample was
// taken in.
//
// Where replicas share their sandboxes (Config.Replica), each sandbox is
// metered by the one replica holding its lease in the store (leases.go).
//
// # Sampling and recovery
//
// internal/metering samples every handed-out sandbox each second (cgroup CPU
// counter, memory usage, the writable layer's statfs for disk, the egress
// gateway's request and byte counts) and writes
// per-hour, per-sandbox deltas to `usage_hours`, with the cost they add as
// `credit_ledger` rows, in one transaction every 10 s and at stop (the
// `Stopping` hook samples before the cgroup goes). Only deltas are written,
// and with them each sandbox's meter point (its CPU counter and the time
// metered up to: `store.MeterPointStore`, rows of `meter_leases` no replica
// holds), the first at the first sample after its start. After a crash the
// sandboxes keep running and their cgroups counting: at the next start the
// engine hands each leftover's cgroup reading to `metering.Recover`
// (`runtime.LeftoverFunc`, from the Manager's reconcile and from the OCI
// runtime's sweep of dead instances) before destroying it, which charges the
// counter's difference from the point and wall and GB-seconds reserved up to
// the record's stop, and ends the point in the same transaction: nothing is
// lost but the counts of the last interval (executions, commands, egress
// requests), and a second start charges nothing twice (recover.go;
// docs/security.md, "Metering across a crash").
// Pool members are metered from hand-out (their CPU before is subtracted).
// Reports (`GET /v1/account/usage`, `GET /v1/sandboxes/{id}/usage`) read the
// store and add the deltas not yet flushed under the meter's lock, so every
// sample is counted exactly once and figures are live; cost is estimated from
// the operator's price table (`serve --price-*`, micro-units).
//
// Imports: api (the usage report's wire types), internal/account,
// internal/sandbox, internal/store, internal/runtime and the standard
// library.
package metering

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/store"
)

const gib = float64(1 << 30)

// readTimeout bounds one reading of a sandbox's usage. A live agent
// answers in milliseconds.
const readTimeout = 2 * time.Second

// maxReads is how many sandboxes one tick reads at once.
const maxReads = 16

// Prices are what usage costs, in micro-units of the operator's currency.
// The defaults are in the range peers charge (E2B, Modal: a few
// millionths of a dollar per CPU- or GB-second).
type Prices struct {
	CPUSecond float64 `json:"cpu_second_micros" toml:"cpu_second_micros"` // [14]
	GBSecond  float64 `json:"gb_second_micros" toml:"gb_second_micros"`   // memory reserved [4.5]
	Execution float64 `json:"execution_micros" toml:"execution_micros"`   // [0]
	// What an account keeps in the store (its records: events,
	// executions, alerts, deliveries, sandboxes), per GB-second [0.03,
	// about 0.08 units a GB-month].
	StorageGBSecond float64 `json:"storage_gb_second_micros" toml:"storage_gb_second_micros"`
	// A second of one device (a GPU) held by a sandbox [0].
	DeviceSecond float64 `json:"device_second_micros" toml:"device_second_micros"`
}

// API is p as a usage report shows it.
func (p Prices) API() api.Prices {
	return api.Prices{CPUSecondMicros: p.CPUSecond, GBSecondMicros: p.GBSecond, ExecutionMicros: p.Execution, StorageGBSecond: p.StorageGBSecond,
		DeviceSecondMicros: p.DeviceSecond}
}

// DefaultPrices are the prices when the operator sets none.
var DefaultPrices = Prices{CPUSecond: 14, GBSecond: 4.5, StorageGBSecond: 0.03}

// Cost returns what usage costs, in micro-units.
func (p Prices) Cost(cpuSeconds, gbSecondsReserved float64, executions int64) float64 {
	return cpuSeconds*p.CPUSecond + gbSecondsReserved*p.GBSecond + float64(executions)*p.Execution
}

// Config configures a Meter. Zero fields take the defaults in brackets.
type Config struct {
	SampleInterval time.Duration `toml:"sample_interval"` // [1s]
	FlushInterval  time.Duration `toml:"flush_interval"`  // at most 10s [10s]
	Prices         *Prices       `toml:"prices"`          // [DefaultPrices]
	// AfterFlush runs in the meter's loop after every flush (the accounts'
	// refresh, the alert rules, the credits' grace check).
	AfterFlush func(ctx context.Context)
	Logger     *slog.Logger
	// Replica is this server's name among the replicas sharing their
	// sandboxes: each sandbox is then metered under a lease (leases.go).
	// "" on one box.
	Replica string `toml:"-"`
}

func (c *Config) setDefaults() {
	if c.SampleInterval <= 0 {
		c.SampleInterval = time.Second
	}
	if c.FlushInterval <= 0 || c.FlushInterval > 10*time.Second {
		c.FlushInterval = 10 * time.Second
	}
	if c.FlushInterval < c.SampleInterval {
		c.FlushInterval = c.SampleInterval
	}
	if c.Prices == nil {
		p := DefaultPrices
		c.Prices = &p
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Meter meters sandboxes.
type Meter struct {
	cfg      Config
	st       store.AccountStore
	rs       store.ReplicaStore    // st's leases; used when Config.Replica is set
	ps       store.MeterPointStore // st's meter points; used on one box (recover.go)
	ss       store.StorageStore    // st's storage, metered at each flush (storage.go)
	accounts *account.Registry

	live sync.Map // sandbox id → *tracker, for Count and Live

	// mu guards trackers and their counts, and serialises flushes; it
	// is never held across a reading (tracker.sampling is).
	mu       sync.Mutex
	trackers map[string]*tracker // live and stopped-but-unflushed
	fresh    bool                // a tracker's point is not in the store yet: flush at the next sample

	tok tokens // model tokens (tokens.go)

	kick chan struct{} // a sandbox stopped: flush now
	quit chan struct{}
	done chan struct{}
	once sync.Once
}

type tracker struct {
	sb       *sandbox.Sandbox
	account  *account.Account
	template string

	executions atomic.Int64 // counted since the last sample
	commands   atomic.Int64

	// sampling is held across one sample, its reading and what it
	// adds: a tracker's samples apply in the order they were read.
	sampling sync.Mutex

	// Guarded by Meter.mu.
	last       time.Time
	lastCPU    uint64
	lastEgress int64 // the gateway's request count at the last sample
	lastIn     int64 // and its byte counts
	lastOut    int64
	memory     int64 // the cgroup's memory use at the last sample, bytes
	stopped    bool
	paused     bool // between Pause and Resume: nothing is counted
	pointed    bool // its meter point is in the store (one box: recover.go)
	// epoch changes when the lease moves the counters a reading adds
	// to (leases.go): a reading taken before is dropped.
	epoch   uint64
	pending map[time.Time]*store.UsageDelta // by hour, not yet flushed
	total   store.UsageDelta                // the sandbox's life so far

	// Under a lease (leases.go), guarded by Meter.mu too.
	holder    bool      // this replica samples it: it holds the lease, or is its creator and none exists yet
	confirmed bool      // the store records this replica's lease
	base      counters  // what a lease this replica records first starts from
	retry     time.Time // a standby tracker tries to take the lease from then on
}

// New returns a Meter and starts its loop; Close ends it.
func New(cfg Config, st store.AccountStore, accounts *account.Registry) *Meter {
	cfg.setDefaults()
	m := &Meter{cfg: cfg, st: st, accounts: accounts, trackers: map[string]*tracker{},
		kick: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	m.tok.pending = map[tokenKey]map[time.Time]*store.TokenDelta{}
	m.tok.used = map[tokenKey]*tokenMonth{}
	m.tok.reserved = map[tokenKey]int64{}
	m.tok.st, _ = st.(store.ModelStore)
	m.ss, _ = st.(store.StorageStore)
	m.rs, _ = st.(store.ReplicaStore)
	m.ps, _ = st.(store.MeterPointStore)
	go m.loop()
	return m
}

// Prices returns the price table.
func (m *Meter) Prices() Prices { return *m.cfg.Prices }

// Start meters a sandbox handed to acct from now on. A pool member's CPU
// before hand-out is not counted.
func (m *Meter) Start(sb *sandbox.Sandbox, acct *account.Account) {
	now := time.Now()
	t := &tracker{sb: sb, account: acct, template: sb.Template,
		last: now, pending: map[time.Time]*store.UsageDelta{}}
	t.total = store.UsageDelta{SandboxID: sb.ID, Account: acct.ID, Template: sb.Template}
	if sb.FromPool() {
		ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
		if u, err := sb.Usage(ctx); err == nil {
			t.lastCPU = u.CPUNanos
		}
		cancel()
	}
	if m.leased() {
		// The creator samples from its first reading, to the
		// microsecond the store keeps, and records its lease from it.
		t.last = now.Truncate(time.Microsecond)
		t.holder, t.base = true, counters{cpu: t.lastCPU, at: t.last}
	}
	m.mu.Lock()
	m.trackers[sb.ID] = t
	m.fresh = m.fresh || m.pointed()
	m.mu.Unlock()
	m.live.Store(sb.ID, t)
}

// Count counts an execution or a command of a metered sandbox.
func (m *Meter) Count(id string, w sandbox.Work) {
	v, ok := m.live.Load(id)
	if !ok {
		return
	}
	t := v.(*tracker)
	if w == sandbox.WorkExecution {
		t.executions.Add(1)
	} else {
		t.commands.Add(1)
	}
}

// Stop takes a sandbox's last sample (its cgroup must still exist) and
// has the loop flush at once; later samples of it are none.
func (m *Meter) Stop(sb *sandbox.Sandbox) {
	m.mu.Lock()
	t := m.trackers[sb.ID]
	m.mu.Unlock()
	if t != nil {
		m.sample(t, true)
	}
	m.live.Delete(sb.ID)
	if t != nil {
		select {
		case m.kick <- struct{}{}:
		default: // a flush is already due
		}
	}
}

// Pause takes a sandbox's last sample before it is paused (its cgroup
// must still exist); until Resume nothing of it is counted.
func (m *Meter) Pause(sb *sandbox.Sandbox) {
	m.mu.Lock()
	t := m.trackers[sb.ID]
	m.mu.Unlock()
	if t == nil {
		return
	}
	m.sample(t, false)
	t.sampling.Lock()
	defer t.sampling.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	t.paused, t.memory = true, 0
}

// Resume meters a resumed sandbox again from now: its new cgroup's CPU
// counter starts afresh, and what it reads now is the base of the next
// sample's delta.
func (m *Meter) Resume(sb *sandbox.Sandbox) {
	m.mu.Lock()
	t := m.trackers[sb.ID]
	m.mu.Unlock()
	if t == nil {
		return
	}
	t.sampling.Lock()
	defer t.sampling.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	u, err := sb.Usage(ctx)
	cancel()
	m.mu.Lock()
	defer m.mu.Unlock()
	t.paused, t.last = false, time.Now()
	if err == nil {
		t.lastCPU = u.CPUNanos
	} else {
		t.lastCPU = 0
	}
}

// Pending runs read (a query of the store) with no flush in between and
// returns the deltas of an account ("" for every account) not yet
// flushed, so that a report adds them to what is stored and sees every
// sample exactly once.
func (m *Meter) Pending(acct string, read func() error) ([]store.UsageDelta, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := read(); err != nil {
		return nil, err
	}
	var out []store.UsageDelta
	for _, t := range m.trackers {
		if acct != "" && t.account.ID != acct {
			continue
		}
		for _, p := range t.pending {
			out = append(out, *p)
		}
	}
	return out, nil
}

// Live returns a metered sandbox's usage so far, flushed or not.
func (m *Meter) Live(id string) (store.UsageDelta, bool) {
	m.mu.Lock()
	t := m.trackers[id]
	m.mu.Unlock()
	if t == nil || m.leased() {
		// A shared sandbox's usage is the stored one: replicas meter it
		// in turns.
		return store.UsageDelta{}, false
	}
	m.sample(t, false)
	m.mu.Lock()
	defer m.mu.Unlock()
	return t.total, true
}

// Now samples a running sandbox and returns its CPU time so far and the
// memory it uses now; ok is false for a sandbox not metered or stopped.
func (m *Meter) Now(id string) (cpu time.Duration, memoryBytes int64, ok bool) {
	m.mu.Lock()
	t := m.trackers[id]
	m.mu.Unlock()
	if t == nil {
		return 0, 0, false
	}
	m.sample(t, false)
	m.mu.Lock()
	defer m.mu.Unlock()
	if t.stopped || m.leased() && !t.holder {
		return 0, 0, false
	}
	if m.leased() {
		return time.Duration(t.lastCPU), t.memory, true // the sandbox's counter: its total, whoever metered it
	}
	return time.Duration(t.total.CPUNanos), t.memory, true
}

// sample reads a sandbox's usage (m.mu not held) and adds what it used
// since the last sample; stop makes it the last one. A stopped tracker's
// samples are none.
func (m *Meter) sample(t *tracker, stop bool) {
	t.sampling.Lock()
	defer t.sampling.Unlock()
	m.mu.Lock()
	if t.stopped {
		m.mu.Unlock()
		return
	}
	if t.paused {
		// A paused sandbox uses nothing but the server's disk (its
		// checkpoint and kept disk, metered as paused storage:
		// paused.go): its wall and memory stand still.
		m.mu.Unlock()
		m.samplePaused(t, stop)
		return
	}
	// Only the lease's holder reads (leases.go); the others count.
	read, epoch := !m.leased() || t.holder, t.epoch
	m.mu.Unlock()
	var u runtime.Usage
	var err error
	if read {
		ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
		u, err = t.sb.Usage(ctx)
		cancel()
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if read && epoch == t.epoch {
		m.addReading(t, now, u, err)
	} else {
		// Not read, or read against counters the lease has moved
		// since: what was counted here is added, the rest is the next
		// sample's.
		m.count(t, now)
	}
	if stop {
		t.stopped = true
	}
}

// addReading adds what a reading (u, or none: err) taken at now says the
// sandbox used since the last sample; m.mu is held.
func (m *Meter) addReading(t *tracker, now time.Time, u runtime.Usage, err error) {
	dt := now.Sub(t.last)
	if dt < 0 {
		dt = 0
	}
	t.last = now
	d := store.UsageDelta{
		WallNanos: dt.Nanoseconds(),
		// The limit in force now: a policy may resize a running sandbox.
		GBSecondsReserved: float64(t.sb.CurrentLimits().MemoryBytes) / gib * dt.Seconds(),
		Executions:        t.executions.Swap(0),
		Commands:          t.commands.Swap(0),
		DeviceSeconds:     float64(t.sb.DeviceCount()) * dt.Seconds(),
	}
	t.egress(&d)
	if err == nil {
		d.CPUNanos = cpuDelta(u, &t.lastCPU)
		d.GBSecondsUsed = float64(u.MemoryBytes) / gib * dt.Seconds()
		t.memory = int64(u.MemoryBytes)
		d.DiskPeakBytes = u.DiskBytes
	}
	t.add(now, d)
	cpu := float64(d.CPUNanos) / 1e9
	t.account.Accrue(account.Usage{SandboxSeconds: dt.Seconds(), CPUSeconds: cpu, GBSeconds: d.GBSecondsReserved,
		Executions: d.Executions}, m.cfg.Prices.Cost(cpu, d.GBSecondsReserved, d.Executions)+d.DeviceSeconds*m.cfg.Prices.DeviceSecond)
}

// count adds what a tracker counts where it does not sample (a shared
// sandbox another replica meters): the executions, commands and egress
// requests made through this replica; m.mu is held.
func (m *Meter) count(t *tracker, now time.Time) {
	d := store.UsageDelta{Executions: t.executions.Swap(0), Commands: t.commands.Swap(0)}
	t.egress(&d)
	if d == (store.UsageDelta{}) {
		return
	}
	t.add(now, d)
	t.account.Accrue(account.Usage{Executions: d.Executions}, m.cfg.Prices.Cost(0, 0, d.Executions))
}

// egress adds to d what the sandbox's egress gateway counted since the
// last sample; m.mu is held.
func (t *tracker) egress(d *store.UsageDelta) {
	if n := t.sb.EgressRequests(); n > t.lastEgress {
		d.EgressRequests, t.lastEgress = n-t.lastEgress, n
	}
	in, out := t.sb.EgressBytes()
	if in > t.lastIn {
		d.EgressBytesIn, t.lastIn = in-t.lastIn, in
	}
	if out > t.lastOut {
		d.EgressBytesOut, t.lastOut = out-t.lastOut, out
	}
}

// add adds d to the tracker's pending delta of now's hour and to its
// total.
func (t *tracker) add(now time.Time, d store.UsageDelta) {
	hour := now.UTC().Truncate(time.Hour)
	p := t.pending[hour]
	if p == nil {
		p = &store.UsageDelta{SandboxID: t.sb.ID, Account: t.account.ID, Template: t.template, Hour: hour}
		t.pending[hour] = p
	}
	p.Add(d)
	t.total.Add(d)
}

func cpuDelta(u runtime.Usage, last *uint64) int64 {
	if u.CPUNanos < *last {
		return 0 // a counter never goes back; a reset cgroup would
	}
	d := int64(u.CPUNanos - *last)
	*last = u.CPUNanos
	return d
}

func (m *Meter) loop() {
	defer close(m.done)
	sample := time.NewTicker(m.cfg.SampleInterval)
	defer sample.Stop()
	lastFlush := time.Now()
	for {
		select {
		case <-m.quit:
			return
		case <-m.kick:
			lastFlush = time.Now()
			m.flushAndAfter()
		case now := <-sample.C:
			m.sampleAll()
			m.mu.Lock()
			fresh := m.fresh
			m.mu.Unlock()
			// A sandbox started since the last flush has its point
			// recorded at the next sample (recover.go).
			if fresh || now.Sub(lastFlush) >= m.cfg.FlushInterval-m.cfg.SampleInterval/2 {
				lastFlush = now
				m.flushAndAfter()
			}
		}
	}
}

func (m *Meter) flushAndAfter() {
	if m.st == nil {
		return // a server without a store (route listings in tests)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m.meterStorage(ctx, time.Now())
	if err := m.Flush(ctx); err != nil {
		m.cfg.Logger.Error("flush usage", "err", err)
	}
	if m.cfg.AfterFlush != nil {
		m.cfg.AfterFlush(ctx)
	}
}

// Flush writes every pending delta and the cost accrued since the last
// flush to the store, in one transaction.
func (m *Meter) Flush(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.leased() {
		return m.flush(ctx, nil)
	}
	now := time.Now()
	m.takeLeases(ctx, now)
	// A flush refused for lost leases is made again without them (after
	// a third loss in a row, a race with takers, the rest waits for the
	// next flush).
	for try := 1; ; try++ {
		err := m.flush(ctx, m.leases(now))
		if !m.lostLeases(err) || try == 3 {
			return err
		}
	}
}

// flush writes every pending delta, the cost accrued since the last flush
// and leases, in one transaction; m.mu is held.
func (m *Meter) flush(ctx context.Context, leases []store.MeterLease) error {
	var deltas []store.UsageDelta
	for _, t := range m.trackers {
		for _, p := range t.pending {
			deltas = append(deltas, *p)
		}
	}
	owed := map[*account.Account]int64{}
	var ledger []store.LedgerEntry
	now := time.Now()
	m.accounts.Each(func(a *account.Account) {
		if micros := a.TakeOwed(); micros > 0 {
			owed[a] = micros
			ledger = append(ledger, store.LedgerEntry{Account: a.ID, CreatedAt: now, Kind: store.LedgerUsage,
				AmountMicros: -micros, Reason: "metered usage"})
		}
	})
	var points []store.MeterPoint
	if m.pointed() {
		points = m.points()
	}
	var err error
	switch {
	case leases != nil:
		err = m.rs.AddLeasedUsage(ctx, deltas, ledger, leases)
	case points != nil:
		err = m.ps.AddMeteredUsage(ctx, deltas, ledger, points)
	default:
		err = m.st.AddUsage(ctx, deltas, ledger)
	}
	if err != nil {
		return err // everything stays pending for the next flush
	}
	if points != nil {
		for _, t := range m.trackers {
			t.pointed = true
		}
		m.fresh = false
	}
	// The tokens' cost is in the ledger now; their counts follow (and
	// stay pending if this fails).
	defer func() {
		if err := m.flushTokens(ctx); err != nil {
			m.cfg.Logger.Error("flush model tokens", "err", err)
		}
	}()
	for a, micros := range owed {
		a.Settled(micros)
	}
	for id, t := range m.trackers {
		clear(t.pending)
		if t.stopped {
			delete(m.trackers, id)
		}
	}
	return nil
}

// Close stops the loop, takes a last sample of every sandbox still
// metered and flushes.
func (m *Meter) Close(ctx context.Context) error {
	m.once.Do(func() { close(m.quit) })
	<-m.done
	m.sampleAll()
	return m.Flush(ctx)
}

// sampleAll samples every live tracker, maxReads at a time: a sandbox
// slow to read holds up its own sample only.
func (m *Meter) sampleAll() {
	m.mu.Lock()
	live := make([]*tracker, 0, len(m.trackers))
	for _, t := range m.trackers {
		if !t.stopped {
			live = append(live, t)
		}
	}
	m.mu.Unlock()
	var g errgroup.Group
	g.SetLimit(maxReads)
	for _, t := range live {
		g.Go(func() error {
			m.sample(t, false)
			return nil
		})
	}
	g.Wait()
}

// Sandboxes returns the live metered sandboxes of an account.
func (m *Meter) Sandboxes(acct string) []*sandbox.Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*sandbox.Sandbox
	for _, t := range m.trackers {
		if !t.stopped && t.account.ID == acct {
			out = append(out, t.sb)
		}
	}
	return out
}
