package oci

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/runtime"
)

// gVisor (runsc) sandboxes. A sandbox whose Spec.Runtime is RuntimeGVisor
// (or empty, with Config.DefaultRuntime RuntimeGVisor) is run by runsc
// from a spec of its own (buildRunscSpec), in the same bundle layout, on
// the same disk and overlay, in the same cgroup as a runc sandbox; what
// differs:
//
//   - Kernel: every system call of the sandbox's processes is served by
//     the Sentry, gVisor's kernel in user space (platform systrap), which
//     itself runs in the sandbox's cgroup under runsc's own seccomp filter
//     on the host. The spec's seccomp profile (SeccompProfile) is applied
//     inside the Sentry (--oci-seccomp), to the tenant's processes, as a
//     second filter; the spec's capabilities and no_new_privs are the
//     Sentry's.
//   - Ids: runsc makes the user namespace of its Sentry and gofer itself,
//     so the spec joins none; the template is seen through an idmapped
//     mount owned by 0..65535 (the ids the Sentry shows), and the
//     sandbox's host id range only owns its bundle. The per-user counters
//     (inotify, message queues, namespaces) are the Sentry's, not the
//     host kernel's: no NamespaceLimits are written.
//   - Agent channel: runsc cannot accept on a listening socket passed in
//     from the host (EINVAL), so the agent listens itself (init --listen)
//     at runscSocketDir/agent.sock, on a directory of the bundle
//     (runscSocketHost, 0700, root's) bind-mounted there; runsc's gofer
//     creates the host socket (--host-uds=create: binding, never
//     connecting out). Code inside the sandbox could replace that socket
//     with a symlink to another socket of the host, so the host checks
//     every connection's peer (dialRunsc): the process that listens must
//     be in this sandbox's own cgroup (the gofer is).
//   - Pids: the tenant's processes are the Sentry's tasks, which the host
//     kernel does not count one by one: the sandbox's limit is the
//     Sentry's RLIMIT_NPROC on every process the agent starts (its
//     --nproc), and the host's pids cgroup bounds the Sentry's, the
//     gofer's and the platform's own tasks (twice the limit plus
//     runscPids); no tenant cgroup is made.
//   - Network: for a sandbox with one, the engine makes its network
//     namespace (bound at runscNetns in the bundle, lo up) and the egress
//     gateway puts its TUN device there (runtime.Network.AttachNetns)
//     before runsc runs with --network=sandbox: the Sentry starts in that
//     namespace and takes the device (a packet socket on it, for its own
//     network stack; the host's address of it removed), so that the
//     sandbox's packets reach the gateway as a runc sandbox's do. runsc's
//     netstack cannot be handed a device otherwise (no flag takes a
//     descriptor; its plugin stack needs a cgo build, which does not run
//     here), and the gateway stays the same for both runtimes. Without a
//     network, --network=none: the Sentry's own loopback alone.
//   - Not offered (runtime.ErrUnsupported): persistent volumes,
//     checkpoint, snapshot and clone (CRIU). Freeze and thaw are runsc
//     pause and resume.
//   - Teardown: the cgroup kill (Sentry and gofer at once), then `runsc
//     delete --force`, then runc's steps (which unmount the bundle's
//     network namespace); runsc's own state is in the instance's
//     runscDir, whose shared network namespace file (null-netns, a mount)
//     Close unmounts with the rest of the instance.

const (
	// gvisorMarker, in a bundle, says that runsc runs the sandbox; it is
	// written before anything else of the sandbox exists.
	gvisorMarker = "gvisor"
	// runscSocketHost is the bundle's directory holding the agent's
	// socket, bind-mounted at runscSocketDir.
	runscSocketHost = "agent-run"
	runscSocketDir  = "/.sheepfold/run"
	// runscNetns, in a bundle, is the bind mount of a networked gVisor
	// sandbox's network namespace (attachRunscNet).
	runscNetns = "netns"
)

// runscPids is what a gVisor sandbox's pids cgroup holds beyond twice
// its pids limit: the Sentry's and the gofer's threads.
const runscPids = 256

// runscFlags are runsc's global flags for every command of an instance;
// network is its --network: "none" (the sandbox's own loopback alone), or
// "sandbox" for one whose network namespace (runscNetns) holds the egress
// gateway's device.
func (o *OCI) runscFlags(network string) []string {
	return []string{
		"--root", o.runscDir,
		"--network=" + network,
		"--overlay2=none",   // the engine's overlay on the sandbox's disk is the root
		"--host-uds=create", // the agent's socket (and no connecting out)
		"--oci-seccomp",     // the spec's profile inside the Sentry too
	}
}

func (o *OCI) runsc(ctx context.Context, args ...string) *exec.Cmd {
	return o.runscNet(ctx, "none", args...)
}

func (o *OCI) runscNet(ctx context.Context, network string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, o.cfg.RunscPath, append(o.runscFlags(network), args...)...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	return cmd
}

// gvisor says whether sandbox id is run by runsc.
func (o *OCI) gvisor(id string) bool {
	_, err := os.Stat(filepath.Join(o.bundle(id), gvisorMarker))
	return err == nil
}

// Runtimes implements runtime.Chooser: runc always, gVisor where runsc is
// configured.
func (o *OCI) Runtimes() []string {
	if o.cfg.RunscPath == "" {
		return []string{RuntimeRunc}
	}
	return []string{RuntimeGVisor, RuntimeRunc}
}

// DefaultRuntime is the runtime of a sandbox that names none.
func (o *OCI) DefaultRuntime() string { return o.cfg.DefaultRuntime }

// flavour resolves a spec's runtime choice.
func (o *OCI) flavour(choice string) (string, error) {
	if choice == "" {
		choice = o.cfg.DefaultRuntime
	}
	switch {
	case choice == RuntimeRunc || choice == o.Name():
		return RuntimeRunc, nil
	case choice == RuntimeGVisor && o.cfg.RunscPath != "":
		return RuntimeGVisor, nil
	case choice == RuntimeGVisor:
		return "", fmt.Errorf("%w: runtime %q: gVisor's runsc is not installed on this host (make setup builds it)", ErrNoRunsc, choice)
	}
	return "", fmt.Errorf("%w: runtime %q: this host offers %s", runtime.ErrUnsupported, choice, strings.Join(o.Runtimes(), ", "))
}

// ErrNoRunsc reports a sandbox asking for gVisor on an engine without
// runsc.
var ErrNoRunsc = fmt.Errorf("%w: gVisor is not installed", runtime.ErrUnsupported)

// buildRunscSpec is buildSpec for runsc: no user namespace to join, no
// per-user sysctls (the Sentry's), no descriptors passed; the agent
// listens on runscSocketDir itself.
func buildRunscSpec(in specInput, sockDir string) (*specs.Spec, error) {
	in.Userns = "-" // buildSpec wants one; removed below
	spec, err := buildSpec(in)
	if err != nil {
		return nil, err
	}
	spec.Linux.Namespaces = slices.DeleteFunc(spec.Linux.Namespaces, func(n specs.LinuxNamespace) bool {
		return n.Type == specs.UserNamespace || n.Type == specs.CgroupNamespace
	})
	spec.Linux.Sysctl = nil
	if in.Netns != "" {
		for i, n := range spec.Linux.Namespaces {
			if n.Type == specs.NetworkNamespace {
				spec.Linux.Namespaces[i].Path = in.Netns
			}
		}
	}
	for i, r := range spec.Linux.Seccomp.Syscalls {
		if slices.Equal(r.Names, []string{"clone3"}) {
			spec.Linux.Seccomp.Syscalls[i].Action = specs.ActAllow
		}
	}
	spec.Annotations = nil // the CRIU annotations: no checkpoint under runsc
	spec.Process.Args = append(append([]string{AgentPath, "init"}, RlimitFlags...), "--listen", runscSocketDir+"/agent.sock")
	spec.Process.Args = append(spec.Process.Args, runtime.AgentDefaults(in.Spec)...)
	if l := in.Spec.Limits.Pids; l > 0 {
		// The tenant's limit is the Sentry's RLIMIT_NPROC on each process
		// the agent starts; the host's pids cgroup bounds the Sentry's
		// own tasks, with room for its threads and the platform's stubs.
		spec.Process.Args = append(spec.Process.Args, fmt.Sprintf("--nproc=%d", l))
		n := 2*l + runscPids
		spec.Linux.Resources.Pids = &specs.LinuxPids{Limit: &n}
	}
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: runscSocketDir, Type: "bind", Source: sockDir,
		Options: []string{"bind", "rw", "nosuid", "nodev", "noexec"}})
	// runsc mounts a tmpfs of its own at an empty /tmp that the spec does
	// not mount: writable on a read-only root, and outside the disk. The
	// root's own /tmp, bound there, keeps both as under runc.
	if !slices.ContainsFunc(spec.Mounts, func(m specs.Mount) bool { return m.Destination == "/tmp" }) {
		mode := "rw"
		if in.Spec.ReadOnly {
			mode = "ro"
		}
		// Before the writable paths below it, which it would hide.
		at := slices.IndexFunc(spec.Mounts, func(m specs.Mount) bool { return strings.HasPrefix(m.Destination, "/tmp/") })
		if at < 0 {
			at = len(spec.Mounts)
		}
		spec.Mounts = slices.Insert(spec.Mounts, at, specs.Mount{Destination: "/tmp", Type: "bind", Source: in.RootFS + "/tmp",
			Options: []string{"bind", mode, "nosuid", "nodev"}})
	}
	return spec, nil
}

// createRunsc is Create's second half for a gVisor sandbox, from the
// bundle b with its id range at base; destroy undoes it on error.
func (o *OCI) createRunsc(ctx context.Context, s runtime.Spec, b string, base uint32) (*runtime.Instance, error) {
	if s.Network != nil && s.Network.AttachNetns == nil {
		return nil, fmt.Errorf("%w: a network other than the egress gateway's device", ErrGVisor)
	}
	if len(s.Volumes) > 0 {
		return nil, fmt.Errorf("%w: volumes (not yet)", ErrGVisor)
	}
	began := time.Now()
	// The template as owned by the ids runsc's Sentry shows: 0..65535.
	// The socket's mount point is made in the upper layer before the
	// overlay is mounted: neither the host nor runsc's gofer may create
	// it through the overlay, whose root the idmapped template owns.
	rootfs, err := o.mountRoot(b, s, 0, func(rw string) error {
		return os.MkdirAll(filepath.Join(rw, "upper", runscSocketDir), 0o755)
	})
	if err != nil {
		return nil, err
	}
	mounted := time.Now()
	sockDir := filepath.Join(b, runscSocketHost)
	if err := os.Mkdir(sockDir, 0o700); err != nil {
		return nil, err
	}
	in := specInput{Spec: s, RootFS: rootfs, AgentBin: o.cfg.AgentBin, Writable: filepath.Join(b, "rw"), CgroupDir: o.cg.path(s.ID)}
	if o.disk == nil && canWrite(s) {
		in.DiskInMemory = diskSize(s)
	}
	network := "none"
	if s.Network != nil {
		// The namespace, and the gateway's device in it, before runsc:
		// it takes the interfaces it finds there when the Sentry starts.
		network = "sandbox"
		if in.Netns, err = o.attachRunscNet(ctx, b, s.Network); err != nil {
			return nil, err
		}
		in.ResolvConf = filepath.Join(b, "resolv.conf")
		if err := os.WriteFile(in.ResolvConf, []byte(s.Network.ResolvConf), 0o644); err != nil {
			return nil, err
		}
	}
	spec, err := buildRunscSpec(in, sockDir)
	if err != nil {
		return nil, err
	}
	logf, err := writeBundle(b, spec, base)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	pidFile := filepath.Join(b, "init.pid")
	cmd := o.runscNet(ctx, network, "run", "--detach", "--bundle", b, "--pid-file", pidFile, s.ID)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = logf, logf, logf
	ran := time.Now()
	if err := cmd.Run(); err != nil {
		log, _ := os.ReadFile(logf.Name())
		return nil, fmt.Errorf("runsc run: %w: %s", err, tail(log))
	}
	started := time.Now()
	pid, err := readPid(pidFile)
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(sockDir, "agent.sock")
	dial := o.dialRunsc(s.ID, sock)
	// Create returns once the agent listens: it binds its socket a few
	// milliseconds after runsc returns.
	for {
		c, err := dial(ctx)
		if err == nil {
			c.Close()
			break
		}
		if ctx.Err() != nil || errors.Is(err, errNotThisSandbox) {
			log, _ := os.ReadFile(logf.Name())
			return nil, fmt.Errorf("the agent under runsc does not listen: %w: %s", err, tail(log))
		}
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Millisecond):
		}
	}
	const r = 10 * time.Microsecond
	o.cfg.Logger.Debug("gvisor sandbox started", "id", s.ID, "root", mounted.Sub(began).Round(r),
		"spec", ran.Sub(mounted).Round(r), "runsc", started.Sub(ran).Round(r), "agent", time.Since(started).Round(r))
	return &runtime.Instance{ID: s.ID, Socket: sock, Dial: dial, PID: pid}, nil
}

// attachRunscNet makes the network namespace of gVisor sandbox b, bound
// at runscNetns in its bundle, with its loopback up, and has the egress
// gateway put its device there (n.AttachNetns); it returns the
// namespace's path, which destroy unmounts.
//
// runsc --network=sandbox runs the Sentry in that namespace and, as it
// starts, takes each interface it finds up there: it opens a packet
// socket on the gateway's TUN device for the Sentry's own network stack
// and removes the device's address from the host's, so that the host
// kernel of the namespace no longer answers for the sandbox. The
// namespace belongs to the host's user namespace: the Sentry, which runs
// as root of a user namespace runsc makes (without CAP_NET_ADMIN even
// there), holds no capability over it and cannot change the device or its
// routes (TestGVisorNetwork); the sandbox's processes
// see only the Sentry's stack, whose one way out is that device.
func (o *OCI) attachRunscNet(ctx context.Context, b string, n *runtime.Network) (string, error) {
	path := filepath.Join(b, runscNetns)
	if err := newNetns(path); err != nil {
		return "", fmt.Errorf("the sandbox's network namespace: %w", err)
	}
	if err := n.AttachNetns(ctx, path); err != nil {
		return "", fmt.Errorf("attach the sandbox's network: %w", err)
	}
	return path, nil
}

// newNetns makes a network namespace, with its loopback up, and binds it
// at path (a new file). The work happens on a thread locked to its
// goroutine that never returns to the host's namespace: Go ends a thread
// whose goroutine exits while locked.
func newNetns(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	done := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		done <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				return fmt.Errorf("unshare: %w", err)
			}
			ns := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
			if err := unix.Mount(ns, path, "", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("bind %s: %w", path, err)
			}
			// runsc gives the Sentry a loopback only if the namespace's is up.
			return loopbackUp()
		}()
	}()
	return <-done
}

// errNotThisSandbox reports an agent socket whose listener is not a
// process of the sandbox's cgroup.
var errNotThisSandbox = errors.New("the agent socket is not this sandbox's")

// dialRunsc returns a dialer of a gVisor sandbox's agent socket that
// checks the listener's process (SO_PEERCRED: runsc's gofer, which made
// the host socket) is in the sandbox's own cgroup, so that a socket the
// sandbox swapped for a symlink to another one is refused.
func (o *OCI) dialRunsc(id, sock string) func(context.Context) (net.Conn, error) {
	want := o.cg.path(id)
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", sock)
		if err != nil {
			return nil, err
		}
		if err := peerIn(c.(*net.UnixConn), want); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
}

// peerIn checks that the process at the other end of c is in cgroup cg
// (a path as /proc/PID/cgroup shows it) in some hierarchy.
func peerIn(c *net.UnixConn, cg string) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return cerr
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", cred.Pid))
	if err != nil {
		return fmt.Errorf("%w: its listener %d: %v", errNotThisSandbox, cred.Pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if _, path, ok := strings.Cut(line[strings.IndexByte(line, ':')+1:], ":"); ok && path == cg {
			return nil
		}
	}
	return fmt.Errorf("%w: its listener %d is outside %s", errNotThisSandbox, cred.Pid, cg)
}

// ErrGVisor reports what a gVisor sandbox cannot do (yet): checkpoint,
// snapshot, restore.
var ErrGVisor error = gvisorError{}

type gvisorError struct{}

func (gvisorError) Error() string        { return "not possible under gVisor" }
func (gvisorError) Is(target error) bool { return target == runtime.ErrUnsupported }

// runscState says whether runsc holds state for sandbox id.
func (o *OCI) runscState(id string) bool {
	m, _ := filepath.Glob(filepath.Join(o.runscDir, id+"_sandbox:*.state"))
	return len(m) > 0
}
