// Package e2b serves E2B's wire protocol over the Sheepfold engine, so that
// the official E2B SDKs (e2b, @e2b/code-interpreter) work against a
// Sheepfold server unchanged: set E2B_API_KEY to a Sheepfold key in E2B's
// shape (e2b_ + 40 hex characters) and both E2B_API_URL and E2B_SANDBOX_URL
// to the server's address.
//
// One listener carries three protocols; ServeHTTP tells them apart the way
// E2B's own proxy does, by the E2b-Sandbox-Port header:
//   - none: the control plane (/sandboxes, /v2/sandboxes: create, list, get,
//     connect, set timeout, kill), authenticated with the API key, errors as
//     {"code": <HTTP status>, "message": ...};
//   - 49983: envd, the in-sandbox daemon: Connect RPC with JSON bodies for
//     process.Process and filesystem.Filesystem (api/envd/*.proto, handlers
//     from connectrpc.com/connect), plus /health, /files and /envs;
//     authenticated with the sandbox's access token (X-Access-Token) or, for
//     /files, a signed URL;
//   - 49999: the code interpreter: POST /execute streaming NDJSON, and
//     /contexts;
//   - any other port: Config.Ports, the server's preview proxy to that
//     port inside the sandbox, under E2B's traffic rules (PublicTraffic,
//     ValidTrafficToken).
//
// A request for a sandbox that is unknown, stopped or not the caller's gets
// 502 {"sandboxId", "message": "The sandbox was not found", "code": 502},
// which the SDKs read as "not running". When a sandbox dies while a stream
// is open, the connection is aborted (not ended cleanly), so that the SDK
// probes /health, sees 502 and reports the sandbox as killed.
//
// Access and traffic tokens are "<key id>.<HMAC-SHA256>" of the sandbox id
// and the id of the API key that asked for them (create, connect, get),
// under a key drawn at start: bound to the sandbox and the key, they need
// no storage, die with the server (as its sandboxes do), work only while
// the sandbox runs and stop working once the key is revoked (checked on
// every use, through the backend's short cache). Signed file URLs are
// signed with such a token, so they die with it.
//
// Authentication comes before any work: a data-plane request's token is
// checked by one HMAC, with nothing looked up, and only a token that
// holds leads to its key's owner and then to the sandbox (which a replica
// may then adopt). A signed URL (a SHA-256 of the path, the user and the
// token, naming no key) is matched against the tokens this handler knows
// (issued here, or learned from the other replicas): one SHA-256 each,
// no HMAC and no store; those of its sandbox alone when the request names
// it (E2b-Sandbox-Id), all of them when it does not, as the E2B SDK's
// downloadUrl and uploadUrl do behind E2B_SANDBOX_URL. A signature that
// matches none makes the handler learn the other replicas' tokens
// (Backend.SignerKeys) at most once per Config.LearnInterval, however
// many arrive; a server alone learns nothing.
//
// A response cut short (a sandbox killed under a stream, a download
// broken mid-way) is broken off with internal/abort, never a panic here.
//
// Imports: internal/sandbox, internal/agentproto, internal/apierr,
// internal/bound (the ranges of numbers), internal/abort (responses cut short), internal/lang (language names), internal/policy (a sandbox's policy at
// create), internal/runtime (usage figures, for metrics), the generated envdpb packages with connectrpc.com/connect and
// protobuf. The caller (internal/server) supplies a Backend
// for keys, ownership and records.
package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/sheepfold/sheepfold/internal/abort"
	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/e2b/envdpb/processpb/processpbconnect"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// EnvdVersion is the envd version Sheepfold reports: the newest whose
// features (as the SDKs gate them) are all implemented here: octet-stream
// and gzip uploads (0.5.7), file metadata (0.6.2), watch events with entries
// (0.6.3), allowNetworkMounts accepted (0.6.4, a no-op: sandboxes have no
// network mounts).
const EnvdVersion = "0.6.4"

// Ports of the in-sandbox services E2B clients address.
const (
	EnvdPort        = "49983"
	InterpreterPort = "49999"
)

// Backend is what the E2B surface needs from the server: API keys, sandboxes
// bound to their owner, and the records kept of them.
type Backend interface {
	// Authenticate returns the owner an API key acts for, and the key's id.
	Authenticate(ctx context.Context, key string) (owner, keyID string, err error)
	// KeyOwner returns the owner of the key with this id while it is not
	// revoked, and an error once it is (or never existed).
	KeyOwner(ctx context.Context, keyID string) (string, error)
	// Create starts a sandbox for owner; the server keeps origin with
	// its record and gives it back through Handler.Adopted to every
	// replica that serves the sandbox later.
	Create(ctx context.Context, owner string, opt sandbox.CreateOptions, origin Origin) (*sandbox.Sandbox, error)
	// Sandbox returns owner's running sandbox; owner "" matches any owner
	// (only to learn whether a sandbox this handler kept something of
	// still runs: the data plane passes the owner its credential's key
	// acts for).
	Sandbox(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
	// Sandboxes lists owner's running sandboxes.
	Sandboxes(ctx context.Context, owner string) []*sandbox.Sandbox
	// SetTimeout moves a sandbox's end to now + d.
	SetTimeout(ctx context.Context, owner, id string, d time.Duration) error
	// Kill stops owner's sandbox.
	Kill(ctx context.Context, owner, id string) error
	// BeginExecution records a code-interpreter execution in the
	// server's execution history as it starts.
	BeginExecution(ctx context.Context, sb *sandbox.Sandbox, language, code string) RecordedExecution
	// SignerKeys maps every running sandbox's id to the ids of the keys
	// that act for its owner and are not revoked: access tokens another
	// replica issued are among theirs, and with them the signatures of
	// signed URLs. A server that shares its sandboxes with no other
	// returns nil (it issued every token itself).
	SignerKeys(ctx context.Context) map[string][]string
}

// Origin is what the control plane knows of a sandbox it created beyond
// the engine's options: the template alias it was asked for, and
// whether its ports take traffic without a token.
type Origin struct {
	Alias         string `json:"alias,omitempty"`
	PublicTraffic bool   `json:"public_traffic,omitempty"`
}

// Adopted tells the handler of a sandbox another replica created
// through E2B's control plane (origin as that replica recorded it).
func (h *Handler) Adopted(id string, origin Origin) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if origin.Alias != "" {
		h.aliases[id] = origin.Alias
	}
	h.traffic[id] = origin.PublicTraffic
}

// RecordedExecution is an execution's record while it runs.
type RecordedExecution interface {
	// ID is the id the execution runs under (its events carry it).
	ID() string
	// Event records what one of its events streamed.
	Event(agentproto.Event)
	// End records how it ended.
	End(*sandbox.Execution, error)
}

// Config tunes the E2B surface. Zero fields take the defaults in brackets.
type Config struct {
	// Templates maps E2B template names to Sheepfold templates
	// [base, code-interpreter-v1 and mcp-gateway → python]. With E2B's
	// mcp option the SDK creates an mcp-gateway sandbox and runs the
	// gateway in it; no Sheepfold template has one, so the SDK reports
	// "Failed to start MCP gateway" and kills the sandbox, as it does on
	// E2B for a template that cannot start it.
	Templates map[string]string
	// MaxTimeout bounds sandbox lifetimes [24h].
	MaxTimeout time.Duration
	// MaxUploadBytes bounds one uploaded file [100 MiB].
	MaxUploadBytes int64
	// WriteTimeout bounds each write of a stream (/execute) to its client:
	// one that stops reading breaks its stream, which interrupts the code
	// [30s].
	WriteTimeout time.Duration
	// Domain is reported as every sandbox's domain, with the port of the
	// request's Host, so that the SDKs' getHost(port) names
	// {port}-{sandboxID}.{Domain}[:port] (the server's preview domain, on
	// its listener); "" reports none.
	Domain string
	// Ports serves E2b-Sandbox-Port traffic for ports other than envd's
	// and the code interpreter's (the server's preview proxy, which asks
	// PublicTraffic and ValidTrafficToken); nil answers 502.
	Ports http.Handler
	// Key makes the access tokens (an HMAC key); replicas must share it.
	// Empty: a random key of this handler's own.
	Key []byte
	// LearnInterval is the shortest time between two learnings of the
	// tokens other replicas issued, which a signed URL matching no token
	// known here asks for [1s].
	LearnInterval time.Duration
	// Hold counts a long-lived request of the key keyID, acting for
	// owner, against their shares (the server's streams) until release
	// is called, or refuses it with a coded error (ERR_TOO_MANY_CONNECTIONS,
	// ERR_CAPACITY). It is asked for envd's streams (process Start,
	// Connect and StreamInput, WatchDir), each polling watcher while it
	// lives, /files transfers and the code interpreter's /execute. Nil
	// holds nothing.
	Hold func(ctx context.Context, owner, keyID string) (release func(), err error)
}

// Handler serves the E2B protocols.
type Handler struct {
	cfg     Config
	backend Backend
	key     []byte       // the HMAC key of access tokens
	serve   http.Handler // dispatch, under abort.Handler
	routes  []string     // Routes; made by New
	control http.Handler
	envd    http.Handler
	interp  http.Handler

	macs atomic.Int64 // HMACs computed, for tests

	// learnMu serializes learnings (learn).
	learnMu sync.Mutex

	// tokMu guards the access tokens signed URLs are matched against: a
	// search holds it for reading, apart from mu, which every request
	// takes.
	tokMu     sync.RWMutex
	issued    map[string]map[string]string // sandbox id → key id → access token issued here
	learned   map[string]map[string]string // the same, of every running sandbox, as of learnedAt
	learnedAt time.Time                    // the last learning's end

	// mu guards the fields below.
	mu       sync.Mutex
	aliases  map[string]string       // sandbox id → the template name the client asked for
	watchers map[string]*pollWatcher // watcher id → polling watcher
	metrics  map[string]*metricsLog  // sandbox id → its metric samples
	// traffic holds, for each sandbox created here, whether its ports
	// take traffic without the traffic token (E2B's allowPublicTraffic,
	// true unless the client said false).
	traffic map[string]bool
}

// New returns a Handler over a backend.
func New(cfg Config, b Backend) *Handler {
	if cfg.Templates == nil {
		cfg.Templates = map[string]string{"base": "python", "code-interpreter-v1": "python", "mcp-gateway": "python"}
	}
	if cfg.MaxTimeout <= 0 {
		cfg.MaxTimeout = 24 * time.Hour
	}
	if cfg.MaxUploadBytes <= 0 {
		cfg.MaxUploadBytes = 100 << 20
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 30 * time.Second
	}
	if cfg.LearnInterval <= 0 {
		cfg.LearnInterval = time.Second
	}
	h := &Handler{cfg: cfg, backend: b, key: make([]byte, 32),
		aliases: map[string]string{}, issued: map[string]map[string]string{}, watchers: map[string]*pollWatcher{},
		metrics: map[string]*metricsLog{},
		traffic: map[string]bool{}}
	if len(cfg.Key) > 0 {
		h.key = cfg.Key
	} else if _, err := rand.Read(h.key); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	h.control = h.controlMux()
	h.envd = h.envdMux()
	h.interp = h.interpreterMux()
	h.serve = abort.Handler(http.HandlerFunc(h.dispatch))
	return h
}

// route records patterns served behind port ("": the control plane).
func (h *Handler) route(port string, patterns ...string) {
	for _, p := range patterns {
		if port != "" {
			p = port + " " + p
		}
		h.routes = append(h.routes, p)
	}
}

// Routes lists every endpoint the handler serves, for tests that try
// them all: control-plane patterns ("GET /sandboxes/{id}"), and
// data-plane ones behind the E2b-Sandbox-Port they are reached on
// ("49983 POST /process.Process/Start").
func (h *Handler) Routes() []string { return slices.Clone(h.routes) }

// Handles reports whether a request belongs to the E2B surface rather than
// Sheepfold's own /v1 API.
func Handles(r *http.Request) bool {
	if r.Header.Get("E2b-Sandbox-Port") != "" {
		return true
	}
	p := r.URL.Path
	return p == "/sandboxes" || strings.HasPrefix(p, "/sandboxes/") ||
		p == "/v2/sandboxes" || strings.HasPrefix(p, "/v2/sandboxes/") ||
		p == "/files" // signed file URLs carry no sandbox header
}

// IsUpload reports whether r uploads files (POST /files), whose body may
// be as large as the upload limit rather than the limit of other requests.
func IsUpload(r *http.Request) bool {
	return r.Method == http.MethodPost && r.URL.Path == "/files"
}

// IsStream reports whether r is a client stream (envd's StreamInput): its
// body stays open between messages, each bounded by maxMessageBytes.
func IsStream(r *http.Request) bool {
	return r.Header.Get("E2b-Sandbox-Port") == EnvdPort && r.URL.Path == processpbconnect.ProcessStreamInputProcedure
}

// ServeHTTP dispatches on the E2b-Sandbox-Port header.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.serve.ServeHTTP(w, r) }

func (h *Handler) dispatch(w http.ResponseWriter, r *http.Request) {
	switch port := r.Header.Get("E2b-Sandbox-Port"); port {
	case "":
		h.control.ServeHTTP(w, r)
	case EnvdPort:
		h.envd.ServeHTTP(w, r)
	case InterpreterPort:
		h.interp.ServeHTTP(w, r)
	default:
		if h.cfg.Ports != nil {
			h.cfg.Ports.ServeHTTP(w, r)
			return
		}
		writeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": r.Header.Get("E2b-Sandbox-Id"),
			"message": "port " + port + " of the sandbox is not reachable", "code": http.StatusBadGateway})
	}
}

// hold is Config.Hold, or nothing when it is nil.
func (h *Handler) hold(ctx context.Context, owner, keyID string) (func(), error) {
	if h.cfg.Hold == nil {
		return func() {}, nil
	}
	return h.cfg.Hold(ctx, owner, keyID)
}

// holdFrom holds a stream of the request's key (a poll watcher's, which
// outlives its request).
func holdFrom(ctx context.Context) (func(), error) {
	if f, ok := ctx.Value(holdKey).(func() (func(), error)); ok {
		return f()
	}
	return func() {}, nil
}

// token is the envd access token of sandbox id for the API key keyID.
func (h *Handler) token(id, keyID string) string {
	return keyID + "." + h.mac("envd-access-token", id, keyID)
}

// trafficToken is the traffic token of sandbox id for keyID: what the
// code-interpreter SDK sends on every call (unlike the access token, which
// older SDKs leave off /contexts).
func (h *Handler) trafficToken(id, keyID string) string {
	return keyID + "." + h.mac("traffic-access-token", id, keyID)
}

func (h *Handler) mac(purpose, id, keyID string) string {
	h.macs.Add(1)
	m := hmac.New(sha256.New, h.key)
	m.Write([]byte(purpose + "\x00" + id + "\x00" + keyID))
	return hex.EncodeToString(m.Sum(nil))
}

// issue returns the access token of sandbox id for keyID and remembers it
// for signed URLs.
func (h *Handler) issue(id, keyID string) string {
	tok := h.token(id, keyID)
	h.tokMu.Lock()
	if h.issued[id] == nil {
		h.issued[id] = map[string]string{}
	}
	h.issued[id][keyID] = tok
	h.tokMu.Unlock()
	return tok
}

// ValidTrafficToken reports whether tok is a traffic token (the SDKs'
// E2B-Traffic-Access-Token) of sandbox id, issued to a key that is not
// revoked and acts for the sandbox's owner.
func (h *Handler) ValidTrafficToken(id, tok string) bool { return h.validFor(id, tok, h.trafficToken) }

// IsTrafficToken reports whether tok was made as a traffic token of
// sandbox id: one HMAC, nothing looked up (ValidTrafficToken also checks
// its key).
func (h *Handler) IsTrafficToken(id, tok string) bool {
	_, ok := tokenKey(id, tok, h.trafficToken)
	return ok
}

// PublicTraffic reports whether sandbox id was created through E2B's
// control plane without network.allowPublicTraffic false: E2B's rule is
// that such a sandbox's ports take traffic without a token. Sandboxes
// created otherwise are not public here.
func (h *Handler) PublicTraffic(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.traffic[id]
}

func (h *Handler) validFor(id, tok string, want func(id, keyID string) string) bool {
	keyID, ok := tokenKey(id, tok, want)
	return ok && h.keyMayUse(id, keyID)
}

// tokenKey returns the id of the key tok was made for, when tok is a
// token (access or traffic, as want makes them) of sandbox id: one HMAC,
// nothing looked up.
func tokenKey(id, tok string, want func(id, keyID string) string) (string, bool) {
	keyID, _, ok := strings.Cut(tok, ".")
	if !ok || keyID == "" || id == "" || !valid(tok, want(id, keyID)) {
		return "", false
	}
	return keyID, true
}

// keyMayUse reports whether keyID is live and its owner's is sandbox id.
func (h *Handler) keyMayUse(id, keyID string) bool {
	ctx := context.Background()
	owner, err := h.backend.KeyOwner(ctx, keyID)
	if err != nil {
		return false
	}
	_, err = h.backend.Sandbox(ctx, owner, id)
	return err == nil
}

func valid(tok, want string) bool { return tok != "" && hmac.Equal([]byte(tok), []byte(want)) }

// forget drops what the handler keeps about a sandbox.
func (h *Handler) forget(id string) {
	h.mu.Lock()
	delete(h.aliases, id)
	delete(h.metrics, id)
	delete(h.traffic, id)
	h.mu.Unlock()
	h.tokMu.Lock()
	delete(h.issued, id)
	h.tokMu.Unlock()
}

// prune forgets sandboxes that stopped without a kill through this
// handler (their timeout, the idle stop, a /v1 call), so that what it
// keeps stays as large as the set of live sandboxes.
func (h *Handler) prune(ctx context.Context) {
	h.tokMu.RLock()
	ids := slices.Collect(maps.Keys(h.issued))
	h.tokMu.RUnlock()
	h.mu.Lock()
	for id := range h.traffic {
		ids = append(ids, id)
	}
	for id := range h.aliases {
		ids = append(ids, id)
	}
	for id := range h.metrics {
		ids = append(ids, id)
	}
	h.mu.Unlock()
	// (The learned tokens are not pruned: each learning replaces them.)
	for _, id := range ids {
		if _, err := h.backend.Sandbox(ctx, "", id); err != nil { // only running ones are found
			h.forget(id)
		}
	}
}

func (h *Handler) addWatcher(w *pollWatcher) string {
	b := make([]byte, 12)
	rand.Read(b)
	id := hex.EncodeToString(b)
	h.mu.Lock()
	h.watchers[id] = w
	h.mu.Unlock()
	return id
}

func (h *Handler) removeWatcher(id string) {
	h.mu.Lock()
	delete(h.watchers, id)
	h.mu.Unlock()
}

// watcher returns a sandbox's polling watcher.
func (h *Handler) watcher(sandboxID, id string) (*pollWatcher, error) {
	h.mu.Lock()
	w, ok := h.watchers[id]
	h.mu.Unlock()
	if !ok || w.sandboxID != sandboxID {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", id))
	}
	return w, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, `{"code":500,"message":"could not encode the response"}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// target returns owner's running sandbox a data-plane request
// addresses, once its credential has named the owner, or answers 502 for
// it and returns nil. A sandbox found running and killed before the
// lookup returned (a kill that overtook the request, as when another
// replica had to adopt it first) breaks the connection off instead, as a
// killed VM's does on E2B: the SDK then finds the sandbox gone and says
// it was killed while the request was in progress.
func (h *Handler) target(w http.ResponseWriter, r *http.Request, owner, id string) *sandbox.Sandbox {
	sb, err := h.backend.Sandbox(r.Context(), owner, id)
	if err == nil {
		switch sb.State() {
		case sandbox.StateRunning:
			return sb
		case sandbox.StateStopping, sandbox.StateStopped:
			abort.Response(r.Context())
			return nil
		}
	}
	sandboxGone(w, id)
	return nil
}

// keyOwner returns the owner keyID acts for while it is not revoked.
func (h *Handler) keyOwner(ctx context.Context, keyID string) (string, bool) {
	owner, err := h.backend.KeyOwner(ctx, keyID)
	return owner, err == nil && owner != ""
}

// sandboxGone answers for a sandbox that is unknown, stopped or not the
// caller's, as E2B's proxy does.
func sandboxGone(w http.ResponseWriter, id string) {
	writeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": id, "message": "The sandbox was not found", "code": http.StatusBadGateway})
}
