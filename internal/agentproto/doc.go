// Package agentproto is the wire protocol between the host (the sandbox
// engine) and the agent that runs inside every sandbox.
//
// One request per connection: the client dials the agent's unix socket,
// writes one Request frame (and, for file uploads, data frames ending with
// an empty one), then reads Event frames until an event of type EventDone.
// Long-running operations (processes, code execution) stream their output as
// events on the same connection; operations on a running process (input,
// signals) are separate requests on new connections.
//
// Call is the one loop that reads an agent's replies, for the host engine
// and for tests alike: it bounds frames, asks an Admit before reading a
// large one, and hands events and data to its Handlers.
//
// Framing: a 4-byte big-endian length N, then N bytes: one kind byte
// (FrameJSON or FrameData) followed by the payload. Frames are bounded by
// MaxFrame. Both sides treat everything they read as untrusted: the host
// never trusts the agent (it runs with the sandboxed code's own uid) and the
// agent never trusts the host's paths.
//
// Imports: the standard library and api, whose Result, ExecError and
// FileInfo it carries as they are (the engine forwards them to /v1
// unchanged; the agent binary links none of api's document).
package agentproto
