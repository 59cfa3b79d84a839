package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"path"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/lang"
)

// kernelContext is one code context: a kernel and its description.
type kernelContext struct {
	info agentproto.ContextInfo
	k    Kernel
	// turn admits one execution at a time: interpreters run one cell after
	// another.
	turn chan struct{}
	// executions counts the executions started since the kernel started
	// (Jupyter's execution_count): kept with the kernel, so that every
	// server that reaches the sandbox numbers them alike.
	executions atomic.Int64
}

// contextTable maps context ids to kernels.
type contextTable struct {
	// mu guards everything below.
	mu   sync.Mutex
	byID map[string]*kernelContext
	// starting holds the default contexts being created, so that racing
	// first executions create one kernel, not several.
	starting map[string]chan struct{}
	closed   bool
}

var errClosing = errors.New("agent: shutting down")

func newContextTable() *contextTable {
	return &contextTable{byID: make(map[string]*kernelContext), starting: make(map[string]chan struct{})}
}

func (t *contextTable) get(id string) *kernelContext {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byID[id]
}

// add registers kc under its id, or closes it when the agent is stopping.
func (t *contextTable) add(kc *kernelContext) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		kc.k.Close()
		return errClosing
	}
	t.byID[kc.info.ID] = kc
	return nil
}

func (t *contextTable) remove(id string) *kernelContext {
	t.mu.Lock()
	defer t.mu.Unlock()
	kc := t.byID[id]
	delete(t.byID, id)
	return kc
}

func (t *contextTable) list() []agentproto.ContextInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]agentproto.ContextInfo, 0, len(t.byID))
	for _, kc := range t.byID {
		out = append(out, kc.info)
	}
	slices.SortFunc(out, func(a, b agentproto.ContextInfo) int {
		if a.ID < b.ID {
			return -1
		}
		if a.ID > b.ID {
			return 1
		}
		return 0
	})
	return out
}

// closeAll closes every kernel; later additions are closed at once.
func (t *contextTable) closeAll(log *slog.Logger) {
	t.mu.Lock()
	t.closed = true
	all := t.byID
	t.byID = make(map[string]*kernelContext)
	t.mu.Unlock()
	for id, kc := range all {
		if err := kc.k.Close(); err != nil {
			log.Warn("close kernel", "context", id, "err", err)
		}
	}
}

// language maps a requested language to its canonical name, or returns a
// failed Done.
func (s *server) language(name string) (string, *agentproto.Event) {
	if s.cfg.NewKernel == nil {
		ev := fail(agentproto.CodeUnsupported, "code contexts are not available")
		return "", &ev
	}
	if name == "" {
		name = lang.Python
		if len(s.cfg.Languages) > 0 {
			name = s.cfg.Languages[0]
		}
	}
	canon := name
	if s.cfg.Canonical != nil {
		c, err := s.cfg.Canonical(name)
		if err != nil {
			ev := fail(agentproto.CodeUnsupported, "unsupported language %q", name)
			return "", &ev
		}
		canon = c
	}
	if len(s.cfg.Languages) > 0 && !slices.Contains(s.cfg.Languages, canon) {
		ev := fail(agentproto.CodeUnsupported, "unsupported language %q", name)
		return "", &ev
	}
	return canon, nil
}

// startKernel starts a kernel for spec (whose Language is canonical) and
// returns its context, not yet registered.
func (s *server) startKernel(id string, spec agentproto.ContextSpec) (*kernelContext, error) {
	info := agentproto.ContextInfo{ID: id, Cwd: s.contextCwd(spec.Cwd)}
	spec.Cwd = hostPath(s.cfg.Root, info.Cwd)
	k, err := s.cfg.NewKernel(s.ctx, spec)
	if err != nil {
		return nil, err
	}
	lang := k.Language()
	if lang == "" {
		lang = spec.Language
	}
	return &kernelContext{
		info: agentproto.ContextInfo{ID: info.ID, Language: lang, Cwd: info.Cwd},
		k:    k,
		turn: make(chan struct{}, 1),
	}, nil
}

// contextCwd is the sandbox path a context asked to start in cwd starts
// in: Config.WorkDir, else the home directory, when cwd is empty;
// relative ones under the home.
func (s *server) contextCwd(cwd string) string {
	if cwd == "" && s.cfg.WorkDir != "" {
		return s.cfg.WorkDir
	}
	if cwd == "" {
		return s.cfg.Home
	}
	if !path.IsAbs(cwd) {
		cwd = path.Join(s.cfg.Home, cwd)
	}
	return path.Clean(cwd)
}

// defaultContext returns the default context of a canonical language,
// creating it on first use.
func (s *server) defaultContext(ctx context.Context, lang string) (*kernelContext, error) {
	id := "default-" + lang
	t := s.ctxs
	for {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return nil, errClosing
		}
		if kc := t.byID[id]; kc != nil {
			t.mu.Unlock()
			return kc, nil
		}
		if ch := t.starting[id]; ch != nil {
			t.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		ch := make(chan struct{})
		t.starting[id] = ch
		t.mu.Unlock()

		kc, err := s.startKernel(id, agentproto.ContextSpec{Language: lang})
		if err == nil {
			err = t.add(kc)
		}
		t.mu.Lock()
		delete(t.starting, id)
		close(ch)
		t.mu.Unlock()
		if err != nil {
			return nil, err
		}
		return kc, nil
	}
}

func newContextID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (s *server) contextCreate(req *agentproto.Request) agentproto.Event {
	if req.Context == nil {
		return fail(agentproto.CodeBadRequest, "context.create needs a context")
	}
	spec := *req.Context
	lang, bad := s.language(spec.Language)
	if bad != nil {
		return *bad
	}
	spec.Language = lang
	// A missing working directory is the caller's mistake, named as such
	// (not found, not a directory), not a failed start.
	if bad := s.contextDir(s.contextCwd(spec.Cwd)); bad != nil {
		return *bad
	}
	kc, err := s.startKernel(newContextID(), spec)
	if err != nil {
		s.log.Warn("start kernel", "language", lang, "err", err)
		return fail(agentproto.CodeInternal, "start %s kernel: %v", lang, err)
	}
	if err := s.ctxs.add(kc); err != nil {
		return fail(agentproto.CodeInternal, "%v", err)
	}
	ev := ok()
	ev.Context = &kc.info
	return ev
}

func (s *server) contextList() agentproto.Event {
	ev := ok()
	ev.Contexts = s.ctxs.list()
	return ev
}

func (s *server) contextRestart(c *conn, req *agentproto.Request) agentproto.Event {
	kc := s.ctxs.get(req.ContextID)
	if kc == nil {
		return fail(agentproto.CodeNotFound, "no context %q", req.ContextID)
	}
	ctx, cancel := s.requestContext(c)
	defer cancel()
	if err := kc.k.Restart(ctx); err != nil {
		return fail(agentproto.CodeInternal, "restart context %s: %v", req.ContextID, err)
	}
	kc.executions.Store(0)
	ev := ok()
	ev.Context = &kc.info
	return ev
}

func (s *server) contextDelete(req *agentproto.Request) agentproto.Event {
	kc := s.ctxs.remove(req.ContextID)
	if kc == nil {
		return fail(agentproto.CodeNotFound, "no context %q", req.ContextID)
	}
	if err := kc.k.Close(); err != nil {
		s.log.Warn("close kernel", "context", req.ContextID, "err", err)
	}
	return ok()
}

// requestContext returns a context that ends when the client hangs up or
// the agent stops.
func (s *server) requestContext(c *conn) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(s.ctx)
	gone := c.hangup()
	s.wg.Go(func() {
		select {
		case <-gone:
			cancel()
		case <-ctx.Done():
		}
	})
	return ctx, cancel
}

func (s *server) execute(c *conn, req *agentproto.Request) agentproto.Event {
	if req.Execute == nil {
		return fail(agentproto.CodeBadRequest, "context.execute needs an execute spec")
	}
	spec := *req.Execute
	if spec.ContextID == "" {
		spec.ContextID = req.ContextID
	}
	ctx, cancel := s.requestContext(c)
	defer cancel()

	var kc *kernelContext
	if spec.ContextID != "" {
		if kc = s.ctxs.get(spec.ContextID); kc == nil {
			return fail(agentproto.CodeNotFound, "no context %q", spec.ContextID)
		}
	} else {
		lang, bad := s.language(spec.Language)
		if bad != nil {
			return *bad
		}
		var err error
		if kc, err = s.defaultContext(ctx, lang); err != nil {
			if ctx.Err() != nil {
				return agentproto.Event{}
			}
			s.log.Warn("start default kernel", "language", lang, "err", err)
			return fail(agentproto.CodeInternal, "start %s kernel: %v", lang, err)
		}
		spec.ContextID = kc.info.ID
	}
	spec.Language = kc.info.Language

	select {
	case kc.turn <- struct{}{}:
	case <-ctx.Done():
		return agentproto.Event{}
	}
	defer func() { <-kc.turn }()
	// The execution starts now, with its number in its context. A
	// preload (the warm pool's) runs none of the user's code: it is not
	// counted, so a context numbers the user's executions from 1 whether
	// its sandbox came from the pool or not.
	var n int64
	if spec.Preload == nil {
		n = kc.executions.Add(1)
	}
	if err := c.send(agentproto.Event{Type: agentproto.EventStart, ExecutionCount: n}); err != nil {
		return agentproto.Event{} // the client hung up
	}

	emit := func(ev agentproto.Event) error {
		if ev.Type == agentproto.EventDone {
			return nil // the Done is Execute's return value
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return c.send(ev)
	}
	done := kc.k.Execute(ctx, spec, emit)
	if ctx.Err() != nil && s.ctx.Err() == nil {
		return agentproto.Event{} // the client hung up
	}
	done.Type = agentproto.EventDone
	return done
}
