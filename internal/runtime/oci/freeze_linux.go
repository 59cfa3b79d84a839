package oci

import (
	"context"
	"fmt"

	"github.com/sheepfold/sheepfold/internal/runtime"
)

// Freeze and thaw (runtime.Freezer): runc pause and resume, which freeze
// and thaw the sandbox's cgroup (the v1 freezer, or cgroup.freeze on
// v2; its tenant cgroup is a child and freezes with it). A frozen
// sandbox keeps its memory, its cgroups and its host objects; its
// processes do not run. Destroy kills a frozen sandbox as a running one
// (the kill freezes, signals and thaws).

var _ runtime.Freezer = (*OCI)(nil)

// Freeze implements runtime.Freezer.
func (o *OCI) Freeze(ctx context.Context, id string) error {
	return o.freezer(ctx, "pause", id)
}

// Thaw implements runtime.Freezer.
func (o *OCI) Thaw(ctx context.Context, id string) error {
	return o.freezer(ctx, "resume", id)
}

func (o *OCI) freezer(ctx context.Context, op, id string) error {
	if !validID(id) {
		return runtime.ErrNotFound
	}
	if err := o.claim(id); err != nil {
		return err
	}
	defer o.release(id)
	if !o.running(id) {
		return fmt.Errorf("%s %s: %w", op, id, runtime.ErrNotFound)
	}
	cmd, name := o.runc(ctx, op, id), o.Name()
	if o.gvisor(id) {
		cmd, name = o.runsc(ctx, op, id), "runsc" // the Sentry stops its tasks
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, op, err, tail(out))
	}
	return nil
}
