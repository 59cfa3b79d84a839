package e2b

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/lang"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// Code-interpreter tunables.
const (
	// interpKeepalive is the silence after which /execute sends a keepalive
	// line, so that a dead client is noticed.
	interpKeepalive = 5 * time.Second
	// interpMaxOutput caps one execution's stdout plus stderr. The output
	// is streamed through, never held: the cap bounds what one execution
	// may send, not memory.
	interpMaxOutput = 64 << 20
)

func (h *Handler) interpreterMux() http.Handler {
	mux := http.NewServeMux()
	h.route(InterpreterPort, "GET /health", "POST /execute", "POST /contexts", "GET /contexts", "DELETE /contexts/{id}", "POST /contexts/{id}/restart")
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`"OK"`))
	})
	mux.HandleFunc("POST /execute", h.execute)
	mux.HandleFunc("POST /contexts", h.createContext)
	mux.HandleFunc("GET /contexts", h.listContexts)
	mux.HandleFunc("DELETE /contexts/{id}", h.deleteContext)
	mux.HandleFunc("POST /contexts/{id}/restart", h.restartContext)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no route "+r.Method+" "+r.URL.Path, http.StatusNotFound)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The SDKs send the access token on /execute (older ones not on
		// /contexts) and the traffic token on every call; either will do,
		// and a wrong one is refused. Both are checked (an HMAC each)
		// before anything is looked up.
		id := r.Header.Get("E2b-Sandbox-Id")
		owner, keyID, ok := h.interpreterOwner(r.Context(), id, r.Header.Get("X-Access-Token"), r.Header.Get("E2B-Traffic-Access-Token"))
		if !ok {
			http.Error(w, "unauthorized: a valid X-Access-Token or E2B-Traffic-Access-Token is required", http.StatusUnauthorized)
			return
		}
		sb := h.target(w, r, owner, id)
		if sb == nil {
			return
		}
		if r.Method == http.MethodPost && r.URL.Path == "/execute" {
			release, err := h.hold(r.Context(), owner, keyID)
			if err != nil {
				interpError(w, r, err)
				return
			}
			defer release()
		}
		mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), sandboxKey, sb)))
	})
}

// interpreterOwner returns the owner whose tokens authorize a
// code-interpreter request for sandbox id, and the key of the first:
// every token given must be sandbox id's, of a live key of that owner,
// and one at least is needed.
func (h *Handler) interpreterOwner(ctx context.Context, id, access, traffic string) (string, string, bool) {
	var keys []string
	for _, t := range []struct {
		tok  string
		want func(id, keyID string) string
	}{{access, h.token}, {traffic, h.trafficToken}} {
		if t.tok == "" {
			continue
		}
		k, ok := tokenKey(id, t.tok, t.want)
		if !ok {
			return "", "", false
		}
		keys = append(keys, k)
	}
	owner := ""
	for _, k := range keys {
		o, ok := h.keyOwner(ctx, k)
		if !ok || owner != "" && o != owner {
			return "", "", false
		}
		owner = o
	}
	if owner == "" {
		return "", "", false
	}
	return owner, keys[0], true
}

// interpError answers a code-interpreter request with a plain-text error,
// as the E2B server does.
func interpError(w http.ResponseWriter, r *http.Request, err error) {
	if abortIfGone(r.Context()) {
		return
	}
	status, msg, retry := httpStatus(err)
	setRetryAfter(w, retry)
	http.Error(w, msg, status)
}

type executeBody struct {
	Code      string            `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

// ndjson writes one JSON object per line and flushes it, each write
// within timeout (Config.WriteTimeout). It is safe for concurrent use.
type ndjson struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	err     error
}

func newNDJSON(w http.ResponseWriter, timeout time.Duration) *ndjson {
	return &ndjson{w: w, rc: http.NewResponseController(w), timeout: timeout}
}

// line writes v and returns the error of the first write that failed.
func (n *ndjson) line(v any) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.err != nil {
		return n.err
	}
	b, err := json.Marshal(v)
	if err != nil {
		n.err = err
		return err
	}
	n.rc.SetWriteDeadline(time.Now().Add(n.timeout))
	if _, n.err = n.w.Write(append(b, '\n')); n.err == nil {
		n.err = n.rc.Flush()
	}
	return n.err
}

// end clears the write deadline once the last line is written.
func (n *ndjson) end() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.err == nil {
		n.rc.SetWriteDeadline(time.Time{})
	}
}

func stamp() string { return time.Now().UTC().Format(time.RFC3339Nano) }

// resultLine renders a rich result in E2B's shape: one key per MIME
// rendering; MIME types E2B has no name for become top-level keys, which
// the SDK gathers into result.extra. As in E2B, a text rendering in quotes
// (a string's repr) loses them.
func resultLine(res *agentproto.Result) map[string]any {
	out := map[string]any{"type": "result", "is_main_result": res.IsMainResult}
	set := func(k, v string) {
		if v != "" {
			out[k] = v
		}
	}
	set("text", unquote(res.Text))
	set("html", res.HTML)
	set("markdown", res.Markdown)
	set("svg", res.SVG)
	set("png", res.PNG)
	set("jpeg", res.JPEG)
	set("pdf", res.PDF)
	set("latex", res.LaTeX)
	set("javascript", res.JavaScript)
	if res.JSON != nil {
		out["json"] = res.JSON
	}
	for k, v := range res.Extra {
		switch k {
		case "e2b/chart", "application/vnd.e2b.chart+json":
			out["chart"] = v
		case "e2b/data", "application/vnd.e2b.data+json":
			out["data"] = v
		default:
			out[k] = v
		}
	}
	return out
}

func unquote(s string) string {
	if len(s) >= 2 && (s[0] == '\'' || s[0] == '"') && s[len(s)-1] == s[0] {
		return s[1 : len(s)-1]
	}
	return s
}

// execute runs code and streams NDJSON: number_of_executions, stdout,
// stderr, result and error lines as they happen, keepalives during
// silences, and end_of_execution last. A client that goes away interrupts
// the code; so does the server's drain, which ends the stream with an
// error line (ShuttingDown) and end_of_execution.
func (h *Handler) execute(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	sb := sandboxFrom(ctx)
	var body executeBody
	if err := decodeBody(r, &body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if body.ContextID != "" && body.Language != "" {
		http.Error(w, "only one of context_id and language may be given", http.StatusBadRequest)
		return
	}
	if l, ok := defaultLanguage(body.ContextID); ok {
		body.ContextID, body.Language = "", l // started at its first use
	}
	req := sandbox.ExecuteRequest{Code: body.Code, ContextID: body.ContextID, Env: body.EnvVars, MaxOutput: interpMaxOutput}
	if body.ContextID == "" {
		canon, err := lang.Canonical(body.Language)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		req.Language = canon
	} else if c, err := h.findContext(ctx, sb, body.ContextID); err != nil {
		interpError(w, r, err)
		return
	} else {
		req.Language = c.Language // for the record; the context decides
	}
	// No execution limit of its own, as in E2B: the client's timeout (which
	// interrupts by disconnecting) and the sandbox's lifetime bound it.
	req.Timeout = max(time.Second, time.Until(sb.Deadline()))

	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	out := newNDJSON(w, h.cfg.WriteTimeout)
	defer out.end()

	stop := make(chan struct{})
	defer close(stop)
	var mu sync.Mutex
	last := time.Now()
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				mu.Lock()
				quiet := now.Sub(last) >= interpKeepalive
				if quiet {
					last = now
				}
				mu.Unlock()
				if quiet {
					out.line(map[string]any{"type": "keepalive"})
				}
			}
		}
	}()
	sentError := false
	rec := h.backend.BeginExecution(ctx, sb, req.Language, req.Code)
	req.ID = rec.ID()
	// Everything is streamed through as it comes; nothing is kept but the
	// execution's record (bounded).
	ex, err := sb.Execute(ctx, req, func(ev agentproto.Event) error {
		rec.Event(ev)
		mu.Lock()
		last = time.Now()
		mu.Unlock()
		switch ev.Type {
		case agentproto.EventStart:
			// The agent numbers a context's executions (every replica
			// reaches the same count), as the kernel does in E2B.
			return out.line(map[string]any{"type": "number_of_executions", "execution_count": ev.ExecutionCount})
		case agentproto.EventStdout:
			return out.line(map[string]any{"type": "stdout", "text": string(ev.Data), "timestamp": stamp()})
		case agentproto.EventStderr:
			return out.line(map[string]any{"type": "stderr", "text": string(ev.Data), "timestamp": stamp()})
		case agentproto.EventResult:
			if ev.Result != nil {
				return out.line(resultLine(ev.Result))
			}
		case agentproto.EventDropped:
			// E2B has no line for it: say so on stderr, as a notebook would.
			if d := ev.Dropped; d != nil {
				return out.line(map[string]any{"type": "stderr", "timestamp": stamp(),
					"text": fmt.Sprintf("sheepfold: a %s of %d bytes was not sent: %s\n", d.Type, d.Bytes, d.Reason)})
			}
		case agentproto.EventError:
			if ev.Error != nil && !sentError {
				sentError = true
				return out.line(map[string]any{"type": "error", "name": ev.Error.Name, "value": ev.Error.Value, "traceback": ev.Error.Traceback})
			}
		}
		return nil
	})
	rec.End(ex, err)
	if err != nil {
		switch {
		case cutByDrain(ctx):
			// The server's drain cut it (the agent interrupted the code):
			// the client is still there to be told.
			out.line(map[string]any{"type": "error", "name": "ShuttingDown",
				"value": apierr.From(context.Cause(ctx)).Message, "traceback": ""})
			out.line(map[string]any{"type": "end_of_execution"})
			return
		case abortIfGone(ctx) || ctx.Err() != nil:
			return // the client left; the agent interrupted the code
		}
		e := apierr.From(err)
		out.line(map[string]any{"type": "error", "name": "ExecutionError", "value": e.Message, "traceback": ""})
	} else if ex.Error != nil && !sentError {
		// The engine's own verdicts: the interpreter died, output cap.
		out.line(map[string]any{"type": "error", "name": ex.Error.Name, "value": ex.Error.Value, "traceback": ex.Error.Traceback})
	} else if ex.Status != sandbox.ExecSuccess && !sentError {
		out.line(map[string]any{"type": "error", "name": "UnexpectedEndOfExecution", "value": "the interpreter stopped unexpectedly; its state is lost", "traceback": ""})
	}
	out.line(map[string]any{"type": "end_of_execution"})
}

// contextJSON is a code context as the code-interpreter API shows it.
type contextJSON struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func contextOf(c agentproto.ContextInfo) contextJSON {
	return contextJSON{ID: c.ID, Language: c.Language, Cwd: c.Cwd}
}

func (h *Handler) findContext(ctx context.Context, sb *sandbox.Sandbox, id string) (agentproto.ContextInfo, error) {
	all, err := sb.Contexts(ctx)
	if err != nil {
		return agentproto.ContextInfo{}, err
	}
	for _, c := range all {
		if c.ID == id {
			return c, nil
		}
	}
	return agentproto.ContextInfo{}, apierr.New(apierr.NotFound, "Context %s not found", id)
}

func (h *Handler) createContext(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if err := decodeBody(r, &body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	canon, err := lang.Canonical(body.Language)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if body.Cwd == "" {
		body.Cwd = "/home/user"
	}
	sb := sandboxFrom(r.Context())
	c, err := sb.CreateContext(r.Context(), agentproto.ContextSpec{Language: canon, Cwd: body.Cwd})
	if err != nil && cwdRefused(err) {
		// E2B changes into the cwd as root, so any directory there is
		// works, one the sandbox's user may not enter included: so does
		// Sheepfold's (the kernel starts in it, as "user"). One that is
		// not there, or not a directory, is the request's mistake: a 400
		// naming it, where E2B answers 500 (or, for Python, makes the
		// context anyway in another directory than it reports).
		msg := fmt.Sprintf("cwd %s does not exist", body.Cwd)
		if apierr.CodeOf(err) == apierr.BadRequest {
			msg = "cwd " + apierr.From(err).Message // "/etc/passwd: not a directory"
		}
		http.Error(w, msg, http.StatusBadRequest)
		return
	}
	if err != nil {
		interpError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, contextOf(c))
}

// cwdRefused reports whether a context was refused for its working
// directory: missing (not found) or not a directory (bad request); the
// agent checks it before it starts a kernel.
func cwdRefused(err error) bool {
	switch apierr.CodeOf(err) {
	case apierr.NotFound, apierr.BadRequest:
		return true
	}
	return false
}

// defaultLanguages are the languages whose default contexts E2B's code
// interpreter starts with, and lists from the first call on. Sheepfold
// starts a default context at its first execution; until then it is
// listed as it will be (its id, language and cwd), and it may be used,
// restarted or removed by that id.
var defaultLanguages = []string{lang.Python, lang.JavaScript}

// defaultContextID is the id of a language's default context (the agent's
// naming).
func defaultContextID(canon string) string { return "default-" + canon }

// defaultLanguage returns the language of a default context's id.
func defaultLanguage(id string) (string, bool) {
	for _, l := range defaultLanguages {
		if id == defaultContextID(l) {
			return l, true
		}
	}
	return "", false
}

func (h *Handler) listContexts(w http.ResponseWriter, r *http.Request) {
	all, err := sandboxFrom(r.Context()).Contexts(r.Context())
	if err != nil {
		interpError(w, r, err)
		return
	}
	// The default contexts first, as E2B lists them, started or not.
	out := make([]contextJSON, 0, len(all)+len(defaultLanguages))
	for _, l := range defaultLanguages {
		c := contextJSON{ID: defaultContextID(l), Language: l, Cwd: "/home/user"}
		if i := slices.IndexFunc(all, func(a agentproto.ContextInfo) bool { return a.ID == c.ID }); i >= 0 {
			c = contextOf(all[i])
		}
		out = append(out, c)
	}
	for _, c := range all {
		if _, ok := defaultLanguage(c.ID); !ok {
			out = append(out, contextOf(c))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) deleteContext(w http.ResponseWriter, r *http.Request) {
	sb, id := sandboxFrom(r.Context()), r.PathValue("id")
	if err := sb.DeleteContext(r.Context(), id); err != nil && !unstartedDefault(id, err) {
		interpError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, nil)
}

// unstartedDefault reports whether err says that id, a default context's,
// is not started: there is nothing to restart or remove.
func unstartedDefault(id string, err error) bool {
	_, ok := defaultLanguage(id)
	return ok && apierr.CodeOf(err) == apierr.NotFound
}

func (h *Handler) restartContext(w http.ResponseWriter, r *http.Request) {
	sb, id := sandboxFrom(r.Context()), r.PathValue("id")
	if _, err := sb.RestartContext(r.Context(), id); err != nil && !unstartedDefault(id, err) {
		interpError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, nil)
}
