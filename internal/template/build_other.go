//go:build !linux

package template

import (
	"context"
	"errors"
	"os"
)

// errUnsupported: building needs Linux (debootstrap, chroot, mount
// namespaces); reading templates works anywhere.
var errUnsupported = errors.New("building templates is supported on Linux only")

const noFollow = 0

// Build fails: see errUnsupported.
func Build(ctx context.Context, def Definition, opt BuildOptions) (Info, error) {
	return Info{}, errUnsupported
}

func lockTemplate(ctx context.Context, dir, name string) (func(), error) { return func() {}, nil }

func removeStaging(dir string) error { return os.RemoveAll(dir) }

func chownTree(dir string, uid, gid int) error { return errUnsupported }

func shiftOwnership(ctx context.Context, root string, shift uint32) (int64, error) {
	return 0, errUnsupported
}

func mountsUnder(dir string) ([]string, error) { return nil, errUnsupported }

// BuildDockerfile fails: see errUnsupported.
func BuildDockerfile(ctx context.Context, dockerfile []byte, opt DockerfileOptions) (Info, error) {
	return Info{}, errUnsupported
}

// Use does nothing where templates cannot be built.
func Use(dataDir, name string) (func(), error) { return func() {}, nil }

// Hold reads the template; nothing is held (nothing removes a tree here).
func Hold(dataDir, ref string) (Info, Release, error) {
	info, err := Get(dataDir, ref)
	return info, func(bool) {}, err
}

// Release lets go of a hold: see Hold.
type Release func(collect bool)

// HoldPath holds nothing: see Hold.
func HoldPath(dataDir, rootfs string) (Release, error) { return func(bool) {}, nil }

// Sweep fails: see errUnsupported.
func Sweep(dataDir string) error { return errUnsupported }

func claimUnused(dir, name string) (func(), error) { return func() {}, nil }

// Tag fails: see errUnsupported.
func Tag(ctx context.Context, dataDir, source string, tags []string) (Info, error) {
	return Info{}, errUnsupported
}

// Untag fails: see errUnsupported.
func Untag(dataDir, name, tag string) error { return errUnsupported }
