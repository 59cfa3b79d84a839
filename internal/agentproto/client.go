package agentproto

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Handlers receive what a call streams back before its Done; any may be
// nil. An error from Event or Data ends the call with that error.
type Handlers struct {
	// Event sees every JSON event before the Done.
	Event func(Event) error
	// Data sees every data frame (the body of a file.read); nil discards
	// them.
	Data func([]byte) error
	// Admit is asked before a large frame is read into memory (see
	// Admit); nil admits every frame at once.
	Admit Admit
}

// ErrRequestTooLarge reports a request (code, a command line, paths,
// an environment) whose encoding does not fit in a frame.
var ErrRequestTooLarge = errors.New("agentproto: request too large for a frame")

// BodyError reports that the request's body (the caller's reader) failed
// while it was being sent: the call was abandoned, and the caller should
// drop the connection (and with it whatever the agent wrote so far).
type BodyError struct{ Err error }

func (e *BodyError) Error() string { return "request body: " + e.Err.Error() }
func (e *BodyError) Unwrap() error { return e.Err }

// Call performs one request on a fresh connection rw: it writes req, then
// body (if not nil) as data frames ending with an empty one, then reads
// frames until the Done, which it returns. Every other frame goes to h.
// This is the one loop that reads an agent's answers, for the engine and
// for tests alike.
//
// If writing the body fails (the agent refused the request early and
// stopped reading), Call still reads the Done the agent sent, and returns
// the write error only if there is none. A failure of body itself is a
// *BodyError, returned at once.
func Call(rw io.ReadWriter, req Request, body io.Reader, h Handlers) (Event, error) {
	c := NewConn(rw)
	if err := c.WriteJSON(req); err != nil {
		if errors.Is(err, ErrFrameTooLarge) {
			return Event{}, ErrRequestTooLarge
		}
		return Event{}, err
	}
	var writeErr error
	if body != nil {
		src := &sourceReader{r: body}
		if _, err := c.CopyBody(src); err != nil {
			if src.err != nil {
				return Event{}, &BodyError{Err: src.err}
			}
			writeErr = err
		}
	}
	for {
		ev, done, err := c.next(h)
		if err != nil {
			if writeErr != nil {
				return Event{}, writeErr
			}
			if err == io.EOF {
				return Event{}, fmt.Errorf("%w: %w before done", ErrBadFrame, io.EOF)
			}
			return Event{}, err
		}
		if done {
			return ev, nil
		}
	}
}

// next reads and handles one frame; done reports the Done, returned as ev.
func (c *Conn) next(h Handlers) (ev Event, done bool, err error) {
	kind, p, release, err := readFrame(c.r, h.Admit)
	if err != nil {
		return Event{}, false, err
	}
	defer release()
	if kind == FrameData {
		if h.Data != nil {
			return Event{}, false, h.Data(p)
		}
		return Event{}, false, nil
	}
	if ev, err = DecodeEvent(p); err != nil {
		return Event{}, false, err
	}
	if ev.Type == EventDone {
		return ev, true, nil
	}
	if h.Event != nil {
		return Event{}, false, h.Event(ev)
	}
	return Event{}, false, nil
}

// DecodeEvent decodes the payload of a JSON frame into an Event.
func DecodeEvent(p []byte) (Event, error) {
	var ev Event
	if err := json.Unmarshal(p, &ev); err != nil {
		return Event{}, fmt.Errorf("%w: %v", ErrBadFrame, err)
	}
	if ev.Type == "" {
		return Event{}, fmt.Errorf("%w: event without a type", ErrBadFrame)
	}
	return ev, nil
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

// Connect performs a port.connect request on a fresh connection rw: it
// writes req and reads exactly one frame, unbuffered, so that every byte
// after it is the TCP stream's. It returns the connected event, or the
// failed Done (Code set, e.g. CodeRefused) when the agent did not connect.
func Connect(rw io.ReadWriter, req Request) (Event, error) {
	if err := WriteFrame(rw, FrameJSON, mustJSON(req)); err != nil {
		return Event{}, err
	}
	kind, p, err := ReadFrame(rw)
	if err != nil {
		if err == io.EOF {
			return Event{}, fmt.Errorf("%w: %w before connected", ErrBadFrame, io.EOF)
		}
		return Event{}, err
	}
	if kind != FrameJSON {
		return Event{}, fmt.Errorf("%w: want a JSON frame, got %q", ErrBadFrame, kind)
	}
	ev, err := DecodeEvent(p)
	if err != nil {
		return Event{}, err
	}
	switch ev.Type {
	case EventConnected:
		return ev, nil
	case EventDone:
		if ev.Code == "" {
			return Event{}, fmt.Errorf("%w: port.connect ended without connecting or failing", ErrBadFrame)
		}
		return ev, nil
	}
	return Event{}, fmt.Errorf("%w: unexpected %q event before connected", ErrBadFrame, ev.Type)
}

// mustJSON encodes a Request, which always encodes.
func mustJSON(req Request) []byte {
	b, err := MarshalJSON(req)
	if err != nil {
		panic(err)
	}
	return b
}
