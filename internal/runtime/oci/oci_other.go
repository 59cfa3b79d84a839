//go:build !linux

package oci

import (
	"context"
	"fmt"

	"github.com/sheepfold/sheepfold/internal/runtime"
)

// OCI is only available on Linux.
type OCI struct{}

// New fails: OCI runtimes need Linux.
func New(Config) (*OCI, error) {
	return nil, fmt.Errorf("%w: OCI runtimes need Linux", runtime.ErrUnsupported)
}

func (*OCI) Name() string { return "unsupported" }
func (*OCI) Create(context.Context, runtime.Spec) (*runtime.Instance, error) {
	return nil, runtime.ErrUnsupported
}
func (*OCI) Destroy(context.Context, string) error { return runtime.ErrUnsupported }
func (*OCI) Usage(context.Context, string) (runtime.Usage, error) {
	return runtime.Usage{}, runtime.ErrUnsupported
}
func (*OCI) List(context.Context) ([]string, error) { return nil, runtime.ErrUnsupported }
func (*OCI) Close() error                           { return nil }
func (*OCI) Checkpoint(context.Context, string, string) error {
	return runtime.ErrUnsupported
}
func (*OCI) Restore(context.Context, string, string) (*runtime.Instance, error) {
	return nil, runtime.ErrUnsupported
}
func (*OCI) Freeze(context.Context, string) error { return runtime.ErrUnsupported }
func (*OCI) Thaw(context.Context, string) error   { return runtime.ErrUnsupported }
func (*OCI) DiskUsed(context.Context, string) (int64, error) {
	return 0, runtime.ErrUnsupported
}

// CheckDisks fails: disks of their own need Linux.
func CheckDisks() error { return fmt.Errorf("%w: disks need Linux", runtime.ErrUnsupported) }
