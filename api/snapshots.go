package api

import "time"

// Snapshot is a snapshot of a sandbox, memory included, kept under a
// name of its account's (schema Snapshot).
type Snapshot struct {
	Name      string    `json:"name"`
	SandboxID string    `json:"sandbox_id"` // the sandbox it was taken of
	Template  string    `json:"template"`
	Resources Resources `json:"resources"`
	CreatedAt time.Time `json:"created_at"`
	SizeBytes int64     `json:"size_bytes"` // on the server's disk
}

// SnapshotList is GET /v1/snapshots's answer (schema SnapshotList).
type SnapshotList struct {
	Snapshots []Snapshot `json:"snapshots"`
}

// SnapshotRequest is POST /v1/sandboxes/{id}/snapshots's body (schema
// SnapshotRequest).
type SnapshotRequest struct {
	Name string `json:"name"`
}

// ForkRequest is POST /v1/sandboxes/{id}/fork's body (schema
// ForkRequest); nil Count is one fork.
type ForkRequest struct {
	Count *int `json:"count,omitempty"`
}

// ForkResult lists the forks a fork made (schema ForkResult).
type ForkResult struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// Diff is the files a fork added, changed and deleted since it was
// forked from Against (schema Diff).
type Diff struct {
	Against string   `json:"against"`
	Added   []string `json:"added"`
	Changed []string `json:"changed"`
	Deleted []string `json:"deleted"`
}

// AdoptResult is what an adopt copied into the fork's parent, deleted
// there, and skipped (schema AdoptResult).
type AdoptResult struct {
	Parent  string         `json:"parent"`
	Copied  []string       `json:"copied"`
	Deleted []string       `json:"deleted"`
	Skipped []AdoptSkipped `json:"skipped"`
}

// AdoptSkipped is a path an adopt left alone, and why (schema
// AdoptSkipped).
type AdoptSkipped struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// Volume is one of an account's persistent volumes (schema Volume):
// a filesystem of SizeMB that sandboxes mount when they start and that
// outlives them. UsedBytes, TotalBytes and MountedBy are shown for one
// volume only.
type Volume struct {
	Name       string    `json:"name"`
	SizeMB     int64     `json:"size_mb"`
	CreatedAt  time.Time `json:"created_at"`
	UsedBytes  *int64    `json:"used_bytes,omitempty"`
	TotalBytes *int64    `json:"total_bytes,omitempty"`
	MountedBy  []string  `json:"mounted_by,omitempty"` // the live sandboxes that mount it
}

// VolumeRequest is POST /v1/volumes's body (schema VolumeRequest); nil
// SizeMB is the server's default.
type VolumeRequest struct {
	Name   string `json:"name"`
	SizeMB *int64 `json:"size_mb,omitempty"`
}

// VolumeFile is a file or directory of a volume, as the volume's file
// calls show it (schema VolumeFile).
type VolumeFile struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"` // from the volume's root
	Type    string    `json:"type"` // "file", "dir", "symlink" or "other"
	Size    int64     `json:"size"`
	ModTime time.Time `json:"mod_time"`
}

// SnapshotPoolRequest is POST /v1/snapshots/{name}/pool's body (schema
// SnapshotPoolRequest): how many sandboxes restored from the snapshot to
// keep ready (0: none).
type SnapshotPoolRequest struct {
	Size int `json:"size"`
}

// SnapshotPool is a snapshot's pool (schema SnapshotPool): the sandboxes
// restored from it ahead of need, which creates from it take.
type SnapshotPool struct {
	Snapshot string `json:"snapshot"`
	Size     int    `json:"size"`  // asked for
	Ready    int    `json:"ready"` // restored and waiting now
}
