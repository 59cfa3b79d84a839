package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/template"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// host is a fake root with the files a healthy cgroup-v2 host has.
func host(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{
		"proc/sys/kernel/osrelease":                             "6.8.0-45-generic",
		"proc/sys/user/max_user_namespaces":                     "63000",
		"sys/fs/cgroup/cgroup.controllers":                      "cpuset cpu io memory hugetlb pids rdma misc",
		"proc/filesystems":                                      "nodev\ttmpfs\n\text4\nnodev\toverlay\n",
		"proc/self/status":                                      "Name:\tcat\nNoNewPrivs:\t0\nSeccomp:\t0\nSeccomp_filters:\t0\n",
		"proc/sys/kernel/seccomp/actions_avail":                 "kill_process kill_thread trap errno user_notif trace log allow",
		"proc/meminfo":                                          "MemTotal:       24000000 kB\nMemFree:  1 kB\nMemAvailable:   20000000 kB\n",
		"proc/sys/fs/inotify/max_user_instances":                "8192",
		"proc/sys/kernel/pid_max":                               "4194304",
		"proc/sys/kernel/apparmor_restrict_unprivileged_userns": "0",
	}
	for p, body := range files {
		write(t, filepath.Join(root, p), body)
	}
	return root
}

func write(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fakeRuncs are scripts that answer --version and features as a runc of
// a version would, by "version seccomp" ("1.5.3 true"). They are written
// in TestMain, before any test runs: a script written while a parallel
// test forks can be held open for writing by the child until it execs, and
// running it then fails with ETXTBSY ("text file busy").
var fakeRuncs = map[string]string{}

func writeFakeRuncs() (cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "doctor-runc")
	if err != nil {
		return nil, err
	}
	for _, v := range []string{"1.1.5", "1.3.2", "1.4.0-rc.2", "1.5.3"} {
		for _, seccomp := range []bool{true, false} {
			key := fmt.Sprintf("%s %v", v, seccomp)
			p := filepath.Join(dir, strings.ReplaceAll(key, " ", "-"), "runc")
			feat := fmt.Sprintf(`{"linux":{"seccomp":{"enabled":%v}}}`, seccomp)
			body := "#!/bin/sh\nif [ \"$1\" = --version ]; then printf 'runc version " + v + "\\nspec: 1.3.0\\n'; else echo '" + feat + "'; fi\n"
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return nil, err
			}
			if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
				return nil, err
			}
			fakeRuncs[key] = p
			criu := "#!/bin/sh\nprintf 'Version: 4.2.1\\nGitID: " + CriuPatchSet + "\\n'\n"
			if err := os.WriteFile(filepath.Join(filepath.Dir(p), "criu"), []byte(criu), 0o755); err != nil {
				return nil, err
			}
		}
	}
	// Debian bookworm's CRIU, which fails on kernels past 6.13.
	debian := filepath.Join(dir, "criu-3.17", "criu")
	if err := os.MkdirAll(filepath.Dir(debian), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(debian, []byte("#!/bin/sh\nprintf 'Version: 3.17.1\\n'\n"), 0o755); err != nil {
		return nil, err
	}
	fakeRuncs["criu 3.17"] = debian
	return func() { os.RemoveAll(dir) }, nil
}

// fakeRunc returns the script of a runc of the given version.
func fakeRunc(t *testing.T, version string, seccomp bool) string {
	t.Helper()
	p, ok := fakeRuncs[fmt.Sprintf("%s %v", version, seccomp)]
	if !ok {
		t.Fatalf("no fake runc %s (seccomp %v): add it to writeFakeRuncs", version, seccomp)
	}
	return p
}

// dataDir makes a data dir holding a complete fake python template.
func dataDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	tpl := filepath.Join(dir, "templates", "python")
	for _, p := range []string{"usr/bin/python3", "usr/bin/node", "bin/bash", "etc/passwd"} {
		write(t, filepath.Join(tpl, "rootfs", p), "")
	}
	info, _ := json.Marshal(template.Info{Name: "python", Version: template.FormatVersion})
	write(t, filepath.Join(tpl, "template.json"), string(info))
	return dir
}

func options(t *testing.T) Options {
	agent := filepath.Join(t.TempDir(), "agent")
	write(t, agent, "")
	if err := os.Chmod(agent, 0o755); err != nil {
		t.Fatal(err)
	}
	runc := fakeRunc(t, "1.5.3", true)
	runsc := filepath.Join(t.TempDir(), "runsc")
	write(t, runsc, "#!/bin/sh\n")
	write(t, runsc+".version", GVisorVersion+"\n")
	if err := os.Chmod(runsc, 0o755); err != nil {
		t.Fatal(err)
	}
	return Options{RunscPath: runsc,
		Root: host(t), DataDir: dataDir(t), RuntimePath: runc, CriuPath: filepath.Join(filepath.Dir(runc), "criu"), AgentPath: agent,
		MaxSandboxes: 64, PoolSize: 2, SandboxMemory: 512 << 20, SandboxDisk: 256 << 20, SandboxPids: 256,
		HostCounters: map[string]int64{"/proc/sys/fs/inotify/max_user_instances": 256},
	}
}

func find(t *testing.T, rs []Result, check string) Result {
	t.Helper()
	for _, r := range rs {
		if r.Check == check {
			return r
		}
	}
	t.Fatalf("no %s check in %v", check, rs)
	return Result{}
}

func TestHealthyHost(t *testing.T) {
	t.Parallel()
	rs := Run(context.Background(), options(t))
	for _, r := range rs {
		if r.Status != OK {
			t.Errorf("%s: %s %s", r.Check, r.Status, r.Detail)
		}
	}
	if Failed(rs) {
		t.Error("Failed says a healthy host failed")
	}
	if got := strings.Count(Format(rs), "\n"); got != len(rs) {
		t.Errorf("Format printed %d lines for %d checks", got, len(rs))
	}
}

// Each case breaks one thing on a healthy host and expects that check, and
// only that check, to say so.
func TestOneThingBroken(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		breakf func(t *testing.T, o *Options)
		check  string
		status Status
		detail string
	}{
		{"old kernel", func(t *testing.T, o *Options) {
			write(t, filepath.Join(o.Root, "proc/sys/kernel/osrelease"), "5.4.0-1")
		},
			"kernel", Fail, "older than 5.6"},
		{"kernel without cgroup.kill", func(t *testing.T, o *Options) {
			write(t, filepath.Join(o.Root, "proc/sys/kernel/osrelease"), "5.10.0-30-amd64")
		}, "kernel", Warn, "cgroup.kill"},
		{"user namespaces off", func(t *testing.T, o *Options) {
			write(t, filepath.Join(o.Root, "proc/sys/user/max_user_namespaces"), "0")
		}, "userns", Fail, "max_user_namespaces is 0"},
		{"no user namespaces at all", func(t *testing.T, o *Options) {
			os.Remove(filepath.Join(o.Root, "proc/sys/user/max_user_namespaces"))
		}, "userns", Fail, "not available"},
		{"cgroup v2 without memory", func(t *testing.T, o *Options) {
			write(t, filepath.Join(o.Root, "sys/fs/cgroup/cgroup.controllers"), "cpu io pids")
		}, "cgroups", Fail, "memory"},
		{"cgroup v2 without io", func(t *testing.T, o *Options) {
			write(t, filepath.Join(o.Root, "sys/fs/cgroup/cgroup.controllers"), "cpu memory pids")
		}, "cgroups", Warn, "no io"},
		{"no cgroups", func(t *testing.T, o *Options) {
			os.Remove(filepath.Join(o.Root, "sys/fs/cgroup/cgroup.controllers"))
		}, "cgroups", Fail, "no cgroup v2"},
		{"no overlayfs", func(t *testing.T, o *Options) {
			write(t, filepath.Join(o.Root, "proc/filesystems"), "nodev\ttmpfs\n\text4\n")
		}, "overlay", Fail, "not available"},
		{"overlayfs a module not loaded yet", func(t *testing.T, o *Options) {
			write(t, filepath.Join(o.Root, "proc/filesystems"), "nodev\ttmpfs\n\text4\n")
			write(t, filepath.Join(o.Root, "lib/modules/6.8.0-45-generic/kernel/fs/overlayfs/overlay.ko.zst"), "")
		}, "overlay", OK, "a module"},
		{"no seccomp", func(t *testing.T, o *Options) {
			write(t, filepath.Join(o.Root, "proc/self/status"), "Name:\tcat\n")
		}, "seccomp", Fail, "not available"},
		{"seccomp without user notification", func(t *testing.T, o *Options) {
			write(t, filepath.Join(o.Root, "proc/sys/kernel/seccomp/actions_avail"), "kill_process errno trace allow")
		}, "seccomp", Warn, "without user notification"},
		{"runc missing", func(t *testing.T, o *Options) { o.RuntimePath = filepath.Join(o.Root, "nope") },
			"runtime", Fail, "not an executable"},
		{"Debian's runc 1.1.5", func(t *testing.T, o *Options) { o.RuntimePath = fakeRunc(t, "1.1.5", true) },
			"runtime", Fail, "security fixes"},
		{"runc 1.3.2", func(t *testing.T, o *Options) { o.RuntimePath = fakeRunc(t, "1.3.2", true) },
			"runtime", Fail, "security fixes"},
		{"runc 1.4.0-rc.2", func(t *testing.T, o *Options) { o.RuntimePath = fakeRunc(t, "1.4.0-rc.2", true) },
			"runtime", Fail, "security fixes"},
		{"runc without seccomp", func(t *testing.T, o *Options) { o.RuntimePath = fakeRunc(t, "1.5.3", false) },
			"runtime", Fail, "without seccomp"},
		{"not runc", func(t *testing.T, o *Options) { o.RuntimePath = "/bin/true" },
			"runtime", Fail, "is not runc"},
		{"agent missing", func(t *testing.T, o *Options) { o.AgentPath = "" }, "agent", Fail, "not an executable"},
		{"no runsc", func(t *testing.T, o *Options) { o.RunscPath = "" }, "gvisor", Warn, "sandboxes run under runc only"},
		{"runsc not the set-up's", func(t *testing.T, o *Options) { write(t, o.RunscPath+".version", "v0.0.0-1\n") },
			"gvisor", Warn, "not the set-up's build"},
		{"runsc built with cgo", func(t *testing.T, o *Options) {
			// A dynamically linked ELF: /bin/true is one on every host we run.
			b, err := os.ReadFile("/bin/true")
			if err != nil {
				t.Fatal(err)
			}
			write(t, o.RunscPath, string(b))
		}, "gvisor", Warn, "linked dynamically"},
		{"criu missing", func(t *testing.T, o *Options) { o.CriuPath = filepath.Join(o.Root, "criu") },
			"checkpoints", Warn, "cannot be checkpointed"},
		{"Debian's criu 3.17", func(t *testing.T, o *Options) { o.CriuPath = fakeRuncs["criu 3.17"] },
			"checkpoints", Warn, `CRIU "3.17.1"`},
		{"no template", func(t *testing.T, o *Options) { os.RemoveAll(filepath.Join(o.DataDir, "templates")) },
			"template", Fail, "not built"},
		{"template without node", func(t *testing.T, o *Options) {
			os.Remove(filepath.Join(o.DataDir, "templates/python/rootfs/usr/bin/node"))
		}, "template", Fail, "no /usr/bin/node"},
		{"little memory for the pool", func(t *testing.T, o *Options) {
			write(t, filepath.Join(o.Root, "proc/meminfo"), "MemTotal: 1000000 kB\nMemAvailable: 600000 kB\n")
			o.PoolSize = 8
		}, "memory", Warn, "the pool of 8"},
		{"disks of their own", func(t *testing.T, o *Options) { o.Disks = func() error { return nil } },
			"disks", OK, "an ext4 image of its own on a loop device"},
		{"no loop devices", func(t *testing.T, o *Options) {
			o.Disks = func() error { return errors.New("no loop devices (modprobe loop)") }
		}, "disks", Warn, "kept in memory, their memory limit holding memory plus disk: no loop devices"},
		{"CDI devices", func(t *testing.T, o *Options) {
			o.Devices = func() ([]string, error) { return []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1"}, nil }
		}, "devices", OK, "2 CDI devices sandboxes may ask for: nvidia.com/gpu=0, nvidia.com/gpu=1"},
		{"no CDI devices", func(t *testing.T, o *Options) { o.Devices = func() ([]string, error) { return nil, nil } },
			"devices", OK, "no CDI devices"},
		{"a broken CDI spec", func(t *testing.T, o *Options) {
			o.Devices = func() ([]string, error) {
				return []string{"a.com/b=c"}, errors.New("CDI specs that cannot be read: /etc/cdi/x.json: bad kind")
			}
		}, "devices", Warn, "1 CDI devices sandboxes may ask for (a.com/b=c), but not those of CDI specs that cannot be read: /etc/cdi/x.json: bad kind"},
		{"no room for the pool's disks", func(t *testing.T, o *Options) {
			o.Disks = func() error { return nil }
			o.SandboxDisk = 1 << 50
		}, "disk", Warn, "the disks of a pool of 2"},
		{"no per-sandbox limits", func(t *testing.T, o *Options) { o.HostCounters = nil },
			"counters", Warn, "no per-namespace limits"},
		{"host inotify limit too low", func(t *testing.T, o *Options) {
			write(t, filepath.Join(o.Root, "proc/sys/fs/inotify/max_user_instances"), "128")
		}, "counters", Warn, "fs.inotify.max_user_instances is 128, under the 256"},
		{"pid space too small", func(t *testing.T, o *Options) {
			write(t, filepath.Join(o.Root, "proc/sys/kernel/pid_max"), "32768")
		}, "counters", Warn, "kernel.pid_max"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			o := options(t)
			c.breakf(t, &o)
			rs := Run(context.Background(), o)
			for _, r := range rs {
				if r.Check == c.check {
					if r.Status != c.status || !strings.Contains(r.Detail, c.detail) {
						t.Errorf("%s: got %s %q, want %s containing %q", r.Check, r.Status, r.Detail, c.status, c.detail)
					}
					if r.Status != OK && r.Fix == "" && r.Status == Fail {
						t.Errorf("%s fails without saying how to fix it", r.Check)
					}
				} else if r.Status != OK {
					t.Errorf("%s also reports %s: %s", r.Check, r.Status, r.Detail)
				}
			}
			if Failed(rs) != (c.status == Fail) {
				t.Errorf("Failed = %v with %s %s", Failed(rs), c.check, c.status)
			}
		})
	}
}

// TestSeccompTSYNCESRCH: Linux 5.6 passes the kernel check (with a warning)
// but cannot give a filter that syncs all threads a listener, which
// allow_subprocess: false needs.
func TestSeccompTSYNCESRCH(t *testing.T) {
	t.Parallel()
	o := options(t)
	write(t, filepath.Join(o.Root, "proc/sys/kernel/osrelease"), "5.6.19")
	if r := find(t, Run(context.Background(), o), "seccomp"); r.Status != Warn || !strings.Contains(r.Detail, "allow_subprocess") {
		t.Fatalf("%+v", r)
	}
}

func TestRuncVersions(t *testing.T) {
	t.Parallel()
	for out, fixed := range map[string]bool{
		"runc version 1.1.5\n":            false,
		"runc version 1.2.7\n":            false,
		"runc version 1.2.8\n":            true,
		"runc version 1.3.3-rc.1\n":       false,
		"runc version 1.3.3\n":            true,
		"runc version 1.4.0-rc.2\n":       false,
		"runc version 1.4.0\n":            true,
		"runc version 1.5.3\ncommit: x\n": true,
		"runc version 2.0.0\n":            true,
	} {
		v, _, pre, ok := parseRunc(out)
		if !ok {
			t.Errorf("%q: not parsed", out)
			continue
		}
		if runcFixed(v, pre) != fixed {
			t.Errorf("%q: fixed = %v, want %v", out, !fixed, fixed)
		}
	}
	if _, _, _, ok := parseRunc("crun version 1.8\n"); ok {
		t.Error("crun's output parsed as runc")
	}
}

func TestJSON(t *testing.T) {
	t.Parallel()
	b, err := JSON([]Result{{Check: "kernel", Status: OK, Detail: "Linux 6.18"}, {Check: "runtime", Status: Fail, Detail: "x", Fix: "y"}})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		OK     bool     `json:"ok"`
		Checks []Result `json:"checks"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.OK || len(got.Checks) != 2 || got.Checks[1].Fix != "y" {
		t.Errorf("JSON = %s", b)
	}
}

// TestThisHost runs every check, the live probes included, on the real
// host with the real data dir: as root (as in CI, after `make template`)
// nothing may fail, and the overlay probe leaves nothing behind.
func TestThisHost(t *testing.T) {
	testutil.RequireRoot(t)
	data := testutil.DataDir()
	o := Options{
		DataDir: data, RuntimePath: testutil.Runc(t), AgentPath: testutil.AgentBin(t),
		MaxSandboxes: 8, PoolSize: 1, SandboxMemory: 512 << 20, SandboxDisk: 256 << 20, SandboxPids: 256,
		HostCounters: oci.HostLimitMinimums(),
	}
	testutil.TemplateRootFS(t, "python")
	rs := Run(context.Background(), o)
	t.Log("\n" + Format(rs))
	for _, r := range rs {
		if r.Status == Fail {
			t.Errorf("%s fails on this host: %s", r.Check, r.Detail)
		}
	}
	if find(t, rs, "overlay").Detail == "overlayfs available" {
		t.Error("the live overlay probe did not run")
	}
	left, _ := filepath.Glob(filepath.Join(data, ".doctor-*"))
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if len(left) > 0 || strings.Contains(string(mounts), ".doctor-") {
		t.Errorf("the overlay probe left %v behind", left)
	}
}

func TestMain(m *testing.M) {
	cleanup, err := writeFakeRuncs()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake runcs:", err)
		os.Exit(1)
	}
	testutil.Main(m, cleanup)
}

// TestMemoryCountsDisksInMemoryOnly: the memory check counts a sandbox's
// disk as memory only where disks are kept in memory.
func TestMemoryCountsDisksInMemoryOnly(t *testing.T) {
	t.Parallel()
	o := options(t)
	o.Disks = func() error { return nil }
	if r := find(t, Run(context.Background(), o), "memory"); !strings.Contains(r.Detail, "64 sandboxes at their default limits may use 32768 MiB") {
		t.Errorf("disks of their own: %q", r.Detail)
	}
	o.Disks = func() error { return errors.New("no loop devices") }
	if r := find(t, Run(context.Background(), o), "memory"); !strings.Contains(r.Detail, "may use 49152 MiB") {
		t.Errorf("disks in memory: %q", r.Detail)
	}
}

// TestGVisorPinnedAsGoMod: the runsc the set-up builds is the gVisor
// version go.mod pins (scripts/setup.sh reads go.mod), which doctor
// expects.
func TestGVisorPinnedAsGoMod(t *testing.T) {
	b, err := os.ReadFile("../../go.mod")
	if err != nil && testutil.InGuest() {
		t.Skip("the cgroup v2 guest has no source tree")
	}
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "gvisor.dev/gvisor "+GVisorVersion+"\n") {
		t.Fatalf("go.mod does not pin gvisor.dev/gvisor %s (GVisorVersion): update one or the other", GVisorVersion)
	}
}
