package e2b

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"sync"
	"time"

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
		Metadata: fi.Metadata,
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
	if u := userFrom(ctx); u == rootUser || u == "" && sandboxFrom(ctx).DefaultUser() == rootUser {
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
	fi, err := sandboxFrom(ctx).Stat(ctx, homePath(ctx, req.Msg.Path), as(ctx))
	if err != nil {
		return nil, connectError(ctx, err)
	}
	return connect.NewResponse(&filesystempb.StatResponse{Entry: entryOf(fi)}), nil
}

// MakeDir creates a directory and its parents; an existing one is
// already_exists (the SDK then returns false).
func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystempb.MakeDirRequest]) (*connect.Response[filesystempb.MakeDirResponse], error) {
	sb, path := sandboxFrom(ctx), homePath(ctx, req.Msg.Path)
	if fi, err := sb.Stat(ctx, path, as(ctx)); err == nil {
		if fi.Type == agentproto.FileTypeDir {
			return nil, connect.NewError(connect.CodeAlreadyExists, errors.New("directory "+fi.Path+" already exists"))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New(fi.Path+" exists and is not a directory"))
	}
	fi, err := sb.MakeDir(ctx, path, owned(ctx))
	if err != nil {
		return nil, connectError(ctx, err)
	}
	return connect.NewResponse(&filesystempb.MakeDirResponse{Entry: entryOf(fi)}), nil
}

func (f *filesystemService) Move(ctx context.Context, req *connect.Request[filesystempb.MoveRequest]) (*connect.Response[filesystempb.MoveResponse], error) {
	fi, err := sandboxFrom(ctx).Move(ctx, homePath(ctx, req.Msg.Source), homePath(ctx, req.Msg.Destination), as(ctx))
	if err != nil {
		return nil, connectError(ctx, err)
	}
	return connect.NewResponse(&filesystempb.MoveResponse{Entry: entryOf(fi)}), nil
}

// ListDir lists entries down to depth levels (at least 1), in path order.
func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystempb.ListDirRequest]) (*connect.Response[filesystempb.ListDirResponse], error) {
	depth := max(1, int(req.Msg.Depth))
	infos, err := sandboxFrom(ctx).ListDir(ctx, homePath(ctx, req.Msg.Path), depth, as(ctx))
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
	err := sandboxFrom(ctx).Remove(ctx, homePath(ctx, req.Msg.Path), as(ctx))
	if err != nil && apierr.CodeOf(err) != apierr.NotFound {
		return nil, connectError(ctx, err)
	}
	return connect.NewResponse(&filesystempb.RemoveResponse{}), nil
}

// fsEvent converts a watch event; ok is false for events E2B has no name
// for (the watched directory itself, lost events).
func fsEvent(ev sandbox.WatchEvent) (*filesystempb.FilesystemEvent, bool) {
	var t filesystempb.EventType
	switch ev.Op {
	case sandbox.WatchCreate:
		t = filesystempb.EventType_EVENT_TYPE_CREATE
	case sandbox.WatchWrite:
		t = filesystempb.EventType_EVENT_TYPE_WRITE
	case sandbox.WatchRemove:
		t = filesystempb.EventType_EVENT_TYPE_REMOVE
	case sandbox.WatchRename:
		t = filesystempb.EventType_EVENT_TYPE_RENAME
	case sandbox.WatchChmod:
		t = filesystempb.EventType_EVENT_TYPE_CHMOD
	default:
		return nil, false
	}
	if ev.Name == "" {
		return nil, false
	}
	out := &filesystempb.FilesystemEvent{Name: ev.Name, Type: t}
	if ev.Entry != nil {
		out.Entry = entryOf(*ev.Entry)
	}
	return out, true
}

// WatchDir streams a directory's changes: a start event once the watch is
// in place, then one event per change, with keepalives during silences.
// It ends at the client's deadline, or when the directory is removed.
func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystempb.WatchDirRequest], stream *connect.ServerStream[filesystempb.WatchDirResponse]) error {
	sb := sandboxFrom(ctx)
	w, err := sb.WatchDir(ctx, homePath(ctx, req.Msg.Path), sandbox.WatchOptions{Recursive: req.Msg.Recursive, IncludeEntry: req.Msg.IncludeEntry, User: userFrom(ctx)})
	if err != nil {
		return connectError(ctx, err)
	}
	defer w.Close()
	var mu sync.Mutex
	send := func(r *filesystempb.WatchDirResponse) error {
		mu.Lock()
		defer mu.Unlock()
		return stream.Send(r)
	}
	if err := send(&filesystempb.WatchDirResponse{Event: &filesystempb.WatchDirResponse_Start{Start: &filesystempb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	tick := time.NewTicker(keepaliveInterval(req.Header()))
	defer tick.Stop()
	for {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				if err := w.Err(); err != nil {
					return connectError(ctx, err)
				}
				return nil
			}
			if fe, ok := fsEvent(ev); ok {
				if err := send(&filesystempb.WatchDirResponse{Event: &filesystempb.WatchDirResponse_Filesystem{Filesystem: fe}}); err != nil {
					return err
				}
			}
		case <-tick.C:
			if err := send(&filesystempb.WatchDirResponse{Event: &filesystempb.WatchDirResponse_Keepalive{Keepalive: &filesystempb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return connectError(ctx, ctx.Err())
		}
	}
}

// Polling watchers (CreateWatcher, GetWatcherEvents, RemoveWatcher) keep
// their events here until fetched. A watcher not polled for
// watcherIdleTimeout is dropped, as is one whose directory or sandbox went
// away.
const (
	watcherIdleTimeout = 10 * time.Minute
	watcherMaxEvents   = 10000
)

type pollWatcher struct {
	sandboxID string
	w         *sandbox.Watcher
	cancel    context.CancelFunc

	// mu guards the fields below.
	mu       sync.Mutex
	events   []*filesystempb.FilesystemEvent
	lastPoll time.Time
}

func (f *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[filesystempb.CreateWatcherRequest]) (*connect.Response[filesystempb.CreateWatcherResponse], error) {
	sb := sandboxFrom(ctx)
	// A watcher holds a stream of its key for as long as it lives.
	release, err := holdFrom(ctx)
	if err != nil {
		return nil, connectError(ctx, err)
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w, err := sb.WatchDir(wctx, homePath(ctx, req.Msg.Path), sandbox.WatchOptions{Recursive: req.Msg.Recursive, IncludeEntry: req.Msg.IncludeEntry, User: userFrom(ctx)})
	if err != nil {
		cancel()
		release()
		return nil, connectError(ctx, err)
	}
	pw := &pollWatcher{sandboxID: sb.ID, w: w, cancel: cancel, lastPoll: time.Now()}
	id := f.h.addWatcher(pw)
	go func() {
		idle := time.NewTicker(time.Minute)
		defer idle.Stop()
		defer release()
		defer f.h.removeWatcher(id)
		defer cancel()
		for {
			select {
			case ev, ok := <-w.Events():
				if !ok {
					return
				}
				if fe, ok := fsEvent(ev); ok {
					pw.mu.Lock()
					if len(pw.events) < watcherMaxEvents {
						pw.events = append(pw.events, fe)
					}
					pw.mu.Unlock()
				}
			case <-idle.C:
				pw.mu.Lock()
				stale := time.Since(pw.lastPoll) > watcherIdleTimeout
				pw.mu.Unlock()
				if stale {
					w.Close()
				}
			}
		}
	}()
	return connect.NewResponse(&filesystempb.CreateWatcherResponse{WatcherId: id}), nil
}

func (f *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystempb.GetWatcherEventsRequest]) (*connect.Response[filesystempb.GetWatcherEventsResponse], error) {
	pw, err := f.h.watcher(sandboxFrom(ctx).ID, req.Msg.WatcherId)
	if err != nil {
		return nil, err
	}
	pw.mu.Lock()
	events := pw.events
	pw.events, pw.lastPoll = nil, time.Now()
	pw.mu.Unlock()
	return connect.NewResponse(&filesystempb.GetWatcherEventsResponse{Events: events}), nil
}

func (f *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystempb.RemoveWatcherRequest]) (*connect.Response[filesystempb.RemoveWatcherResponse], error) {
	pw, err := f.h.watcher(sandboxFrom(ctx).ID, req.Msg.WatcherId)
	if err != nil {
		return nil, err
	}
	pw.w.Close()
	pw.cancel()
	f.h.removeWatcher(req.Msg.WatcherId)
	return connect.NewResponse(&filesystempb.RemoveWatcherResponse{}), nil
}
