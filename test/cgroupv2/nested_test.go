//go:build cgroupv2guest

package cgroupv2

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sheepfold/sheepfold/client"
)

// allCaps is what a privileged container holds: everything the server
// needs to make user namespaces, mounts and cgroups for its sandboxes.
var allCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
	"CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE",
	"CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT",
	"CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
	"CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN",
	"CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
	"CAP_CHECKPOINT_RESTORE",
}

// TestServerInContainer runs `sheepfold serve` inside a container of its
// own (a nested `runc run`: private cgroup and mount namespaces, the
// cgroup filesystem mounted read-write, as a privileged container gets
// it). The server finds itself at the root of its cgroup namespace, moves
// into a leaf so that it may give controllers to its sandboxes' cgroups,
// and every sandbox's cgroup lies inside the container's. Stopping the
// server leaves nothing behind in the container's cgroup.
func TestServerInContainer(t *testing.T) {
	runc, bin := env(t, "SHEEPFOLD_RUNC"), env(t, "SHEEPFOLD_BIN_DIR")
	hostData := env(t, "SHEEPFOLD_DATA_DIR")
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()

	// The container's cgroup: a child of the one delegated to this run.
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	delegated := filepath.Dir(strings.TrimSpace(strings.TrimPrefix(string(own), "0::"))) // we sit in its supervisor leaf
	name := fmt.Sprintf("nested-%d", os.Getpid())
	cgPath := filepath.Join(delegated, name)
	cgDir := filepath.Join("/sys/fs/cgroup", cgPath)

	// The server's own data dir, with the host's template and runc bound
	// in; its database and an API key made before it starts.
	data := filepath.Join("/var/lib", name)
	for _, d := range []string{"templates", "bin"} {
		if err := os.MkdirAll(filepath.Join(data, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { os.RemoveAll(data) })
	keys := exec.Command(filepath.Join(bin, "sheepfold"), "keys", "create", "--name", "nested")
	keys.Env = append(os.Environ(), "SHEEPFOLD_DATA_DIR="+data)
	out, err := keys.CombinedOutput()
	key := regexp.MustCompile(`sf_[0-9a-f]{40}`).FindString(string(out))
	if err != nil || key == "" {
		t.Fatalf("keys create: %v\n%s", err, out)
	}

	// The container's root: an empty directory under which runc, in the
	// container's own mount namespace, binds what the server needs from
	// the guest (nothing is mounted in the guest's namespace).
	rootfs := t.TempDir()
	if err := os.MkdirAll("/run/sheepfold", 0o755); err != nil {
		t.Fatal(err)
	}
	ro := func(p string) specs.Mount {
		return specs.Mount{Destination: p, Type: "bind", Source: p, Options: []string{"rbind", "ro"}}
	}

	port := freePort(t)
	bundle := t.TempDir()
	spec := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Args: []string{filepath.Join(bin, "sheepfold"), "serve", "--listen", "127.0.0.1:" + strconv.Itoa(port), "--pool", "0"},
			Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				"SHEEPFOLD_DATA_DIR=" + data, "SHEEPFOLD_AGENT=" + filepath.Join(bin, "sheepfold-agent")},
			Cwd:          "/",
			Capabilities: &specs.LinuxCapabilities{Bounding: allCaps, Effective: allCaps, Permitted: allCaps},
			Rlimits:      []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 65536, Soft: 65536}},
		},
		Root:     &specs.Root{Path: rootfs},
		Hostname: "nested",
		Mounts: []specs.Mount{
			ro("/usr"), ro("/bin"), ro("/sbin"), ro("/lib"), ro("/lib64"), ro("/etc"), ro(bin),
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "mode=755"}},
			{Destination: "/sys", Type: "bind", Source: "/sys", Options: []string{"rbind", "ro"}},
			// Read-write and afresh: the container's cgroup namespace, where
			// the server makes its sandboxes' cgroups.
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "rw"}},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev"}},
			// Loop devices, for the sandboxes' disks: the control device
			// (the server makes the nodes of the devices it is given).
			{Destination: "/dev/loop-control", Type: "bind", Source: "/dev/loop-control", Options: []string{"bind"}},
			// The host-wide registry of sandboxes' id ranges, shared with
			// every engine on the guest.
			{Destination: "/run/sheepfold", Type: "bind", Source: "/run/sheepfold", Options: []string{"rbind", "rw"}},
			{Destination: data, Type: "bind", Source: data, Options: []string{"rbind", "rw"}},
			{Destination: filepath.Join(data, "templates"), Type: "bind", Source: filepath.Join(hostData, "templates"), Options: []string{"rbind", "ro"}},
			{Destination: filepath.Join(data, "bin"), Type: "bind", Source: filepath.Dir(runc), Options: []string{"rbind", "ro"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: cgPath,
			// As a privileged container has them: the loop devices.
			Resources: &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{
				{Allow: true, Type: "b", Major: ptr(int64(7)), Access: "rwm"},
				{Allow: true, Type: "c", Major: ptr(int64(10)), Minor: ptr(int64(237)), Access: "rwm"},
			}},
			// No PID namespace: the server's orphans (sandboxes' runc
			// processes) are reaped by the guest's init, as under systemd.
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.MountNamespace}, {Type: specs.CgroupNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
			},
		},
	}
	cj, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), cj, 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(bundle, "state")
	logPath := filepath.Join(bundle, "server.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	srv := exec.Command(runc, "--root", state, "run", "--bundle", bundle, name)
	srv.Stdout, srv.Stderr = logf, logf
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	stopped := false
	defer func() {
		if !stopped {
			exec.Command(runc, "--root", state, "kill", name, "KILL").Run()
			<-exited
		}
		exec.Command(runc, "--root", state, "delete", "--force", name).Run()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("the nested server's log:\n%s", b)
		}
	}()

	url := "http://127.0.0.1:" + strconv.Itoa(port)
	c := client.New(url, key)
	var v *client.Version
	for {
		if v, err = c.Version(ctx); err == nil {
			break
		}
		select {
		case err := <-exited:
			stopped = true
			t.Fatalf("the nested server exited: %v", err)
		case <-ctx.Done():
			t.Fatalf("the nested server never answered: %v", err)
		case <-time.After(time.Second):
		}
	}
	if v.Cgroups != "v2" {
		t.Fatalf("nested server reports cgroups %q, want v2", v.Cgroups)
	}
	// The server left its namespace's root for the leaf.
	if b, err := os.ReadFile(filepath.Join(cgDir, "supervisor", "cgroup.procs")); err != nil || len(strings.Fields(string(b))) == 0 {
		t.Fatalf("no process in %s/supervisor: %v %q", cgDir, err, b)
	}

	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: 5 * time.Minute, Resources: &client.Resources{MemoryMB: 192, Pids: 64}})
	if err != nil {
		t.Fatal(err)
	}
	ex, err := c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "6*7"})
	if err != nil || text(ex) != "42" {
		t.Fatalf("6*7 in a sandbox of the nested server: %v %+v", err, ex)
	}
	dirs := sandboxCgroups(t, sb.ID)
	if len(dirs) != 1 || !strings.HasPrefix(dirs[0], cgDir+"/") {
		t.Fatalf("sandbox cgroups %v, want one inside the container's %s", dirs, cgDir)
	}
	// The memory alone: the sandbox's disk is its own (a disk kept in
	// memory would add its 256 MiB).
	if got := read(t, dirs[0], "memory.max"); got != strconv.Itoa(192<<20) {
		t.Fatalf("memory.max %s, want %d", got, 192<<20)
	}

	// A clean stop: the server destroys its sandboxes and their cgroups.
	if err := exec.Command(runc, "--root", state, "kill", name, "TERM").Run(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		stopped = true
	case <-time.After(3 * time.Minute):
		t.Fatal("the nested server did not stop within 3 minutes of SIGTERM")
	}
	var left []string
	filepath.WalkDir(cgDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && p != cgDir && filepath.Base(p) != "supervisor" {
			left = append(left, p)
		}
		return nil
	})
	if len(left) > 0 {
		t.Fatalf("cgroups left in the container's after the server stopped: %v", left)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func ptr[T any](v T) *T { return &v }
