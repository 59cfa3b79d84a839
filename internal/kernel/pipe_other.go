//go:build !linux

package kernel

// pipeBytes is unknown off Linux (where kernels do not run): output is then
// ordered only as far as the pumps have queued it.
func pipeBytes(int) int { return 0 }
