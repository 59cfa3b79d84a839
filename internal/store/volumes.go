package store

import (
	"context"
	"time"
)

// Volume is an account's named persistent volume (internal/server,
// volumes.go): a filesystem of SizeBytes that sandboxes of its owner
// mount. ID names its storage on the host (the runtime's, never shown to
// another account); owner and name identify it in the API.
type Volume struct {
	Owner     string
	Name      string
	ID        string
	SizeBytes int64
	CreatedAt time.Time
}

// VolumeStore persists volumes. Owner and name identify a volume.
type VolumeStore interface {
	// CreateVolume stores v when its owner has fewer than max volumes
	// and their sizes with v's stay within maxBytes (either 0: no bound):
	// ErrLimit otherwise, ErrExists when the name is taken. The check and
	// the insert are one step for every server sharing the store.
	CreateVolume(ctx context.Context, v Volume, max int, maxBytes int64) error
	// GetVolume returns ErrNotFound for an unknown owner and name.
	GetVolume(ctx context.Context, owner, name string) (Volume, error)
	// ListVolumes lists an owner's volumes by name; AllVolumes every
	// owner's, by owner and name.
	ListVolumes(ctx context.Context, owner string) ([]Volume, error)
	AllVolumes(ctx context.Context) ([]Volume, error)
	// DeleteVolume deletes a volume; ErrNotFound when there is none.
	DeleteVolume(ctx context.Context, owner, name string) error
}
