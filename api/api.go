// Package api is the one wire vocabulary of the /v1 REST API: the
// OpenAPI document (openapi.json, embedded for serving at
// /v1/openapi.json) and the Go request and response types of its
// schemas, each type named after its schema (Sandbox, Execution,
// CommandRequest, Error...). The server answers with these types and
// reads its requests into them, and its services build them
// (internal/metering's usage report; webhooks.Hook, secrets.Info,
// session.Answer and llm.Model are aliases of them); the public Go SDK (client/) takes
// them as its own through type aliases (client.Sandbox = api.Sandbox),
// so that the two cannot say different things.
//
// Which is the source: the document. The Go types are written by hand
// and checked against it field for field (this package's
// TestTypesMatchSpec, through internal/testutil/apispec; the Python
// SDK's models by sdk/python/tests/test_spec.py); neither is generated
// from the other. The document is the source because it carries what Go
// types do not (descriptions, enums, bounds, examples, the E2B and
// error-code tables) and is what the Python SDK and other languages
// read; generating it from Go would lose those or move them into tags,
// and generating Go from it would give up the SDK's names and doc
// comments, which its users' code depends on.
//
// A type lives here when more than one of the server, its services, the
// engine, the agent protocol and the SDK would otherwise declare it: the
// engine's sandbox.Execution embeds Execution (and keeps beside it what
// only the engine needs), the event bus's events.Event is Event (its
// Owner, for fan-out, never sent), and the agent protocol's Result,
// ExecError and FileInfo are these (the agent binary links none of the
// document). What stays declared apart, checked against the document by
// its own package's test, are the SDK's requests that take Go values and
// durations where the server reads pointers or raw policies
// (CreateSandboxRequest, SessionRequest, SessionExecuteRequest: the SDK
// sends api.CreateSandbox for the first). internal/account's Limits and
// Overrides are the registry's (TOML tags, methods) and shown as
// AccountLimits.
//
// Imports: the standard library only (TestImportsStdlibOnly), so that
// the public Go SDK can import it without pulling in the server.
package api

import _ "embed"

// OpenAPI is the OpenAPI 3 document of the /v1 API.
//
//go:embed openapi.json
var OpenAPI []byte
