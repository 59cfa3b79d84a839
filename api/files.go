package api

import "time"

// FileInfo describes a path inside a sandbox (schema FileInfo): what the
// file calls answer, and what the agent protocol carries
// (agentproto.FileInfo is this type).
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"` // absolute, cleaned
	Type    string    `json:"type"` // file, dir, symlink, other
	Size    int64     `json:"size"`
	Mode    uint32    `json:"mode"` // permission bits
	ModTime time.Time `json:"mod_time"`
	Owner   string    `json:"owner"`
	Group   string    `json:"group"`
	// SymlinkTarget is set for symlinks.
	SymlinkTarget string `json:"symlink_target,omitempty"`
	// Metadata holds the file's user.e2b.* extended attributes, keys
	// without the prefix: set through E2B's file writes, sent only when
	// a file has some.
	Metadata map[string]string `json:"metadata,omitempty"`
}
