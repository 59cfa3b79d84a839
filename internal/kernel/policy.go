package kernel

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/lang"
)

// pythonBoot compiles the driver (argv[1]) under the name the driver's
// frames carry ("<frozen sheepfold_driver>"; the import rules recognise
// them by their code objects, not by that name). It takes the working
// directory ("", which -c puts first) off sys.path, and the interpreter
// runs with -s (no user site directory): nothing the sandbox's code can
// write (a json.py in the working directory, a .pth file in
// ~/.local/lib/python3.X/site-packages) runs before the driver has
// applied the first execution's policy. The driver puts both back then
// (python_driver.py, _user_paths), under the no-subprocess filter when
// the policy asks for it.
const pythonBoot = `import sys;sys.path[:1]==[""] and sys.path.pop(0);exec(compile(sys.argv.pop(1),"<frozen sheepfold_driver>","exec"))`

// subprocessDenied is set once any execution of this process asked for
// allow_subprocess: false.
var subprocessDenied atomic.Bool

// SubprocessDenied reports whether any code of this process's kernels has
// been asked to run under allow_subprocess: false (the agent's sudo
// consults it where the kernel does not count seccomp filters).
func SubprocessDenied() bool { return subprocessDenied.Load() }

// policyGate applies what a policy asks before an execution starts; k.mu
// is held. It restarts an interpreter that applied a policy a later
// change loosened (ExecuteSpec.PolicyRestartGen), starts Node, R and Java
// under the no-subprocess filter when the policy asks for it (restarting one that
// runs without; state is lost, and said so when code had run), and
// refuses to run Bash code under allow_subprocess: false (a non-nil Done
// says so).
func (k *Kernel) policyGate(spec agentproto.ExecuteSpec, emit func(agentproto.Event) error) *agentproto.Event {
	pol := spec.Policy
	if pol == nil {
		return nil
	}
	if pol.DenySubprocess {
		subprocessDenied.Store(true) // before any code runs under it
	}
	helped := startsFiltered(k.lang)
	if pol.DenySubprocess && (k.lang == lang.Bash || helped && k.opt.Helper == "") {
		why := "a shell that cannot fork runs only its builtins: use a python or javascript context"
		if helped {
			why = "this agent cannot start " + k.lang + " under the seccomp filter (no seccomp-exec helper); use a python context"
		}
		_ = emit(agentproto.Event{Type: agentproto.EventViolation, Violation: &agentproto.Violation{
			Kind: "subprocess_denied", Target: k.lang + " context", Source: agentproto.SourceAgent}})
		_ = emit(agentproto.Event{Type: agentproto.EventError, Error: &agentproto.ExecError{
			Name:  "SubprocessDeniedError",
			Value: fmt.Sprintf("a %s context cannot run while allow_subprocess is false: %s", k.lang, why)}})
		return &agentproto.Event{Type: agentproto.EventDone, Status: agentproto.StatusError, Stats: &agentproto.Stats{}}
	}
	if k.p != nil && k.applied > 0 && k.applied < spec.PolicyRestartGen {
		k.p.kill()
		k.p = nil
	}
	if !helped {
		return nil
	}
	if !pol.DenySubprocess {
		// A filtered interpreter stays so until a loosening restarts it.
		k.filter, k.filterNR = nil, 0
		return nil
	}
	k.filter, k.filterNR = pol.Seccomp, pol.SeccompSyscall
	if k.p != nil && !k.p.filtered {
		if k.p.used {
			_ = emit(agentproto.Event{Type: agentproto.EventStderr, Data: []byte(
				"[sheepfold] this context was restarted to run under allow_subprocess: false; its earlier state is lost\n")})
		}
		k.p.kill()
		k.p = nil
	}
	return nil
}

// cpuWatch ends an execution that passes KernelPolicy.CPUTimeMS. The
// kernel counts the CPU time (the interpreter's threads and the children
// it waited for, from /proc); it is read a few times per limit, at most
// every 100 ms. RLIMIT_CPU, set by the driver a little past the limit, is
// the backstop.
type cpuWatch struct {
	limitMS float64
	pid     int
	cpu0    float64
	t       *time.Ticker
	used    float64
}

func newCPUWatch(pol *agentproto.KernelPolicy, pid int, cpu0 float64) *cpuWatch {
	if pol == nil || pol.CPUTimeMS <= 0 {
		return nil
	}
	every := min(max(time.Duration(pol.CPUTimeMS)*time.Millisecond/4, 10*time.Millisecond), 100*time.Millisecond)
	return &cpuWatch{limitMS: float64(pol.CPUTimeMS), pid: pid, cpu0: cpu0, t: time.NewTicker(every)}
}

func (w *cpuWatch) tick() <-chan time.Time {
	if w == nil {
		return nil
	}
	return w.t.C
}

func (w *cpuWatch) exceeded() bool {
	if w == nil {
		return false
	}
	if used := cpuMS(w.pid) - w.cpu0; used > w.used {
		w.used = used
	}
	return w.used > w.limitMS
}

func (w *cpuWatch) stop() {
	if w != nil {
		w.t.Stop()
	}
}

func (w *cpuWatch) error(killed bool) *agentproto.ExecError {
	e := &agentproto.ExecError{Name: "CPUTimeExceeded",
		Value: fmt.Sprintf("the execution used more than %s of CPU time (cpu_time_seconds) and was stopped",
			time.Duration(w.limitMS)*time.Millisecond)}
	if killed {
		e.Value += "; the interpreter was killed, state is lost"
	}
	return e
}
