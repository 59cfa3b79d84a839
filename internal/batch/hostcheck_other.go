//go:build !linux

package batch

import "context"

// Version implements HostCheck off Linux: unavailable (no namespaces).
func (h HostCheck) Version(context.Context) (string, error) { return "", ErrCheckUnavailable }

// Check implements HostCheck off Linux: unavailable; the check runs in a
// sandbox.
func (h HostCheck) Check(context.Context, string) (CheckResult, error) {
	return CheckResult{}, ErrCheckUnavailable
}
