package sandbox

import (
	"context"
	"time"
)

// ExecTrace holds the moments of one execution's way through the engine,
// for measuring the warm path (serve's SHEEPFOLD_TRACE_EXECUTIONS;
// BENCHMARKS.md says where the time goes). Execute fills it when its
// context carries one (WithExecTrace); nothing is traced otherwise.
type ExecTrace struct {
	Start  time.Time // execute began (the sandbox's state checked)
	Dialed time.Time // the agent's connection open
	First  time.Time // the agent's first frame (the start event) in
	Result time.Time // the first result in
	Done   time.Time // the agent's Done in
	// KernelMS is the kernel driver's own time (the agent's Done): from
	// the request in the agent to the interpreter's done.
	KernelMS float64
	// Recorded is set by the caller once the execution's record is
	// begun (internal/server).
	Recorded time.Time
}

type execTraceKey struct{}

// WithExecTrace returns ctx carrying t, which Execute fills.
func WithExecTrace(ctx context.Context, t *ExecTrace) context.Context {
	return context.WithValue(ctx, execTraceKey{}, t)
}

func execTraceFrom(ctx context.Context) *ExecTrace {
	t, _ := ctx.Value(execTraceKey{}).(*ExecTrace)
	return t
}
