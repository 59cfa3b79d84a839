package sandbox

import (
	"context"
	"io"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/events"
)

// FileInfo describes a path inside a sandbox.
type FileInfo = agentproto.FileInfo

// Paths are resolved by the agent inside the sandbox: relative ones under
// the acting user's home (/home/user by default), and neither ".." nor
// symlinks lead out of the sandbox's root.

// FileOption changes how a file call acts.
type FileOption struct {
	user  string
	owner bool // user owns what the call creates; root's permissions
}

// AsUser makes a file call act as a sandbox user: "user" (the default, uid
// 1000), "root" (root inside the sandbox), or another name from the
// sandbox's /etc/passwd (ERR_BAD_REQUEST "unknown user" otherwise). The
// call's permission checks are that user's, what it creates is owned by
// that user, and relative paths start at that user's home.
func AsUser(name string) FileOption { return FileOption{user: name} }

// OwnedBy makes a write or a mkdir act with root's permissions inside the
// sandbox and leave what it creates (parents included) owned by the user
// name, relative paths starting at that user's home: what E2B's envd does
// for every user. It gives the caller nothing AsUser("root") would not.
func OwnedBy(name string) FileOption { return FileOption{user: name, owner: true} }

// ReadFile copies a file of the sandbox into w; limit > 0 refuses larger files.
func (s *Sandbox) ReadFile(ctx context.Context, path string, w io.Writer, limit int64, opts ...FileOption) (FileInfo, error) {
	var info FileInfo
	err := s.fileCall(ctx, withUser(agentproto.Request{Op: agentproto.OpFileRead, Path: path, Limit: limit}, opts), nil,
		func(ev agentproto.Event) error {
			if ev.Type == agentproto.EventFile && ev.Entry != nil {
				info = *ev.Entry
			}
			return nil
		}, func(p []byte) error {
			_, err := w.Write(p)
			return err
		}, nil)
	return info, err
}

// WriteFile writes r to a file of the sandbox, creating its parents. The
// file appears whole or not at all. mode 0 means 0644; limit > 0 refuses
// bodies larger than that with ERR_FILE_TOO_LARGE.
func (s *Sandbox) WriteFile(ctx context.Context, path string, r io.Reader, mode uint32, limit int64, opts ...FileOption) (FileInfo, error) {
	return s.WriteFileWith(ctx, path, r, WriteOptions{Mode: mode, Limit: limit}, opts...)
}

// WriteOptions are WriteFileWith's options.
type WriteOptions struct {
	Mode  uint32 // permission bits; 0 means 0644
	Limit int64  // > 0 refuses bodies larger than that with ERR_FILE_TOO_LARGE
	// Metadata is stored with the file (FileInfo.Metadata, as E2B's
	// user.e2b.<key> extended attributes). A write replaces the file, and
	// with it all its metadata: nil leaves none. At most 64 keys; a key is
	// at most 246 bytes, a value 64 KiB (ERR_BAD_REQUEST otherwise).
	Metadata map[string]string
}

// WriteFileWith is WriteFile with options.
func (s *Sandbox) WriteFileWith(ctx context.Context, path string, r io.Reader, opt WriteOptions, opts ...FileOption) (FileInfo, error) {
	var done agentproto.Event
	err := s.fileCall(ctx, withUser(agentproto.Request{Op: agentproto.OpFileWrite, Path: path, Mode: opt.Mode, Limit: opt.Limit, Metadata: opt.Metadata}, opts), r, nil, nil, &done)
	return entry(done), err
}

// ListDir lists a directory; depth 1 lists its children, more recurses.
func (s *Sandbox) ListDir(ctx context.Context, path string, depth int, opts ...FileOption) ([]FileInfo, error) {
	page, err := s.ListDirPage(ctx, path, ListOptions{Depth: depth}, opts...)
	return page.Entries, err
}

// ListOptions select one page of a directory listing.
type ListOptions struct {
	Depth int    // 1 lists the children, more recurses
	After string // resume after this entry (the Path of the last entry of the previous page); "" from the start
	Limit int    // at most this many entries; 0 (or more than the agent's cap, 10,000) for the cap
}

// ListPage is one page of a directory listing: each directory's entries
// by name (bytewise), a directory's contents right after it.
type ListPage struct {
	Entries []FileInfo
	// Truncated says the listing goes on after the last entry (the page
	// is full, or the agent's reply reached a frame's size).
	Truncated bool
}

// ListDirPage lists one page of a directory. An After that is not below
// path is ERR_BAD_REQUEST.
func (s *Sandbox) ListDirPage(ctx context.Context, path string, opt ListOptions, opts ...FileOption) (ListPage, error) {
	var done agentproto.Event
	err := s.fileCall(ctx, withUser(agentproto.Request{Op: agentproto.OpFileList, Path: path, Depth: opt.Depth,
		After: opt.After, Limit: int64(opt.Limit)}, opts), nil, nil, nil, &done)
	if done.Entries == nil {
		done.Entries = []FileInfo{}
	}
	return ListPage{Entries: done.Entries, Truncated: done.Truncated && len(done.Entries) > 0}, err
}

// Stat describes one path.
func (s *Sandbox) Stat(ctx context.Context, path string, opts ...FileOption) (FileInfo, error) {
	var done agentproto.Event
	err := s.fileCall(ctx, withUser(agentproto.Request{Op: agentproto.OpFileStat, Path: path}, opts), nil, nil, nil, &done)
	return entry(done), err
}

// MakeDir creates a directory (mode 0755) and its parents.
func (s *Sandbox) MakeDir(ctx context.Context, path string, opts ...FileOption) (FileInfo, error) {
	var done agentproto.Event
	err := s.fileCall(ctx, withUser(agentproto.Request{Op: agentproto.OpFileMkdir, Path: path}, opts), nil, nil, nil, &done)
	return entry(done), err
}

// Remove deletes a file, or a directory with everything in it.
func (s *Sandbox) Remove(ctx context.Context, path string, opts ...FileOption) error {
	return s.fileCall(ctx, withUser(agentproto.Request{Op: agentproto.OpFileRemove, Path: path}, opts), nil, nil, nil, nil)
}

// Move renames a path, creating the target's parents.
func (s *Sandbox) Move(ctx context.Context, from, to string, opts ...FileOption) (FileInfo, error) {
	var done agentproto.Event
	err := s.fileCall(ctx, withUser(agentproto.Request{Op: agentproto.OpFileMove, Path: from, NewPath: to}, opts), nil, nil, nil, &done)
	return entry(done), err
}

func (s *Sandbox) fileCall(ctx context.Context, req agentproto.Request, body io.Reader,
	onEvent func(agentproto.Event) error, onData func([]byte) error, done *agentproto.Event) error {
	if req.Path == "" {
		return apierr.New(apierr.BadRequest, "path is required")
	}
	req.Path = s.projectPath(req.Path)
	if req.NewPath != "" {
		req.NewPath = s.projectPath(req.NewPath)
	}
	writes := false
	switch req.Op {
	case agentproto.OpFileWrite, agentproto.OpFileMkdir, agentproto.OpFileRemove, agentproto.OpFileMove:
		writes = true
		if err := s.checkWritable(req); err != nil {
			return err
		}
	}
	if req.Op == agentproto.OpFileWrite {
		if max := s.Policy().FileSizeBytes(); max > 0 && (req.Limit <= 0 || req.Limit > max) {
			req.Limit = max // file_size_upload_mb
		}
	}
	err := s.do(ctx, req, body, onEvent, onData, done)
	if writes {
		s.deniedByMount(req, err)
		switch apierr.CodeOf(err) {
		case apierr.DiskFull:
			s.emit(events.ResourceExceeded, "", map[string]any{"resource": events.ResourceDisk,
				"limit": s.CurrentLimits().DiskBytes, "unit": "bytes", "target": req.Path})
		case apierr.FileTooLarge:
			s.emit(events.ResourceExceeded, "", map[string]any{"resource": events.ResourceDisk,
				"limit": req.Limit, "unit": "bytes", "target": req.Path})
		}
	}
	return err
}

// withUser sets the request's user from the last AsUser option.
func withUser(req agentproto.Request, opts []FileOption) agentproto.Request {
	for _, o := range opts {
		if o.user != "" && o.owner {
			req.User, req.Owner = "", o.user
		} else if o.user != "" {
			req.User, req.Owner = o.user, ""
		}
	}
	return req
}

func entry(ev agentproto.Event) FileInfo {
	if ev.Entry == nil {
		return FileInfo{}
	}
	return *ev.Entry
}
