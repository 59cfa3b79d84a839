package client

import (
	"context"
	"net/url"
	"time"
)

// Volume is one of the account's persistent volumes: a filesystem of
// SizeMB that its sandboxes mount when they start
// (CreateSandboxRequest.VolumeMounts) and that outlives them. UsedBytes,
// TotalBytes and MountedBy are set by GetVolume only.
type Volume struct {
	Name       string    `json:"name"`
	SizeMB     int64     `json:"size_mb"`
	CreatedAt  time.Time `json:"created_at"`
	UsedBytes  *int64    `json:"used_bytes,omitempty"`
	TotalBytes *int64    `json:"total_bytes,omitempty"`
	MountedBy  []string  `json:"mounted_by,omitempty"` // the live sandboxes that mount it
}

// VolumeMount mounts a volume at Path (absolute, not in a system
// directory) in a new sandbox. ReadOnly mounts it read-only; Shared lets
// other sandboxes that set it too write it at the same time (one writer
// at a time otherwise: ErrVolumeInUse).
type VolumeMount struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
	Shared   bool   `json:"shared,omitempty"`
}

type volumeJSON struct {
	Name   string `json:"name"`
	SizeMB int64  `json:"size_mb,omitempty"`
}

// CreateVolume makes a volume of sizeMB (0: the server's default, 1024)
// in the caller's account. ErrConflict when the name is taken,
// ErrStorageQuotaExceeded past the account's volumes, ErrNotSupported on
// a server whose runtime keeps none.
func (c *Client) CreateVolume(ctx context.Context, name string, sizeMB int64) (*Volume, error) {
	var v Volume
	if err := c.call(ctx, request{method: "POST", path: "/v1/volumes", json: volumeJSON{Name: name, SizeMB: sizeMB}}, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// ListVolumes returns the caller's volumes by name.
func (c *Client) ListVolumes(ctx context.Context) ([]Volume, error) {
	var body struct {
		Volumes []Volume `json:"volumes"`
	}
	if err := c.call(ctx, request{method: "GET", path: "/v1/volumes"}, &body); err != nil {
		return nil, err
	}
	return body.Volumes, nil
}

// GetVolume returns one of the caller's volumes, with what it holds and
// the sandboxes that mount it; ErrVolumeNotFound for a name the account
// does not have.
func (c *Client) GetVolume(ctx context.Context, name string) (*Volume, error) {
	var v Volume
	if err := c.call(ctx, request{method: "GET", path: "/v1/volumes/" + url.PathEscape(name)}, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// DeleteVolume deletes a volume and everything in it; ErrVolumeInUse
// while a live sandbox mounts it.
func (c *Client) DeleteVolume(ctx context.Context, name string) error {
	return c.call(ctx, request{method: "DELETE", path: "/v1/volumes/" + url.PathEscape(name)}, nil)
}
