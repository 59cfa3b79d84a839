package e2b

import (
	"context"
	"errors"
	"io/fs"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/e2b/envdpb/filesystempb"
	"github.com/sheepfold/sheepfold/internal/e2b/envdpb/filesystempb/filesystempbconnect"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// filesystemService implements filesystem.Filesystem over the agent's file
// operations. Relative paths resolve in the user's home, as in envd.
type filesystemService struct {
	filesystempbconnect.UnimplementedFilesystemHandler
	h *Handler
}

var _ filesystempbconnect.FilesystemHandler = (*filesystemService)(nil)

// entryOf converts the agent's FileInfo.
func entryOf(fi sandbox.FileInfo) *filesystempb.EntryInfo {
	e := &filesystempb.EntryInfo{
		Name: fi.Name, Path: fi.Path, Size: fi.Size, Mode: fi.Mode & 0o7777,
		Owner: fi.Owner, Group: fi.Group, ModifiedTime: timestamppb.New(fi.ModTime),
	}
	mode := fs.FileMode(fi.Mode & 0o777)
	switch fi.Type {
	case agentproto.FileTypeFile:
		e.Type = filesystempb.FileType_FILE_TYPE_FILE
	case agentproto.FileTypeDir:
		e.Type, mode = filesystempb.FileType_FILE_TYPE_DIRECTORY, mode|fs.ModeDir
	case agentproto.FileTypeSymlink:
		e.Type, mode = filesystempb.FileType_FILE_TYPE_SYMLINK, mode|fs.ModeSymlink
	}
	e.Permissions = mode.String()
	if fi.SymlinkTarget != "" {
		t := fi.SymlinkTarget
		e.SymlinkTarget = &t
	}
	return e
}

// homePath expands a leading ~ to the user's home.
func homePath(ctx context.Context, p string) string {
	home := "/home/user"
	if userFrom(ctx) == rootUser {
		home = "/root"
	}
	if p == "~" {
		return home
	}
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		return home + "/" + rest
	}
	return p
}

func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[filesystempb.StatRequest]) (*connect.Response[filesystempb.StatResponse], error) {
	fi, err := sandboxFrom(ctx).Stat(ctx, homePath(ctx, req.Msg.Path))
	if err != nil {
		return nil, connectError(ctx, err)
	}
	return connect.NewResponse(&filesystempb.StatResponse{Entry: entryOf(fi)}), nil
}

// MakeDir creates a directory and its parents; an existing one is
// already_exists (the SDK then returns false).
func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystempb.MakeDirRequest]) (*connect.Response[filesystempb.MakeDirResponse], error) {
	sb, path := sandboxFrom(ctx), homePath(ctx, req.Msg.Path)
	if fi, err := sb.Stat(ctx, path); err == nil {
		if fi.Type == agentproto.FileTypeDir {
			return nil, connect.NewError(connect.CodeAlreadyExists, errors.New("directory "+fi.Path+" already exists"))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New(fi.Path+" exists and is not a directory"))
	}
	fi, err := sb.MakeDir(ctx, path)
	if err != nil {
		return nil, connectError(ctx, err)
	}
	return connect.NewResponse(&filesystempb.MakeDirResponse{Entry: entryOf(fi)}), nil
}

func (f *filesystemService) Move(ctx context.Context, req *connect.Request[filesystempb.MoveRequest]) (*connect.Response[filesystempb.MoveResponse], error) {
	fi, err := sandboxFrom(ctx).Move(ctx, homePath(ctx, req.Msg.Source), homePath(ctx, req.Msg.Destination))
	if err != nil {
		return nil, connectError(ctx, err)
	}
	return connect.NewResponse(&filesystempb.MoveResponse{Entry: entryOf(fi)}), nil
}

// ListDir lists entries down to depth levels (at least 1), in path order.
func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystempb.ListDirRequest]) (*connect.Response[filesystempb.ListDirResponse], error) {
	depth := max(1, int(req.Msg.Depth))
	infos, err := sandboxFrom(ctx).ListDir(ctx, homePath(ctx, req.Msg.Path), depth)
	if err != nil {
		return nil, connectError(ctx, err)
	}
	out := &filesystempb.ListDirResponse{Entries: make([]*filesystempb.EntryInfo, 0, len(infos))}
	for _, fi := range infos {
		out.Entries = append(out.Entries, entryOf(fi))
	}
	return connect.NewResponse(out), nil
}

// Remove removes a file or a directory tree; a missing path is no error.
func (f *filesystemService) Remove(ctx context.Context, req *connect.Request[filesystempb.RemoveRequest]) (*connect.Response[filesystempb.RemoveResponse], error) {
	err := sandboxFrom(ctx).Remove(ctx, homePath(ctx, req.Msg.Path))
	if err != nil && apierr.CodeOf(err) != apierr.NotFound {
		return nil, connectError(ctx, err)
	}
	return connect.NewResponse(&filesystempb.RemoveResponse{}), nil
}
