package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
)

// errAgentGone reports that the agent's socket no longer answers: the
// sandbox's init has exited.
var errAgentGone = errors.New("sandbox agent is gone")

// agentClient talks to one sandbox's agent: one connection per request.
type agentClient struct {
	socket string
}

// call sends req and reads events until Done. onEvent sees every other JSON
// event; onData every data frame; body, if set, is sent after the request as
// data frames. A Done that reports a failure becomes an *apierr.Error.
func (c *agentClient) call(ctx context.Context, req agentproto.Request, body io.Reader,
	onEvent func(agentproto.Event) error, onData func([]byte) error) (agentproto.Event, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", c.socket)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
			return agentproto.Event{}, errAgentGone
		}
		return agentproto.Event{}, fmt.Errorf("dial agent: %w", err)
	}
	defer nc.Close()
	// Cancelling ctx unblocks every read and write below.
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	conn := agentproto.NewConn(nc)
	if err := conn.WriteJSON(req); err != nil {
		return agentproto.Event{}, c.ioErr(ctx, "send request", err)
	}
	// The agent may refuse a body part way (too large, disk full) and
	// answer at once: a failed write is then explained by the reply.
	var sendErr error
	if body != nil {
		src := &sourceReader{r: body}
		if _, err := conn.CopyBody(src); err != nil {
			if ctx.Err() != nil {
				return agentproto.Event{}, ctx.Err()
			}
			if src.err != nil {
				// The caller's body failed (e.g. an upload over the
				// server's limit): drop the connection, and with it the
				// agent's partial file.
				return agentproto.Event{}, src.err
			}
			sendErr = err
		}
	}
	for {
		kind, p, err := conn.ReadFrame()
		if err != nil {
			if sendErr != nil {
				err = sendErr
			}
			return agentproto.Event{}, c.ioErr(ctx, "read reply", err)
		}
		if kind == agentproto.FrameData {
			if onData != nil {
				if err := onData(p); err != nil {
					return agentproto.Event{}, err
				}
			}
			continue
		}
		var ev agentproto.Event
		if err := unmarshalEvent(p, &ev); err != nil {
			return agentproto.Event{}, err
		}
		if ev.Type == agentproto.EventDone {
			if ev.Code != "" {
				return ev, agentError(ev)
			}
			return ev, nil
		}
		if onEvent != nil {
			if err := onEvent(ev); err != nil {
				return agentproto.Event{}, err
			}
		}
	}
}

func (c *agentClient) ioErr(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return fmt.Errorf("%s: %w", what, errAgentGone)
	}
	if what == "send request" && errors.Is(err, agentproto.ErrFrameTooLarge) {
		// The caller's own request (code, a command line, a path) is
		// over the protocol's frame size.
		return apierr.Wrap(err, apierr.BadRequest, "the request is too large: code, command lines, paths and environments may hold at most %d MiB together", agentproto.MaxFrame>>20)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// agentError turns a failed Done into a coded error. The agent's message
// is shown to the caller: it speaks only of the caller's own sandbox.
func agentError(ev agentproto.Event) error {
	code := apierr.Internal
	switch ev.Code {
	case agentproto.CodeBadRequest, agentproto.CodeNotDir, agentproto.CodeIsDir:
		code = apierr.BadRequest
	case agentproto.CodeNotFound:
		code = apierr.NotFound
	case agentproto.CodeExists:
		code = apierr.Conflict
	case agentproto.CodePermission:
		code = apierr.PathNotAllowed
	case agentproto.CodeTooLarge:
		code = apierr.FileTooLarge
	case agentproto.CodeNoSpace:
		code = apierr.DiskFull
	case agentproto.CodeUnsupported:
		code = apierr.UnsupportedLanguage
	}
	msg := ev.Message
	if msg == "" {
		msg = ev.Code
	}
	return apierr.New(code, "%s", msg)
}

// sourceReader remembers whether a failure came from the body itself
// rather than from the connection.
type sourceReader struct {
	r   io.Reader
	err error
}

func (s *sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		s.err = err
	}
	return n, err
}
