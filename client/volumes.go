package client

import (
	"context"
	"io"
	"net/url"

	"github.com/sheepfold/sheepfold/api"
)

// Volume is one of the account's persistent volumes: a filesystem of
// SizeMB that its sandboxes mount when they start
// (CreateSandboxRequest.VolumeMounts) and that outlives them. UsedBytes,
// TotalBytes and MountedBy are set by GetVolume only.
type Volume = api.Volume

// VolumeMount mounts a volume at Path (absolute, not in a system
// directory) in a new sandbox. ReadOnly mounts it read-only; Shared lets
// other sandboxes that set it too write it at the same time (one writer
// at a time otherwise: ErrVolumeInUse).
type VolumeMount = api.VolumeMount

// CreateVolume makes a volume of sizeMB (0: the server's default, 1024)
// in the caller's account. ErrConflict when the name is taken,
// ErrStorageQuotaExceeded past the account's volumes, ErrNotSupported on
// a server whose runtime keeps none.
func (c *Client) CreateVolume(ctx context.Context, name string, sizeMB int64) (*Volume, error) {
	var v Volume
	if err := c.call(ctx, request{method: "POST", path: "/v1/volumes", json: volumeRequest(name, sizeMB)}, &v); err != nil {
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

// VolumeFile is a file or directory of a volume (the file calls below,
// which need no sandbox).
type VolumeFile = api.VolumeFile

func volumeFilesPath(name string) string { return "/v1/volumes/" + url.PathEscape(name) + "/files" }

// WriteVolumeFile writes r to the file at path (from the volume's root)
// of volume name, without a sandbox, making it and its directories as
// the sandboxes' user. ErrVolumeInUse while a sandbox writes the volume,
// ErrDiskFull when it is full.
func (c *Client) WriteVolumeFile(ctx context.Context, name, path string, r io.Reader) (*VolumeFile, error) {
	var f VolumeFile
	return &f, c.call(ctx, request{method: "PUT", path: volumeFilesPath(name), query: url.Values{"path": {path}},
		body: r, contentType: "application/octet-stream"}, &f)
}

// ReadVolumeFile returns the contents of the regular file at path of
// volume name, without a sandbox.
func (c *Client) ReadVolumeFile(ctx context.Context, name, path string) ([]byte, error) {
	res, err := c.do(ctx, request{method: "GET", path: volumeFilesPath(name), query: url.Values{"path": {path}}})
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	return io.ReadAll(res.Body)
}

// ListVolumeFiles lists the directory at path ("" is the root) of volume
// name, without a sandbox.
func (c *Client) ListVolumeFiles(ctx context.Context, name, path string) ([]VolumeFile, error) {
	var body struct {
		Entries []VolumeFile `json:"entries"`
	}
	var q url.Values
	if path != "" {
		q = url.Values{"path": {path}}
	}
	return body.Entries, c.call(ctx, request{method: "GET", path: volumeFilesPath(name) + "/list", query: q}, &body)
}

// RemoveVolumeFile removes the file, symlink or empty directory at path
// of volume name, without a sandbox.
func (c *Client) RemoveVolumeFile(ctx context.Context, name, path string) error {
	return c.call(ctx, request{method: "DELETE", path: volumeFilesPath(name), query: url.Values{"path": {path}}}, nil)
}

// volumeRequest is a create's body: a size of 0 is left out, for the
// server's default.
func volumeRequest(name string, sizeMB int64) api.VolumeRequest {
	r := api.VolumeRequest{Name: name}
	if sizeMB != 0 {
		r.SizeMB = &sizeMB
	}
	return r
}
