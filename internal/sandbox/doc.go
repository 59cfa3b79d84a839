// Package sandbox is the engine: it creates sandboxes through a
// runtime.Runtime, talks to the agent inside each one, runs code, commands
// and file operations there, and enforces lifetimes. A warm pool
// (pool.go) keeps sandboxes started ahead, their Python libraries
// imported, and hands them out on Create.
//
// A sandbox moves through the states Starting → Running → Stopping →
// Stopped, one way only; an operation on a sandbox that is not Running
// fails with ERR_SANDBOX_STATE. Errors that reach callers carry an
// apierr code; the agent is treated as untrusted (it runs with the
// sandboxed code's uid), so nothing it says is believed beyond its own
// sandbox.
//
// Imports: internal/runtime, internal/agentproto, internal/apierr,
// internal/events (what it emits), internal/policy (the decisions it
// enforces), internal/egress (a networked sandbox's gateway), internal/lang,
// internal/typescript (transpiling before the agent), internal/ratelimit,
// internal/backoff (the waits of its retry loops), golang.org/x/sync and x/time, and the standard library; never net/http,
// never a transport.
package sandbox
