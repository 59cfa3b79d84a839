package client

import (
	"context"
	"net/url"

	"github.com/sheepfold/sheepfold/api"
)

// Snapshot is a saved sandbox (its processes, memory and files) that new
// sandboxes start from (CreateSandboxRequest.Snapshot).
type Snapshot = api.Snapshot

// CreateSnapshot saves the running sandbox id under name (unique in the
// account) while it runs on. ErrConflict: the name is taken;
// ErrSandboxState: a request of it is in flight, or it is paused;
// ErrNotSupported: the server cannot.
func (c *Client) CreateSnapshot(ctx context.Context, id, name string) (*Snapshot, error) {
	var s Snapshot
	return &s, c.call(ctx, request{method: "POST", path: sandboxPath(id, "snapshots"), json: api.SnapshotRequest{Name: name}}, &s)
}

// ListSnapshots lists the account's snapshots, oldest first.
func (c *Client) ListSnapshots(ctx context.Context) ([]Snapshot, error) {
	var out api.SnapshotList
	return out.Snapshots, c.call(ctx, request{method: "GET", path: "/v1/snapshots"}, &out)
}

// GetSnapshot describes one of the account's snapshots.
func (c *Client) GetSnapshot(ctx context.Context, name string) (*Snapshot, error) {
	var s Snapshot
	return &s, c.call(ctx, request{method: "GET", path: "/v1/snapshots/" + url.PathEscape(name)}, &s)
}

// DeleteSnapshot deletes a snapshot; sandboxes started from it run on.
// ErrConflict: sandboxes are being started from it.
func (c *Client) DeleteSnapshot(ctx context.Context, name string) error {
	return c.call(ctx, request{method: "DELETE", path: "/v1/snapshots/" + url.PathEscape(name)}, nil)
}

// Diff is what a fork added, changed and deleted in its files since it
// was forked from Against (paths inside the sandbox, sorted).
type Diff = api.Diff

// Fork makes count (1 to 8) independent copies of the running sandbox
// id, with its processes, memory and files, each a new sandbox of its
// own; the parent runs on.
func (c *Client) Fork(ctx context.Context, id string, count int) ([]Sandbox, error) {
	var out api.ForkResult
	return out.Sandboxes, c.call(ctx, request{method: "POST", path: sandboxPath(id, "fork"), json: api.ForkRequest{Count: &count}}, &out)
}

// DiffSandbox lists what the fork id changed in its files since it was
// forked from parent. ErrNotFound: id is not a fork of parent made by
// the server's current run.
func (c *Client) DiffSandbox(ctx context.Context, id, parent string) (*Diff, error) {
	var d Diff
	return &d, c.call(ctx, request{method: "GET", path: sandboxPath(id, "diff"), query: url.Values{"against": {parent}}}, &d)
}

// Adopted is what AdoptFork copied into the parent, deleted from it and
// left (with why).
type Adopted = api.AdoptResult

// AdoptSkipped is a path AdoptFork left, and why.
type AdoptSkipped = api.AdoptSkipped

// AdoptFork copies the fork id's changes since the fork (DiffSandbox)
// into its parent: files and directories it added or changed are written
// there, paths it deleted are removed. ErrNotFound: id is not a fork made
// by the server's current run.
func (c *Client) AdoptFork(ctx context.Context, id string) (*Adopted, error) {
	var a Adopted
	return &a, c.call(ctx, request{method: "POST", path: sandboxPath(id, "adopt")}, &a)
}

// SnapshotPool is a snapshot's pool: sandboxes restored from it ahead of
// need, which creates from it take.
type SnapshotPool = api.SnapshotPool

// SetSnapshotPool keeps size sandboxes restored from the snapshot name
// ahead of need (0: none), so that a create from it skips the restore.
// ErrNotSupported: the server keeps no snapshot pools;
// ErrSessionQuotaExceeded: past the account's bound over all its pools.
func (c *Client) SetSnapshotPool(ctx context.Context, name string, size int) (*SnapshotPool, error) {
	var p SnapshotPool
	return &p, c.call(ctx, request{method: "POST", path: "/v1/snapshots/" + url.PathEscape(name) + "/pool", json: api.SnapshotPoolRequest{Size: size}}, &p)
}

// GetSnapshotPool reports the snapshot name's pool: its size and how
// many members are ready.
func (c *Client) GetSnapshotPool(ctx context.Context, name string) (*SnapshotPool, error) {
	var p SnapshotPool
	return &p, c.call(ctx, request{method: "GET", path: "/v1/snapshots/" + url.PathEscape(name) + "/pool"}, &p)
}
