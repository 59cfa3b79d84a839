package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

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
	nc     net.Conn

	once    sync.Once
	closing chan struct{} // closed by shut
	reason  error         // why shut was called; set before closing is closed
	done    chan struct{} // closed when the reader has returned
	err     error         // set before done is closed
}

// WatchDir starts watching a directory of the sandbox and returns once the
// agent has the watch in place, so that every change made after it returns
// is reported. A missing path is ERR_NOT_FOUND, a path that is not a
// directory ERR_BAD_REQUEST, as for the other file calls. An open watch
// does not count as activity for the idle timeout.
func (s *Sandbox) WatchDir(ctx context.Context, path string, opt WatchOptions) (*Watcher, error) {
	if path == "" {
		return nil, apierr.New(apierr.BadRequest, "path is required")
	}
	if err := s.running(); err != nil {
		return nil, err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", s.agent.socket)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
			return nil, s.watchGone(errAgentGone)
		}
		return nil, fmt.Errorf("dial agent: %w", err)
	}
	first, err := startWatch(ctx, nc, agentproto.Request{
		Op: agentproto.OpFileWatch, Path: path, Recursive: opt.Recursive, IncludeEntry: opt.IncludeEntry, User: opt.User,
	})
	if err != nil {
		nc.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, s.watchGone(err)
	}
	if first.Type == agentproto.EventDone {
		nc.Close()
		if first.Code != "" {
			return nil, agentError(first)
		}
		return nil, apierr.New(apierr.Internal, "the agent ended the watch before it started")
	}
	w := &Watcher{
		events:  make(chan WatchEvent, watchBuffer),
		nc:      nc,
		closing: make(chan struct{}),
		done:    make(chan struct{}),
	}
	stop := context.AfterFunc(ctx, func() { w.shut(ctx.Err()) })
	go func() {
		defer close(w.done)
		defer close(w.events)
		defer stop()
		w.err = w.read(ctx, s)
	}()
	return w, nil
}

// startWatch sends the request and reads the first event: the agent's
// confirmation, or a Done refusing the watch. Cancelling ctx meanwhile
// unblocks it.
func startWatch(ctx context.Context, nc net.Conn, req agentproto.Request) (agentproto.Event, error) {
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	conn := agentproto.NewConn(nc)
	if err := conn.WriteJSON(req); err != nil {
		return agentproto.Event{}, watchIOErr(err)
	}
	for {
		kind, p, err := agentproto.ReadFrame(nc)
		if err != nil {
			return agentproto.Event{}, watchIOErr(err)
		}
		if kind != agentproto.FrameJSON {
			continue
		}
		var ev agentproto.Event
		if err := unmarshalEvent(p, &ev); err != nil {
			return agentproto.Event{}, err
		}
		if ev.Type == agentproto.EventWatchStart || ev.Type == agentproto.EventDone {
			return ev, nil
		}
	}
}

// read delivers events until the watch ends and returns why it ended.
// It reads the connection without a buffer of its own, so that nothing
// is lost between startWatch and here.
func (w *Watcher) read(ctx context.Context, s *Sandbox) error {
	for {
		kind, p, err := agentproto.ReadFrame(w.nc)
		if err != nil {
			select {
			case <-w.closing:
				return w.reason
			default:
			}
			if ctx.Err() != nil { // startWatch's deadline, set just as it returned
				return ctx.Err()
			}
			return s.watchGone(watchIOErr(err))
		}
		if kind != agentproto.FrameJSON {
			continue
		}
		var ev agentproto.Event
		if err := unmarshalEvent(p, &ev); err != nil {
			w.nc.Close()
			return err
		}
		switch {
		case ev.Type == agentproto.EventDone:
			w.nc.Close()
			if ev.Code != "" {
				return agentError(ev)
			}
			return nil
		case ev.Type == agentproto.EventFS && ev.FS != nil:
			select {
			case w.events <- WatchEvent{Name: ev.FS.Name, Op: ev.FS.Op, Entry: ev.Entry}:
			case <-w.closing:
				return w.reason
			}
		}
	}
}

// Events returns the channel of changes; it is closed when the watch ends.
func (w *Watcher) Events() <-chan WatchEvent { return w.events }

// Close ends the watch (the agent releases it) and waits until Events is
// closed. It is safe to call more than once, and concurrently.
func (w *Watcher) Close() error {
	w.shut(nil)
	<-w.done
	return nil
}

// Err says why the watch ended once Events is closed: nil after Close or
// the removal of the watched directory, the context's error when it
// ended, an ERR_SANDBOX_STATE error when the sandbox stopped. While the
// watch runs it returns nil.
func (w *Watcher) Err() error {
	select {
	case <-w.done:
		return w.err
	default:
		return nil
	}
}

// shut closes the connection once, recording why.
func (w *Watcher) shut(reason error) {
	w.once.Do(func() {
		w.reason = reason
		close(w.closing)
		w.nc.Close()
	})
}

// watchIOErr classifies a failed read or write on the agent connection.
func watchIOErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return fmt.Errorf("watch: %w", errAgentGone)
	}
	return fmt.Errorf("watch: %w", err)
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
