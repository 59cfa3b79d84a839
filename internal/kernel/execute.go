package kernel

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/lang"
)

// An execution goes through these states, each one step (a method of
// execution) that returns the next:
//
//	admit ──refused, or the last execution's ────┐
//	  │     code killed at its CPU time limit    │
//	  │     after its end (idle.go)              │
//	ready (start or restart the interpreter,     │
//	  │    drop output between executions) ─fail─┤
//	send (baseline stats, the request) ─────fail─┤
//	  │                                          │
//	run (output, results, control messages,      │
//	  │  until done, a kill or the end)          │
//	finish (the outcome, the stats; under a CPU ─┴──► end
//	        time limit, the idle watch starts)
type execState int

const (
	execAdmit execState = iota
	execReady
	execSend
	execRun
	execFinish
	execEnd
)

func (s execState) String() string {
	return [...]string{"admit", "ready", "send", "run", "finish", "end"}[s]
}

// Reasons the kernel interrupts an execution (execution.why).
const (
	whyTimeout = "timeout"
	whyOutput  = "output"
	whyCancel  = "cancel"
	whyCPU     = "cpu"
)

// execution is the state of one Execute; k.mu is held throughout.
type execution struct {
	k     *Kernel
	ctx   context.Context
	spec  agentproto.ExecuteSpec
	emit  func(agentproto.Event) error
	start time.Time
	done  agentproto.Event // the Done returned

	p        *proc
	pid      int
	cpu0     float64
	cpu      *cpuWatch
	emitting bool   // false once emit failed: the rest is not sent
	mark     []byte // the end-of-output marker on stdout and stderr

	// Set by run.
	out       <-chan chunk // nil once the pumps have ended
	killTimer <-chan time.Time
	why       string // set once the kernel interrupts: whyTimeout and the like
	outBytes  int64
	capped    bool      // the output passed the cap: the rest is dropped
	seen      [3]bool   // the marker (or the end) was seen on stdout, stderr
	pending   [3][]byte // the end of a chunk that may be the start of the marker
	// holdLines: a stream's last line, written without its newline, waits
	// up to lineHold (partialTimer) in partial for the rest (R's print).
	holdLines    bool
	partial      [3][]byte
	partialTimer <-chan time.Time
	partialSince time.Time // when the oldest held piece arrived
	gotDone      bool
	killed       bool // the interrupt's grace passed: the interpreter was killed
	execErr      *agentproto.ExecError
	policyErr    bool // the driver could not apply the execution's policy
	// Refusals of the seccomp filter: the first of each kind and target
	// at once, the rest counted in one event at the end. The maps are
	// made at the first refusal: none on the common path.
	reported map[agentproto.Violation]bool
	later    map[agentproto.Violation]int64
}

// Execute runs code; see the agent's Kernel interface.
func (k *Kernel) Execute(ctx context.Context, spec agentproto.ExecuteSpec, emit func(agentproto.Event) error) agentproto.Event {
	k.mu.Lock()
	defer k.mu.Unlock()
	x := &execution{k: k, ctx: ctx, spec: spec, emit: emit, start: time.Now(), emitting: true,
		done: agentproto.Event{Type: agentproto.EventDone}, holdLines: k.lang == lang.R}
	defer func() { x.cpu.stop() }()
	for st := execAdmit; st != execEnd; {
		if k.onState != nil {
			k.onState(st)
		}
		st = x.step(st)
	}
	return x.done
}

func (x *execution) step(st execState) execState {
	switch st {
	case execAdmit:
		return x.admit()
	case execReady:
		return x.ready()
	case execSend:
		return x.sendRequest()
	case execRun:
		return x.run()
	case execFinish:
		return x.finish()
	}
	panic(fmt.Sprintf("kernel: execution in unknown state %d", st))
}

// admit refuses what this kernel cannot run.
func (x *execution) admit() execState {
	k := x.k
	if k.closed {
		x.done.Code, x.done.Message = agentproto.CodeNotFound, "the context was deleted"
		return execEnd
	}
	if v := k.stopIdle(); v.killed {
		// The last execution's code passed its CPU time limit after
		// the execution ended, and was killed (idle.go).
		if k.p != nil {
			k.p.kill()
			k.p = nil
		}
		x.done = v.report(x.emit)
		return execEnd
	}
	if x.spec.Preload != nil && k.lang != lang.Python {
		x.done.Code, x.done.Message = agentproto.CodeUnsupported, "preloading modules needs a python context"
		return execEnd
	}
	if refused := k.policyGate(x.spec, x.emit); refused != nil {
		x.done = *refused
		return execEnd
	}
	return execReady
}

// ready makes sure an interpreter runs, and drops output written between
// executions (a background thread, say), which belongs to none; an
// interpreter whose pipes ended is replaced: one whose code closed its
// stdout and stderr (and went on running) can write no output, nor the
// marker that ends an execution.
func (x *execution) ready() execState {
	k := x.k
	// An interpreter whose stdout or stderr an execution read to its end
	// (its code closed them) can end no execution: replace it. That end
	// may have been read while its channel is not closed yet, which the
	// loop below would not see.
	if k.p != nil && (k.p.ended[1] || k.p.ended[2]) {
		k.p.kill()
		k.p = nil
	}
	if k.p == nil || !k.p.alive() {
		if k.p != nil {
			k.p.kill()
		}
		if !x.startInterpreter() {
			return execEnd
		}
	}
	for {
		select {
		case c, ok := <-k.p.out:
			if !ok || c.eof {
				k.p.kill()
				k.p = nil
				if !x.startInterpreter() {
					return execEnd
				}
			}
		default:
			x.p, x.pid = k.p, k.p.cmd.Process.Pid
			return execSend
		}
	}
}

// startInterpreter starts a fresh interpreter; on failure the Done says why.
func (x *execution) startInterpreter() bool {
	if err := x.k.start(); err != nil {
		x.done.Code, x.done.Message = agentproto.CodeInternal, err.Error()
		return false
	}
	return true
}

// sendRequest takes the baseline of the statistics, reports what the
// filter refused since the last execution, and writes the request.
func (x *execution) sendRequest() execState {
	k, p := x.k, x.p
	x.cpu0 = cpuMS(x.pid)
	_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", x.pid), []byte("5"), 0)
	for _, v := range sortedViolations(p.deny.take()) {
		v.Target += " (between executions)"
		x.send(agentproto.Event{Type: agentproto.EventViolation, Violation: &v})
	}
	p.used = true
	marker := newMarker()
	x.mark = []byte("\x1e" + marker + "\n")
	request := k.request(x.spec, marker)
	if x.spec.Policy != nil {
		k.applied = x.spec.PolicyGen
	}
	if _, err := p.ctlW.Write(request); err != nil {
		p.kill()
		k.p = nil
		x.done.Status = agentproto.StatusKilled
		x.send(agentproto.Event{Type: agentproto.EventError, Error: &agentproto.ExecError{
			Name: "KernelDied", Value: "the interpreter was not running; state is lost", Traceback: err.Error()}})
		return execEnd
	}
	return execRun
}

// run forwards output, results and control messages until the driver is
// done and both streams reached the marker, the interrupt's grace ends
// (the interpreter is then killed) or the interpreter is gone.
func (x *execution) run() execState {
	p := x.p
	var timer <-chan time.Time
	if x.spec.TimeoutMS > 0 {
		timer = time.After(time.Duration(x.spec.TimeoutMS) * time.Millisecond)
	}
	x.cpu = newCPUWatch(x.spec.Policy, x.pid, x.cpu0)
	x.out = p.out
	ctxDone, ctl, exited := x.ctx.Done(), p.ctl, p.exited
	for !(x.gotDone && x.seen[1] && x.seen[2]) {
		select {
		case c, ok := <-x.out:
			x.handle(c, ok)
		case <-p.deny.kick:
			x.denied()
		case m, ok := <-ctl:
			if !ok {
				// The interpreter is gone (or closed its control
				// pipe), often just after it wrote its last output,
				// which the pumps may not have read yet. After a done
				// its marker follows (the driver writes it first):
				// wait for it. Without one nothing marks the end:
				// take what was written, in the pipes or queued.
				ctl = nil
				if !x.gotDone {
					x.settle()
					return execFinish
				}
				continue
			}
			x.control(m)
		case <-timer:
			timer = nil
			x.interrupt(whyTimeout)
		case <-x.cpu.tick():
			if x.cpu.exceeded() {
				x.interrupt(whyCPU)
			}
		case <-ctxDone:
			ctxDone = nil
			x.interrupt(whyCancel)
		case <-x.partialTimer:
			// An interpreter still running (or waiting for a CPU, on a
			// loaded machine) is still writing the line: hold on, up
			// to maxLineHold; one that waits (a sleep, input) is not.
			if time.Since(x.partialSince) < maxLineHold && runnable(x.pid) {
				x.partialTimer = time.After(lineHold)
			} else {
				x.flushPartial()
			}
		case <-x.killTimer:
			// The grace bounds the interpreter's stop, not the
			// forwarding of what it wrote before: output queued
			// behind a slow emit may outlast it. A driver that sent
			// its done wrote its markers first: take the control
			// messages sent and the output written, and kill only an
			// interpreter that has not stopped (or forged a done).
			for ctl != nil {
				select {
				case m, ok := <-ctl:
					if !ok {
						ctl = nil
						continue
					}
					x.control(m)
					continue
				default:
				}
				break
			}
			if x.gotDone {
				x.settle()
				if x.seen[1] && x.seen[2] {
					return execFinish
				}
			}
			x.killed = true
			return execFinish
		case <-exited:
			// The control pipe closes too; its last messages come first.
			exited = nil
		}
	}
	return execFinish
}

// finish reports the refusals counted, replaces an interpreter that must
// not serve again, and classifies the outcome.
func (x *execution) finish() execState {
	k, p, spec := x.k, x.p, x.spec
	x.denied() // counted before the calls returned: all are in
	for _, v := range sortedViolations(x.later) {
		x.send(agentproto.Event{Type: agentproto.EventViolation, Violation: &v})
	}
	if x.killed || !x.gotDone || x.policyErr {
		// A policy the interpreter could not apply is applied by a
		// fresh one at the next execution.
		p.kill()
		k.p = nil
	}
	status := agentproto.StatusOK
	if !x.killed && !x.gotDone {
		// The interpreter died on its own (a signal such as the OOM
		// killer's, or exit in a shell).
		status = agentproto.StatusKilled
		x.execErr = &agentproto.ExecError{Name: "KernelDied", Value: diedHow(p) + "; state is lost"}
	}
	switch x.why {
	case whyTimeout:
		status = agentproto.StatusTimeout
		x.execErr = &agentproto.ExecError{Name: "TimeoutError",
			Value: fmt.Sprintf("execution exceeded %s", time.Duration(spec.TimeoutMS)*time.Millisecond)}
		if x.killed {
			x.execErr.Value += "; the interpreter did not stop and was killed, state is lost"
		}
	case whyOutput:
		status = agentproto.StatusOutputLimit
		x.done.Truncated = true
		x.execErr = &agentproto.ExecError{Name: "OutputLimitExceeded",
			Value: fmt.Sprintf("output passed %d bytes and the execution was stopped", spec.MaxOutputBytes)}
	case whyCancel:
		status = agentproto.StatusError
		x.execErr = &agentproto.ExecError{Name: "Cancelled", Value: "the execution was cancelled"}
	case whyCPU:
		status = agentproto.StatusCPULimit
		x.execErr = x.cpu.error(x.killed)
	}
	if x.why == "" && !x.gotDone && x.cpu != nil && (x.cpu.exceeded() || signalled(p, syscall.SIGXCPU)) {
		// RLIMIT_CPU, the backstop, ended the interpreter first.
		status = agentproto.StatusCPULimit
		x.execErr = x.cpu.error(true)
	}
	if x.execErr != nil && status == agentproto.StatusOK {
		status = agentproto.StatusError
	}
	if x.execErr != nil {
		x.send(agentproto.Event{Type: agentproto.EventError, Error: x.execErr})
	}
	x.done.Status = status
	x.done.Stats = &agentproto.Stats{DurationMS: float64(time.Since(x.start).Microseconds()) / 1000}
	if k.p != nil {
		cpu, own := cpuStat(x.pid)
		x.done.Stats.CPUTimeMS = cpu - x.cpu0
		x.done.Stats.PeakMemoryBytes = peakRSS(x.pid)
		if x.cpu != nil && !k.noIdleWatch {
			// The limit goes on binding what the code left running.
			k.idle = watchIdle(x.pid, own, x.done.Stats.CPUTimeMS, x.cpu.limitMS)
		}
	}
	return execEnd
}

// diedHow describes how an interpreter that ended on its own ended.
func diedHow(p *proc) string {
	st := p.cmd.ProcessState
	if st == nil {
		return "the interpreter exited"
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Sprintf("the interpreter was killed by signal %d (%s), possibly out of memory", int(ws.Signal()), ws.Signal())
	}
	return fmt.Sprintf("the interpreter exited with status %d", st.ExitCode())
}

// send emits ev unless an earlier emit failed.
func (x *execution) send(ev agentproto.Event) {
	if x.emitting && x.emit(ev) != nil {
		x.emitting = false
	}
}

// interrupt sends SIGINT to the interpreter's group, once, and gives it
// Options.InterruptGrace before run kills it.
func (x *execution) interrupt(reason string) {
	if x.why != "" {
		return
	}
	x.why = reason
	_ = syscall.Kill(-x.pid, syscall.SIGINT)
	x.killTimer = time.After(x.k.opt.InterruptGrace)
}

// lineHold is how long a line written in pieces waits for its end while
// the interpreter waits (sleeps, reads); maxLineHold how long while it
// runs; maxHeldLine how much of it may wait.
const (
	lineHold    = 100 * time.Millisecond
	maxLineHold = 2 * time.Second
	maxHeldLine = 4 << 10
)

// output forwards data of a stream. R writes a printed line in pieces,
// each flushed (print("a") writes `[1]`, ` "a"` and the newline), so that
// a reader could see a line in several messages where E2B's kernel sends
// one: with holdLines a last line without its newline (up to maxHeldLine
// bytes) waits for the rest while the interpreter runs (up to
// maxLineHold: on a loaded machine it may wait for a CPU between two
// pieces), and lineHold once it waits (a sleep, a read). It is sent
// before any result, error or the end (flushPartial).
func (x *execution) output(stream int, data []byte) {
	if !x.holdLines {
		x.forward(stream, data)
		return
	}
	buf := append(x.partial[stream], data...)
	cut := bytes.LastIndexByte(buf, '\n') + 1
	if len(buf)-cut > maxHeldLine {
		cut = len(buf)
	}
	x.forward(stream, buf[:cut])
	x.partial[stream] = nil
	if cut < len(buf) {
		x.partial[stream] = bytes.Clone(buf[cut:])
		if x.partialTimer == nil {
			x.partialTimer, x.partialSince = time.After(lineHold), time.Now()
		}
	}
}

// flushPartial forwards the lines held without their end.
func (x *execution) flushPartial() {
	for i, b := range x.partial {
		if len(b) > 0 {
			x.forward(i, b)
		}
		x.partial[i] = nil
	}
	x.partialTimer = nil
}

// runnable reports whether process pid is running or waiting for a CPU
// (state R in /proc/PID/stat).
func runnable(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'R'
}

// forward forwards data of a stream, up to the output cap.
func (x *execution) forward(stream int, data []byte) {
	if len(data) == 0 {
		return
	}
	if x.capped {
		return
	}
	typ := agentproto.EventStdout
	if stream == 2 {
		typ = agentproto.EventStderr
	}
	if x.spec.MaxOutputBytes > 0 {
		room := x.spec.MaxOutputBytes - x.outBytes
		if int64(len(data)) > room {
			// Past the cap: the execution stops when its spec says so;
			// else the rest is dropped after a marker and the code runs
			// on (to its end or its timeout).
			x.capped, x.done.Truncated = true, true
			if room > 0 {
				x.send(agentproto.Event{Type: typ, Data: data[:room]})
			}
			x.outBytes = x.spec.MaxOutputBytes
			if x.spec.StopAtOutputCap {
				x.interrupt(whyOutput)
				return
			}
			x.send(agentproto.Event{Type: typ, Data: fmt.Appendf(nil, agentproto.OutputCapMarker, x.spec.MaxOutputBytes)})
			return
		}
	}
	x.outBytes += int64(len(data))
	x.send(agentproto.Event{Type: typ, Data: data})
}

// handle takes one chunk of output: up to the marker it is this
// execution's; the bytes that may be the marker's start wait for the next.
func (x *execution) handle(c chunk, ok bool) {
	if !ok {
		x.out = nil
		return
	}
	if c.eof {
		x.seen[c.stream] = true
		x.p.ended[c.stream] = true
		x.output(c.stream, x.pending[c.stream])
		x.pending[c.stream] = nil
		x.flushPartial()
		return
	}
	if x.seen[c.stream] {
		return // output after the marker belongs to no execution
	}
	buf := append(x.pending[c.stream], c.data...)
	if i := bytes.Index(buf, x.mark); i >= 0 {
		x.output(c.stream, buf[:i])
		x.pending[c.stream] = nil
		x.seen[c.stream] = true
		x.flushPartial()
		return
	}
	keep := partialSuffix(buf, x.mark)
	x.output(c.stream, buf[:len(buf)-keep])
	x.pending[c.stream] = bytes.Clone(buf[len(buf)-keep:])
}

// drainQueued handles the output already queued.
func (x *execution) drainQueued() {
	for x.out != nil {
		select {
		case c, ok := <-x.out:
			x.handle(c, ok)
		default:
			return
		}
	}
}

// settle forwards the output written before a result arrived, so that
// events keep the order in which the code produced them: once the pipes
// hold nothing unread (and no pump is between a read and its queueing),
// all of it is queued; take what is queued. It waits at most a second for
// a busy pump. A line held without its end is sent too.
func (x *execution) settle() {
	defer x.flushPartial() // what was written comes before what follows
	deadline := time.Now().Add(time.Second)
	for x.out != nil {
		x.drainQueued()
		if !x.p.unread() {
			x.drainQueued()
			return
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// denied reports the seccomp filter's refusals: the first of each kind
// and target now, the others counted for finish.
func (x *execution) denied() {
	for _, v := range sortedViolations(x.p.deny.take()) {
		key := agentproto.Violation{Kind: v.Kind, Target: v.Target}
		if x.reported[key] {
			x.later[key] += v.Count
			continue
		}
		if x.reported == nil {
			x.reported, x.later = map[agentproto.Violation]bool{}, map[agentproto.Violation]int64{}
		}
		x.reported[key] = true
		x.settle()
		x.send(agentproto.Event{Type: agentproto.EventViolation, Violation: &v})
	}
}

// control takes one message of the driver's control pipe.
func (x *execution) control(m ctlMsg) {
	switch m.Type {
	case "result":
		if m.Result != nil {
			x.settle()
			x.send(agentproto.Event{Type: agentproto.EventResult, Result: m.Result})
		}
	case "dropped":
		x.settle()
		if m.What == "error" {
			x.execErr = &agentproto.ExecError{Name: "ErrorTooLarge",
				Value: fmt.Sprintf("the code raised an error whose report (%d bytes) is too large to send", m.Bytes)}
			return
		}
		what := m.What
		if what == "" || what == "message" {
			what = agentproto.EventResult
		}
		x.send(agentproto.Event{Type: agentproto.EventDropped, Dropped: &agentproto.Dropped{Type: what, Bytes: m.Bytes,
			Reason: fmt.Sprintf("a %s of %d bytes is over the limit of %d bytes", what, m.Bytes, agentproto.MaxResult)}})
	case "error":
		x.execErr = m.Error
	case "violation":
		if m.Kind != "" {
			x.settle()
			x.send(agentproto.Event{Type: agentproto.EventViolation, Violation: &agentproto.Violation{Kind: m.Kind, Target: m.Target,
				Source: agentproto.SourceSandbox}})
		}
	case "policy_failed":
		x.policyErr = true
	case "done":
		x.gotDone = true
		if x.k.lang == lang.Bash {
			var rc int
			fmt.Sscanf(strings.TrimPrefix(m.raw, "done "), "%d", &rc)
			if rc != 0 {
				x.execErr = &agentproto.ExecError{Name: "ExitError", Value: "exit status " + strconv.Itoa(rc)}
			}
		}
	}
}
