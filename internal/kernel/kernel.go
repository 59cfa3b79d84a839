// Package kernel runs stateful code contexts: long-lived interpreters
// (Python, Node, Bash, R, Java) driven by small embedded driver scripts,
// one execution at a time, with output streamed as it is written.
//
// Each interpreter runs in its own process group with three channels: its
// real stdout and stderr (pipes the kernel streams as they fill) and a
// control pipe pair (fds 3 and 4) carrying JSON lines: the request in, the
// results, the error and "done" out (the Bash driver moves both to fds of
// its own first: Bash scripts take 3 and 4 for theirs; the R and Java
// drivers, which have no JSON parser, get hex-encoded fields on one line,
// hexRequest, and reopen fds 3 and 4 through /proc/self/fd, which is why
// their pipes' mode lets the interpreter's user open them). At the end of every
// execution the driver writes a per-execution random marker to stdout and
// stderr, so the kernel knows when all output of that execution has been
// read; an interpreter that ends within an execution is read to the end of
// what it wrote.
// Python interpreters, and Node, R and Java ones started under
// allow_subprocess: false, also get fd 5, a socket the no-subprocess seccomp filter's
// listener comes back over (notify_linux.go); an interpreter under that
// filter is also in a Landlock domain of its own. Python starts with -s
// and without its working directory on sys.path until its first
// execution's policy is applied (pythonBoot).
//
// Timeouts and the output cap send SIGINT to the group, then SIGKILL after
// Options.InterruptGrace; an interpreter that died is restarted on the next
// execution. CPU time and peak memory are read from /proc for the
// interpreter (children it waited for count too).
//
// What the driver says (the end of an execution, results, errors,
// violations) is the word of the code it runs, which can write all of it
// itself: the kernel marks the violations it relays from the driver as
// the sandbox's (agentproto.SourceSandbox), and does not stop counting
// CPU time at the end an execution's driver reports (idle.go).
//
// Languages and their names are internal/lang's.
//
// # Contexts and results
//
// A context is a long-lived interpreter running an embedded driver script
// (internal/kernel): Python (persistent globals, trailing expression value,
// IPython-style `_repr_*_` MIME results, DataFrames also as E2B's `e2b/data`
// (columns as lists), matplotlib figures as PNG, PIL images as PNG (as the
// last expression, and at `image.show()` and `image.save(filename)`, as in E2B),
// exceptions as name/value/traceback, figures with E2B chart data at
// `plt.show()` and at the end of a cell, `!cmd` shell escapes), Node (vm
// context: let/const persist; cells with top-level await keep their
// declarations; static ESM imports become awaited dynamic imports made by the
// driver, their bindings globals), TypeScript (the Node driver; the host engine transpiles each
// cell with esbuild in internal/typescript, so the agent stays small), Bash
// (a persistent shell), R (`r_driver.R`: R's own binary with
// `--vanilla`; each visible top-level value is a result as R prints it,
// data frames and matrices also as an HTML table, plot pages drawn in the
// cell as PNG from a png device set as the default; conditions as their
// class, message and the calls from the cell down), Java
// (`java_driver.java`, compiled in memory by the java launcher's
// source-file mode from a sealed memfd: jshell's engine in the same JVM,
// so snippets keep their state; expression values as jshell renders them,
// strings unquoted as E2B shows them; exceptions as their simple class
// name, message and stack; the environment, and an execution's env, as
// system properties, as E2B's Java kernel has them; its heap is half the
// sandbox's memory, MemoryEnv; its interrupt grace at least 2 s). Language names and aliases are one table,
// internal/lang, which both the host and the agent import; the host never
// imports internal/kernel.
// Results are bounded: one result's encoding at 3.5 MB (the drivers
// report a larger one as `dropped`, and the kernel reads at most a frame of
// any control line the code writes itself), one execution's at 1000 results
// and 16 MiB; what is not delivered is counted in the execution's
// `dropped` (results, bytes, reason) with `truncated: true`. A streamed
// execution keeps nothing on the host: its events go to the client as they
// come, each write with a 30 s deadline (a client that stops reading
// interrupts the code; a command's stream likewise stops following, and a
// foreground command is killed; E2B's envd RPCs, whose every write has the
// same deadline, detach from their process on Start and Connect, as when
// the client closes the stream, and end their watch on WatchDir; SSE event
// streams end with their subscription, and file downloads (/v1 and E2B's
// `/files`) with the agent call reading the file), and the `done` event
// does not repeat them.
// Output streams as it is written; a per-execution marker on stdout/stderr
// tells when an execution's output is complete, and output written before a
// result is forwarded before it (the pumps read under a lock until their
// chunk is queued, so "nothing unread in the pipes" means "all queued").
// Timeouts interrupt (SIGINT) and then, after the grace
// (`Options.InterruptGrace`), kill the interpreter's process group; a dead
// interpreter restarts on next use. The grace bounds the interpreter's
// stop, not the forwarding of its output: a driver that sent its done by
// then is not killed, and what it wrote before is forwarded, however slowly
// the client takes it (TestGraceBoundsTheStopOnly). Past the output cap
// (`ExecuteSpec.MaxOutputBytes`) the kernel sends `agentproto.OutputCapMarker`
// once, drops the rest and lets the code run to its end or its timeout,
// unless the spec's `StopAtOutputCap` (the policy's
// `output_filtering.stop_on_output_cap`) asks it to interrupt there. A
// warm pool's preload is not counted in the context's `execution_count`.
// An interrupt that cuts off an import must not leave the context unable to
// import the package again: the Python driver puts SIGINT off while the
// import system's own code runs (a module lock could be left taken) or a C
// extension module initialises (a Cython module cut off there stays
// half-initialised for the life of the interpreter; the kill after the
// grace is the bound), ignores one that arrives between executions, and
// after an execution that raised it drops from
// `sys.modules` every module whose parent package is no longer loaded (the
// submodules a cut-off import had finished hold the cut-off package object,
// and `import pandas` failed on them with "partially initialized module").
// The sandbox's environment sizes numerical thread pools
// (`OPENBLAS_NUM_THREADS`, `OMP_NUM_THREADS`, `MKL_NUM_THREADS`) to its CPU
// limit unless the caller set them: OpenBLAS's idle workers spin, and under
// a one-CPU quota they made a matplotlib savefig twice as slow.
//
// # No subprocess: seccomp user notification
//
// The filter returns
// `SECCOMP_RET_USER_NOTIF` for `execve`, `execveat`, `fork`, `vfork`, `clone`
// without `CLONE_THREAD` and other ABIs' calls, and `ENOSYS` for `clone3`.
// It is installed with `SECCOMP_FILTER_FLAG_NEW_LISTENER` by the process it
// confines, which sends the listener to the agent over a socket pair the
// kernel gave it as fd 5 (`SCM_RIGHTS`) and closes its own copy before any
// user code runs under the filter:
//   - Python: the driver, when a policy first asks for it
//     (`TSYNC|NEW_LISTENER|TSYNC_ESRCH`, Linux ≥ 5.7), so state and preloads
//     are kept;
//   - Node, R and Java (which cannot make system calls themselves): the agent starts them
//     through its own binary, `agent seccomp-exec FILTER NR node …`
//     (`kernel.SeccompExec`), which installs the filter, sends the listener
//     and execs the interpreter (R's own binary: /usr/bin/R is a shell
//     script, whose exec of R would be a second one). The agent lets exactly that one `execve` of the
//     helper's pid continue (no user code has run in that process); it
//     answers everything else with EPERM, never "continue". The agent does
//     not install the filter on one of its own threads and fork: Go's fork
//     holds a P in a raw system call until the child execs, and with
//     GOMAXPROCS 1 the supervisor could never answer the child's exec.
//
// The kernel (internal/kernel/notify_linux.go) keeps the listener in the
// runtime's poller, answers each notification (counting it first, so that
// the execution that made the call sees it before the call returns), and
// the execution loop reports the counts as `violation` events: the first
// of each system call at once, the rest in one event with `count` at the
// end; refusals between executions at the next one. The agent adopts the
// first seccomp listener that arrives on fd 5 and closes anything else.
// Code under the filter cannot take the notifications over with a filter
// and listener of its own (a newer filter's notification would win the tie
// with ours, and its "continue" would run the call): the kernel allows one
// listener per filter chain and refuses a second with EBUSY
// (`TestPythonOwnListener`); a listener code installed before a policy
// arrived makes the driver's install fail, and the interpreter is replaced.
// Without a supervisor (the agent gone, or a listener lost) the kernel
// fails notified calls with ENOSYS, so the refusal never depends on the
// agent. Beside the filter, the confined interpreter enters a Landlock
// domain of its own (`_landlock` in the driver, `kernel.landlockSelf` in
// `seccomp-exec`; Linux 5.13+): it handles no file access the sandbox uses,
// but the ptrace access check then refuses the interpreter every process
// outside it (`/proc/PID/mem`, `fd/N`, `maps` of an idle context's
// interpreter, which is the same user's and unfiltered). Python starts with
// `-s` and without its working directory on `sys.path` (`pythonBoot`); the
// driver restores both after the first execution's policy is applied
// (`_user_paths`), so a `.pth` file or a shadowing module the confined code
// wrote runs under the filter when its interpreter restarts. The rate is bounded by the agent: one answer per attempt, costing
// the sandbox's own CPU (the agent runs in the sandbox's cgroup).
//
// Imports: agentproto, fdpass, lang, pidfd, the standard library and x/sys only.
package kernel

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/lang"
	"github.com/sheepfold/sheepfold/internal/pidfd"
)

var (
	//go:embed python_driver.py
	pythonDriver string
	//go:embed python_charts.py
	pythonCharts string
	//go:embed node_driver.js
	nodeDriver string
	//go:embed bash_driver.sh
	bashDriver string
	//go:embed r_driver.R
	rDriver string
	//go:embed java_driver.java
	javaDriver string
)

// Options configure how kernels start.
type Options struct {
	Python, Node, Bash string // interpreter paths [/usr/bin/python3, /usr/bin/node, /bin/bash]
	// R is R's own binary, not the /usr/bin/R shell script (a context
	// under allow_subprocess: false may exec once: the interpreter), with
	// RHome its R_HOME [/usr/lib/R/bin/exec/R, /usr/lib/R]; Java is the
	// java launcher [/usr/bin/java].
	R, RHome, Java string
	BaseEnv        []string      // the interpreter's environment; the spec's Env is added
	DefaultCwd     string        // when the spec has none [/home/user]
	InterruptGrace time.Duration // SIGINT to SIGKILL [500ms]
	// Credential is the interpreter's uid, gid and groups; nil: the
	// caller's own (agent.KernelCredential says which).
	Credential *syscall.Credential
	// StartOn, when set, is given the context's working directory (a
	// host path) and the function that starts the interpreter, and calls
	// it on a thread whose working directory is dir: the interpreter's
	// command has no Dir and inherits it (agent.StartIn, so that the
	// interpreter runs in dir even where its user may not enter it, with
	// an empty capability bounding set). Nil: the command's Dir is dir
	// and start is called directly.
	StartOn func(dir string, start func() error) error
	// Helper is a program whose first argument "seccomp-exec" runs
	// SeccompExec (the agent's own binary): Node contexts start through it
	// under allow_subprocess: false. Empty: they refuse to run then.
	Helper string
	// Wrap, when set, turns the interpreter's command (its path and argv)
	// into the one that starts it: the agent's nproc-exec, which bounds
	// the user's tasks in a Pod (internal/agent, nproc.go).
	Wrap func(path string, argv []string) (string, []string)
}

// Kernel is one context's interpreter. Its methods are safe for concurrent
// use; executions are serialised.
type Kernel struct {
	lang string
	spec agentproto.ContextSpec
	opt  Options

	// mu serialises executions, restarts and Close, and guards p, closed
	// and applied.
	mu     sync.Mutex
	p      *proc
	closed bool
	// applied is the policy generation the running interpreter has
	// applied (ExecuteSpec.PolicyGen); 0 for a fresh one.
	applied int64
	// filter, when set, is the no-subprocess seccomp filter (and the
	// number of the seccomp system call) a Node interpreter starts under.
	filter   []byte
	filterNR int
	// idle, when set, counts the CPU time the last execution's process
	// group goes on using after its end, against its limit (idle.go).
	idle *idleWatch
	// noIdleWatch (set by tests) starts none: the control of the
	// attacks idle.go stops.
	noIdleWatch bool

	// onState, when set (by tests), sees each state an execution enters.
	onState func(execState)
}

// proc is one running interpreter.
type proc struct {
	cmd    *exec.Cmd
	ctlW   *os.File
	out    chan chunk // stdout/stderr chunks; stream -1 means both have closed
	ctl    chan ctlMsg
	exited chan struct{} // closed when the process has been waited for

	pipes [2]syscall.RawConn // read ends of stdout and stderr

	filtered bool // started under the no-subprocess filter (Node)
	used     bool // an execution has run in it
	// ended marks the output streams (1, 2) an execution read to their
	// end: the interpreter can write no marker there any more. Read and
	// written by executions, under the kernel's lock.
	ended [3]bool
	deny  *denials // what its seccomp filter refused, for the execution loop
	// lmu guards lconn, the kernel's end of the socket pair the filter's
	// listener arrives over, and listener, once it has arrived.
	lmu      sync.Mutex
	lconn    *net.UnixConn
	listener *os.File
	// readMu is held by a pump from each read of a pipe until the chunk
	// read is queued on out, so that a reader holding it sees output
	// either in the pipes or queued, never in between.
	readMu sync.Mutex
}

// unread reports whether output waits in the pipes or between a pump's
// read and its queueing.
func (p *proc) unread() bool {
	if !p.readMu.TryLock() {
		return true // a pump is between a read and its queueing
	}
	defer p.readMu.Unlock()
	for _, rc := range p.pipes {
		n := 0
		rc.Control(func(fd uintptr) { n = pipeBytes(int(fd)) })
		if n > 0 {
			return true
		}
	}
	return false
}

type chunk struct {
	stream int // 1 stdout, 2 stderr
	data   []byte
	eof    bool
}

type ctlMsg struct {
	Type   string                `json:"type"`
	Result *agentproto.Result    `json:"result,omitempty"`
	Error  *agentproto.ExecError `json:"error,omitempty"`
	// A "dropped" message stands for one (of type What) that was too
	// large to send: the driver's own, or a line the kernel would not
	// read (ctlLines).
	What   string `json:"what,omitempty"`
	Bytes  int64  `json:"bytes,omitempty"`
	Kind   string `json:"kind,omitempty"`   // violation
	Target string `json:"target,omitempty"` // violation
	raw    string
}

// Start starts an interpreter for spec.Language.
func Start(ctx context.Context, spec agentproto.ContextSpec, opt Options) (*Kernel, error) {
	canon, err := lang.Canonical(spec.Language)
	if err != nil {
		return nil, err
	}
	opt.Python = cmp.Or(opt.Python, "/usr/bin/python3")
	opt.Node = cmp.Or(opt.Node, "/usr/bin/node")
	opt.Bash = cmp.Or(opt.Bash, "/bin/bash")
	opt.R = cmp.Or(opt.R, "/usr/lib/R/bin/exec/R")
	opt.RHome = cmp.Or(opt.RHome, "/usr/lib/R")
	opt.Java = cmp.Or(opt.Java, "/usr/bin/java")
	opt.DefaultCwd = cmp.Or(opt.DefaultCwd, "/home/user")
	if opt.InterruptGrace <= 0 {
		opt.InterruptGrace = 500 * time.Millisecond
	}
	if canon == lang.Java {
		// The JVM stops a snippet from a thread it starts for the
		// signal, at the snippet's next safepoint: under a one-CPU quota
		// the spinning snippet delayed that past half a second, and the
		// kill lost the context's state.
		opt.InterruptGrace = max(opt.InterruptGrace, javaInterruptGrace)
	}
	if spec.Cwd == "" {
		spec.Cwd = opt.DefaultCwd
	}
	spec.Language = canon
	k := &Kernel{lang: canon, spec: spec, opt: opt}
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.start(); err != nil {
		return nil, err
	}
	return k, nil
}

// Installed returns the languages of langs whose interpreter is installed
// at its default path, of those a template may leave out (R, Java): the
// agent offers only those, so that a sandbox of a template without R
// answers "unsupported language" rather than failing to start it.
func Installed(langs []string) []string {
	return installed(langs, func(p string) error { _, err := os.Stat(p); return err })
}

func installed(langs []string, stat func(string) error) []string {
	var out []string
	for _, l := range langs {
		p := map[string]string{lang.R: "/usr/lib/R/bin/exec/R", lang.Java: "/usr/bin/java"}[l]
		if p != "" && stat(p) != nil {
			continue
		}
		out = append(out, l)
	}
	return out
}

// Language returns the canonical language.
func (k *Kernel) Language() string { return k.lang }

func (k *Kernel) command() *exec.Cmd {
	switch k.lang {
	case lang.Python:
		return exec.Command(k.opt.Python, "-s", "-c", pythonBoot, pythonDriver, pythonCharts) // -s: pythonBoot
	case lang.JavaScript, lang.TypeScript: // the host sends TypeScript cells transpiled
		return k.filtered(k.opt.Node, "-e", nodeDriver)
	case lang.R:
		// --vanilla: no site or user profile, no saved workspace.
		return k.filtered(k.opt.R, "--vanilla", "--no-echo", "-e", rDriver)
	case lang.Java:
		// The launcher compiles the driver's source (a memory file, its
		// path set by start: javaSource) in memory; the serial collector
		// keeps the JVM's threads few.
		args := []string{"-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto"}
		if n, err := strconv.ParseInt(k.env(MemoryEnv), 10, 64); err == nil && n > 0 {
			// Its heap: half (the default is a quarter above 256 MiB,
			// half below); the rest for the JVM's own and jshell's.
			args = append(args, "-XX:MaxRAM="+strconv.FormatInt(n, 10), "-XX:MaxRAMPercentage=50", "-XX:MinRAMPercentage=50")
		}
		return k.filtered(k.opt.Java, append(args, "--add-modules", "jdk.jshell", "--source", "17", javaSource)...)
	default:
		return exec.Command(k.opt.Bash, "--noprofile", "--norc", "-c", bashDriver)
	}
}

// givePipe lets the interpreter running as cred (nil: the caller's user)
// open pipe f through /proc: mode 0666, or where the kernel refuses a
// pipe's mode (gVisor), the interpreter's user as its owner.
func givePipe(f *os.File, cred *syscall.Credential) error {
	err := f.Chmod(0o666)
	if !errors.Is(err, syscall.EPERM) || cred == nil {
		return err
	}
	if cerr := f.Chown(int(cred.Uid), int(cred.Gid)); cerr != nil {
		return errors.Join(err, cerr)
	}
	return nil
}

// javaInterruptGrace is the least grace a Java context's interrupt gets.
const javaInterruptGrace = 2 * time.Second

// MemoryEnv, in the sandbox's environment, is its memory limit in bytes:
// the engine sets it (the sandbox has no cgroup files to read it from),
// and a Java context's JVM takes it as the machine's memory, sizing its
// heap from it.
const MemoryEnv = "SHEEPFOLD_MEMORY_BYTES"

// env returns the value of name in the interpreter's environment (the
// context's own first).
func (k *Kernel) env(name string) string {
	if v, ok := k.spec.Env[name]; ok {
		return v
	}
	v := ""
	for _, kv := range k.opt.BaseEnv {
		if rest, ok := strings.CutPrefix(kv, name+"="); ok {
			v = rest
		}
	}
	return v
}

// javaSource stands in the Java command for the path of the driver's
// source, a descriptor start passes.
const javaSource = "SHEEPFOLD-JAVA-DRIVER"

// filtered is the command that runs path with args, through the
// seccomp-exec helper when the context runs under the no-subprocess
// filter (Node, R and Java start under it; Python installs it itself).
func (k *Kernel) filtered(path string, args ...string) *exec.Cmd {
	if k.filter != nil {
		return exec.Command(k.opt.Helper, append([]string{"seccomp-exec", base64.StdEncoding.EncodeToString(k.filter),
			strconv.Itoa(k.filterNR), path}, args...)...)
	}
	return exec.Command(path, args...)
}

// startsFiltered reports whether the language's interpreter starts under
// the no-subprocess filter (through the helper) rather than installing it.
func startsFiltered(l string) bool {
	switch l {
	case lang.JavaScript, lang.TypeScript, lang.R, lang.Java:
		return true
	}
	return false
}

// start launches the interpreter; k.mu is held.
func (k *Kernel) start() error {
	cmd := k.command()
	if k.opt.Wrap != nil && cmd.Err == nil {
		cmd.Path, cmd.Args = k.opt.Wrap(cmd.Path, cmd.Args)
	}
	startOn := k.opt.StartOn
	if startOn == nil {
		cmd.Dir = k.spec.Cwd
		startOn = func(_ string, start func() error) error { return start() }
	}
	env := append([]string{}, k.opt.BaseEnv...)
	switch k.lang {
	case lang.Python:
		env = append(env, "MPLBACKEND=Agg")
	case lang.R:
		// What /usr/bin/R (a shell script) sets before it runs R's binary.
		// R_DEFAULT_PACKAGES: the driver attaches them (r_driver.R).
		env = append(env, "R_HOME="+k.opt.RHome, "R_SHARE_DIR=/usr/share/R/share",
			"R_INCLUDE_DIR=/usr/share/R/include", "R_DOC_DIR=/usr/share/R/doc", "R_DEFAULT_PACKAGES=NULL")
	}
	keys := make([]string, 0, len(k.spec.Env))
	for key := range k.spec.Env {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		env = append(env, key+"="+k.spec.Env[key])
	}
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: k.opt.Credential}

	reqR, reqW, err := os.Pipe()
	if err != nil {
		return err
	}
	msgR, msgW, err := os.Pipe()
	if err != nil {
		reqR.Close()
		reqW.Close()
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return errors.Join(err, closeAll(reqR, reqW, msgR, msgW))
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return errors.Join(err, closeAll(reqR, reqW, msgR, msgW))
	}
	var pipes [2]syscall.RawConn
	for i, r := range []io.Reader{stdout, stderr} {
		f, ok := r.(*os.File)
		if !ok {
			return errors.Join(fmt.Errorf("start %s: output pipe is a %T, not a file", k.lang, r), closeAll(reqR, reqW, msgR, msgW))
		}
		if pipes[i], err = f.SyscallConn(); err != nil {
			return errors.Join(fmt.Errorf("start %s: %w", k.lang, err), closeAll(reqR, reqW, msgR, msgW))
		}
	}
	if k.lang == lang.R || k.lang == lang.Java {
		// R and Java cannot use an inherited descriptor as such: their
		// drivers open /proc/self/fd/3 and 4, which checks the pipe's
		// mode against the interpreter's user (the agent made the pipe).
		// Opening through /proc needs ptrace access to the process, so
		// this gives the pipes to no one who could not reach them anyway.
		// gVisor's kernel refuses to change a pipe's mode (EPERM, even
		// for its owner) but lets root give it away: there the pipes
		// become the interpreter's own, mode 0600, which reach the same
		// processes (the interpreter's user, who may ptrace it).
		for _, f := range []*os.File{reqR, msgW} {
			if err := givePipe(f, k.opt.Credential); err != nil {
				return errors.Join(fmt.Errorf("start %s: %w", k.lang, err), closeAll(reqR, reqW, msgR, msgW))
			}
		}
	}
	cmd.ExtraFiles = []*os.File{reqR, msgW}
	// A filter's listener comes back over fd 5: Python installs the
	// filter itself when a policy asks, Node starts under it.
	filtered := k.filter != nil && startsFiltered(k.lang)
	var lconn *net.UnixConn
	if k.lang == "python" || filtered {
		child, own, err := listenerChannel()
		if err != nil {
			return errors.Join(fmt.Errorf("start %s: %w", k.lang, err), closeAll(reqR, reqW, msgR, msgW))
		}
		defer child.Close()
		cmd.ExtraFiles = append(cmd.ExtraFiles, child)
		lconn = own
	}
	if k.lang == lang.Java {
		src, err := sourceFile("sheepfold-java-driver", javaDriver)
		if err != nil {
			if lconn != nil {
				lconn.Close()
			}
			return errors.Join(fmt.Errorf("start %s: %w", k.lang, err), closeAll(reqR, reqW, msgR, msgW))
		}
		defer src.Close()
		cmd.ExtraFiles = append(cmd.ExtraFiles, src)
		for i, a := range cmd.Args {
			if a == javaSource {
				cmd.Args[i] = fmt.Sprintf("/proc/self/fd/%d", 2+len(cmd.ExtraFiles))
			}
		}
	}
	if err := startOn(k.spec.Cwd, cmd.Start); err != nil {
		if lconn != nil {
			lconn.Close()
		}
		return errors.Join(fmt.Errorf("start %s: %w", k.lang, err), closeAll(reqR, reqW, msgR, msgW))
	}
	reqR.Close()
	msgW.Close()
	// Let the OOM killer pick the interpreter before the agent (whose
	// score the runtime sets to 500; raising needs no privilege).
	_ = os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", cmd.Process.Pid), []byte("1000"), 0)

	p := &proc{cmd: cmd, ctlW: reqW, out: make(chan chunk, 64), ctl: make(chan ctlMsg, 16), exited: make(chan struct{}), pipes: pipes,
		filtered: filtered, deny: newDenials(), lconn: lconn}
	if lconn != nil {
		execPID := 0
		if filtered {
			execPID = cmd.Process.Pid // the helper, whose exec of Node is let through
		}
		go receiveListener(lconn, execPID, p.deny, &p.lmu, &p.listener)
	}
	var readers sync.WaitGroup
	readers.Add(2)
	go p.pump(1, p.pipes[0], &readers)
	go p.pump(2, p.pipes[1], &readers)
	go func() {
		defer close(p.ctl)
		defer msgR.Close()
		ctlLines(msgR, agentproto.MaxFrame, func(line, head []byte, size int64) {
			var m ctlMsg
			switch {
			case line == nil:
				m = ctlMsg{Type: "dropped", What: sniffType(head), Bytes: size}
			case k.lang == "bash":
				m = ctlMsg{Type: "done", raw: string(line)}
			default:
				if err := json.Unmarshal(line, &m); err != nil {
					return
				}
			}
			p.ctl <- m
		})
	}()
	go func() {
		readers.Wait() // cmd.Wait closes the pipes: read them to the end first
		close(p.out)
		// Without holding an OS thread while the interpreter lives (the
		// agent's threads stay within its reserve of tasks; see package
		// pidfd); failing that, Wait waits.
		_ = pidfd.AwaitExit(cmd.Process.Pid)
		_ = cmd.Wait()
		close(p.exited)
	}()
	k.p = p
	k.applied = 0
	return nil
}

// ctlLines reads newline-ended lines from r until it ends, passing each
// to fn. A line longer than max bytes is not kept: fn gets a nil line, the
// line's first bytes (head) and its length, so that a driver (or the code
// running in it, which can write to the control pipe too) writing a huge
// line costs the agent at most max bytes and loses only that line.
func ctlLines(r io.Reader, max int, fn func(line, head []byte, size int64)) {
	const headLen = 64
	br := bufio.NewReaderSize(r, 64<<10)
	var (
		line []byte
		head []byte
		size int64
		over bool
	)
	for {
		chunk, err := br.ReadSlice('\n')
		size += int64(len(chunk))
		if !over && len(line)+len(chunk) > max+1 {
			over = true
			head = append(line, chunk...)[:min(headLen, len(line)+len(chunk))]
			head = bytes.Clone(head)
			line = nil
		} else if !over {
			line = append(line, chunk...)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			return // a last line without its newline is incomplete: dropped
		}
		if over {
			fn(nil, head, size-1)
		} else {
			fn(line[:len(line)-1], nil, size-1)
		}
		if cap(line) > 1<<20 {
			line = nil // do not keep a huge buffer for small lines
		}
		line, head, size, over = line[:0], nil, 0, false
	}
}

// sniffType guesses the type of a control message from its first bytes.
func sniffType(head []byte) string {
	h := bytes.ReplaceAll(head, []byte(" "), nil)
	for _, t := range []string{"error", "result", "done"} {
		if bytes.HasPrefix(h, []byte(`{"type":"`+t+`"`)) {
			return t
		}
	}
	return "message"
}

func (p *proc) pump(stream int, rc syscall.RawConn, wg *sync.WaitGroup) {
	defer wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, held, err := p.read(rc, buf)
		if n > 0 {
			p.out <- chunk{stream: stream, data: bytes.Clone(buf[:n])}
		}
		if held {
			p.readMu.Unlock()
		}
		if err != nil {
			p.out <- chunk{stream: stream, eof: true}
			return
		}
	}
}

// read reads a pipe once it is readable, taking readMu for the read; held
// says whether the caller must release it (after queueing what was read).
func (p *proc) read(rc syscall.RawConn, buf []byte) (n int, held bool, err error) {
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		p.readMu.Lock()
		n, rerr = syscall.Read(int(fd), buf)
		if rerr == syscall.EAGAIN || rerr == syscall.EINTR {
			p.readMu.Unlock()
			return false // wait until readable
		}
		held = true
		return true
	})
	switch {
	case err != nil:
	case rerr != nil:
		err = rerr
	case n == 0:
		err = io.EOF
	}
	if n < 0 {
		n = 0
	}
	return n, held, err
}

func closeAll(fs ...*os.File) error {
	for _, f := range fs {
		f.Close()
	}
	return nil
}

// kill ends the interpreter's whole process group and waits for it.
func (p *proc) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.ctlW.Close()
	p.lmu.Lock()
	if p.lconn != nil {
		p.lconn.Close()
	}
	if p.listener != nil {
		p.listener.Close()
	}
	p.lmu.Unlock()
	// Drain the readers so they reach the end of their pipes and exit.
	go func() {
		for range p.out {
		}
	}()
	go func() {
		for range p.ctl {
		}
	}()
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
	}
}

func (p *proc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Restart replaces the interpreter; its state is gone.
func (k *Kernel) Restart(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return errors.New("kernel closed")
	}
	k.stopIdle()
	if k.p != nil {
		k.p.kill()
		k.p = nil
	}
	return k.start()
}

// Close kills the interpreter. It is idempotent.
func (k *Kernel) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.closed = true
	k.stopIdle()
	if k.p != nil {
		k.p.kill()
		k.p = nil
	}
	return nil
}

func newMarker() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "SHEEPFOLD-END-" + hex.EncodeToString(b[:])
}

// request encodes one execution for the driver.
func (k *Kernel) request(spec agentproto.ExecuteSpec, marker string) []byte {
	if k.lang == lang.R || k.lang == lang.Java {
		return hexRequest(marker, spec)
	}
	if k.lang != "bash" {
		req := map[string]any{"code": spec.Code, "env": spec.Env, "marker": marker}
		if spec.Preload != nil {
			req = map[string]any{"preload": spec.Preload, "marker": marker}
		}
		if spec.Policy != nil && k.applied != spec.PolicyGen {
			req["policy"] = spec.Policy
		}
		b, _ := json.Marshal(req)
		return append(b, '\n')
	}
	var pre, post strings.Builder
	keys := make([]string, 0, len(spec.Env))
	for key := range spec.Env {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for i, key := range keys {
		if !validName(key) {
			continue
		}
		fmt.Fprintf(&pre, "if [ -n \"${%[1]s+x}\" ]; then __sf_s%[2]d=$%[1]s; __sf_h%[2]d=1; else __sf_h%[2]d=; fi; export %[1]s=%[3]s\n",
			key, i, shellQuote(spec.Env[key]))
		fmt.Fprintf(&post, "if [ -n \"$__sf_h%[2]d\" ]; then %[1]s=$__sf_s%[2]d; else unset %[1]s; fi\n", key, i)
	}
	code := pre.String() + spec.Code + "\n"
	postS := post.String() + ":\n"
	return []byte(fmt.Sprintf("%s %d %d\n%s%s", marker, len(code), len(postS), code, postS))
}

// hexRequest encodes an execution for the R and Java drivers, which have
// no JSON parser: one line of space-separated fields, the marker, then the
// code and the env's names and values in pairs, each hex-encoded UTF-8.
// Their policy is applied outside them: the filter they start under, the
// CPU watch and the limits the kernel sets on their process.
func hexRequest(marker string, spec agentproto.ExecuteSpec) []byte {
	keys := make([]string, 0, len(spec.Env))
	for key := range spec.Env {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(marker)
	b.WriteByte(' ')
	b.WriteString(hex.EncodeToString([]byte(spec.Code)))
	b.WriteString(" " + strconv.Itoa(len(keys)))
	for _, key := range keys {
		b.WriteString(" " + hex.EncodeToString([]byte(key)) + " " + hex.EncodeToString([]byte(spec.Env[key])))
	}
	b.WriteByte('\n')
	return []byte(b.String())
}

func validName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// sortedViolations returns counts (the seccomp supervisor's) as
// violations carrying their count, seen by the agent, in a stable order.
func sortedViolations(counts map[agentproto.Violation]int64) []agentproto.Violation {
	if len(counts) == 0 {
		return nil
	}
	out := make([]agentproto.Violation, 0, len(counts))
	for v, n := range counts {
		v.Count, v.Source = n, agentproto.SourceAgent
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Target < out[j].Target
	})
	return out
}

// signalled reports whether the interpreter was ended by sig.
func signalled(p *proc, sig syscall.Signal) bool {
	if st := p.cmd.ProcessState; st != nil {
		ws, ok := st.Sys().(syscall.WaitStatus)
		return ok && ws.Signaled() && ws.Signal() == sig
	}
	return false
}

var clockTicks = 100.0 // USER_HZ on Linux

// cpuMS reads utime+stime+cutime+cstime of pid in milliseconds.
func cpuMS(pid int) float64 {
	ms, _ := cpuStat(pid)
	return ms
}

// cpuStat reads utime+stime+cutime+cstime of pid in milliseconds, and
// its own utime+stime in clock ticks.
func cpuStat(pid int) (ms float64, own uint64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 15 {
		return 0, 0
	}
	var ticks [4]uint64
	for j, idx := range []int{11, 12, 13, 14} { // fields 14-17 of stat, after pid and comm
		ticks[j], _ = strconv.ParseUint(f[idx], 10, 64)
	}
	return float64(ticks[0]+ticks[1]+ticks[2]+ticks[3]) * 1000 / clockTicks, ticks[0] + ticks[1]
}

// peakRSS reads VmHWM of pid in bytes.
func peakRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// partialSuffix is the length of the longest end of buf that could be the
// start of mark: those bytes wait for the next chunk.
func partialSuffix(buf, mark []byte) int {
	for n := min(len(mark)-1, len(buf)); n > 0; n-- {
		if bytes.HasPrefix(mark, buf[len(buf)-n:]) {
			return n
		}
	}
	return 0
}
