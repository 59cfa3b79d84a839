package sandbox

import (
	"context"
	"errors"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
)

// WatchOptions configure WatchDir.
type WatchOptions struct {
	// Recursive also watches every subdirectory, including those made
	// after the watch started.
	Recursive bool
	// IncludeEntry adds the changed entry's FileInfo to each event, when
	// the entry still exists.
	IncludeEntry bool
	// User is the sandbox user the watch acts as (see AsUser): its
	// permissions apply and relative paths start at its home.
	User string
}

// Kinds of change in WatchEvent.Op.
const (
	WatchCreate   = agentproto.FSCreate   // created, or moved in (under its new name)
	WatchWrite    = agentproto.FSWrite    // written; at most about one per file per second
	WatchRemove   = agentproto.FSRemove   // removed
	WatchRename   = agentproto.FSRename   // moved away (under its old name)
	WatchChmod    = agentproto.FSChmod    // mode, owner, times or attributes changed
	WatchOverflow = agentproto.FSOverflow // changes were lost (the sandbox's kernel queue overflowed)
)

// WatchEvent is one change in a watched directory.
type WatchEvent struct {
	// Name is the entry's path relative to the watched directory
	// ("sub/file.txt"); empty for the watched directory itself.
	Name string
	Op   string // Watch* constants
	// Entry describes the entry after the change (WatchOptions.IncludeEntry;
	// nil for removals and renames, or when the entry is already gone).
	Entry *FileInfo
}

// watchBuffer is how many events a Watcher holds for a slow reader before
// the agent, and then the sandbox's kernel, queue them.
const watchBuffer = 256

// Watcher streams the changes of one directory of a sandbox. Events are
// delivered on Events until the watch ends: Close, the WatchDir context
// ending, the watched directory being removed (after an event
// {Name: "", Op: WatchRemove}) or the sandbox stopping; Err then says why.
// Its owner must Close it or end its context: until then, an unread
// event holds its goroutine.
type Watcher struct {
	events chan WatchEvent
	// cancel ends the watch's call to the agent, with its reason
	// (errWatchClosed for Close).
	cancel context.CancelCauseFunc
	ended  chan struct{} // closed once err is set, before events is closed
	done   chan struct{} // closed last, after events
	err    error
}

// errWatchClosed is the cause of a watch ended by Close.
var errWatchClosed = errors.New("watch closed")

// WatchDir starts watching a directory of the sandbox and returns once the
// agent has the watch in place, so that every change made after it returns
// is reported. A missing path is ERR_NOT_FOUND, a path that is not a
// directory ERR_BAD_REQUEST, as for the other file calls. An open watch
// does not count as activity for the idle timeout.
func (s *Sandbox) WatchDir(ctx context.Context, path string, opt WatchOptions) (*Watcher, error) {
	if path == "" {
		return nil, apierr.New(apierr.BadRequest, "path is required")
	}
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	req := agentproto.Request{
		Op: agentproto.OpFileWatch, Path: s.projectPath(path), Recursive: opt.Recursive, IncludeEntry: opt.IncludeEntry, User: opt.User,
	}
	wctx, cancel := context.WithCancelCause(ctx)
	w := &Watcher{
		events: make(chan WatchEvent, watchBuffer), cancel: cancel,
		ended: make(chan struct{}), done: make(chan struct{}),
	}
	started := make(chan struct{})
	go func() {
		defer close(w.done)
		defer close(w.events)
		defer cancel(nil)
		w.err = w.run(wctx, s, req, started)
		close(w.ended) // Err answers as soon as a reader sees Events closed
	}()
	select {
	case <-started:
		return w, nil
	case <-w.done:
		if w.err == nil {
			return nil, apierr.New(apierr.Internal, "the agent ended the watch before it started")
		}
		return nil, w.err
	}
}

// run is the watch's one call to the agent, through the engine's one
// reply loop: it closes started at the agent's confirmation, delivers
// events until the watch ends, and returns why it ended.
func (w *Watcher) run(ctx context.Context, s *Sandbox, req agentproto.Request, started chan struct{}) error {
	isStarted := false
	_, err := s.agent.call(ctx, req, nil, agentproto.Handlers{Event: func(ev agentproto.Event) error {
		switch {
		case ev.Type == agentproto.EventWatchStart && !isStarted:
			isStarted = true
			close(started)
		case ev.Type == agentproto.EventFS && ev.FS != nil:
			select {
			case w.events <- WatchEvent{Name: ev.FS.Name, Op: ev.FS.Op, Entry: ev.Entry}:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}}, callOptions{})
	// The context first: the agent may end the call cleanly after a cancel.
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errWatchClosed):
		return nil
	case ctx.Err() != nil:
		return cause
	case err == nil:
		return nil // the watched directory was removed
	}
	return s.watchGone(err)
}

// Events returns the channel of changes; it is closed when the watch ends.
func (w *Watcher) Events() <-chan WatchEvent { return w.events }

// Close ends the watch (the agent releases it) and waits until Events is
// closed. It is safe to call more than once, and concurrently.
func (w *Watcher) Close() error {
	w.cancel(errWatchClosed)
	<-w.done
	return nil
}

// Err says why the watch ended once Events is closed: nil after Close or
// the removal of the watched directory, the context's error when it
// ended, an ERR_SANDBOX_STATE error when the sandbox stopped. While the
// watch runs it returns nil.
func (w *Watcher) Err() error {
	select {
	case <-w.ended:
		return w.err
	default:
		return nil
	}
}

// watchGone explains a watch cut by its sandbox: a sandbox already
// stopping says so; otherwise the agent died under a running sandbox,
// which gone handles.
func (s *Sandbox) watchGone(err error) error {
	if rerr := s.running(); rerr != nil && errors.Is(err, errAgentGone) {
		return rerr
	}
	return s.gone(err)
}
