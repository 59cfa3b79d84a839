//go:build cgroupv2guest

// Package cgroupv2 is the end-to-end check that run.sh's guest runs against
// the installed `sheepfold.service` on a pure cgroup v2 host with systemd:
// sandboxes live in the service's delegated cgroup with their limits in
// the v2 files, an OOM is reported as ERR_OUT_OF_MEMORY, pids and CPU
// quota hold. It is built only with -tags cgroupv2guest (run.sh) and fails,
// never skips, without the server it is pointed at.
//
// # The harness
//
//   - test/cgroupv2 (`make test-cgroupv2`): the host here is cgroup v1 hybrid,
//     so a qemu guest (TCG without /dev/kvm, KVM with it) proves the pure v2
//     path: Debian's kernel, systemd as init, the guest image built once by
//     image.sh and cached under `<data>/guest` (rebuilt when image.sh
//     changes), the template as a second read-only ext4 disk, bin/cgroupv2 (binaries,
//     .deb, compiled tests) shared read-only over 9p. Inside, as a `Delegate=yes` unit: the
//     compiled privileged tests of internal/runtime/oci, the cgroup-relevant
//     ones of internal/sandbox (isolation, OOM, pids, CPU, disk, crash),
//     internal/doctor, no cgroup left behind, then the .deb installed and its
//     sheepfold.service driven by the Go SDK (e2e_test.go: cgroup placement
//     inside the unit, the v2 limit files, ERR_OUT_OF_MEMORY with
//     memory.events' oom_kill, pids.max, cpu.max throttling), stopping the
//     unit leaves no cgroup, and `sheepfold doctor` breaking one thing at a
//     time (template, runc, user namespaces). The guest's exit status comes
//     back through the 9p outbox; none is a failure;
package cgroupv2

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/client"
)

// env returns a required setting of the guest's run.
func env(t *testing.T, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: in-guest.sh sets it", name)
	}
	return v
}

// sandboxCgroups returns every cgroup directory named id.
func sandboxCgroups(t *testing.T, id string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir("/sys/fs/cgroup", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // cgroups come and go while we walk
		}
		if d.IsDir() && d.Name() == id {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func read(t *testing.T, dir, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func text(ex *client.Execution) string {
	for _, r := range ex.Results {
		if r.IsMainResult {
			return r.Text
		}
	}
	return ""
}

func TestServiceOnCgroupV2(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := client.New(env(t, "SHEEPFOLD_URL"), env(t, "SHEEPFOLD_API_KEY"))
	service := env(t, "SHEEPFOLD_SERVICE_CGROUP") // e.g. /system.slice/sheepfold.service

	v, err := c.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v.Cgroups != "v2" {
		t.Fatalf("server reports cgroups %q, want v2", v.Cgroups)
	}
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: 10 * time.Minute,
		Resources: &client.Resources{MemoryMB: 256, Pids: 64, CPUs: 0.5}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(context.Background(), sb.ID)

	ex, err := c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "1+1"})
	if err != nil || text(ex) != "2" {
		t.Fatalf("1+1: %v %+v", err, ex)
	}

	// One cgroup, inside the service's delegated one, with the limits.
	dirs := sandboxCgroups(t, sb.ID)
	if len(dirs) != 1 || !strings.HasPrefix(dirs[0], "/sys/fs/cgroup"+service+"/") {
		t.Fatalf("sandbox cgroups %v, want one under %s", dirs, service)
	}
	dir := dirs[0]
	t.Logf("sandbox cgroup %s", dir)
	for file, want := range map[string]string{
		"memory.max":      strconv.Itoa(256 << 20),
		"memory.high":     "max", // see oci.resources: throttling would stall, not help
		"memory.swap.max": "0",   // memory+swap = memory: never swapped out
		// The sandbox's 64 tasks, in its threaded child "tenant", and
		// the agent's reserve above them (oci.AgentPids, 64).
		"pids.max":           "128",
		"tenant/pids.max":    "64",
		"tenant/cgroup.type": "threaded",
		"cpu.max":            "50000 100000",
	} {
		if got := read(t, dir, file); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}

	t.Run("pids", func(t *testing.T) {
		ex, err := c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: `
import os, time
kids = []
try:
    for _ in range(200):
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        kids.append(pid)
    refused = False
except (BlockingIOError, OSError):
    refused = True
for pid in kids:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
(refused, len(kids))`})
		if err != nil || !strings.HasPrefix(text(ex), "(True, ") {
			t.Fatalf("forks past pids.max: %v %+v", err, ex)
		}
		n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(text(ex), "(True, "), ")"))
		if n >= 64 {
			t.Fatalf("%d forks with pids.max 64", n)
		}
	})

	t.Run("cpu quota", func(t *testing.T) {
		ex, err := c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: `
import time
end = time.monotonic() + 3
while time.monotonic() < end:
    pass`})
		if err != nil || ex.Status != client.StatusSuccess {
			t.Fatalf("busy loop: %v %+v", err, ex)
		}
		// Half a CPU: at most about half the wall time on the CPU.
		if ratio := ex.CPUTimeMS / ex.ExecutionTimeMS; ratio > 0.7 {
			t.Fatalf("cpu %.0f ms in %.0f ms (%.2f) with cpus 0.5", ex.CPUTimeMS, ex.ExecutionTimeMS, ratio)
		}
		if thr := read(t, dir, "cpu.stat"); !strings.Contains(thr, "nr_throttled") || strings.Contains(thr, "nr_throttled 0\n") {
			t.Fatalf("not throttled: %s", thr)
		}
	})

	t.Run("out of memory", func(t *testing.T) {
		ex, err := c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "a = []\nwhile True:\n    a.append(bytearray(16 << 20))", Timeout: 2 * time.Minute})
		if err != nil || ex.ErrorCode != "ERR_OUT_OF_MEMORY" {
			t.Fatalf("want ERR_OUT_OF_MEMORY: %v %+v", err, ex)
		}
		if ex.PeakMemoryBytes < 128<<20 {
			t.Fatalf("peak memory %d after filling 256 MiB", ex.PeakMemoryBytes)
		}
		n := read(t, dir, "memory.events") + "\n"
		if !strings.Contains(n, "oom_kill ") || strings.Contains(n, "oom_kill 0\n") {
			t.Fatalf("memory.events: %s", n)
		}

		ex, err = c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "'still ' + 'here'"})
		if err != nil || text(ex) != "'still here'" {
			t.Fatalf("sandbox unusable after OOM: %v %+v", err, ex)
		}
	})

	t.Run("pressure", func(t *testing.T) {
		// The busy loop above ran at half a CPU: the sandbox's PSI shows
		// it, through the API.
		req, _ := http.NewRequestWithContext(ctx, "GET", env(t, "SHEEPFOLD_URL")+"/v1/sandboxes/"+sb.ID+"?usage=1", nil)
		req.Header.Set("Authorization", "Bearer "+env(t, "SHEEPFOLD_API_KEY"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			Usage *struct {
				MemoryLimitBytes int64 `json:"memory_limit_bytes"`
				Pressure         *struct {
					CPUSome float64 `json:"cpu_some_avg10"`
				} `json:"pressure"`
			} `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET ?usage=1: %d %v", resp.StatusCode, err)
		}
		if out.Usage == nil || out.Usage.Pressure == nil || out.Usage.MemoryLimitBytes != 256<<20 {
			t.Fatalf("usage without pressure on cgroup v2: %+v", out.Usage)
		}
		t.Logf("cpu some avg10 %.2f%%", out.Usage.Pressure.CPUSome)
	})

	// Paused to disk by the CRIU the package installs: the sandbox's
	// cgroup goes while it is paused, and a variable and a file are
	// there after the resume, in a cgroup with the same limits.
	t.Run("pause", func(t *testing.T) {
		if ex, err := c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "kept = 41\nopen('/tmp/kept', 'w').write('file')"}); err != nil || ex.Error != nil {
			t.Fatalf("before the pause: %v %+v", err, ex)
		}
		p, err := c.PauseSandbox(ctx, sb.ID)
		if err != nil || p.State != "paused" {
			t.Fatalf("pause: %v %+v", err, p)
		}
		if dirs := sandboxCgroups(t, sb.ID); len(dirs) != 0 {
			t.Fatalf("a paused sandbox's cgroups: %v", dirs)
		}
		if _, err := c.ResumeSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		ex, err := c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "kept + 1, open('/tmp/kept').read()"})
		if err != nil || text(ex) != "(42, 'file')" {
			t.Fatalf("after the resume: %v %+v", err, ex)
		}
		dirs := sandboxCgroups(t, sb.ID)
		if len(dirs) != 1 || read(t, dirs[0], "memory.max") != strconv.Itoa(256<<20) || read(t, dirs[0], "tenant/pids.max") != "64" {
			t.Fatalf("the restored sandbox's cgroups %v", dirs)
		}
		dir = dirs[0]
	})

	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("cgroup %s still there after kill: %v", dir, err)
	}
}
