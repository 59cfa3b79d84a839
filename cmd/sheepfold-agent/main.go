//go:build linux

// Command sheepfold-agent is the agent inside every sandbox. The host
// bind-mounts this static binary read-only at /.sheepfold/agent and runc
// starts it as the sandbox's pid 1:
//
//	/.sheepfold/agent init [serve flags]
//
// with a listening unix socket as fd 3, which the host dials from outside.
// init is a tiny init (reaps orphans, forwards signals) that runs
// "/proc/self/exe serve" as its only child; serve answers the host's
// requests (package internal/agent).
//
// init also keeps the sandbox's deadline. The host gives it with every ping
// that carries a lifetime (at start and on every extension), and may give
// it at start with serve's --lifetime (a Pod's agent: a server that dies
// before its first ping leaves no sandbox without a deadline); serve passes
// it to init over a pipe (serve's fd 4, close-on-exec, so that nothing
// serve starts can reach it), and when it passes init exits. init is the
// pid 1 of the sandbox's pid namespace, so its exit makes the kernel kill
// every other process there, and no process in the sandbox, root included,
// can stop or kill pid 1 (signals from inside reach pid 1 only through the
// handlers it installed). The stopped container's cgroups, mounts and
// bundle stay until the engine destroys it, or, when no engine ran, until
// the next engine's start. Both run as uid 0 of the sandbox's
// user namespace and start user code as "user" (or root on request), and
// both keep themselves non-dumpable, so that no code in the sandbox, root
// included, can ptrace them or read their /proc files.
//
// "seccomp-exec FILTER SYSCALL PROGRAM [ARG...]" is run by serve, never by
// the host: it starts a Node interpreter under the no-subprocess seccomp
// filter and hands the filter's listener back to serve (kernel.SeccompExec).
// "nproc-exec N PATH ARGV0 [ARG...]" likewise starts a program under
// RLIMIT_NPROC N, when serve has --nproc (agent.NprocExec).
//
// "netlock --agent-port N" is a Pod's init container: it closes the Pod's
// network namespace to everything but the agent's port and replies
// (agent.LockNetwork) before the sandbox starts.
//
// For tests and debugging, "serve --listen PATH" (also through init)
// creates the socket itself. In a Kubernetes Pod, "init --listen-tcp
// ADDR --tls-dir DIR" listens on the Pod's network instead, with TLS that
// admits only the server (package agenttls); with "--pids-max N" it first
// checks that its container's cgroup has the sandbox's pids limit, and
// refuses to serve otherwise (agent.CheckPidsMax).
//
// The flag package is enough for two sub-commands of an in-sandbox binary;
// cobra stays in cmd/sheepfold.
package main

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/agent"
	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/agenttls"
	"github.com/sheepfold/sheepfold/internal/kernel"
	"github.com/sheepfold/sheepfold/internal/lang"
	"github.com/sheepfold/sheepfold/internal/osthread"
)

// version is set at build time: -ldflags "-X main.version=...".
var version = "dev"

// listenerFD is the descriptor runc passes with --preserve-fds 1.
const listenerFD = 3

// lifetimeFD is serve's end of the pipe that carries deadlines to init.
const lifetimeFD = 4

// servePidsFD is where init passes serve the sandbox's pids cgroup
// (--pids-cgroup-fd), after the lifetime pipe.
const servePidsFD = 5

// exitLifetime is init's exit status when the sandbox's lifetime ended.
const exitLifetime = 124

func main() {
	if filepath.Base(os.Args[0]) == "sudo" {
		// Bind-mounted as the sandbox's sudo (oci.SudoPath).
		os.Exit(agent.Sudo(os.Args[1:]))
	}
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	switch os.Args[1] {
	case "init":
		boundProcs()
		os.Exit(runInit(os.Args[2:]))
	case "serve":
		boundProcs()
		os.Exit(runServe(os.Args[2:]))
	case agent.NprocExecCommand:
		// Starts a program under RLIMIT_NPROC (serve's --nproc); serve
		// runs it, never the host.
		os.Exit(agent.NprocExec(os.Args[2:]))
	case "seccomp-exec":
		// Runs an interpreter under the no-subprocess filter
		// (kernel.SeccompExec); the agent starts it, never the host.
		os.Exit(kernel.SeccompExec(os.Args[2:]))
	case "netlock":
		// A Pod's init container: closes the Pod's network to all but
		// the agent's port (agent.LockNetwork), then exits.
		os.Exit(runNetlock(os.Args[2:]))
	case "version":
		fmt.Println(version)
	default:
		usage()
		os.Exit(2)
	}
}

// maxProcs bounds init's and serve's GOMAXPROCS. Their OS threads live in
// a small reserve of tasks beyond the sandbox's pids limit
// (internal/runtime/oci AgentPids), and the Go runtime keeps about one
// thread for each P besides those blocked in system calls. The sandbox
// mounts no cgroup filesystem, so the runtime cannot read the sandbox's
// CPU quota and would take the host's CPU count, which may be large. One
// sandbox's agent has no use for more.
const maxProcs = 4

func boundProcs() {
	if runtime.GOMAXPROCS(0) > maxProcs {
		runtime.GOMAXPROCS(maxProcs)
	}
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: %s init|serve [--root DIR] [--home DIR] [--listen SOCKET | --listen-tcp ADDR --tls-dir DIR] | netlock --agent-port N | seccomp-exec FILTER SYSCALL PROGRAM [ARG...]\n", os.Args[0])
}

func runNetlock(args []string) int {
	fs := flag.NewFlagSet("netlock", flag.ContinueOnError)
	port := fs.Int("agent-port", 0, "the TCP port the agent listens on (--listen-tcp's), the only one the Pod admits connections to")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := agent.LockNetwork(*port); err != nil {
		fmt.Fprintf(os.Stderr, "netlock: %v\n", err)
		return 1
	}
	return 0
}

func runServe(args []string) int {
	inherited := inheritedListener()

	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	root := fs.String("root", "/", "directory file operations are confined to")
	home := fs.String("home", "/home/user", "sandbox path of the user's home")
	user := fs.String("user", "", "the user processes and file operations that name none run as (a template's USER); empty: \"user\"")
	workDir := fs.String("workdir", "", "sandbox path processes and code contexts that name no working directory start in (a template's WORKDIR); empty: the user's home")
	listen := fs.String("listen", "", "create and listen on this unix socket instead of using fd 3")
	listenTCP := fs.String("listen-tcp", "", "listen on this TCP address (host:port) with TLS instead (a sandbox in a Pod); needs --tls-dir")
	tlsDir := fs.String("tls-dir", "", "directory of the agent's TLS credential for --listen-tcp ("+agenttls.CertFile+", "+agenttls.KeyFile+", "+agenttls.CAFile+")")
	toInit := fs.Bool("lifetime-fd", false, "send deadlines to init over fd 4 (init passes it); otherwise serve keeps them itself")
	lifetime := fs.Duration("lifetime", 0, "end the sandbox this long after the start unless a ping sets its lifetime first (a Pod, which outlives the server that made it: one whose server died before its first ping ends anyway); 0: no deadline until a ping sets one")
	switchUsers := fs.Bool("switch-users", false, "refuse to serve unless every request can run as its own user (a sandbox's agent)")
	nproc := fs.Int64("nproc", 0, "RLIMIT_NPROC of every process the agent starts (a Pod with a user namespace of its own); 0: none")
	egressListen := fs.String("egress-listen", "", "listen for the sandbox's proxied egress on this loopback address (host:port; HTTP_PROXY names it): each connection goes to the server's gateway through an egress.accept request (a Pod's network)")
	history := fs.Bool("usage-history", false, "sample the sandbox's usage every 5 s and keep an hour of it for usage.history (a Pod's agent: every replica reads the same history)")
	scratch := fs.String("scratch", "", "the home and /tmp are the sandbox's scratch volume (a Pod's memory-backed emptyDir): unpack this home seed archive (sheepfold template export) into --home before serving, and report the volume as the sandbox's disk")
	var ownVolumes []string
	fs.Func("own-volume", "a persistent volume mounted read-write at this sandbox path (a Pod's claim): make its root the sandbox user's before serving when it is still root's (a fresh volume); repeatable", func(p string) error {
		ownVolumes = append(ownVolumes, p)
		return nil
	})
	cgroupRoot := fs.String("cgroup-root", "/sys/fs/cgroup", "where the usage op reads the sandbox's cgroups (tests point it at a fake tree)")
	pidsCgroup := fs.Int("pids-cgroup-fd", -1, "the sandbox's pids cgroup, opened by the host: every process the agent starts begins in its tenant leaf, under the sandbox's pids limit (agent.UseTenantCgroup); init passes it")
	pidsMax := fs.Int64("pids-max", 0, "refuse to serve unless the agent's own cgroup (a Pod's container) has pids.max N, the sandbox's pids limit, which the node's NRI plugin sets (agent.CheckPidsMax); 0: no check")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("component", "agent", "pid", os.Getpid())
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		log.Error("set non-dumpable", "err", err)
		return 1
	}
	if *pidsCgroup >= 0 {
		if err := agent.UseTenantCgroup(*pidsCgroup); err != nil {
			log.Error("pids cgroup", "err", err)
			return 1
		}
	}
	if *pidsMax > 0 {
		// Before it listens: a container without the sandbox's pids
		// limit never serves, and its Pod fails with this message.
		if err := agent.CheckPidsMax(*cgroupRoot, *pidsMax); err != nil {
			log.Error("pids limit", "err", err)
			return 1
		}
	}

	var ln net.Listener
	var err error
	switch {
	case *listenTCP != "":
		// Reached over a network: every connection must be the server's
		// (agenttls).
		if inherited != nil {
			inherited.Close()
		}
		ln, err = listenTLS(*listenTCP, *tlsDir)
	case *listen != "":
		if inherited != nil {
			inherited.Close()
		}
		ln, err = net.Listen("unix", *listen)
	case inherited != nil:
		ln, err = net.FileListener(inherited) // dups it
		inherited.Close()
	default:
		err = errors.New("no listening socket at fd 3 and no --listen")
	}
	if err != nil {
		log.Error("listen", "err", err)
		return 1
	}

	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGTERM, unix.SIGINT, unix.SIGHUP)
	defer stop()
	setLifetime, err := lifetimeKeeper(*toInit, stop, log)
	if err != nil {
		log.Error("lifetime", "err", err)
		return 1
	}
	var egress net.Listener
	if *egressListen != "" {
		host, _, err := net.SplitHostPort(*egressListen)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			log.Error("--egress-listen must be a loopback address and port", "addr", *egressListen)
			return 2
		}
		if egress, err = net.Listen("tcp", *egressListen); err != nil {
			log.Error("egress listener", "err", err)
			return 1
		}
	}
	var disk string
	if *scratch != "" {
		if err := agent.PrepareScratch(*root, *home, "/tmp", *scratch); err != nil {
			log.Error("prepare the scratch volume", "err", err)
			return 1
		}
		disk = *home
	}
	for _, p := range ownVolumes {
		// After the scratch volume: a volume below the home is
		// mounted over a directory of it.
		if err := agent.OwnVolume(*root, p); err != nil {
			log.Error("give the volume to the user", "path", p, "err", err)
			return 1
		}
	}
	// Code contexts run as the default user ("user", or --user: a
	// template's USER) when the agent is the sandbox's root.
	kernelCred, err := agent.KernelCredentialFor(*root, *user)
	if err != nil {
		log.Error("the code contexts' user", "err", err)
		return 2
	}
	// The agent's own binary is the seccomp-exec helper of Node contexts
	// under allow_subprocess: false.
	self, err := os.Executable()
	if err != nil {
		log.Error("own path", "err", err)
		return 1
	}
	if *nproc < 0 {
		log.Error("--nproc must not be negative")
		return 2
	}
	// Interpreters start under --nproc as every process does.
	var kernelWrap func(string, []string) (string, []string)
	if *nproc > 0 {
		kernelWrap = func(path string, argv []string) (string, []string) {
			return agent.NprocCommand(self, *nproc, path, argv)
		}
	}
	cfg := agent.Config{
		SubprocessDenied: kernel.SubprocessDenied,
		Root:             *root,
		Home:             *home,
		User:             *user,
		WorkDir:          *workDir,
		Version:          version,
		NewKernel: func(ctx context.Context, spec agentproto.ContextSpec) (agent.Kernel, error) {
			k, err := kernel.Start(ctx, spec, kernel.Options{BaseEnv: os.Environ(), Credential: kernelCred, Helper: self,
				StartOn: func(dir string, start func() error) error { return agent.StartIn(kernelCred, dir, start) },
				Wrap:    kernelWrap})
			if err != nil {
				return nil, err
			}
			return k, nil
		},
		Canonical:   lang.Canonical,
		Languages:   kernel.Installed(lang.All()), // R and Java where the template has them
		SetLifetime: setLifetime,
		Lifetime:    *lifetime,
		SwitchUsers: *switchUsers,
		Logger:      log,
		CgroupRoot:  *cgroupRoot,
		Disk:        disk,
		Egress:      egress,

		UsageHistory: *history,
		Nproc:        *nproc,
		Helper:       self,
	}
	log.Info("serving", "version", version, "root", *root, "home", *home, "addr", ln.Addr().String())
	if err := agent.Serve(ctx, ln, cfg); err != nil {
		log.Error("serve", "err", err)
		return 1
	}
	log.Info("stopped")
	return 0
}

// listenTLS listens on a TCP address with the credential in dir: TLS 1.3,
// the server's client certificate required.
func listenTLS(addr, dir string) (net.Listener, error) {
	if dir == "" {
		return nil, errors.New("--listen-tcp needs --tls-dir")
	}
	cfg, err := agenttls.LoadAgentConfig(dir)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return tls.NewListener(ln, cfg), nil
}

// lifetimeKeeper returns serve's SetLifetime. Under init (toInit) it sends
// each lifetime to init, which ends the sandbox; run alone (the fake
// runtime, tests) serve keeps the deadline itself and, when it passes,
// stops (stop) as on SIGTERM, killing everything it started.
func lifetimeKeeper(toInit bool, stop func(), log *slog.Logger) (func(time.Duration) error, error) {
	if toInit {
		// Inherited without close-on-exec: set it, so that no process
		// serve starts holds the pipe.
		syscall.CloseOnExec(lifetimeFD)
		w := os.NewFile(lifetimeFD, "lifetime")
		var mu sync.Mutex
		return func(d time.Duration) error {
			mu.Lock()
			defer mu.Unlock()
			var b [8]byte
			binary.BigEndian.PutUint64(b[:], uint64(d.Milliseconds()))
			_, err := w.Write(b[:])
			return err
		}, nil
	}
	var mu sync.Mutex
	var t *time.Timer
	return func(d time.Duration) error {
		mu.Lock()
		defer mu.Unlock()
		if t != nil {
			t.Stop()
		}
		t = time.AfterFunc(d, func() {
			log.Warn("the sandbox's lifetime ended; stopping")
			stop()
		})
		return nil
	}, nil
}

// readLifetimes passes each lifetime serve sends (8 bytes, big-endian
// milliseconds) to out, and closes out when serve's end is closed.
func readLifetimes(r io.Reader, out chan<- time.Duration) {
	defer close(out)
	var b [8]byte
	for {
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return
		}
		out <- time.Duration(min(binary.BigEndian.Uint64(b[:]), math.MaxInt64/uint64(time.Millisecond))) * time.Millisecond
	}
}

// runInit is the container's pid 1: it runs "serve" as its child, forwards
// SIGTERM, SIGINT and SIGHUP to it, reaps every child (orphans are
// reparented to pid 1) and exits with the serve child's status, or with
// exitLifetime when the sandbox's deadline passes (see the package doc).
func runInit(args []string) int {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("component", "agent-init")
	args, err := setRlimits(args)
	if err != nil {
		log.Error("set rlimits", "err", err)
		return 1
	}
	pidsCgroup, args, err := pidsCgroupFlag(args)
	if err != nil {
		log.Error("pids cgroup", "err", err)
		return 1
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		log.Error("set non-dumpable", "err", err)
		return 1
	}
	// When not pid 1 (tests, debugging), still be the reaper of orphans.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		log.Warn("set child subreaper", "err", err)
	}

	sigs := make(chan os.Signal, 64)
	signal.Notify(sigs, unix.SIGCHLD, unix.SIGTERM, unix.SIGINT, unix.SIGHUP)

	lr, lw, err := os.Pipe()
	if err != nil {
		log.Error("lifetime pipe", "err", err)
		return 1
	}
	// Pass fds 0-2, the listener (when there is one; a nil entry is a
	// closed fd) and the lifetime pipe through.
	ln := inheritedListener()
	files := []*os.File{os.Stdin, os.Stdout, os.Stderr, ln, lw}
	// As a container's pid 1, the agent is a sandbox's: serve must run
	// everything as its requested user, or nothing at all.
	if os.Getpid() == 1 {
		args = append([]string{"--switch-users"}, args...)
	}
	if pidsCgroup != nil {
		files = append(files, pidsCgroup) // servePidsFD
		args = append([]string{fmt.Sprintf("--pids-cgroup-fd=%d", servePidsFD)}, args...)
	}
	// If init dies, serve must not live on outside its pid 1: its
	// Pdeathsig, from the thread that never ends (osthread.Kept), so that
	// no thread of init's that ends sends it.
	var proc *os.Process
	err = osthread.Kept(func() (err error) {
		proc, err = os.StartProcess("/proc/self/exe", append([]string{os.Args[0], "serve", "--lifetime-fd"}, args...), &os.ProcAttr{
			Files: files,
			Sys:   &syscall.SysProcAttr{Pdeathsig: unix.SIGKILL},
		})
		return err
	})
	if ln != nil {
		ln.Close() // serve owns the listener now
	}
	if pidsCgroup != nil {
		pidsCgroup.Close() // init starts no process of the tenant's
	}
	lw.Close()
	if err != nil {
		log.Error("start serve", "err", err)
		return 1
	}
	child := proc.Pid
	lifetimes := make(chan time.Duration)
	go readLifetimes(lr, lifetimes)
	var expired <-chan time.Time
	var deadline *time.Timer

	for {
		var sig os.Signal
		select {
		case d, ok := <-lifetimes:
			if !ok {
				lifetimes = nil // serve is gone; SIGCHLD follows
				continue
			}
			if deadline != nil {
				deadline.Stop()
			}
			deadline = time.NewTimer(d)
			expired = deadline.C
			continue
		case <-expired:
			log.Warn("the sandbox's lifetime ended; stopping every process")
			if os.Getpid() != 1 {
				// Not a namespace's init (tests): end serve at least.
				_ = unix.Kill(child, unix.SIGKILL)
			}
			return exitLifetime
		case sig = <-sigs:
		}
		if sig != unix.SIGCHLD {
			if err := unix.Kill(child, sig.(unix.Signal)); err != nil && !errors.Is(err, unix.ESRCH) {
				log.Warn("forward signal", "signal", sig, "err", err)
			}
			continue
		}
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if err == unix.EINTR {
				continue
			}
			if err != nil || pid <= 0 {
				break
			}
			if pid == child {
				return exitStatus(ws)
			}
		}
	}
}

// rlimitNames are the resources init's --rlimit flags may set.
var rlimitNames = map[string]int{"core": unix.RLIMIT_CORE, "nofile": unix.RLIMIT_NOFILE, "memlock": unix.RLIMIT_MEMLOCK}

// setRlimits applies init's own leading --rlimit=NAME=N flags (the
// runtime's limits for the whole sandbox, internal/runtime/oci) to itself,
// so that everything it starts inherits them, and returns the remaining
// arguments, which are serve's. Any malformed flag fails: nothing runs
// without its limits.
func setRlimits(args []string) ([]string, error) {
	for len(args) > 0 && strings.HasPrefix(args[0], "--rlimit=") {
		name, value, _ := strings.Cut(strings.TrimPrefix(args[0], "--rlimit="), "=")
		res, ok := rlimitNames[name]
		n, err := strconv.ParseUint(value, 10, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("bad flag %q", args[0])
		}
		if err := unix.Setrlimit(res, &unix.Rlimit{Cur: n, Max: n}); err != nil {
			return nil, fmt.Errorf("%s: %w", args[0], err)
		}
		args = args[1:]
	}
	return args, nil
}

// pidsCgroupFlag takes init's leading --pids-cgroup-fd=N, the sandbox's
// pids cgroup that runc passes (internal/runtime/oci PidsCgroupFD), and
// returns it, nil without the flag, and the remaining arguments.
func pidsCgroupFlag(args []string) (*os.File, []string, error) {
	if len(args) == 0 || !strings.HasPrefix(args[0], "--pids-cgroup-fd=") {
		return nil, args, nil
	}
	fd, err := strconv.Atoi(strings.TrimPrefix(args[0], "--pids-cgroup-fd="))
	var st unix.Stat_t
	if err != nil || fd < 3 || unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil, nil, fmt.Errorf("bad flag %q: not an open directory", args[0])
	}
	syscall.CloseOnExec(fd) // passed to serve alone, through its Files
	return os.NewFile(uintptr(fd), "pids-cgroup"), args[1:], nil
}

// inheritedListener returns fd 3 if it is a socket (the listener runc
// passes), or nil: a descriptor the Go runtime opened itself must not be
// taken for it.
func inheritedListener() *os.File {
	var st unix.Stat_t
	if err := unix.Fstat(listenerFD, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil
	}
	return os.NewFile(listenerFD, "listener")
}

// exitStatus maps a wait status to a shell-style exit code.
func exitStatus(ws unix.WaitStatus) int {
	switch {
	case ws.Exited():
		return ws.ExitStatus()
	case ws.Signaled():
		return 128 + int(ws.Signal())
	}
	return 1
}
