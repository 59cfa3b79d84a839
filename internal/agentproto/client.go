package agentproto

import (
	"encoding/json"
	"fmt"
	"io"
)

// Call performs one request on a fresh connection rw: it writes req, then
// body (if not nil) as data frames ending with an empty one, then reads
// events until the Done, which it returns.
//
// Events before the Done go to onEvent (nil ignores them); an error from
// onEvent ends the call with that error. Data frames (the body of a
// file.read) are copied to sink, or discarded when sink is nil.
//
// If writing the body fails (the agent refused the request early and
// stopped reading), Call still reads the Done the agent sent, and returns
// the write error only if there is none.
func Call(rw io.ReadWriter, req Request, body io.Reader, sink io.Writer, onEvent func(Event) error) (Event, error) {
	c := NewConn(rw)
	if err := c.WriteJSON(req); err != nil {
		return Event{}, err
	}
	var writeErr error
	if body != nil {
		_, writeErr = c.CopyBody(body)
	}
	for {
		kind, p, err := c.ReadFrame()
		if err != nil {
			if writeErr != nil {
				return Event{}, writeErr
			}
			if err == io.EOF {
				return Event{}, fmt.Errorf("%w: connection closed before done", ErrBadFrame)
			}
			return Event{}, err
		}
		if kind == FrameData {
			if sink != nil {
				if _, err := sink.Write(p); err != nil {
					return Event{}, err
				}
			}
			continue
		}
		ev, err := DecodeEvent(p)
		if err != nil {
			return Event{}, err
		}
		if ev.Type == EventDone {
			return ev, nil
		}
		if onEvent != nil {
			if err := onEvent(ev); err != nil {
				return Event{}, err
			}
		}
	}
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
