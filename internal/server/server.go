// Package server is Sheepfold's HTTP transport: the /v1 REST API of
// docs/api-v1.md (and api/openapi.json) over the sandbox engine, with API
// key authentication, per-owner sandbox isolation, streaming (SSE and
// NDJSON) execution and commands, and the sandbox and execution records
// kept in a store.Store.
//
// Routing is the standard library's http.ServeMux with method and path
// patterns; one file per endpoint group. Errors are *apierr.Error values,
// rendered by one function (writeError); nothing else writes an error body.
//
// Decisions the contract leaves open:
//   - A sandbox of another owner is ERR_SANDBOX_NOT_FOUND (404), exactly as
//     an unknown one. The caller's own sandbox that has stopped (timed out,
//     killed, crashed, server restarted) stays visible: GET answers 200 with
//     state "stopped" and stop_reason, DELETE answers 204 (idempotent), and
//     every other call answers 409 ERR_SANDBOX_STATE naming the reason.
//   - sandbox_config.max_execution_time is the sandbox's default execution
//     timeout and also its cap: a longer timeout_ms is lowered to it.
//   - A stream (SSE or NDJSON) sends its headers with its first event, or
//     after 200 ms; an error before that is a plain JSON error response
//     with its status, one after it is a last "failure" event carrying the
//     usual error object ({"error":{code,message,request_id}}) instead of
//     "done". The NDJSON done line of a command is {"type":"done",
//     "command":{...}}.
//   - Foreground commands default to a 60 s timeout and are killed when
//     their caller goes away; background ones have no timeout unless given.
//   - Sandboxes the engine stops on its own (timeouts, crashes) are
//     recorded in the store by a sweeper every Config.SweepInterval, and
//     at once by any request that meets them; a record the store could
//     not write is retried. Records past Config.Retention are pruned;
//     the code and output of a stopped sandbox's executions go sooner
//     (Config.StoppedRetention); each account's records are bounded by
//     kind (Config.Storage, storage.go).
//   - Every body is bounded and a stalled one cut (bodyDeadline);
//     admission counts memory limits (and disks kept in memory) against the host (admit);
//     a wrong method on a known path is 405 with Allow.
//   - Tenants share the server within shares (conns.go): streams
//     (long-lived requests) per key, per account and in all; open
//     connections, the oldest quiet ones closed past the bound;
//     dashboard sessions per account (ui.go); each account's requests
//     are paced, waiting past the pace rather than refused (pace.go).
//   - /readyz fails with the store; a shutdown drains in order, and
//     what it cuts off ends with ERR_SHUTTING_DOWN (drain.go). A client
//     that goes away is not the server's failure (499, logged at debug).
//
// It also serves the E2B surface (internal/e2b) on the same handler, as
// that package's Backend (e2b.go).
//
// # Start and drain
//
// `sheepfold serve` starts in order: config → store (SQLite in the data dir,
// embedded migrations, WAL, busy_timeout 5 s, one write handle and 8
// read handles; records
// still running from a run that crashed are marked stopped, "server
// restarted" or "timed out") → event bus → engine (runtime `server-<hash>`
// instance, leftovers destroyed, those that resist in the background) → HTTP.
// On SIGTERM it drains (internal/server/drain.go): /readyz answers 503
// `ERR_SHUTTING_DOWN` at once, new sandboxes are refused, every other
// request is still served for `--drain-delay` (5 s; skipped when nothing has
// asked /readyz); then event streams end, the listener closes and requests
// in flight run up to `--shutdown-timeout` (10 s); at that deadline the
// contexts of those still running are canceled with `ERR_SHUTTING_DOWN` as
// the cause (requests' contexts derive from the server's base context) and
// they have 2 s to end their streams with that error; then it closes the
// engine (every sandbox destroyed), marks their records stopped, closes the
// store. /readyz also pings the store (`store.Pinger`, its verdict kept a
// second). Keys are `sf_`/`e2b_` + 40 hex characters, kept only as SHA-256;
// each sandbox belongs to the key's owner and is invisible (404) to others.
// Streaming executions and commands send SSE or NDJSON events as the agent
// produces them.
//
// # Bounds
//
// Bounds: every request body has a limit (16 MiB of JSON, uploads
// `--file-size-upload-mb` per file and per request in all, 4 MiB per Connect
// message compressed and decompressed), and a body that stalls for 30 s is
// cut (a per-read deadline through `http.ResponseController`, not a global
// read or write timeout, so long streams and slow uploads live); headers
// must arrive within 10 s, idle connections close after 2 minutes. Metadata
// and env are bounded in keys and bytes. Admission counts each sandbox's
// memory limit (plus its disk where the runtime keeps disks in memory:
// `sandbox.Manager.Footprint`) against the host's memory times
// `--overcommit` (2) and answers 503 `ERR_CAPACITY` past it; a sandbox's own
// disk is reserved on the data dir by the runtime, which answers the same
// when it has no room (one
// sandbox larger than that alone is 400, "One ceiling" in internal/sandbox); /readyz is
// 503 at that cap, at `--max-sandboxes`, when the data dir has under 256 MiB
// free, or while draining. A sweeper records stops of sandboxes the engine
// ended; a stop the store could not record stays in memory and is retried.
// Records of stopped sandboxes and executions older than `--retention` (7
// days) are pruned hourly; `GET /v1/sandboxes` pages (`limit`, `cursor`,
// `next`), and so does a directory listing (`GET .../files/list`: `limit`
// up to 10,000, `cursor`, `next_cursor` with `truncated`; the agent walks
// each directory's entries sorted by name, a directory's contents right
// after it, and resumes after the cursor's entry; the cursor is bound to
// the listing's path and depth, and a bad one is 400). A wrong method on a known path is 405 `ERR_METHOD_NOT_ALLOWED`
// with `Allow`.
//
// # Shares
//
// Shares of what tenants share (internal/server/conns.go, ui.go;
// docs/security.md, section 13): every stream (a request that may stay
// open: executions, commands, event streams, transfers, previews, MCP
// calls, E2B streams, watchers and interpreter executions) holds a place
// in its key's, its account's and the server's share while it runs, taken
// in the route's wrapper (`streamed`, from the table `streamRoutes`), in
// `servePreview`, and through `e2b.Config.Hold` on the E2B surface; a
// stream past a share is refused at once. The server's share comes from
// `RLIMIT_NOFILE` with a reserve for everything else. Past
// `--max-connections` open connections, the server's `ConnState` hook
// closes the oldest serving no request. Dashboard sessions are kept per
// account, the oldest ended past its share.
//
// # No request stops the server
//
// No request stops the server (docs/security.md, section 1). A response
// that must break off mid-way (a download whose source failed, a stream
// whose sandbox died, a client that stopped reading) is cut with
// internal/abort: the handler calls `abort.Response` and returns, its later
// writes fail, and `abort.Handler`, outermost in the server's chain (inside
// the body bound), breaks the connection once the handler is done: through
// the writer's own `Abort` for the in-process transport of `/mcp`, or with
// the code base's one `panic(http.ErrAbortHandler)` on a net/http server's
// goroutine, which net/http recovers. The panic recovery (`recoverPanics`)
// logs a panic and answers 500, or cuts the response if it had begun, and
// never raises it again; the in-process transport and the MCP tools recover
// what reaches their own goroutines. `TestNoRepanic` (internal/abort, run by
// `make lint` and `make test`) walks the source of both binaries and refuses
// a re-raised recovered value and any other `panic(http.ErrAbortHandler)`.
//
// # Metrics
//
// The instruments are internal/metrics's (its doc says what is counted and
// who sees what); the server serves `/metrics` (admin keys on the API
// listener, no key on `serve --metrics-listen`) and `GET /v1/metrics`.
// Logs are log/slog (`--log-format text|json`); each request's line
// carries `request_id`, `account` and `sandbox` (filled in by the handler
// that resolved them), method, path, status, bytes and duration.
//
// # Previews
//
// What a preview is (its forms, its credentials, the reverse proxy and
// what it strips from requests and answers) is internal/preview's; the
// server is its edge (preview.go). Previews live on origins of their own,
// on the API's listener: `Server.route` looks at `Host` before anything
// else. A `Host` under `--preview-domain` (default `localhost`) is the
// host form `{port}-{id}.{domain}` and reaches only that preview, or
// internal/e2b for envd's and the interpreter's ports, or a 404 page:
// never the /v1 mux, the dashboard or E2B's control plane. Any other
// `Host` is the API's origin, where two forms remain for programs: the
// path form `/v1/sandboxes/{id}/proxy/{port}/...`, which answers browsers
// with a 307 to the host form, and E2B's `E2b-Sandbox-Id`/
// `E2b-Sandbox-Port` headers for ports other than envd's and the
// interpreter's (internal/e2b hands them over through `e2b.Config.Ports`).
// Both are recognised before the /v1 mux, so an app's paths and methods
// are its own; their bodies are streamed, not bounded by the JSON limit.
// Access is decided before anything is dialled (preauth.go, then
// `servePreview`): the credentials that hold by themselves first, then
// the running sandbox (on a replica, through its record), then whether
// the port is public: made public (`PUT /v1/sandboxes/{id}/ports/{port}`,
// kept with the server's record of the sandbox) or an E2B sandbox created
// with public traffic (E2B's default; `allowPublicTraffic: false` needs
// E2B's traffic token). A sandbox not running is a 502 page; a preview
// holds a stream of its sandbox's owner while it runs (conns.go), and its
// dial (`Sandbox.DialPort`, agentproto `port.connect`; nothing listening is
// the agent's `refused`, at once) marks the sandbox active for its idle
// timeout and is counted by internal/metrics (BenchmarkPreview measures a
// small GET). `GET /v1/sandboxes/{id}/ports` merges the agent's
// `port.list` with the public ports and gives each its URLs, a signed URL
// and the sandbox's preview token.
//
// # Webhooks
//
// Webhooks are internal/webhooks' (its doc says how they are queued,
// signed, retried and confined); the server serves their endpoints
// (webhooks.go: `POST/GET/DELETE /v1/webhooks`,
// `GET /v1/webhooks/{id}/deliveries`) and hands the package its store,
// bus and `Config.Webhook*` bounds.
//
// # Sessions
//
// Sessions (sessions.go, session_ask.go; `sessions` table, migration
// 0007) bind a model to a sandbox whose id they share, so the sandbox
// routes (policy, events, files, usage) serve sessions unchanged and a
// session ends with its sandbox. The server creates, admits, finds and
// ends them and serves their endpoints; what a session does beyond its
// sandbox is internal/session's: `/execute` answers with its seeds' shape
// of an execution (`output`, `status`, `execution_time_ms`,
// `error{code,message}`, charts), and `/ask` runs its loop (session.Ask)
// in the request, reaching the model relay through the session's account
// (models.go: admitted, metered and priced as every completion, so quotas
// and fallbacks apply) and the sandbox through its executions, recorded
// as every execution is.
//
// # Pause, snapshots and forks
//
// `POST /v1/sandboxes/{id}/pause|resume` call the engine's Pause and
// Resume (internal/sandbox's doc says what they do); the server records a
// paused sandbox `paused` (its Pausing/Resumed hooks, paused.go), shows
// and lists it so, and the E2B surface maps onto the same calls. At the
// start, server.New holds each sandbox the engine took back paused again
// for its recorded owner (box, account slot, metering standing still) and
// records stopped, with why, those recorded paused that the engine did not
// take back. Its AdmitPause hook bounds an account's paused sandboxes
// (`--max-paused-per-account`) and paused bytes (pausedbytes.go),
// reserving each pause's estimate until it resumes.
//
// Snapshots (snapshots.go) are named per account under
// DATA_DIR/snapshots/<hash of the owner>/<name> (snapshot.json, the
// record of what the sandbox was made with and its size_bytes; state/, the
// engine's). A new one is made in a `.new-` directory, measured, and
// renamed to its name only within the account's bounds (count, and bytes
// with MaxSnapshotBytesPerAccount), checked under snapMu. After each
// snapshot made or deleted, and at the start for all, the account's
// snapshots' bytes go to the store (StorageStore.SetSnapshotBytes, keyed
// by the snapshot dir's name among the servers' disks,
// DATA_DIR/snapshots/.disk), which MeterStorage charges as storage. A
// create with `snapshot` goes through the ordinary create path
// (admission, accounting, record, tokens) with the record's options. A
// fork (fork.go) is a snapshot into DATA_DIR/snapshots/.forks restored
// `count` times in parallel through the same create path; its images go
// once the forks run, and its copy of the parent's files stays as the
// forks' baseline for `GET .../diff`; `POST .../adopt` replays that diff
// into the parent through the engine's file calls of both sandboxes,
// never from the host. E2B's snapshot and fork calls reach the same code
// through e2b.SnapshotBackend (e2b.go); an E2B create whose template id
// names one of the account's snapshots starts from it. Snapshot pools
// (snappool.go, `POST /v1/snapshots/{name}/pool`) are the engine's, keyed
// by snapshotKey (owner and name); the server keeps their sizes
// (snapPools, under snapMu), bounds them per account, and empties a pool
// when its snapshot is deleted.
//
// Imports: api (the /v1 wire types it answers with and reads requests
// into; its own wire types are only those no other package shares),
// internal/sandbox, internal/store, internal/events, internal/auth,
// internal/account (limits and balances), internal/alerts (which raises
// alerts; alerts.go serves their endpoints), internal/metering,
// internal/metrics (the instruments, served by metrics.go),
// internal/policy, internal/webhooks (which registers webhooks and
// delivers to them; webhooks.go serves its endpoints), internal/llm (the
// model relay), internal/apierr, internal/bound (the ranges of numbers),
// internal/secrets (the accounts' secrets), internal/egress (the
// gateways' resolver of secrets, secrets_egress.go), internal/identity
// (the workload identity's issuer: identity.go), internal/e2b,
// internal/mcpserver (the /mcp endpoint, with a Go SDK client that
// calls this server in process), internal/agentproto,
// internal/runtime (limits), internal/lang (metric labels, the ask's
// fence tags, the default language), internal/abort (responses cut
// short), internal/ui (the dashboard's embedded front end), api (the
// OpenAPI document), internal/preview (what a preview is: its forms,
// credentials and proxy), internal/session (a session's execution
// shape and its ask loop), internal/volume (a volume's files, their
// errors and entries: volumes.go), internal/batch (batch jobs: what
// runs when; batches.go runs each item through the create and execute
// paths) and internal/template (the built templates and Dockerfile
// builds: templates.go; the RUN steps' runner is handed in).
// Never a runtime implementation: the engine is handed in.
package server

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sheepfold/sheepfold/internal/abort"
	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/alerts"
	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/batch"
	"github.com/sheepfold/sheepfold/internal/e2b"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/identity"
	"github.com/sheepfold/sheepfold/internal/llm"
	"github.com/sheepfold/sheepfold/internal/metering"
	"github.com/sheepfold/sheepfold/internal/metrics"
	"github.com/sheepfold/sheepfold/internal/preview"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/secrets"
	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/template"
	"github.com/sheepfold/sheepfold/internal/webhooks"
)

// Config configures a Server. Zero fields take the defaults in brackets.
type Config struct {
	// MaxUploadBytes bounds one uploaded file [100 MiB].
	MaxUploadBytes int64
	// MaxBatchInputsFileBytes bounds a batch's inputs_file, read whole
	// when the batch is made [64 MiB].
	MaxBatchInputsFileBytes int64
	// BatchCheckPython is the host's Python that checks a batch's code
	// before any sandbox is used (batch.HostCheck), where its version is
	// the template's; "-" checks in a sandbox always [/usr/bin/python3].
	BatchCheckPython string
	// MaxSandboxes bounds the sandboxes running at once through this
	// server; 0 leaves the bound to the engine.
	MaxSandboxes int
	// MaxPausedPerAccount bounds each account's sandboxes paused to disk
	// at once (their checkpoints and disks are kept on the server's disk
	// while they use nothing else); 0: no bound (paused.go).
	MaxPausedPerAccount int
	// MaxSnapshotsPerAccount bounds each account's snapshots
	// [DefaultMaxSnapshotsPerAccount] (snapshots.go).
	MaxSnapshotsPerAccount int
	// MaxSnapshotPoolPerAccount bounds the sandboxes each account keeps
	// restored ahead in its snapshots' pools, all pools together; 0: no
	// snapshot pools (snappool.go).
	MaxSnapshotPoolPerAccount int
	// MaxPausedBytesPerAccount bounds the bytes each account's sandboxes
	// paused to disk hold on the server's disk (checkpoints and kept
	// disks); 0: no bound (pausedbytes.go).
	MaxPausedBytesPerAccount int64
	// MaxSnapshotBytesPerAccount bounds the bytes each account's
	// snapshots hold on the server's disk; 0: no bound (snapshots.go).
	MaxSnapshotBytesPerAccount int64
	// MaxTimeout is the longest lifetime a sandbox may be given [24h].
	MaxTimeout time.Duration
	// Version, Runtime and Cgroups are reported by /v1/version.
	Version string
	Runtime string
	Cgroups string
	// Ready reports whether the engine can create sandboxes (/readyz);
	// nil means it can while the server is not shutting down.
	Ready func(ctx context.Context) error
	// SweepInterval is how often stopped sandboxes (timed out, crashed)
	// are recorded in the store [2s].
	SweepInterval time.Duration
	// CollectInterval is how often a server whose engine shares its
	// sandboxes runs the replicas' collector (shared.go)
	// [DefaultCollectInterval].
	CollectInterval time.Duration
	// PreviewKey signs preview tokens and URLs; replicas must share it.
	// Empty: a random key of this server's own.
	PreviewKey []byte
	// BodyReadTimeout is the longest a request body may stall: every read
	// of it must make progress within this time, so a long upload at any
	// steady rate passes and a stalled one is cut [30s].
	BodyReadTimeout time.Duration
	// ReadHeaderTimeout bounds reading a request's headers [10s];
	// IdleTimeout bounds a kept-alive connection between requests [2m].
	ReadHeaderTimeout time.Duration
	IdleTimeout       time.Duration
	// HostMemoryBytes is the memory sandboxes may commit, times
	// Overcommit [2]: admission refuses a sandbox whose memory limit
	// (plus its disk, where the runtime keeps disks in memory:
	// sandbox.Manager.Footprint) would take the sum of all sandboxes'
	// past it (503 ERR_CAPACITY). 0 turns the check off. A disk of its
	// own is reserved on the data dir by the runtime, which refuses a
	// create it has no room for (503 ERR_CAPACITY too).
	HostMemoryBytes int64
	Overcommit      float64
	// TemplateRunner runs the RUN steps of template builds (POST
	// /v1/templates, templates.go); nil: the server builds no templates
	// (501). TemplateUIDShift is the templates' uid shift (the runtime's
	// mapping). TemplateRegistries are the registries a FROM may pull
	// from.
	TemplateRunner     template.StepRunner
	TemplateUIDShift   uint32
	TemplateRegistries template.Registries
	// DataDir is where the server keeps its database and sandboxes;
	// /readyz is not ready while it has less than MinFreeDiskBytes free
	// [256 MiB]. "" skips the check.
	DataDir          string
	MinFreeDiskBytes int64
	// ShutdownTimeout is how long the caller of Shutdown lets requests
	// in flight run (sheepfold serve --shutdown-timeout) [10s].
	ShutdownTimeout time.Duration
	// DrainDelay is how long Shutdown keeps serving after the drain
	// begins, /readyz answering 503, before the listener closes (serve
	// --drain-delay) [5s]; negative: none. It is skipped when nothing
	// has asked /readyz since the start (drain.go).
	DrainDelay time.Duration
	// ReadyCheckInterval is how long /readyz keeps the store's verdict
	// (a ping) [1s].
	ReadyCheckInterval time.Duration
	// MaxStreamsPerKey and MaxStreamsPerAccount bound the streams
	// (long-lived requests: conns.go) one API key, and one account, may
	// hold open at once [DefaultMaxStreamsPerKey,
	// DefaultMaxStreamsPerAccount]; MaxStreams bounds the streams of all
	// [StreamsFromLimit of the process's RLIMIT_NOFILE]. Negative: no
	// bound.
	MaxStreamsPerKey     int
	MaxStreamsPerAccount int
	MaxStreams           int
	// MaxConnections bounds the client connections open: past it, a new
	// one closes the oldest serving no request (conns.go)
	// [ConnectionsFromLimit of RLIMIT_NOFILE]. Negative: no bound.
	MaxConnections int
	// UISessionsPerAccount bounds one account's dashboard sessions: a
	// login past it ends the account's oldest session
	// [DefaultUISessionsPerAccount].
	UISessionsPerAccount int
	// PacePerAccount is the rate, in requests a second, to which this
	// server paces each account's requests: past it they wait their
	// place (pace.go) [DefaultPacePerAccount]. Negative: no pacing.
	PacePerAccount int
	// Retention is how long records of stopped sandboxes and executions
	// are kept [7 days]; PruneInterval is how often older ones (and rate
	// buckets full again) are deleted [1h].
	Retention     time.Duration
	PruneInterval time.Duration
	// StoppedRetention is how long the executions of a stopped sandbox
	// keep their code and output [24h]: then they are cleared (at the
	// next prune), and the records, small, stay until Retention.
	StoppedRetention time.Duration
	// Storage bounds what each account keeps in the store, by kind of
	// record: the number of records and their bytes (storage.go). A zero
	// measure takes DefaultStorage's; a negative one is unbounded.
	Storage store.Bounds
	// Volumes bounds the accounts' persistent volumes (volumes.go).
	Volumes VolumeLimits
	// Events is the bus the engine emits to (its Config.Events): the
	// server streams, lists and posts (webhooks) what it stores. Nil
	// makes a bus of the server's own over the store, which then sees
	// only what is emitted to it (Server.Events).
	Events *events.Bus
	// WebhookAllowHosts restricts where webhooks may deliver: host names
	// (exact, or "*.example.com") and CIDRs. Empty restricts nothing. It
	// never widens WebhookAllowCIDRs' rule, except that its CIDRs count
	// as allowed ranges too (internal/webhooks).
	WebhookAllowHosts []string
	// WebhookAllowCIDRs are the address ranges webhooks may reach
	// although they are not public (loopback, private, carrier-grade NAT,
	// reserved; policy.ForbiddenAddr) or are the host's own. Empty: only
	// public addresses. Unspecified, multicast, link-local and cloud
	// metadata addresses are refused whatever this says.
	WebhookAllowCIDRs []string
	// WebhookTimeout bounds one delivery attempt; a failed attempt holds
	// its slot this long whatever failed [10s]. WebhookWorkers bounds the
	// deliveries in flight [32], WebhookAccountWorkers those of one
	// account [4].
	WebhookTimeout        time.Duration
	WebhookWorkers        int
	WebhookAccountWorkers int
	// WebhookRetryBase is the wait before a failed delivery's second
	// attempt; each later wait doubles [1s], each drawn in its upper half
	// (internal/backoff). WebhookMaxAttempts bounds the attempts of one
	// delivery [6].
	WebhookRetryBase   time.Duration
	WebhookMaxAttempts int
	// Accounts are the default limits of accounts and the credit rules;
	// it must be valid (account.Config.Validate).
	Accounts account.Config
	// Metering sets the sampling and flush intervals and the prices.
	Metering metering.Config
	// NoAccounting turns account limits, rate limits and metering off
	// (benchmarks compare the two).
	NoAccounting bool
	// Models relays chat completions to the configured model providers
	// (models.go); nil serves no model.
	Models *llm.Relay
	// PreviewDomain names the previews' origins: {port}-{sandbox id}.
	// {PreviewDomain} reaches that port inside the sandbox, on the
	// server's listener, and a Host under it never reaches the API
	// (preview.go). A wildcard DNS name pointing at the server, outside
	// the site of the API's own name ["localhost", which browsers resolve
	// to the loopback without DNS].
	PreviewDomain string
	// Secrets keeps the accounts' secrets (secrets.go, internal/secrets).
	// Nil: a service over the store whose values are sealed with a
	// random key of this server's own, which no restart keeps.
	Secrets *secrets.Service
	// EgressCA is the PEM of the CA with which the egress gateways
	// terminate TLS for the hosts of policies' rules (egress.Intercept):
	// sandboxes whose policy has rules get it in their trust stores
	// (secrets_egress.go). Nil: the gateways terminate no TLS.
	EgressCA []byte
	// Identity is the workload identity's issuer, whose OIDC discovery
	// document and JWKS identity.go serves. Nil: those routes answer 404.
	Identity *identity.Issuer
}

func (c *Config) setDefaults() {
	if c.MaxUploadBytes <= 0 {
		c.MaxUploadBytes = 100 << 20
	}
	if c.MaxBatchInputsFileBytes <= 0 {
		c.MaxBatchInputsFileBytes = 64 << 20
	}
	if c.MaxTimeout <= 0 {
		c.MaxTimeout = 24 * time.Hour
	}
	if c.MaxSnapshotsPerAccount <= 0 {
		c.MaxSnapshotsPerAccount = DefaultMaxSnapshotsPerAccount
	}
	if c.Version == "" {
		c.Version = "dev"
	}
	if c.SweepInterval <= 0 {
		c.SweepInterval = 2 * time.Second
	}
	if c.CollectInterval <= 0 {
		c.CollectInterval = DefaultCollectInterval
	}
	if c.BodyReadTimeout <= 0 {
		c.BodyReadTimeout = 30 * time.Second
	}
	if c.ReadHeaderTimeout <= 0 {
		c.ReadHeaderTimeout = 10 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 2 * time.Minute
	}
	if c.Overcommit <= 0 {
		c.Overcommit = 2
	}
	if c.MinFreeDiskBytes <= 0 {
		c.MinFreeDiskBytes = 256 << 20
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 10 * time.Second
	}
	if c.DrainDelay == 0 {
		c.DrainDelay = DefaultDrainDelay
	}
	c.DrainDelay = max(0, c.DrainDelay)
	if c.ReadyCheckInterval <= 0 {
		c.ReadyCheckInterval = time.Second
	}
	if c.Retention <= 0 {
		c.Retention = 7 * 24 * time.Hour
	}
	if c.MaxStreamsPerKey == 0 {
		c.MaxStreamsPerKey = DefaultMaxStreamsPerKey
	}
	if c.MaxStreamsPerAccount == 0 {
		c.MaxStreamsPerAccount = DefaultMaxStreamsPerAccount
	}
	if c.MaxStreams == 0 {
		c.MaxStreams = defaultMaxStreams()
	}
	if c.PacePerAccount == 0 {
		c.PacePerAccount = DefaultPacePerAccount
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = ConnectionsFromLimit(nofile())
	}
	if c.UISessionsPerAccount <= 0 {
		c.UISessionsPerAccount = DefaultUISessionsPerAccount
	}
	if c.PruneInterval <= 0 {
		c.PruneInterval = time.Hour
	}
	if c.StoppedRetention <= 0 {
		c.StoppedRetention = 24 * time.Hour
	}
	c.Storage = storageBounds(c.Storage)
	c.Volumes = c.Volumes.withDefaults()
	if c.PreviewDomain == "" {
		c.PreviewDomain = DefaultPreviewDomain
	}
	c.PreviewDomain = strings.ToLower(c.PreviewDomain)
}

// Server serves the API. It is an http.Handler; Serve and Shutdown run it
// on a listener.
type Server struct {
	cfg     Config
	store   store.Store
	engine  *sandbox.Manager
	log     *slog.Logger
	auth    *auth.Authenticator
	handler http.Handler
	routes  []string

	// records are the execution records being written after their
	// replies (execute.go).
	records recordWrites
	// traceExec logs the hops of every plain execution
	// (SHEEPFOLD_TRACE_EXECUTIONS; execute.go).
	traceExec bool

	// snapMu guards snapUse (snapshots in use, by snapshotKey: a delete
	// is refused), snapMaking (names being made) and forks (snapshots.go,
	// fork.go).
	snapMu     sync.Mutex
	snapUse    map[string]int
	snapMaking map[string]bool
	forks      map[string]forkOf // by the fork's id
	// forkGroups are the fork groups' baselines kept (fork.go), by
	// their directory: metered and bounded as the account's snapshots.
	forkGroups map[string]forkGroup
	// snapPools are the snapshots' pools, by snapshotKey (snappool.go);
	// guarded by snapMu.
	snapPools map[string]*poolHold
	// snapDisk names the snapshot dir among the disks of the servers
	// sharing the store (meterSnapshots); set at the start.
	snapDisk string

	bus         *events.Bus
	hooks       *webhooks.Service
	secrets     *secrets.Service
	ownBus      bool          // bus was made by New, closed by Shutdown
	streamsDone chan struct{} // closed when Shutdown begins: event streams end

	templates templateBuilds // template builds (templates.go)

	http        *http.Server
	draining    atomic.Bool
	drainStart  atomic.Int64 // when Drain was first called (Unix nanoseconds)
	readyAsked  atomic.Bool  // /readyz has been asked since the start
	readyStore  readyCheck   // the store's last verdict for /readyz (drain.go)
	inflight    inflight     // requests being served
	base        context.Context
	cut         context.CancelCauseFunc // cancels base (errCut): a drain's deadline
	stop        chan struct{}
	stopOnce    sync.Once
	streamsOnce sync.Once
	sweeper     sync.WaitGroup

	// mu guards boxes and pooled.
	mu    sync.Mutex
	boxes map[string]*box
	// pooled is what the snapshot pools' members hold of the server's
	// slots and host memory (snappool.go), counted by admit beside boxes.
	pooled struct {
		count int
		bytes int64
	}

	// replica names this server among those sharing its sandboxes (a new
	// name at every start); "" when the engine shares nothing
	// (shared.go).
	replica string

	accounts *account.Registry
	meter    *metering.Meter
	ui       uiSessions     // dashboard logins
	streams  *streams       // long-lived requests' shares (conns.go)
	paces    *paces         // each account's requests paced (pace.go)
	conns    *shedConns     // the bound of open connections (conns.go)
	tenants  sync.Map       // sandbox id → *tenant (quota.go)
	paused   pausedHolds    // what pauses in flight and paused sandboxes reserve (pausedbytes.go)
	tenantMu sync.Mutex     // guards tenant.released
	alerts   *alerts.Alerts // internal/alerts: raised by callers and rules
	// flushes counts the metering flushes this server finished (with
	// what follows each, afterFlush); tests wait on it.
	flushes atomic.Int64

	// sessionMu guards pendingSessions, the sessions each owner is
	// creating now (rate_limiting.concurrent_sessions: sessions.go).
	sessionMu       sync.Mutex
	pendingSessions map[string]int

	// keysMu guards keys, the E2B surface's cache of key states.
	keysMu sync.Mutex
	keys   map[string]keyState

	e2b         *e2b.Handler
	preview     *preview.Proxy // preview.go
	previewKey  []byte         // signs preview tokens and URLs, and E2B's access tokens
	previewKeys *preview.Keys  // previewKey's preview tokens and signed URLs
	metrics     *metrics.Metrics
	batches     *batch.Manager // batches.go; nil without an engine or a store
	// hostPython is the major.minor of the host check's Python, asked of
	// it once (batches.go).
	hostPython func() (string, error)
	// hostChecks holds a place for each host check running
	// (maxHostChecks at once; batches.go).
	hostChecks chan struct{}
}

// box is what the server keeps about each live sandbox it created.
type box struct {
	sb          *sandbox.Sandbox
	owner       string
	execTimeout time.Duration          // default (and longest) execution timeout; 0: the engine's
	footprint   int64                  // what admission counts, in bytes (sandbox.Manager.Footprint)
	public      map[int]bool           // ports made public (preview.go); guarded by Server.mu
	token       atomic.Pointer[string] // its preview token, computed at first use (preview.go)
}

// New returns a Server over a store and an engine. It starts a goroutine
// that records sandboxes stopped by the engine; Shutdown ends it.
func New(cfg Config, st store.Store, m *sandbox.Manager, log *slog.Logger) *Server {
	cfg.setDefaults()
	if log == nil {
		log = slog.Default()
	}
	s := &Server{
		cfg: cfg, store: st, engine: m, log: log,
		auth:  &auth.Authenticator{Store: st},
		boxes: map[string]*box{}, keys: map[string]keyState{},
		stop:      make(chan struct{}),
		traceExec: os.Getenv("SHEEPFOLD_TRACE_EXECUTIONS") != "",
		bus:       cfg.Events, streamsDone: make(chan struct{}),
		accounts: account.NewRegistry(cfg.Accounts, st),
		streams:  newStreams(max(0, cfg.MaxStreamsPerKey), max(0, cfg.MaxStreamsPerAccount), max(0, cfg.MaxStreams)),
		paces:    newPaces(max(0, cfg.PacePerAccount)),
		conns:    newShedConns(max(0, cfg.MaxConnections)),
		ui:       uiSessions{perAccount: cfg.UISessionsPerAccount},
	}
	s.base, s.cut = context.WithCancelCause(context.Background())
	if st != nil {
		st.SetBounds(cfg.Storage)
	}
	if s.bus == nil && st != nil {
		s.bus, s.ownBus = events.NewBus(EventStore(st), events.BusConfig{Logger: log}), true
	}
	s.previewKey = cfg.PreviewKey
	if len(s.previewKey) == 0 {
		s.previewKey = make([]byte, 32)
		if _, err := rand.Read(s.previewKey); err != nil {
			panic(err) // crypto/rand never fails on Linux
		}
	}
	mc := metrics.Config{StreamsOpen: s.streams.open, ConnectionsShed: s.conns.shedCount,
		Collectors: []prometheus.Collector{&storageCollector{s: s}}, Logger: log}
	if m != nil {
		mc.Engine = m
	}
	s.metrics = metrics.New(mc)
	s.streams.refused = s.metrics.StreamRefused
	s.previewKeys = preview.NewKeys(s.previewKey)
	s.preview = preview.NewProxy(preview.ProxyConfig{Dial: s.dialPreview, Logger: s.log, RequestID: requestIDFrom,
		StripHeaders: []string{uiHeader}, StripCookies: []string{uiCookie}})
	s.hooks = webhooks.New(webhooks.Config{AllowHosts: cfg.WebhookAllowHosts, AllowCIDRs: cfg.WebhookAllowCIDRs,
		Timeout: cfg.WebhookTimeout, Workers: cfg.WebhookWorkers, AccountWorkers: cfg.WebhookAccountWorkers,
		RetryBase: cfg.WebhookRetryBase, MaxAttempts: cfg.WebhookMaxAttempts, Logger: log}, st)
	s.secrets = cfg.Secrets
	if s.secrets == nil && st != nil {
		s.secrets = ownSecrets(st)
	}
	if st != nil {
		if err := s.hooks.Start(context.Background(), s.bus); err != nil {
			log.Error("load webhooks: none will be delivered", "err", err)
		}
	}
	if m != nil && m.Shared() && st != nil {
		s.replica = newReplicaID()
		s.heartbeat(context.Background()) // before any execution names it
		s.sweeper.Add(1)
		go s.heartbeats()
	}
	mcfg := cfg.Metering
	mcfg.Logger = log
	mcfg.AfterFlush = s.afterFlush
	mcfg.Replica = s.replica
	s.meter = metering.New(mcfg, st, s.accounts)
	if m != nil {
		s.installHooks()
	}
	if m != nil && m.CanSnapshot() && m.SnapshotDir() != "" {
		if err := removeSnapshotLeftovers(m.SnapshotDir()); err != nil {
			log.Error("remove snapshots a crash left half made or half deleted", "err", err)
		}
		s.startSnapshotMeter(m.SnapshotDir())
	}
	ac := alerts.Config{Store: st, Accounts: s.accounts, Logger: log, NewID: func() string { return newID("alert_") }}
	if s.bus != nil {
		ac.Emit = s.bus.Emit
	}
	s.alerts = alerts.New(ac)
	if st != nil {
		s.sweeper.Add(1)
		go func() {
			defer s.sweeper.Done()
			s.alerts.Run(s.stop)
		}()
		if s.bus != nil && !cfg.NoAccounting {
			s.bus.OnEvent(s.alerts.OnEvent)
		}
		if s.bus != nil {
			s.bus.OnEvent(s.metrics.OnEvent)
		}
	}
	mux := http.NewServeMux()
	s.routesInto(mux)
	// E2B's access tokens: from the preview key, so that replicas, which
	// share it, accept each other's.
	tokenKey := hmac.New(sha256.New, s.previewKey)
	tokenKey.Write([]byte("e2b access tokens"))
	s.e2b = e2b.New(e2b.Config{MaxTimeout: cfg.MaxTimeout, MaxUploadBytes: cfg.MaxUploadBytes,
		WriteTimeout: streamWriteTimeout, Domain: cfg.PreviewDomain, Ports: http.HandlerFunc(s.e2bPreview),
		Key: tokenKey.Sum(nil), LearnInterval: e2bLearnInterval, Hold: s.holdStream}, e2bBackend{s})
	// Previews (by Host or path) and the E2B protocols (an
	// E2b-Sandbox-Port header or E2B's own paths) share the listener;
	// route keeps previews off the API's origin.
	top := s.route(mux)
	// abort.Handler is the one place a response is broken off (the
	// handlers call abort.Response); bodyDeadline stays outermost, with
	// the server's own ResponseWriter for its body limit.
	s.handler = s.track(s.bodyDeadline(abort.Handler(s.requestID(s.accessLog(s.recoverPanics(top))))))
	// No global ReadTimeout or WriteTimeout: they would cut long streams
	// (executions, command output, uploads). Bodies get a per-read
	// deadline instead (bodyDeadline); streams set their own.
	// Requests' contexts derive from base, which a drain's deadline
	// cancels (drain.go).
	s.http = &http.Server{Handler: s.handler, ReadHeaderTimeout: cfg.ReadHeaderTimeout, IdleTimeout: cfg.IdleTimeout,
		ErrorLog:    slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		BaseContext: func(net.Listener) context.Context { return s.base },
		ConnState:   s.conns.state}
	s.http.RegisterOnShutdown(s.endStreams)
	if m != nil {
		s.takeBackPaused(context.Background()) // paused.go
		if m.CanSnapshot() && m.SnapshotDir() != "" {
			s.restoreSnapshotPools(context.Background(), m.SnapshotDir()) // snappool.go
		}
	}
	s.sweeper.Add(1)
	go s.sweep()
	if m != nil && st != nil {
		s.startBatches() // batches.go
	}
	return s
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// Routes returns the patterns of every route, as registered.
func (s *Server) Routes() []string { return append([]string(nil), s.routes...) }

// Serve accepts connections on ln until Shutdown; it returns nil after a
// Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	err := s.http.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Drain marks the server as shutting down: /readyz answers 503 at once,
// new sandboxes are refused, and requests cut off from now on get
// ERR_SHUTTING_DOWN. Shutdown drains too.
func (s *Server) Drain() {
	s.drainStart.CompareAndSwap(0, time.Now().UnixNano())
	s.draining.Store(true)
}

// Shutdown drains (drain.go): it keeps serving for the drain delay
// (DrainDelay, from the first Drain), then ends the event streams, stops
// accepting requests and waits (until ctx ends) for those in flight; at
// ctx's end it cuts those still running, gives them cutGrace to say so
// and closes their connections. It then stops the sweeper. The engine
// is the caller's to close; call RecordStopped after closing it.
func (s *Server) Shutdown(ctx context.Context) error {
	s.Drain()
	s.stopBatches() // their unfinished items run again at the next start
	if d := s.drainDelay() - time.Since(time.Unix(0, s.drainStart.Load())); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	s.endStreams()
	err := s.http.Shutdown(ctx)
	if err != nil {
		s.cut(errCut)
		grace, cancel := context.WithTimeout(context.Background(), cutGrace)
		if s.inflight.wait(grace) != nil {
			s.log.Warn("requests still running after the drain cut them off", "grace", cutGrace)
		}
		// A handler's return is not its response's end: net/http writes
		// the last chunk after it. Closing now could cut that off (the
		// client reads "unexpected EOF" for a response that was whole),
		// so the connections are closed as they fall idle, for what is
		// left of the grace.
		s.http.Shutdown(grace)
		cancel()
		s.http.Close()
	}
	s.cut(errCut)
	s.stopOnce.Do(func() { close(s.stop) })
	s.sweeper.Wait()
	if s.shared() && s.store != nil {
		// A last collection: what ended since the last one (a warm
		// pool member whose replica died, on a node that reported it
		// only now) is not left for replicas that may never come.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		s.collect(cctx)
		cancel()
	}
	s.retire()
	s.hooks.Stop()
	if s.ownBus {
		s.bus.Close()
	}
	return err
}

// track counts the requests in flight (inflight), for the drain.
func (s *Server) track(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.inflight.add()
		defer s.inflight.done()
		next.ServeHTTP(w, r)
	})
}

// endStreams ends the event streams, which never end on their own.
func (s *Server) endStreams() {
	s.streamsOnce.Do(func() { close(s.streamsDone) })
}

// Events is the sink of the server's bus.
func (s *Server) Events() events.Sink { return s.bus }

// Close waits for the execution records still being written, takes the
// last metering sample of every sandbox still metered and flushes the
// usage to the store. Call it after closing the engine.
func (s *Server) Close(ctx context.Context) error {
	s.records.wait(ctx, "")
	return s.meter.Close(ctx)
}

// RecordStopped records in the store every sandbox the engine has
// stopped, with its reason. Shutdown's callers call it after closing the
// engine.
func (s *Server) RecordStopped(ctx context.Context) {
	s.mu.Lock()
	var stopped []*box
	for id, b := range s.boxes {
		if b.sb == nil {
			continue // a create in progress
		}
		if st := b.sb.State(); st == sandbox.StateStopping || st == sandbox.StateStopped {
			delete(s.boxes, id)
			if !b.sb.Released() { // a released one's record is not ours (shared.go)
				stopped = append(stopped, b)
			}
		}
	}
	s.mu.Unlock()
	for _, b := range stopped {
		s.recordStop(ctx, b)
	}
}

// recordStop records that b's sandbox stopped. When the store fails (busy,
// full) the box is kept, so that the next sweep tries again: no stop is
// lost while the server runs.
func (s *Server) recordStop(ctx context.Context, b *box) {
	reason := b.sb.Info().StopReason
	if reason == "" {
		reason = "stopped"
	}
	if err := s.store.StopSandbox(ctx, b.sb.ID, reason, time.Now()); err != nil {
		s.log.Error("record sandbox stop; retrying at the next sweep", "sandbox", b.sb.ID, "err", err)
		s.mu.Lock()
		if _, ok := s.boxes[b.sb.ID]; !ok {
			s.boxes[b.sb.ID] = b
		}
		s.mu.Unlock()
	}
}

// rateGrace is how long after a rate bucket is full again it is
// deleted: servers sharing the store may keep slightly different clocks.
const rateGrace = time.Minute

// prune deletes the records older than the retention period, and the
// rate buckets (store.RateStore) full again, which no longer count.
func (s *Server) prune(ctx context.Context) {
	if n, err := s.store.DeleteRatesBefore(ctx, time.Now().Add(-rateGrace)); err != nil {
		s.log.Warn("prune rate buckets", "err", err)
	} else if n > 0 {
		s.log.Debug("pruned rate buckets", "buckets", n)
	}
	ns, ne, err := s.store.DeleteStoppedBefore(ctx, time.Now().Add(-s.cfg.Retention))
	if err != nil {
		s.log.Warn("prune old records", "err", err)
	} else if ns+ne > 0 {
		s.log.Info("pruned old records", "sandboxes", ns, "executions", ne, "retention", s.cfg.Retention)
	}
	if n, err := s.store.ClearStoppedBefore(ctx, time.Now().Add(-s.cfg.StoppedRetention)); err != nil {
		s.log.Warn("clear outputs of stopped sandboxes", "err", err)
	} else if n > 0 {
		s.log.Info("cleared the code and output of stopped sandboxes' executions", "executions", n, "retention", s.cfg.StoppedRetention)
	}
}

func (s *Server) sweep() {
	defer s.sweeper.Done()
	t := time.NewTicker(s.cfg.SweepInterval)
	defer t.Stop()
	p := time.NewTicker(s.cfg.PruneInterval)
	defer p.Stop()
	if s.store != nil {
		s.prune(context.Background())
	}
	var collect <-chan time.Time
	if s.shared() {
		s.collect(context.Background())
		c := time.NewTicker(s.cfg.CollectInterval)
		defer c.Stop()
		collect = c.C
	}
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.RecordStopped(context.Background())
		case <-collect:
			s.collect(context.Background())
		case <-p.C:
			s.prune(context.Background())
		}
	}
}

// uploadFraming is what a multipart upload may add to its files' bytes
// (part headers, boundaries).
const uploadFraming = 1 << 20

// bodyLimit is the most a request body may hold: file uploads the upload
// limit (in total, however many files), anything else maxJSONBody; an
// E2B input stream is a long-lived stream whose messages Connect bounds
// one by one (0: no total).
func (s *Server) bodyLimit(r *http.Request) int64 {
	switch {
	case e2b.IsStream(r):
		return 0
	case s.isPreview(r):
		return 0 // streamed to the app, never held: the app bounds it
	case e2b.IsUpload(r),
		(r.Method == http.MethodPut || r.Method == http.MethodPost) && strings.HasPrefix(r.URL.Path, "/v1/sandboxes/") && strings.HasSuffix(r.URL.Path, "/files"),
		r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, "/v1/volumes/") && strings.HasSuffix(r.URL.Path, "/files"):
		return s.cfg.MaxUploadBytes + uploadFraming
	}
	return maxJSONBody
}

func newID(prefix string) string {
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return prefix + hex.EncodeToString(b[:])
}
