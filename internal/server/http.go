package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/abort"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/e2b"
	"github.com/sheepfold/sheepfold/internal/store"
)

// handlerFunc is an endpoint: it writes a success itself and returns
// errors for writeError to render.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

// routesInto registers every route. Each endpoint group's file adds its own.
func (s *Server) routesInto(mux *http.ServeMux) {
	add := func(pattern string, authed bool, h handlerFunc) {
		s.routes = append(s.routes, pattern)
		e := s.endpoint(authed, s.streamed(pattern, h))
		mux.Handle(pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			setRoute(r, pattern)
			e.ServeHTTP(w, r)
		}))
	}
	s.healthRoutes(add)
	s.sandboxRoutes(add)
	s.snapshotRoutes(add)
	s.forkRoutes(add)
	s.policyRoutes(add)
	s.executeRoutes(add)
	s.contextRoutes(add)
	s.commandRoutes(add)
	s.fileRoutes(add)
	s.eventRoutes(add)
	s.webhookRoutes(add)
	s.secretRoutes(add)
	s.volumeRoutes(add)
	s.templateRoutes(add)
	s.batchRoutes(add)
	s.identityRoutes(add)
	s.accountRoutes(add)
	s.usageRoutes(add)
	s.alertRoutes(add)
	s.mcpRoutes(add)
	s.modelRoutes(add)
	s.sessionRoutes(add)
	s.uiRoutes(add, mux)
	s.portRoutes(add)
	s.metricsRoutes(add)
	s.metricsSummaryRoutes(add)
	s.executionHistoryRoutes(add)
	// Anything else is a JSON 405 for a known path, else a JSON 404, not
	// the mux's plain text.
	mux.Handle("/", s.endpoint(false, func(w http.ResponseWriter, r *http.Request) error {
		if allow := allowed(mux, r); len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			return apierr.New(apierr.MethodNotAllowed, "%s %s is not allowed; use %s", r.Method, r.URL.Path, strings.Join(allow, " or "))
		}
		return apierr.New(apierr.NotFound, "no route %s %s", r.Method, r.URL.Path)
	}))
}

// allowed returns the methods mux has a route for at r's path, other
// than its catch-all "/".
func allowed(mux *http.ServeMux, r *http.Request) []string {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		probe := *r
		probe.Method = m
		if _, pattern := mux.Handler(&probe); pattern != "" && pattern != "/" {
			allow = append(allow, m)
		}
	}
	return allow
}

type addFunc func(pattern string, authed bool, h handlerFunc)

// endpoint adapts a handlerFunc, authenticating first when authed.
func (s *Server) endpoint(authed bool, h handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if authed {
			p, err := s.auth.Check(r.Context(), s.secretOf(r))
			if err != nil {
				s.writeError(w, r, err)
				return
			}
			r = r.WithContext(auth.WithPrincipal(r.Context(), p))
			if li := logInfoFrom(r.Context()); li != nil {
				li.owner = p.Owner
			}
			if !inProcess(r.Context()) {
				if err := s.paces.wait(r.Context(), p.Owner); err != nil {
					s.writeError(w, r, err)
					return
				}
			}
			if !s.cfg.NoAccounting {
				if err := s.limitRequest(w, r, p); err != nil {
					s.writeError(w, r, err)
					return
				}
			}
		}
		if err := h(w, r); err != nil {
			s.writeError(w, r, err)
		}
	})
}

func owner(r *http.Request) string {
	p, _ := auth.PrincipalFrom(r.Context())
	return p.Owner
}

// classify attaches codes to the causes the server meets uncoded from
// its own dependencies (the store): the server's one table of causes to
// codes, used by /v1 (errorJSON) and the E2B surface (e2bBackend) alike.
func classify(err error) error {
	if err == nil || apierr.CodeOf(err) != apierr.Internal {
		return err
	}
	if errors.Is(err, store.ErrUnavailable) {
		return &apierr.Error{Code: apierr.StorageUnavailable, Err: err, RetryAfter: time.Second,
			Message: "the server's database is busy or full; retry later"}
	}
	return err
}

func (s *Server) errorJSON(r *http.Request, err error) (*apierr.Error, api.ErrorDetail) {
	ctx := r.Context()
	e := apierr.From(classify(err))
	switch {
	case cutByDrain(ctx) || s.draining.Load() && (e.Code == apierr.Internal || e.Code == apierr.SandboxState):
		// Cut off by the shutdown (its context canceled at the drain's
		// deadline, or its sandbox stopped with the engine): say so,
		// rather than "internal error" or "sandbox stopped".
		e = apierr.Wrap(err, apierr.ShuttingDown, "%s", errCut.Message)
	case e.Code == apierr.Internal && bodyBroken(ctx):
		// The failure was the request body's: its client hung up, or
		// sent less than it announced.
		e = apierr.Wrap(err, apierr.BadRequest, "the request body broke off before its end")
	}
	rid := requestIDFrom(ctx)
	switch {
	case clientGone(ctx):
		// Nobody is left to tell: not the server's failure.
		s.log.Debug("client went away", "request_id", rid, "method", r.Method, "path", r.URL.Path, "code", e.Code, "err", err)
	case e.Code == apierr.Internal:
		s.log.Error("request failed", "request_id", rid, "method", r.Method, "path", r.URL.Path, "err", err)
	case e.Err != nil:
		s.log.Debug("request refused", "request_id", rid, "code", e.Code, "err", e.Err)
	}
	return e, api.ErrorDetail{Code: string(e.Code), Message: e.Message, RequestID: rid}
}

// statusClientGone is what the access log and the metrics count for a
// request whose client went away before its answer (nginx's "client
// closed request"); nothing is sent.
const statusClientGone = 499

// writeError renders err: the only place an error body is written. A
// request whose client went away (or whose body stalled: net/http
// cancels its context too) gets its connection closed, nothing written
// (statusClientGone), so that no implicit 200 follows.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	e, body := s.errorJSON(r, err)
	if clientGone(r.Context()) {
		if li := logInfoFrom(r.Context()); li != nil {
			li.gone = true
		}
		abort.Response(r.Context())
		return
	}
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", fmt.Sprint(int((e.RetryAfter+time.Second-1)/time.Second)))
	}
	writeJSON(w, e.HTTPStatus(), api.Error{Error: body})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		http.Error(w, `{"error":{"code":"ERR_INTERNAL","message":"could not encode the response"}}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

// maxJSONBody bounds JSON request bodies (code to execute included).
const maxJSONBody = 16 << 20

// decodeJSON reads a JSON body into v, refusing unknown fields and
// trailing data. An empty body leaves v as is when optional.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any, optional bool) error {
	body := http.MaxBytesReader(w, r.Body, maxJSONBody)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			if optional {
				return nil
			}
			return apierr.New(apierr.BadRequest, "the request body must be a JSON object")
		}
		return jsonError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return apierr.New(apierr.BadRequest, "malformed JSON: unexpected data after the object")
	}
	return nil
}

func jsonError(err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var big *http.MaxBytesError
	switch {
	case errors.As(err, &syn):
		return apierr.Wrap(err, apierr.BadRequest, "malformed JSON at byte %d: %v", syn.Offset, syn)
	case errors.As(err, &typ):
		if typ.Field != "" {
			return apierr.Wrap(err, apierr.BadRequest, "field %q must be %s, not %s", typ.Field, jsonType(typ.Type.Kind().String()), typ.Value)
		}
		return apierr.Wrap(err, apierr.BadRequest, "the request body must be a JSON object, not %s", typ.Value)
	case errors.As(err, &big):
		return apierr.Wrap(err, apierr.BadRequest, "the request body is larger than %d bytes", big.Limit)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return apierr.Wrap(err, apierr.BadRequest, "malformed JSON: the body ends too early")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return apierr.Wrap(err, apierr.BadRequest, "unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
	}
	return apierr.Wrap(err, apierr.BadRequest, "malformed JSON: %v", err)
}

func jsonType(kind string) string {
	switch kind {
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "map", "struct":
		return "an object"
	case "slice", "array":
		return "an array"
	case "ptr":
		return "a value of another type"
	}
	return "a number"
}

// Middleware.

// bodyDeadline cuts request bodies that stall. A request with a body gets a
// read deadline of BodyReadTimeout, moved forward at every read of the
// body and cleared once the body is read to its end (the server's
// background read that notices a client hang-up must not time out during
// a long stream). A handler that never reads a body leaves the deadline
// running, so the server's discard of the unread rest after the handler
// (up to 256 KiB) cannot hang on a client that sends nothing.
//
// It also bounds every body (bodyLimit), on the server's own
// ResponseWriter, so that a body over the limit closes the connection.
func (s *Server) bodyDeadline(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		// A shallow copy: the server keeps its own *Request, whose Body
		// it checks after the handler to decide whether the connection
		// may be reused.
		r2 := *r
		r = &r2
		if limit := s.bodyLimit(r); limit > 0 {
			r.Body = http.MaxBytesReader(w, r.Body, limit)
		}
		if e2b.IsStream(r) {
			next.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.SetReadDeadline(time.Now().Add(s.cfg.BodyReadTimeout)); err == nil {
			bs := &bodyState{}
			r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc, idle: s.cfg.BodyReadTimeout, state: bs}
			r = r.WithContext(context.WithValue(r.Context(), keyBody, bs))
		}
		next.ServeHTTP(w, r)
	})
}

// deadlineBody moves its connection's read deadline at every read, and
// records in state a read that failed other than by the body's end or
// bound.
type deadlineBody struct {
	io.ReadCloser
	rc    *http.ResponseController
	idle  time.Duration
	done  bool
	state *bodyState
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	if b.done {
		return b.ReadCloser.Read(p)
	}
	_ = b.rc.SetReadDeadline(time.Now().Add(b.idle))
	n, err := b.ReadCloser.Read(p)
	var big *http.MaxBytesError
	switch {
	case errors.Is(err, io.EOF):
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	case err != nil && !errors.As(err, &big):
		b.state.broken.Store(true)
	}
	return n, err
}

// bodyState is what bodyDeadline learns of a request's body as it is
// read.
type bodyState struct {
	broken atomic.Bool // a read failed: the client hung up, stalled or sent less than announced
}

// bodyBroken reports whether reading ctx's request's body failed (not
// its end, not its bound): an error of the request then is the client's.
func bodyBroken(ctx context.Context) bool {
	bs, _ := ctx.Value(keyBody).(*bodyState)
	return bs != nil && bs.broken.Load()
}

type ctxKey int

const (
	keyRequestID ctxKey = iota
	keyLogInfo
	keyBody // *bodyState
)

func requestIDFrom(ctx context.Context) string {
	id, _ := ctx.Value(keyRequestID).(string)
	return id
}

func validRequestID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c == '-' || c == '_' || c == '.' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}

// requestID takes the caller's X-Request-Id when it is sane, else makes
// one, and echoes it in the response.
func (s *Server) requestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Request-Id")
		if !validRequestID(id) {
			id = newID("req_")
		}
		w.Header().Set("X-Request-Id", id)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), keyRequestID, id)))
	})
}

// logInfo is what handlers learn about a request for its log line and
// metrics: filled in as they go (one request, one goroutine).
type logInfo struct {
	start   time.Time // the request's arrival (accessLog)
	owner   string
	sandbox string
	route   string // the route's pattern, "preview" or "e2b"; "" for none (404, 405)
	gone    bool   // the client went away before an error could be answered
}

// setRoute records the route a request took.
func setRoute(r *http.Request, route string) {
	if li := logInfoFrom(r.Context()); li != nil {
		li.route = route
	}
}

// setSandbox records the sandbox a request is about.
func setSandbox(r *http.Request, id string) {
	if li := logInfoFrom(r.Context()); li != nil {
		li.sandbox = id
	}
}

func logInfoFrom(ctx context.Context) *logInfo {
	li, _ := ctx.Value(keyLogInfo).(*logInfo)
	return li
}

// statusWriter records the status and size of a response.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	return n, err
}

func (w *statusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (s *Server) accessLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		li := &logInfo{start: start}
		next.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), keyLogInfo, li)))
		d := time.Since(start)
		route := li.route
		if route == "" {
			route = "other"
		}
		status := sw.status
		if status == 0 && (li.gone || clientGone(r.Context())) {
			status = statusClientGone
		}
		s.metrics.HTTPRequest(route, status, d)
		s.log.LogAttrs(r.Context(), slog.LevelInfo, "request",
			slog.String("request_id", requestIDFrom(r.Context())), slog.String("method", r.Method),
			slog.String("path", r.URL.Path), slog.Int("status", status), slog.Int64("bytes", sw.bytes),
			slog.Duration("duration", d), slog.String("account", li.owner), slog.String("sandbox", li.sandbox))
	})
}

// recoverPanics turns a panic into a 500 ERR_INTERNAL when nothing was
// written yet, else cuts the response short (abort.Response), and logs
// its cause and stack. It never raises a panic again: the request may be
// served on a goroutine no net/http server recovers (the in-process
// transport of /mcp). http.ErrAbortHandler, which the standard library
// raises itself (httputil.ReverseProxy, when a body breaks mid-way),
// becomes abort.Response too.
func (s *Server) recoverPanics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw, ok := w.(*statusWriter)
		if !ok {
			sw = &statusWriter{ResponseWriter: w}
		}
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v != http.ErrAbortHandler {
				s.log.Error("panic", "request_id", requestIDFrom(r.Context()), "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
				if sw.status == 0 {
					s.writeError(sw, r, apierr.Wrap(fmt.Errorf("panic: %v", v), apierr.Internal, "internal error"))
					return
				}
			}
			abort.Response(r.Context())
		}()
		next.ServeHTTP(sw, r)
	})
}
