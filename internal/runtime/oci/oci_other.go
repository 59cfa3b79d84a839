//go:build !linux

package oci

import (
	"context"
	"fmt"
	"io"
	"os"

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
func (*OCI) Snapshot(context.Context, string, string) error { return runtime.ErrUnsupported }
func (*OCI) Clone(context.Context, runtime.Spec, string) (*runtime.Instance, error) {
	return nil, runtime.ErrUnsupported
}
func (*OCI) Freeze(context.Context, string) error { return runtime.ErrUnsupported }
func (*OCI) Thaw(context.Context, string) error   { return runtime.ErrUnsupported }
func (*OCI) DiskUsed(context.Context, string) (int64, error) {
	return 0, runtime.ErrUnsupported
}

// CheckDisks fails: disks of their own need Linux.
func CheckDisks() error { return fmt.Errorf("%w: disks need Linux", runtime.ErrUnsupported) }

func (*OCI) MakeVolume(context.Context, string, int64) error { return runtime.ErrUnsupported }
func (*OCI) RemoveVolume(context.Context, string) error      { return runtime.ErrUnsupported }
func (*OCI) VolumeUsage(context.Context, string) (int64, int64, error) {
	return 0, 0, runtime.ErrUnsupported
}
func (*OCI) OpenVolume(context.Context, string) (*os.File, int, int, error) {
	return nil, 0, 0, runtime.ErrUnsupported
}

// Changes fails: snapshots need Linux.
func (*OCI) Changes(context.Context, string, string, string) (runtime.Changes, error) {
	return runtime.Changes{}, runtime.ErrUnsupported
}

// CDIDevices lists no devices: devices need Linux.
func CDIDevices([]string) ([]runtime.Device, error) { return nil, nil }

// StepRunner runs template build steps; it needs Linux.
type StepRunner struct{ RuntimePath, Dir string }

// Step is one command of a build.
type Step struct {
	RootFS   string
	Args     []string
	Env      []string
	Cwd      string
	UID, GID uint32
	HostID   uint32
	Network  *StepNetwork
}

// StepNetwork is the network of a build step.
type StepNetwork struct {
	ResolvConf string
	CAFile     string
	Attach     func(ctx context.Context, nsPath string) error
}

// Run fails: build steps need Linux.
func (StepRunner) Run(context.Context, Step, io.Writer) error { return runtime.ErrUnsupported }
