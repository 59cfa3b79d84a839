package e2b

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/sheepfold/sheepfold/internal/e2b/envdpb/filesystempb"
	"github.com/sheepfold/sheepfold/internal/e2b/envdpb/filesystempb/filesystempbconnect"
	"github.com/sheepfold/sheepfold/internal/e2b/envdpb/processpb"
	"github.com/sheepfold/sheepfold/internal/e2b/envdpb/processpb/processpbconnect"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// The sandbox users E2B clients may name.
const (
	defaultUser = "user"
	rootUser    = "root"
)

type ctxKey int

const (
	sandboxKey ctxKey = iota
	userKey
	keyIDKey // the API key of a control-plane request
	hostKey  // the Host of a control-plane request
	holdKey  // func() (release func(), err error): holds a stream of the request's key (Handler.hold)
)

// streamProcedures are envd's RPCs whose requests are long-lived: each
// holds a stream of its key while it runs (Config.Hold).
var streamProcedures = map[string]bool{
	processpbconnect.ProcessStartProcedure:          true,
	processpbconnect.ProcessConnectProcedure:        true,
	processpbconnect.ProcessStreamInputProcedure:    true,
	filesystempbconnect.FilesystemWatchDirProcedure: true,
}

// sandboxFrom returns the sandbox a data-plane request addresses.
func sandboxFrom(ctx context.Context) *sandbox.Sandbox {
	sb, _ := ctx.Value(sandboxKey).(*sandbox.Sandbox)
	return sb
}

// userFrom returns the sandbox user a request acts as: "" when it names
// none, the sandbox's default (its template's USER, else "user": the
// agent's; E2B's envd since 0.4.0, where the SDK stopped sending "user").
func userFrom(ctx context.Context) string {
	u, _ := ctx.Value(userKey).(string)
	return u
}

// maxMessageBytes bounds one envd RPC message (a process's input chunk is
// the largest an SDK sends); connectEnvelope is the framing around it.
const (
	maxMessageBytes = 4 << 20
	connectEnvelope = 5
)

func (h *Handler) envdMux() http.Handler {
	mux := http.NewServeMux()
	// Every RPC message is bounded, compressed and decompressed: the body
	// by maxMessageBytes on the wire, the message by WithReadMaxBytes.
	limit := connect.WithReadMaxBytes(maxMessageBytes)
	bounded := func(pattern string, hd http.Handler) (string, http.Handler) {
		return pattern, http.MaxBytesHandler(hd, maxMessageBytes+connectEnvelope)
	}
	// Every write of an RPC's response, a stream's message included,
	// must reach the client within WriteTimeout: one that stops reading
	// breaks its stream (Start and Connect then detach from the process,
	// WatchDir ends its watch) instead of pinning it.
	deadline := func(pattern string, hd http.Handler) (string, http.Handler) {
		return pattern, writeDeadlines(hd, h.cfg.WriteTimeout)
	}
	mux.Handle(deadline(processpbconnect.NewProcessHandler(&processService{h: h}, limit)))
	mux.Handle(deadline(bounded(filesystempbconnect.NewFilesystemHandler(&filesystemService{h: h}, limit))))
	for _, fd := range []protoreflect.FileDescriptor{processpb.File_process_process_proto, filesystempb.File_filesystem_filesystem_proto} {
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			for j := range sd.Methods().Len() {
				h.route(EnvdPort, "POST /"+string(sd.FullName())+"/"+string(sd.Methods().Get(j).Name()))
			}
		}
	}
	h.route(EnvdPort, "GET /health", "GET /envs", "GET /files", "POST /files")
	mux.HandleFunc("GET /envs", func(w http.ResponseWriter, r *http.Request) {
		env := sandboxFrom(r.Context()).Env
		if env == nil {
			env = map[string]string{}
		}
		writeJSON(w, http.StatusOK, env)
	})
	mux.Handle("/files", writeDeadlines(http.HandlerFunc(h.serveFiles), h.cfg.WriteTimeout))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		e := noRoute(w, mux, r)
		writeJSON(w, e.status, map[string]any{"code": e.status, "message": e.message})
	})

	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The credential first, and nothing looked up before it holds:
		// the access token (one HMAC), or for /files a signature. /health
		// needs it too: a sandbox's state is its owner's to learn.
		id := r.Header.Get("E2b-Sandbox-Id")
		keyID, msg := h.envdKey(r.Context(), r, id)
		if keyID == "" {
			writeJSON(w, http.StatusUnauthorized, map[string]any{"code": http.StatusUnauthorized, "message": msg})
			return
		}
		owner, ok := h.keyOwner(r.Context(), keyID)
		if !ok {
			writeJSON(w, http.StatusUnauthorized, map[string]any{"code": http.StatusUnauthorized, "message": errUnauthorized})
			return
		}
		sb := h.target(w, r, owner, id)
		if sb == nil {
			return
		}
		if r.URL.Path == "/health" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		user, err := basicUser(r.Header.Get("Authorization"))
		if err != nil {
			// Connect's own error writer: the status and body each
			// protocol expects (no table of ours).
			connect.NewErrorWriter().Write(w, r, connect.NewError(connect.CodeUnauthenticated, err))
			return
		}
		if streamProcedures[r.URL.Path] || r.URL.Path == "/files" {
			release, err := h.hold(r.Context(), owner, keyID)
			if err != nil {
				if r.URL.Path == "/files" {
					status, msg, retry := httpStatus(err)
					setRetryAfter(w, retry)
					writeFilesError(w, status, "%s", msg)
				} else {
					connect.NewErrorWriter().Write(w, r, connectError(r.Context(), err))
				}
				return
			}
			defer release()
		}
		ctx := context.WithValue(r.Context(), sandboxKey, sb)
		ctx = context.WithValue(ctx, userKey, user)
		ctx = context.WithValue(ctx, holdKey, func() (func(), error) { return h.hold(ctx, owner, keyID) })
		mux.ServeHTTP(w, r.WithContext(ctx))
	})
}

// errUnauthorized is envd's answer to a request without a valid
// credential.
const errUnauthorized = "unauthorized access, please provide a valid access token or method signing if supported"

// envdKey returns the key whose access token authorizes an envd request
// for sandbox id: its X-Access-Token, or for /files a signature made
// with such a token (E2B's signed URLs); else "" and why.
func (h *Handler) envdKey(ctx context.Context, r *http.Request, id string) (keyID, msg string) {
	if tok := r.Header.Get("X-Access-Token"); tok != "" {
		if k, ok := tokenKey(id, tok, h.token); ok {
			return k, ""
		}
	}
	if r.URL.Path == "/files" {
		if s, ok := signedOf(r); ok {
			if id == "" {
				return "", "invalid signature"
			}
			_, k, msg := h.signer(ctx, id, s)
			return k, msg
		}
	}
	return "", errUnauthorized
}

// basicUser reads the user from "Authorization: Basic base64(user:)", as
// the SDK sends it when a call names a user.
func basicUser(h string) (string, error) {
	if h == "" {
		return "", nil
	}
	scheme, rest, _ := strings.Cut(h, " ")
	if !strings.EqualFold(scheme, "Basic") {
		return "", errors.New("authorization must be Basic base64(user:)")
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(rest))
	if err != nil {
		return "", errors.New("malformed Basic authorization")
	}
	user, _, _ := strings.Cut(string(b), ":")
	return checkUser(user)
}

// checkUser accepts the users a sandbox has for E2B clients; none ("")
// is the sandbox's default user (userFrom).
func checkUser(user string) (string, error) {
	switch user {
	case "", defaultUser, rootUser:
		return user, nil
	}
	return "", fmt.Errorf("user %q does not exist in the sandbox (use %q or %q)", user, defaultUser, rootUser)
}

// writeDeadlines gives every write and flush of next's response a
// deadline of timeout from its start, and clears it when next returns.
func writeDeadlines(next http.Handler, timeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dw := &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), timeout: timeout}
		next.ServeHTTP(dw, r)
		if dw.err == nil {
			dw.rc.SetWriteDeadline(time.Time{})
		}
	})
}

// deadlineWriter is a ResponseWriter whose writes each have a deadline;
// once one fails, every later one fails with the same error. Connect
// writes a stream's messages from one goroutine at a time.
type deadlineWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	err     error // the first failed write or flush
}

func (d *deadlineWriter) Write(p []byte) (int, error) {
	if d.err != nil {
		return 0, d.err
	}
	d.rc.SetWriteDeadline(time.Now().Add(d.timeout))
	n, err := d.ResponseWriter.Write(p)
	d.err = err
	return n, err
}

// Flush implements http.Flusher, which Connect's streams need.
func (d *deadlineWriter) Flush() {
	if d.err != nil {
		return
	}
	d.rc.SetWriteDeadline(time.Now().Add(d.timeout))
	d.err = d.rc.Flush()
}

// Unwrap lets http.ResponseController reach the connection.
func (d *deadlineWriter) Unwrap() http.ResponseWriter { return d.ResponseWriter }
