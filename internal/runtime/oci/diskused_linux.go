package oci

import (
	"context"
	"path/filepath"

	"github.com/sheepfold/sheepfold/internal/runtime"
)

var _ runtime.DiskMeter = (*OCI)(nil)

// DiskUsed implements runtime.DiskMeter: what the sandbox's writable
// layer holds (its disk of its own, or its tmpfs), read from the mounted
// filesystem, which a checkpointed sandbox keeps.
func (o *OCI) DiskUsed(_ context.Context, id string) (int64, error) {
	if !validID(id) {
		return 0, runtime.ErrNotFound
	}
	used, _, ok := diskUsage(filepath.Join(o.bundles, id, "rw"))
	if !ok {
		return 0, runtime.ErrNotFound
	}
	return used, nil
}
