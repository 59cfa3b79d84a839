package agent

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/testutil"
)

// cgroup2Mount is where this host's cgroup2 hierarchy is mounted: the
// whole of /sys/fs/cgroup (v2) or /sys/fs/cgroup/unified (hybrid v1); "".
func cgroup2Mount() string {
	for _, m := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		var st unix.Statfs_t
		if unix.Statfs(m, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return m
		}
	}
	return ""
}

// TestStartInTenantCgroup2 runs StartIn as a sandbox's agent does on
// cgroup v2, against the kernel: in a user namespace of its own (its root
// a host uid that is not root) and a cgroup namespace rooted at the
// sandbox's cgroup, holding that cgroup's directory as the host opened it.
// The host then makes the threaded leaf "tenant" and gives the agent its
// cgroup.threads and the sandbox's cgroup.procs (as oci.makeTenant does).
// The process StartIn starts must be in "tenant", the agent's own threads
// must stay out. The control: without the files given, the kernel refuses
// the move and nothing starts. (The pids controller itself is not needed
// for the kernel's checks, and a hybrid host's cgroup2 hierarchy has
// none; the pids limit's side is TestForkBombSparesTheAgent.)
func TestStartInTenantCgroup2(t *testing.T) {
	if os.Getenv("SHEEPFOLD_TENANT_AGENT") == "1" {
		tenantAgent()
		return
	}
	testutil.RequireRoot(t)
	mount := cgroup2Mount()
	if mount == "" {
		t.Skip("no cgroup2 hierarchy on this host")
	}
	for _, give := range []bool{true, false} {
		t.Run(fmt.Sprintf("given_%v", give), func(t *testing.T) {
			sb := filepath.Join(mount, fmt.Sprintf("sheepfold-agent-test-%d", os.Getpid()))
			if err := os.Mkdir(sb, 0o755); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				for _, d := range []string{filepath.Join(sb, "tenant"), sb} {
					for end := time.Now().Add(10 * time.Second); unix.Rmdir(d) == unix.EBUSY && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
					}
				}
			})
			dir, err := os.Open(sb)
			if err != nil {
				t.Fatal(err)
			}
			defer dir.Close()
			const hostRoot = 100000 // the "sandbox's" root on the host
			cmd := exec.Command("/proc/self/exe", "-test.run=^TestStartInTenantCgroup2$")
			cmd.Env = append(os.Environ(), "SHEEPFOLD_TENANT_AGENT=1")
			cmd.ExtraFiles = []*os.File{dir} // fd 3
			cmd.SysProcAttr = &syscall.SysProcAttr{
				Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWCGROUP,
				UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostRoot, Size: 65536}},
				GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostRoot, Size: 65536}},
				Credential:  &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: true},
				UseCgroupFD: true, CgroupFD: int(dir.Fd()),
			}
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Wait()
			out := bufio.NewScanner(stdout)
			if !out.Scan() || out.Text() != "ready" {
				t.Fatalf("the agent did not start: %q", out.Text())
			}
			tenant := filepath.Join(sb, "tenant")
			if err := os.Mkdir(tenant, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(tenant, "cgroup.type"), []byte("threaded"), 0); err != nil {
				t.Fatal(err)
			}
			if give {
				for _, f := range []string{filepath.Join(tenant, "cgroup.threads"), filepath.Join(sb, "cgroup.procs")} {
					if err := os.Chown(f, hostRoot, -1); err != nil {
						t.Fatal(err)
					}
				}
			}
			stdin.Write([]byte("go\n"))
			var lines []string
			for out.Scan() {
				lines = append(lines, out.Text())
			}
			got := strings.Join(lines, "\n")
			if give && got != "ns=0::/\nstarted=0::/tenant\nagent=0::/" {
				t.Errorf("the agent reports\n%s\nwant its cgroup namespace at the sandbox's cgroup, the process in tenant and itself outside it", got)
			}
			if !give && (!strings.Contains(got, "permission denied") || strings.Contains(got, "started=")) {
				t.Errorf("without the files given, the agent reports\n%s\nwant the move refused and nothing started", got)
			}
		})
	}
}

// tenantAgent is the agent's side of TestStartInTenantCgroup2: once the
// host has made the tenant, its cgroup (the namespace's root, "0::/"),
// the cgroup of a process started through StartIn and its own again. It
// runs as uid 0 of its user namespace, host uid 100000.
func tenantAgent() {
	own := func(path string) string {
		b, _ := os.ReadFile(path)
		for line := range strings.Lines(string(b)) {
			if strings.HasPrefix(line, "0::") {
				return strings.TrimSpace(line)
			}
		}
		return "none"
	}
	fmt.Println("ready")
	bufio.NewReader(os.Stdin).ReadString('\n')
	fmt.Printf("ns=%s\n", own("/proc/self/cgroup"))
	if err := UseTenantCgroup(3); err != nil {
		fmt.Printf("error %v\n", err)
		os.Exit(0)
	}
	var cg []byte
	err := StartIn(nil, "", func() (err error) {
		cg, err = exec.Command("cat", "/proc/self/cgroup").Output()
		return err
	})
	if err != nil {
		fmt.Printf("error %v\n", err)
		os.Exit(0)
	}
	for line := range strings.Lines(string(cg)) {
		if strings.HasPrefix(line, "0::") {
			fmt.Printf("started=%s\n", strings.TrimSpace(line))
		}
	}
	fmt.Printf("agent=%s\n", own("/proc/self/cgroup"))
	os.Exit(0)
}
