package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

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

// TestMeteringKill9: a server killed with SIGKILL loses at most one flush
// interval of a busy sandbox's usage, and the next start counts no second
// twice (the stored figures do not move).
func TestMeteringKill9(t *testing.T) {
	const flush = time.Second
	dir, key := newDataDir(t)
	p := serveOn(t, dir, key, "--pool", "0", "--metering-flush-interval", flush.String())
	var sb struct{ ID string }
	p.call("POST", "/v1/sandboxes", map[string]any{"timeout": 600, "resources": map[string]any{"cpus": 1}}, &sb)
	p.call("POST", "/v1/sandboxes/"+sb.ID+"/commands", map[string]any{"cmd": "python3", "args": []string{"-c", "while True: pass"}, "background": true}, nil)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if cpu, _ := storedCPU(t, dir, sb.ID); cpu >= 3e9 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("usage never reached the database:\n%s", p.log)
		}
	}
	before := cgroupCPU(t, sb.ID)
	p.stop(syscall.SIGKILL)
	stored, wall := storedCPU(t, dir, sb.ID)
	lost := int64(before) - stored
	t.Logf("cgroup %.3f s at the kill; stored %.3f s (wall %.3f s): %.3f s lost", float64(before)/1e9, float64(stored)/1e9, float64(wall)/1e9, float64(lost)/1e9)
	// One flush interval plus one sample interval of one busy CPU, and
	// the time between the last sample and the kill.
	if lost < 0 || lost > int64(2*flush+500*time.Millisecond) {
		t.Fatalf("%.3f CPU-seconds lost at the kill; at most one interval may be", float64(lost)/1e9)
	}

	// The restart destroys the sandbox left behind and records nothing
	// more of it, however many flushes pass.
	p2 := serveOn(t, dir, key, "--pool", "0", "--metering-flush-interval", flush.String())
	var sb2 struct{ ID string }
	p2.call("POST", "/v1/sandboxes", map[string]any{}, &sb2) // something to meter and flush
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, w := storedCPU(t, dir, sb2.ID); w > int64(3*flush) {
			break // three flushes of the new server have happened
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new server never flushed:\n%s", p2.log)
		}
	}
	again, wall2 := storedCPU(t, dir, sb.ID)
	if again != stored || wall2 != wall {
		t.Fatalf("after the restart the killed sandbox's usage moved: cpu %d → %d, wall %d → %d", stored, again, wall, wall2)
	}
	var rep struct {
		Groups []struct {
			SandboxID  string  `json:"sandbox_id"`
			CPUSeconds float64 `json:"cpu_seconds"`
		}
	}
	p2.call("GET", "/v1/account/usage?group_by=sandbox", nil, &rep)
	found := false
	for _, g := range rep.Groups {
		if g.SandboxID == sb.ID {
			found = true
			if fmt.Sprintf("%.6f", g.CPUSeconds) != fmt.Sprintf("%.6f", float64(stored)/1e9) {
				t.Fatalf("the report says %.6f s, the database %.6f s", g.CPUSeconds, float64(stored)/1e9)
			}
		}
	}
	if !found {
		t.Fatalf("the killed sandbox is not in the report: %+v", rep)
	}
	// The CLI prints the same report.
	out, err := exec.Command(p2.bin, "usage", "--url", p2.url, "--api-key", key, "--group-by", "sandbox", "--json").CombinedOutput()
	if err != nil || !strings.Contains(string(out), sb.ID) {
		t.Fatalf("sheepfold usage --json: %v\n%s", err, out)
	}
	out, err = exec.Command(p2.bin, "usage", "--url", p2.url, "--api-key", key, "--group-by", "sandbox").CombinedOutput()
	if err != nil || !strings.Contains(string(out), sb.ID) || !strings.Contains(string(out), "total") {
		t.Fatalf("sheepfold usage: %v\n%s", err, out)
	}
}
