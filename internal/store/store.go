// Package store is the server's persistence: API keys, sandbox records,
// execution records, events and webhooks (events.go), each account's
// stored records counted and bounded (storage.go). Store is the
// interface the server uses; sqlite/ is the implementation for one host,
// postgres/ the one on PostgreSQL; storetest/ is the suite both pass.
//
// # Two implementations, one behaviour
//
// `store.Store` has two implementations that keep the same records with the
// same meaning: internal/store/sqlite (a file in the data dir) and
// internal/store/postgres (`postgres.Open(ctx, dsn)`, pgx and its pool).
// Each embeds its own migrations/NNNN_name.sql with the same numbers and
// names (a test fails when the two directories differ), applied in order
// and recorded in schema_migrations; PostgreSQL applies them under a
// session advisory lock, so servers starting together migrate once.
// PostgreSQL's times are timestamptz (UTC, microseconds: the precision the
// interface promises), JSON is kept as text verbatim, and event ids, from a
// sequence, are drawn and committed under a transaction advisory lock so
// that none becomes visible after a larger one (readers page by "after
// id"). Both map a missing row to `ErrNotFound`, a taken name to
// `ErrExists`, and a database that cannot answer now (busy past its wait, a
// lock timeout of 5 s, a lost connection, a full disk, a shutdown) to
// `ErrUnavailable`. internal/store/storetest is the behaviour both show, run
// by each package's tests: SQLite's on temp files, PostgreSQL's on a real
// server that internal/testutil/pgtest starts from Debian's postgresql
// package (`make setup` installs it without a default cluster): initdb in a
// temp dir as the postgres user, a unix socket there and no TCP, fsync off,
// one server per test binary and a fresh database per test.
// What each account keeps is counted by kind in the `stored` table, kept
// by triggers (migration 0014), and bounded by the writes themselves
// (store.StorageStore, `SetBounds`): the write that takes an account past
// its bound of a kind deletes the account's oldest records of that kind in
// its transaction (docs/security.md, "Storage per account"). SQLite reads
// on a pool of their own (query_only) beside its one write handle, and its
// busiest writes take turns round the accounts (sqlite/turns.go).
// Admissions that servers sharing a store must see together go through the
// store too (store.AdmissionStore, migration 0009): a create of an account
// with a concurrent cap reserves a slot (its running sandboxes plus live
// reservations under the cap, then a reservation row, in one transaction)
// that ConfirmSandbox turns into the sandbox's record, and an execution of an
// account with a monthly quota is counted in a per-account, per-month row
// (started from the month's usage). SQLite serialises them as its writes
// are (BEGIN IMMEDIATE); PostgreSQL under a per-account transaction advisory
// lock. A reservation whose server died lapses after ReservationTTL. The
// server asks the store only when the store is shared (account.Config.
// SharedStore: `--database postgres://...`): one server's in-memory counts
// are exact, and a store transaction per execution cost the warm 1+1 of an
// account with a quota 0.2 ms (bench, 5 Dec). The in-memory counts stay the
// first, free check either way.
// An account's requests and executions per minute, when the store is
// shared, are counted in the store alone (store.RateStore, migration 0011):
// each key's token bucket is one row holding the time, in nanoseconds, it
// is full again (the generic cell rate algorithm), taken in one upsert
// (INSERT ... ON CONFLICT DO UPDATE ... RETURNING, which serialises on the
// row), and ratelimit.Stored turns it into the very Result (headers,
// Retry-After) the in-memory bucket gives: they differ only in rounding and
// when a limit changes (the store keeps the time to full, the bucket its
// tokens). Times are the servers' clocks (kept in step by NTP). A take the
// store cannot count fails closed (503 ERR_STORAGE_UNAVAILABLE,
// Retry-After 1): the key was read from the same store a moment before.
// Buckets full again a minute ago are deleted by each server's prune.
//
// Imports: the standard library only. Implementations live in
// subpackages and may import their database driver.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// ErrNotFound reports a record that does not exist.
var ErrNotFound = errors.New("store: not found")

// ErrUnavailable reports a database that cannot answer now: busy or
// locked past its wait, full, or failing. Retrying later may succeed.
var ErrUnavailable = errors.New("store: database busy, full or unavailable")

// Pinger is a Store that can tell cheaply whether its database answers
// now (the server's /readyz asks it). A failure wraps ErrUnavailable.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Key is an API key. Only the SHA-256 of the secret is kept.
type Key struct {
	ID        string
	Name      string
	Owner     string // the account the key acts for (its ID)
	Role      string // RoleUser or RoleAdmin; "" is RoleUser
	Hash      string // lowercase hex SHA-256 of the secret
	CreatedAt time.Time
	RevokedAt *time.Time
}

// Sandbox states recorded in the store.
const (
	SandboxRunning = "running"
	// SandboxPaused: checkpointed to the server's disk (its processes
	// ended, its memory in the checkpoint), to be resumed. StopAllRunning
	// leaves it: a paused sandbox outlives the server's run.
	SandboxPaused  = "paused"
	SandboxStopped = "stopped"
)

// ReasonTimedOut is the stop reason of a sandbox whose lifetime ended.
const ReasonTimedOut = "timed out"

// Sandbox is the record of one sandbox.
type Sandbox struct {
	ID         string
	Owner      string
	Template   string
	State      string
	CreatedAt  time.Time
	ExpiresAt  time.Time
	StoppedAt  *time.Time
	StopReason string
	Metadata   json.RawMessage // a JSON object; nil is {}
	Resources  json.RawMessage // a JSON object; nil is {}
	Policy     json.RawMessage // the security policy (internal/policy JSON); nil when none was given
}

// ExecutionRunning is the status of an execution recorded as it started
// and not yet ended; the others are the engine's (success, error,
// timeout).
const ExecutionRunning = "running"

// ExecutionError is the status of an execution that ended in an error.
const ExecutionError = "error"

// Execution is the record of one code execution.
type Execution struct {
	ID              string
	SandboxID       string
	Owner           string
	Language        string
	Status          string
	ErrorCode       string
	Error           string // why it ended without an outcome of its own ("server restarted"); "" otherwise
	ExecutionTimeMS float64
	CPUTimeMS       float64
	PeakMemoryBytes int64
	CreatedAt       time.Time
	Code            string          // the code it ran (the server cuts it to a bound)
	Output          json.RawMessage // stdout, stderr, results and error as a JSON object; nil while running
	// Replica is the server running it when servers share their
	// sandboxes (ReplicaStore); "" otherwise. It is only written.
	Replica string
}

// KeptOutputs is how many of a sandbox's newest executions keep their
// Output; older records keep the rest of their fields.
const KeptOutputs = 50

// ExecutionFilter selects a page of a sandbox's executions, newest first.
type ExecutionFilter struct {
	SandboxID string // required
	Before    string // only executions older than the one with this ID (a cursor); "" from the newest
	Limit     int    // at most this many; 0 for all
}

// SandboxFilter selects sandbox records, oldest first.
type SandboxFilter struct {
	Owner string // required, unless AnyOwner
	// AnyOwner lists every owner's sandboxes (the collector of servers
	// that share sandboxes); Owner is then ignored.
	AnyOwner bool
	State    string // "" for every state
	// Live selects running and paused sandboxes (State is then ignored).
	Live  bool
	After string // only records after the one with this ID (a cursor); "" from the start
	Limit int    // at most this many; 0 for all
}

// Store persists the server's state. Implementations are safe for
// concurrent use, keep times to the microsecond (at least) and give them
// back in UTC; storetest is the suite every implementation passes.
type Store interface {
	EventStore

	CreateKey(ctx context.Context, k Key) error
	// KeyByHash returns the key with this hash, revoked or not.
	KeyByHash(ctx context.Context, hash string) (Key, error)
	// KeyByID returns the key with this id, revoked or not.
	KeyByID(ctx context.Context, id string) (Key, error)
	ListKeys(ctx context.Context) ([]Key, error)
	// RevokeKey marks a key revoked; revoking twice keeps the first time.
	RevokeKey(ctx context.Context, id string, at time.Time) error
	// CountActiveKeys counts keys that are not revoked.
	CountActiveKeys(ctx context.Context) (int, error)

	PutSandbox(ctx context.Context, s Sandbox) error
	GetSandbox(ctx context.Context, id string) (Sandbox, error)
	ListSandboxes(ctx context.Context, f SandboxFilter) ([]Sandbox, error)
	UpdateSandboxExpiry(ctx context.Context, id string, expiresAt time.Time) error
	// UpdateSandboxPolicy replaces a sandbox's recorded security policy.
	UpdateSandboxPolicy(ctx context.Context, id string, policy json.RawMessage) error
	// SetSandboxPaused records a live sandbox paused (SandboxPaused) or
	// running again, with its expiry; a stopped one stays stopped, and a
	// missing one is ErrNotFound.
	SetSandboxPaused(ctx context.Context, id string, paused bool, expiresAt time.Time) error
	// StopSandbox marks a running or paused sandbox stopped; a stopped one keeps its
	// first reason.
	StopSandbox(ctx context.Context, id, reason string, at time.Time) error
	// StopAllRunning marks every running sandbox stopped and returns how
	// many there were. Those whose lifetime had ended by at are marked
	// ReasonTimedOut, stopped at their expiry: a sandbox ends at its
	// deadline even while no server runs (its agent keeps the deadline).
	StopAllRunning(ctx context.Context, reason string, at time.Time) (int, error)

	// DeleteStoppedBefore removes the records of sandboxes stopped before
	// t, and executions made before t, and says how many of each went;
	// meter leases that lapsed before t go too.
	DeleteStoppedBefore(ctx context.Context, t time.Time) (sandboxes, executions int, err error)

	// AddExecution records an execution, replacing the record with its ID:
	// once as it starts (ExecutionRunning), again when it ends.
	AddExecution(ctx context.Context, e Execution) error
	// EndRunningExecutions marks every execution still recorded as running
	// ended (ExecutionError with code and message) and returns how many
	// there were: at start, those are what a crashed server was running.
	EndRunningExecutions(ctx context.Context, code, message string) (int, error)
	ListExecutions(ctx context.Context, sandboxID string) ([]Execution, error)
	// PageExecutions lists a sandbox's executions newest first, with their
	// code and output.
	PageExecutions(ctx context.Context, f ExecutionFilter) ([]Execution, error)

	AccountStore
	AdmissionStore
	RateStore
	ModelStore
	SecretStore
	VolumeStore
	BatchStore
	ReplicaStore
	MeterPointStore
	StorageStore

	Close() error
}
