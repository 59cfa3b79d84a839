package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
)

// proc is a server of a test's own, on its own data dir, with the
// binaries of the package's shared server.
type proc struct {
	t       *testing.T
	dir     string
	url     string
	key     string
	cmd     *exec.Cmd
	log     *bytes.Buffer
	bin     string
	waitErr chan error
}

// newDataDir prepares a data dir that reuses the shared server's runtime
// and templates, and makes a key.
func newDataDir(t *testing.T) (dir, key string) {
	t.Helper()
	s := start(t)
	dir, err := os.MkdirTemp("", "sfmeter")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"bin/runc", "templates"} {
		target, err := os.Readlink(filepath.Join(s.dataDir, l))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(dir, l)); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(s.bin, "--data-dir", dir, "keys", "create", "--name", "meter").CombinedOutput()
	if err != nil {
		t.Fatalf("keys create: %v: %s", err, out)
	}
	return dir, regexp.MustCompile(`sf_[0-9a-f]{40}`).FindString(string(out))
}

func serveOn(t *testing.T, dir, key string, args ...string) *proc {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p := &proc{t: t, dir: dir, url: "http://" + addr, key: key, log: &bytes.Buffer{}, bin: start(t).bin, waitErr: make(chan error, 1)}
	p.cmd = exec.Command(p.bin, append([]string{"--data-dir", dir, "serve", "--listen", addr}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.waitErr <- p.cmd.Wait() }()
	t.Cleanup(func() { p.stop(syscall.SIGTERM) })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if res, err := http.Get(p.url + "/readyz"); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not start:\n%s", p.log)
		}
	}
}

// stop signals the server and waits for it to end.
func (p *proc) stop(sig syscall.Signal) {
	if p.cmd.ProcessState != nil {
		return
	}
	p.cmd.Process.Signal(sig)
	select {
	case <-p.waitErr:
	case <-time.After(60 * time.Second):
		p.cmd.Process.Kill()
		<-p.waitErr
	}
}

// call sends a JSON request and decodes a JSON answer.
func (p *proc) call(method, path string, body any, out any) http.Header {
	p.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, p.url+path, rd)
	req.Header.Set("Authorization", "Bearer "+p.key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode >= 300 {
		p.t.Fatalf("%s %s: %d %s", method, path, res.StatusCode, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			p.t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
	return res.Header
}

// cgroupCPU reads a sandbox's CPU counter from its cgroup (v1 cpuacct or
// v2 cpu.stat), in nanoseconds.
func cgroupCPU(t *testing.T, id string) uint64 {
	t.Helper()
	if m, _ := filepath.Glob("/sys/fs/cgroup/cpuacct/sheepfold/*/" + id + "/cpuacct.usage"); len(m) == 1 {
		b, err := os.ReadFile(m[0])
		if err != nil {
			t.Fatal(err)
		}
		v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if m, _ := filepath.Glob("/sys/fs/cgroup/sheepfold/*/" + id + "/cpu.stat"); len(m) == 1 {
		b, err := os.ReadFile(m[0])
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "usage_usec "); ok {
				n, _ := strconv.ParseUint(v, 10, 64)
				return n * 1000
			}
		}
	}
	t.Fatalf("no cgroup CPU counter for sandbox %s", id)
	return 0
}

// TestMeteringAccuracy: a sandbox that burns 2.0 CPU-seconds is metered
// within 5 % of its cgroup's own counter (from hand-out for a warm pool
// member, whose CPU before is not the user's).
func TestMeteringAccuracy(t *testing.T) {
	dir, key := newDataDir(t)
	p := serveOn(t, dir, key, "--pool", "1")
	// A full pool, so that the sandbox is a member handed out: its CPU
	// before (the preload) is not metered. TestMeteringKill9 meters
	// sandboxes without a pool, from their start.
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		var v struct {
			Pool *struct{ Size, Ready int }
		}
		p.call("GET", "/v1/version", nil, &v)
		if v.Pool != nil && v.Pool.Ready >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pool did not fill: %+v", v.Pool)
		}
	}
	var sb struct{ ID string }
	hdr := p.call("POST", "/v1/sandboxes", map[string]any{}, &sb)
	c0 := cgroupCPU(t, sb.ID)
	var ex struct{ Status, Stderr string }
	p.call("POST", "/v1/sandboxes/"+sb.ID+"/execute", map[string]any{
		"code":       "import time\nopen('/home/user/blob', 'wb').write(b'x' * 5_000_000)\nt = time.process_time()\nwhile time.process_time() - t < 2.0:\n    pass\n",
		"timeout_ms": 60000}, &ex)
	if ex.Status != "success" {
		t.Fatalf("burn: %+v", ex)
	}
	c1 := cgroupCPU(t, sb.ID)
	p.call("DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
	var u struct {
		CPUSeconds float64 `json:"cpu_seconds"`
		DiskPeak   int64   `json:"disk_peak_bytes"`
		Live       bool
	}
	p.call("GET", "/v1/sandboxes/"+sb.ID+"/usage", nil, &u)
	want := float64(c1) / 1e9
	if hdr.Get("Sheepfold-Pool") == "hit" {
		want = float64(c1-c0) / 1e9
	}
	t.Logf("pool %s: cgroup %.3f s at hand-out, %.3f s after the burn; metered %.3f s (want %.3f)",
		hdr.Get("Sheepfold-Pool"), float64(c0)/1e9, float64(c1)/1e9, u.CPUSeconds, want)
	if want < 2.0 || u.CPUSeconds < want*0.95 || u.CPUSeconds > want*1.05 {
		t.Fatalf("metered %.3f CPU-seconds; the cgroup counted %.3f", u.CPUSeconds, want)
	}
	if hdr.Get("Sheepfold-Pool") != "hit" {
		t.Fatalf("the sandbox was not a pool member (%q): the hand-out case went untested", hdr.Get("Sheepfold-Pool"))
	}
	if u.DiskPeak < 5_000_000 {
		t.Fatalf("disk high-water mark %d bytes; the sandbox wrote 5 MB", u.DiskPeak)
	}
}

// storedCPU sums the stored CPU nanoseconds of a sandbox.
func storedCPU(t *testing.T, dir, id string) (int64, int64) {
	t.Helper()
	db, err := sqlite.Open(context.Background(), filepath.Join(dir, "sheepfold.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.QueryUsage(context.Background(), store.UsageFilter{SandboxID: id, GroupBy: store.GroupNone})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		return 0, 0
	}
	return rows[0].CPUNanos, rows[0].WallNanos
}

// TestMeteringKill9: a server killed with SIGKILL before its flush loses
// none of its sandboxes' CPU. The next start charges each sandbox left
// behind what its cgroup counted since the last flush, the time the
// server was down included, before it destroys it; wall and GB-seconds
// run to its end (the restart, or its deadline when that passed while no
// server ran); a third start that meets one of them again (its destroy
// failed) charges nothing more. Three sandboxes: a pool member that
// burned 2 CPU-seconds and idles (metered from hand-out: its warm-up is
// not the user's), one that burns a CPU through the crash, and one whose
// lifetime ends while no server runs. Tolerances: the idle one within
// 50 ms + 2 % of its cgroup's counter read before the kill; the dead one
// exactly its final counter (1 ms); the busy one between its counter read
// before the restart and that plus one CPU for the time the restart took
// (+ 0.2 s).
func TestMeteringKill9(t *testing.T) {
	s := newCrashServer(t)
	s.extra = []string{"--metering-flush-interval", "10s"}
	ctx := context.Background()
	s.start(1)
	c := s.client()
	s.poolReady()
	off := &client.Resources{MemoryMB: 256} // not the pool's limits: a create of its own, metered from 0
	burner := client.CommandRequest{Cmd: "python3", Args: []string{"-c", "while True: pass"}}

	busy, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: 10 * time.Minute, Resources: off})
	if err != nil {
		t.Fatal(err)
	}
	busyMetered := time.Now() // metered from before this at the latest
	if _, err := c.StartCommand(ctx, busy.ID, burner); err != nil {
		t.Fatal(err)
	}
	v0, err := c.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	idle, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	handOut := cgroupCPU(t, idle.ID)
	if v1, err := c.Version(ctx); err != nil || v1.Pool.Hits != v0.Pool.Hits+1 {
		t.Fatalf("the idle sandbox is not a pool member: %+v %v", v1, err)
	}
	ex, err := c.Execute(ctx, idle.ID, client.ExecuteRequest{Timeout: time.Minute,
		Code: "import time\nt = time.process_time()\nwhile time.process_time() - t < 2.0:\n    pass\n"})
	if err != nil || ex.Status != "success" {
		t.Fatalf("burn: %+v %v", ex, err)
	}
	short, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: 8 * time.Second, Resources: off})
	if err != nil {
		t.Fatal(err)
	}
	shortMetered := time.Now() // metered from before this at the latest
	if _, err := c.StartCommand(ctx, short.ID, burner); err != nil {
		t.Fatal(err)
	}
	shortProcs := procs(short.ID)
	ids := []string{idle.ID, busy.ID, short.ID}
	stored := func() map[string][2]int64 { // cpu, wall
		out := map[string][2]int64{}
		for _, id := range ids {
			cpu, wall := storedCPU(t, s.dir, id)
			out[id] = [2]int64{cpu, wall}
		}
		return out
	}
	beforeKill := map[string]uint64{}
	for _, id := range ids {
		beforeKill[id] = cgroupCPU(t, id)
	}
	flushed := stored()
	s.kill9()
	if !slices.ContainsFunc(shortProcs, sandboxProc.alive) {
		t.Fatal("the short sandbox ended before the kill: its life while no server ran went untested")
	}
	for _, id := range ids {
		t.Logf("%s: cgroup %.3f s before the kill, %.3f s of it flushed", id, float64(beforeKill[id])/1e9, float64(flushed[id][0])/1e9)
	}

	// While no server runs, the short one ends at its deadline (its
	// agent keeps it) and the busy one burns on.
	eventually(t, time.Until(short.ExpiresAt)+15*time.Second, "the short sandbox's processes to end", func() bool {
		return !slices.ContainsFunc(shortProcs, sandboxProc.alive)
	})
	if time.Now().Before(short.ExpiresAt) {
		t.Fatalf("the short sandbox ended before its deadline %s", short.ExpiresAt)
	}
	// The busy one's destroy will fail (an immutable file in its bundle),
	// so that a third start meets it again.
	m, _ := filepath.Glob(filepath.Join(s.dir, "run", "*", "sandboxes", busy.ID, "config.json"))
	if len(m) != 1 {
		t.Fatalf("no bundle of %s", busy.ID)
	}
	stuck := m[0]
	setImmutable(t, stuck, true)
	defer func() {
		if _, err := os.Stat(stuck); err == nil {
			setImmutable(t, stuck, false)
		}
	}()
	final := map[string]uint64{}
	for _, id := range ids {
		final[id] = cgroupCPU(t, id)
	}
	busyProcs := procs(busy.ID)
	readAt := time.Now()
	s.start(0)
	restartTook := time.Since(readAt)
	// A leftover's usage is recorded before its destroy begins: once all
	// three are destroyed (the busy one's processes and cgroup; its
	// bundle stays).
	eventually(t, 30*time.Second, "the leftovers' destroys", func() bool {
		b := s.bundles()
		return !slices.Contains(b, idle.ID) && !slices.Contains(b, short.ID) && !slices.ContainsFunc(busyProcs, sandboxProc.alive)
	})

	got := stored()
	for _, id := range ids {
		t.Logf("%s: cgroup %.3f s before the restart; stored %.3f s after it, wall %.3f s", id, float64(final[id])/1e9,
			float64(got[id][0])/1e9, float64(got[id][1])/1e9)
	}
	want := float64(beforeKill[idle.ID]-handOut) / 1e9
	if cpu := float64(got[idle.ID][0]) / 1e9; want < 2.0 || math.Abs(cpu-want) > 0.05+0.02*want {
		t.Errorf("idle pool member: %.3f CPU-seconds stored; its cgroup counted %.3f since hand-out before the kill", cpu, want)
	}
	if d := got[short.ID][0] - int64(final[short.ID]); d < -1e6 || d > 1e6 {
		t.Errorf("short: %d ns stored; its cgroup's final counter is %d", got[short.ID][0], final[short.ID])
	}
	if wall := got[short.ID][1]; wall > short.ExpiresAt.Sub(short.CreatedAt).Nanoseconds()+1e6 ||
		wall < short.ExpiresAt.Sub(shortMetered).Nanoseconds()-1e6 {
		t.Errorf("short: %.3f s of wall stored; it lived from %s (metered by %s) to its deadline %s", float64(wall)/1e9,
			short.CreatedAt, shortMetered, short.ExpiresAt)
	}
	if cpu := got[busy.ID][0]; cpu < int64(final[busy.ID]) || cpu > int64(final[busy.ID])+restartTook.Nanoseconds()+2e8 {
		t.Errorf("busy: %d ns stored; its cgroup counted %d before a restart of %s", cpu, final[busy.ID], restartTook)
	}
	if w := time.Duration(got[busy.ID][1]); w < readAt.Sub(busyMetered) {
		t.Errorf("busy: %s of wall stored; it was metered for %s at least before the restart", w, readAt.Sub(busyMetered))
	}
	// The account's report and ledger say the same.
	rep, err := c.Usage(ctx, client.UsageQuery{GroupBy: "sandbox"})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range rep.Groups {
		if st, ok := got[g.SandboxID]; ok && fmt.Sprintf("%.6f", g.CPUSeconds) != fmt.Sprintf("%.6f", float64(st[0])/1e9) {
			t.Errorf("the report says %.6f CPU-seconds of %s, the database %.6f", g.CPUSeconds, g.SandboxID, float64(st[0])/1e9)
		}
	}
	cr, err := c.Credits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := cr.SpentMicros - rep.Total.CostMicros; d < -3 || d > 3 {
		t.Errorf("the ledger has %d micros spent; the usage costs %d", cr.SpentMicros, rep.Total.CostMicros)
	}

	// The third start meets the busy one again (its processes and cgroup
	// went, its bundle stayed) and charges nothing more of anything.
	if !slices.Contains(s.bundles(), busy.ID) {
		t.Fatal("the busy sandbox's bundle went: the third start meets nothing")
	}
	s.kill9()
	s.start(0)
	if !strings.Contains(s.log.String(), busy.ID) {
		t.Fatalf("the third start did not meet the busy sandbox again:\n%s", s.log.String())
	}
	setImmutable(t, stuck, false)
	eventually(t, 30*time.Second, "the stuck leftover to be destroyed in the background", func() bool {
		return !slices.Contains(s.bundles(), busy.ID)
	})
	if again := stored(); !maps.Equal(again, got) {
		t.Fatalf("after a third start the usage moved: %v → %v", got, again)
	}

	// The CLI prints the same report.
	out, err := exec.Command(s.bin, "usage", "--url", "http://"+s.addr, "--api-key", s.key, "--group-by", "sandbox", "--json").CombinedOutput()
	if err != nil || !strings.Contains(string(out), busy.ID) {
		t.Fatalf("sheepfold usage --json: %v\n%s", err, out)
	}
	out, err = exec.Command(s.bin, "usage", "--url", "http://"+s.addr, "--api-key", s.key, "--group-by", "sandbox").CombinedOutput()
	if err != nil || !strings.Contains(string(out), busy.ID) || !strings.Contains(string(out), "total") {
		t.Fatalf("sheepfold usage: %v\n%s", err, out)
	}
}
