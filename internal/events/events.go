// Package events defines a sandbox's typed events (lifecycle, executions,
// security violations, exceeded resources, policy changes) and the Sink
// the engine, the kernels' reports and the network gateway emit them to.
// Bus (bus.go) is the server's Sink: it keeps every event in a Store and
// fans it out live to subscribers (SSE) and hooks (webhooks); see
// "Events, sources and the bus" below.
//
// # Events, sources and the bus
//
// Each sandbox emits typed events (internal/events): `sandbox.created` (at
// create, or when a warm pool member is handed out) and `sandbox.stopped`
// with its reason, `execution.started` and `execution.finished` (status,
// error code, language, duration, CPU time, peak memory) from `Sandbox.Execute`
// (execute_hooks.go), `resource_exceeded` (limit, observed, unit) for the
// CPU time, wall-time, output, memory, disk and pids limits the engine
// detects (memory and pids from the cgroup's OOM-kill count and
// `pids.events` `max`, read only after an execution or command that
// failed, against the counts last reported: limits.go), network_requests
// from the gateway, and `security_violation` /
// `policy.changed` from the policy and egress layers. The engine emits to
// `sandbox.Config.Events`; it knows the sandbox's owner only as an opaque
// string (`CreateOptions.Owner`) copied into each event for fan-out.
//
// Every event says who recorded it (`Source`, kept in the store's `source`
// column): `host` (the engine and the server; the Bus's default), `gateway`
// (the Manager marks what the egress gateway emits), `agent` (a violation
// the agent saw itself: a system call its seccomp supervisor refused) or
// `sandbox` (a violation a language driver relayed over its control pipe,
// which the code in the sandbox can write too: agentproto.Violation's
// `Source`, set by internal/kernel). The engine keeps at most
// `Config.Reports` of a sandbox's reports (agent's and sandbox's), 100 per
// execution and 300 a minute per sandbox (internal/sandbox/reports.go),
// counts the rest in `execution.finished` (`reports_dropped`) and emits one
// `resource_exceeded` (`reports`) of its own for them; a report never ends
// an execution nor changes a limit (docs/security.md §7).
//
// The server's sink is an `events.Bus`: `Emit` only appends to an in-memory
// queue (bounded; it never blocks or does I/O on the emitter's path), and
// one goroutine writes batches to the store (`events` table; ids only grow)
// in group commits (it waits up to `BusConfig.FlushDelay`, 20 ms, for a
// batch to fill: each execution's two events would otherwise cost a SQLite
// transaction each; `Sync`, so every `Query`, and `Close` write at once, so a
// listing sees every event emitted before it and a clean shutdown loses none)
// and then fans each stored event out, in id order, to live subscribers
// (each with a bounded buffer: one that falls behind is dropped and told
// "lagged", never waited for) and to hooks (webhooks). Because only stored
// events are fanned out, a subscription records the last id fanned out
// when it began (`From`): a resuming SSE reader replays the store's events
// in (Last-Event-ID, From] and then reads live ones, with no gap and no
// duplicate. `GET /v1/sandboxes/{id}/events` and `GET /v1/events` stream
// SSE (`Accept: text/event-stream`) or answer pages of JSON (filters type,
// since, sandbox; cursor = last id). Events older than `serve
// --event-retention` (7 days) are deleted hourly. The store package imports
// nothing of ours, so the server adapts its `EventStore` to `events.Store`.
//
// Imports: the standard library and api (Event is api.Event, the one
// declaration of the wire's event), so that everything that emits can
// import it without reaching persistence or transport.
package events

import (
	"slices"

	"github.com/sheepfold/sheepfold/api"
)

// Type names an event (Event.Type). Types are append-only and never
// renamed.
type Type = string

// The event types.
const (
	SandboxCreated Type = "sandbox.created"
	SandboxStopped Type = "sandbox.stopped"
	SandboxPaused  Type = "sandbox.paused"
	SandboxResumed Type = "sandbox.resumed"
	// SandboxPausing: an auto-pause sandbox will be paused at pause_at
	// unless it is active by then (Details: pause_at, reason, notice_ms).
	SandboxPausing    Type = "sandbox.pausing"
	ExecutionStarted  Type = "execution.started"
	ExecutionFinished Type = "execution.finished"
	SecurityViolation Type = "security_violation"
	ResourceExceeded  Type = "resource_exceeded"
	PolicyChanged     Type = "policy.changed"
	AlertCreated      Type = "alert.created" // an account's alert (internal/server alerts.go)
	// SecretUsed: the egress gateway put a secret into a request, or
	// refused a request for a secret's sake (Details: secret, host,
	// method, path, outcome; never the value).
	SecretUsed Type = "secret.used"
)

// Types returns the event types above, in the order they were added (the
// OpenAPI document's EventType enum).
func Types() []Type {
	return []Type{SandboxCreated, SandboxStopped, ExecutionStarted, ExecutionFinished, SecurityViolation,
		ResourceExceeded, PolicyChanged, AlertCreated, SecretUsed, SandboxPaused, SandboxResumed, SandboxPausing}
}

// Known reports whether t is one of the event types: the types a filter
// or a webhook may name.
func Known(t Type) bool { return slices.Contains(Types(), t) }

// Kinds of security_violation (Details["kind"]).
const (
	KindModuleBlocked    = "module_blocked"
	KindSubprocessDenied = "subprocess_denied"
	KindNetworkDenied    = "network_denied"
	KindDNSDenied        = "dns_denied"
	KindPathDenied       = "path_denied"
	KindSyscallDenied    = "syscall_denied"
	// KindSecretMisdirected: a placeholder of a secret sent where the
	// gateway does not substitute it (internal/egress, inject.go).
	KindSecretMisdirected = "secret_misdirected"
)

// Resources of resource_exceeded (Details["resource"]).
const (
	ResourceCPUTime         = "cpu_time"
	ResourceWallTime        = "wall_time"
	ResourceMemory          = "memory"
	ResourceDisk            = "disk"
	ResourceOutput          = "output"
	ResourceNetworkRequests = "network_requests"
	ResourceNetworkFlows    = "network_flows" // connections open at once through the egress gateway
	ResourcePids            = "pids"
	// ResourceReports: the sandbox's reports (its security_violation
	// and resource_exceeded events) past the engine's bound, dropped.
	ResourceReports = "reports"
)

// Who recorded an event (Event.Source). A record is only as good as its
// source: the host's are the server's own; the sandbox's are what code in
// the sandbox said (its language driver's reports, which the code can
// write too) and are kept as its word, bounded in number
// (internal/sandbox, reports.go).
const (
	// SourceHost: the server and its engine (lifecycle, executions as the
	// host saw them, its own checks and limits). The Bus's default.
	SourceHost = "host"
	// SourceGateway: the egress gateway, which sees the sandbox's traffic
	// from outside the sandbox.
	SourceGateway = "gateway"
	// SourceAgent: the agent inside the sandbox saw it itself (a system
	// call its seccomp supervisor refused); the sandbox's code can cause
	// these reports but not write them.
	SourceAgent = "agent"
	// SourceSandbox: the code in the sandbox reported it; it may be forged.
	SourceSandbox = "sandbox"
)

// Event is one thing that happened to a sandbox: the API's Event. ID and
// Timestamp are set by the sink when zero, Source by the Bus (SourceHost)
// when empty, Owner (never sent) by the emitter for fan-out. Details are
// small JSON-able values: for security_violation "kind", "target" and
// "execution_id"; for resource_exceeded "resource", "limit" and
// "observed".
type Event = api.Event

// Sink receives events. Emit must not block the caller for long: a sink
// that stores or sends them does so in the background.
type Sink interface {
	Emit(Event)
}

// SinkFunc adapts a function to Sink.
type SinkFunc func(Event)

// Emit implements Sink.
func (f SinkFunc) Emit(e Event) { f(e) }

// Discard drops every event.
var Discard Sink = SinkFunc(func(Event) {})
