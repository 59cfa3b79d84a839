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
// requests (package internal/agent). Both run as uid 0 of the sandbox's
// user namespace and start user code as "user" (or root on request), and
// both keep themselves non-dumpable, so that no code in the sandbox, root
// included, can ptrace them or read their /proc files.
//
// For tests and debugging, "serve --listen PATH" (also through init)
// creates the socket itself.
//
// The flag package is enough for two sub-commands of an in-sandbox binary;
// cobra stays in cmd/sheepfold.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/agent"
	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/kernel"
)

// version is set at build time: -ldflags "-X main.version=...".
var version = "dev"

// listenerFD is the descriptor runc passes with --preserve-fds 1.
const listenerFD = 3

// languages are the canonical languages the kernel package drives.
var languages = kernel.Languages()

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	switch os.Args[1] {
	case "init":
		os.Exit(runInit(os.Args[2:]))
	case "serve":
		os.Exit(runServe(os.Args[2:]))
	case "version":
		fmt.Println(version)
	default:
		usage()
		os.Exit(2)
	}
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: %s init|serve [--root DIR] [--home DIR] [--listen SOCKET]\n", os.Args[0])
}

func runServe(args []string) int {
	inherited := inheritedListener()

	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	root := fs.String("root", "/", "directory file operations are confined to")
	home := fs.String("home", "/home/user", "sandbox path of the user's home")
	listen := fs.String("listen", "", "create and listen on this unix socket instead of using fd 3")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("component", "agent", "pid", os.Getpid())
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		log.Error("set non-dumpable", "err", err)
		return 1
	}

	var ln net.Listener
	var err error
	switch {
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
	// Code contexts run as "user" when the agent is the sandbox's root.
	kernelCred := agent.KernelCredential(*root)
	cfg := agent.Config{
		Root:    *root,
		Home:    *home,
		Version: version,
		NewKernel: func(ctx context.Context, spec agentproto.ContextSpec) (agent.Kernel, error) {
			k, err := kernel.Start(ctx, spec, kernel.Options{BaseEnv: os.Environ(), Credential: kernelCred})
			if err != nil {
				return nil, err
			}
			return k, nil
		},
		Canonical: kernel.Canonical,
		Languages: languages,
		Logger:    log,
	}
	log.Info("serving", "version", version, "root", *root, "home", *home, "addr", ln.Addr().String())
	if err := agent.Serve(ctx, ln, cfg); err != nil {
		log.Error("serve", "err", err)
		return 1
	}
	log.Info("stopped")
	return 0
}

// runInit is the container's pid 1: it runs "serve" as its child, forwards
// SIGTERM, SIGINT and SIGHUP to it, reaps every child (orphans are
// reparented to pid 1) and exits with the serve child's status.
func runInit(args []string) int {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("component", "agent-init")
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

	// Pass fds 0-2 and the listener (when there is one) through.
	files := []*os.File{os.Stdin, os.Stdout, os.Stderr}
	if ln := inheritedListener(); ln != nil {
		files = append(files, ln)
	}
	proc, err := os.StartProcess("/proc/self/exe", append([]string{os.Args[0], "serve"}, args...), &os.ProcAttr{
		Files: files,
		// If init dies, serve must not live on outside its pid 1.
		Sys: &syscall.SysProcAttr{Pdeathsig: unix.SIGKILL},
	})
	if len(files) > listenerFD {
		files[listenerFD].Close() // serve owns the listener now
	}
	if err != nil {
		log.Error("start serve", "err", err)
		return 1
	}
	child := proc.Pid

	for sig := range sigs {
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
	return 1 // unreachable: sigs is never closed
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
