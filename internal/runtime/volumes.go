package runtime

import (
	"context"
	"errors"
	"os"
)

// VolumeMount mounts a persistent volume (Volumes) in a sandbox.
type VolumeMount struct {
	// ID is the volume's id, as Volumes.MakeVolume made it.
	ID string
	// Path is where it appears inside: absolute and clean (the engine
	// checks it, internal/sandbox volumes.go).
	Path string
	// ReadOnly mounts it read-only: the kernel refuses every write.
	ReadOnly bool
}

// Volumes is implemented by runtimes that keep persistent volumes:
// filesystems of a bounded size that outlive the sandboxes mounting them
// (Spec.Volumes) and the engine itself. A runtime without it refuses a
// Spec with volumes (ErrUnsupported).
type Volumes interface {
	// MakeVolume makes the volume id (lowercase letters, digits and
	// '-') able to hold size bytes: writes past it fail (ENOSPC) in
	// every sandbox mounting it. The host's lack of room is ErrCapacity.
	MakeVolume(ctx context.Context, id string, size int64) error
	// RemoveVolume removes a volume and everything in it; an unknown one
	// is no error. The caller makes sure no sandbox mounts it.
	RemoveVolume(ctx context.Context, id string) error
	// VolumeUsage reads what a volume holds and can hold, in bytes;
	// ErrVolumeNotFound for an unknown one.
	VolumeUsage(ctx context.Context, id string) (used, total int64, err error)
}

// ErrVolumeNotFound reports a volume the runtime does not hold.
var ErrVolumeNotFound = errors.New("volume not found")

// VolumeOpener is implemented by Volumes runtimes whose volumes the host
// itself holds: OpenVolume opens volume id's root directory (the caller
// closes it; the volume stays while it is open, even once removed) and
// says the owner of what the host creates in it, so that sandboxes
// mounting it see it as their "user"'s. ErrVolumeNotFound for an unknown
// volume.
type VolumeOpener interface {
	OpenVolume(ctx context.Context, id string) (root *os.File, uid, gid int, err error)
}
