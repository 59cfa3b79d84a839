package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
)

// TemplateStarts is implemented by Templates whose templates start a
// command in each of their sandboxes (a Dockerfile's LABEL
// sheepfold.start and sheepfold.ready: template.Info.Start, Ready).
type TemplateStarts interface {
	StartOf(name string) (TemplateStart, error)
}

// TemplateStart is what a sandbox of a template runs as it starts.
type TemplateStart struct {
	// Command is run by sh -c in the background as User in WorkDir with
	// Env added; "" runs nothing.
	Command string
	// Ready is the check that says the sandbox is ready: "port:N" (a TCP
	// connection to port N inside the sandbox is accepted), "cmd:COMMAND"
	// (sh -c COMMAND, run as Command is, exits 0), or "" (ready once
	// Command has started).
	Ready string
	// User and WorkDir are the template's last USER and WORKDIR: those
	// of the start command, and the defaults of every process and code
	// context of its sandboxes (runtime.Spec.User, WorkDir). A USER's
	// ":group" is dropped: a user runs with its primary group.
	User    string
	WorkDir string
	Env     []string // "K=V"
	// Root is the template's project directory (LABEL sheepfold.root):
	// the file API resolves an absolute path whose first component is
	// none of the root filesystem's top-level entries (nor a volume's)
	// under it: "/src/App.tsx" is Root/src/App.tsx, "/tmp/x" stays.
	Root string
}

// SandboxIDEnv names the sandbox's id in its start command's
// environment (a dev server's base path for the preview's path form).
const SandboxIDEnv = "SHEEPFOLD_SANDBOX_ID"

// project is a sandbox's TemplateStart.Root and the names it leaves
// alone.
type project struct {
	root string
	top  map[string]bool
}

// newProject is the project of a sandbox of st on rootfs with volumes
// mounted at mounts; nil when st has no Root.
func newProject(st TemplateStart, rootfs string, mounts []string) *project {
	if st.Root == "" || !path.IsAbs(st.Root) {
		return nil
	}
	ents, err := os.ReadDir(rootfs)
	if err != nil || len(ents) == 0 {
		// Not a tree of this host's (a cluster's runtime): no name is
		// known, so none is mapped.
		return nil
	}
	p := &project{root: path.Clean(st.Root), top: map[string]bool{".": true, "..": true}}
	for _, e := range ents {
		p.top[e.Name()] = true
	}
	for _, m := range mounts {
		top, _, _ := strings.Cut(strings.TrimLeft(m, "/"), "/")
		p.top[top] = true
	}
	return p
}

// projectOf is the project of a sandbox of template tmpl on rootfs (one
// restored or cloned: its start command is not run again).
func (m *Manager) projectOf(tmpl, rootfs string, volumes []VolumeMount) *project {
	st, err := m.templateStart(tmpl)
	if err != nil {
		return nil
	}
	var mounts []string
	for _, v := range volumes {
		mounts = append(mounts, v.Path)
	}
	return newProject(st, rootfs, mounts)
}

// projectPath maps a file API path (project).
func (s *Sandbox) projectPath(p string) string {
	if s.project == nil || !strings.HasPrefix(p, "/") {
		return p
	}
	top, _, _ := strings.Cut(strings.TrimLeft(p, "/"), "/")
	if top == "" || s.project.top[top] {
		return p
	}
	return path.Join(s.project.root, p)
}

// DefaultStartTimeout is Config.StartTimeout's default.
const DefaultStartTimeout = 60 * time.Second

// StartTag is the process.list tag of a template's start command.
const StartTag = "sheepfold.start"

// startOutputTail is how much of the start command's last output a
// failed start reports.
const startOutputTail = 4 << 10

// readyPoll is how often the ready check is tried.
const readyPoll = 20 * time.Millisecond

// readyCheck is a parsed TemplateStart.Ready.
type readyCheck struct {
	port int
	cmd  string
}

// ParseReady parses a ready check: "port:N" (1..65535), "cmd:COMMAND" or "".
func ParseReady(s string) (readyCheck, error) {
	kind, arg, _ := strings.Cut(s, ":")
	switch {
	case s == "":
		return readyCheck{}, nil
	case kind == "port":
		p, err := strconv.Atoi(arg)
		if err != nil || p < 1 || p > 65535 {
			return readyCheck{}, fmt.Errorf("ready check %q: the port must be 1..65535", s)
		}
		return readyCheck{port: p}, nil
	case kind == "cmd" && strings.TrimSpace(arg) != "":
		return readyCheck{cmd: arg}, nil
	}
	return readyCheck{}, fmt.Errorf("ready check %q: want port:N or cmd:COMMAND", s)
}

// templateStart is the start of template name's sandboxes (none when
// the Templates say none).
func (m *Manager) templateStart(name string) (TemplateStart, error) {
	ts, ok := m.cfg.Templates.(TemplateStarts)
	if !ok {
		return TemplateStart{}, nil
	}
	st, err := ts.StartOf(name)
	if err != nil {
		return TemplateStart{}, err
	}
	if _, err := ParseReady(st.Ready); err != nil {
		return TemplateStart{}, apierr.Wrap(err, apierr.TemplateNotReady, "template %q: %v", name, err)
	}
	if st.Command == "" && st.Ready != "" {
		return TemplateStart{}, apierr.New(apierr.TemplateNotReady, "template %q has a ready check but no start command", name)
	}
	// USER's "name[:group]": the agent's users are passwd(5) names (or
	// uids), each with its primary group.
	st.User, _, _ = strings.Cut(st.User, ":")
	return st, nil
}

// DefaultUser is the user the sandbox's processes and file calls that
// name none act as: its template's USER (TemplateStart.User) as its
// agent started with it, else "user".
func (s *Sandbox) DefaultUser() string {
	u, known := s.startUser, s.startUserKnown
	if !known { // taken back or restored: the template's now
		if st, err := s.m.templateStart(s.Template); err == nil {
			u = st.User
		}
	}
	if u == "" {
		return agentproto.UserDefault
	}
	return u
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	// mu guards b.
	mu  sync.Mutex
	b   []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// runTemplateStart starts st's command in s, which is starting (a pool
// member) or just running, and returns once st's ready check holds, the
// command has ended (ERR_TEMPLATE_NOT_READY with its last output), or
// timeout has passed (the same code, reason "timeout"). The caller
// destroys s when it fails: the command and everything it started go
// with it.
func (s *Sandbox) runTemplateStart(ctx context.Context, st TemplateStart, timeout time.Duration) error {
	if st.Command == "" {
		return nil
	}
	check, err := ParseReady(st.Ready)
	if err != nil {
		return apierr.Wrap(err, apierr.TemplateNotReady, "%v", err)
	}
	began := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	env := map[string]string{SandboxIDEnv: s.ID}
	for _, kv := range st.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			env[k] = v
		}
	}
	spec := agentproto.ProcessSpec{Cmd: "/bin/sh", Args: []string{"-c", st.Command}, Env: env,
		Cwd: st.WorkDir, User: st.User, Tag: StartTag}
	out := &tailBuffer{max: startOutputTail}
	started := make(chan int, 1)
	type ended struct {
		done agentproto.Event
		err  error
	}
	exited := make(chan ended, 1)
	// The stream is read until the sandbox is ready, then cut: the
	// command runs on (cancelling a call stops its streaming only).
	streamCtx, stopStream := context.WithCancel(context.WithoutCancel(ctx))
	defer stopStream()
	go func() {
		done, err := s.agent.call(streamCtx, agentproto.Request{Op: agentproto.OpProcessStart, Process: &spec}, nil,
			agentproto.Handlers{Event: func(ev agentproto.Event) error {
				switch ev.Type {
				case agentproto.EventStart:
					started <- ev.PID
				case agentproto.EventStdout, agentproto.EventStderr:
					out.Write(ev.Data)
				}
				return nil
			}}, callOptions{})
		exited <- ended{done, err}
	}()
	fail := func(reason string, cause error, format string, a ...any) error {
		msg := fmt.Sprintf(format, a...)
		tail := strings.TrimSpace(out.String())
		if tail != "" {
			msg += "; its last output:\n" + tail
		}
		return &apierr.Error{Code: apierr.TemplateNotReady, Message: msg, Err: cause,
			Details: map[string]any{"reason": reason, "command": st.Command, "ready": st.Ready, "output": tail}}
	}
	ended1 := func(e ended) error {
		if e.err != nil {
			if streamCtx.Err() != nil && ctx.Err() != nil {
				return fail("timeout", e.err, "the template's start command %q was not ready within %s", st.Command, timeout)
			}
			return fail("start_failed", e.err, "the template's start command %q could not run", st.Command)
		}
		code := "?"
		if e.done.ExitCode != nil {
			code = strconv.Itoa(*e.done.ExitCode)
		}
		if e.done.Signal != 0 {
			code = "signal " + strconv.Itoa(e.done.Signal)
		}
		return fail("exited", nil, "the template's start command %q ended (exit %s) before the sandbox was ready (%s)", st.Command, code, orNone(st.Ready))
	}
	if check == (readyCheck{}) {
		select {
		case <-started:
			return nil
		case e := <-exited:
			return ended1(e)
		case <-ctx.Done():
			return fail("timeout", ctx.Err(), "the template's start command %q did not start within %s", st.Command, timeout)
		}
	}
	tick := time.NewTicker(readyPoll)
	defer tick.Stop()
	for {
		ready, err := s.readyHolds(ctx, check, spec)
		// A check cut by the deadline (its dial's own timeout may come
		// a moment before the context says so) is the timeout's.
		if err != nil && ctx.Err() == nil && time.Now().Before(deadline) {
			return fail("check_failed", err, "the template's ready check %q could not run", st.Ready)
		}
		if ready {
			s.m.log.Debug("template start ready", "sandbox", s.ID, "template", s.Template, "after", time.Since(began).Round(time.Millisecond))
			return nil
		}
		select {
		case e := <-exited:
			if e.err == nil && e.done.Signal == 0 && e.done.ExitCode != nil && *e.done.ExitCode == 0 {
				// A command that did its work and ended (E2B's start
				// commands may: `touch /tmp/ready`): the check decides.
				exited = nil
				continue
			}
			return ended1(e)
		case <-ctx.Done():
			select {
			case e := <-exited: // it ended just now: say so, not "timeout"
				if e.err == nil {
					return ended1(e)
				}
			default:
			}
			return fail("timeout", ctx.Err(), "the template's ready check %q did not hold within %s of the start command %q", st.Ready, timeout, st.Command)
		case <-tick.C:
		}
	}
}

func orNone(s string) string {
	if s == "" {
		return "no ready check"
	}
	return "ready check " + s
}

// readyHolds tries check (a port or a command) once.
func (s *Sandbox) readyHolds(ctx context.Context, check readyCheck, like agentproto.ProcessSpec) (bool, error) {
	switch {
	case check.port > 0:
		nc, ev, err := s.connect(ctx, agentproto.Request{Op: agentproto.OpPortConnect, Port: check.port}, time.Now().Add(time.Second))
		if err != nil {
			return false, err
		}
		if nc == nil {
			if ev.Code == agentproto.CodeRefused {
				return false, nil
			}
			return false, agentError(ev)
		}
		nc.Close()
		return true, nil
	case check.cmd != "":
		spec := like
		spec.Args, spec.Tag = []string{"-c", check.cmd}, "sheepfold.ready"
		spec.TimeoutMS = 5000
		done, err := s.agent.call(ctx, agentproto.Request{Op: agentproto.OpProcessStart, Process: &spec}, nil,
			agentproto.Handlers{}, callOptions{})
		if err != nil {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return false, nil
			}
			return false, err
		}
		return done.ExitCode != nil && *done.ExitCode == 0, nil
	}
	return false, errors.New("no ready check")
}
