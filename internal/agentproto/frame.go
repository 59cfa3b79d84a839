package agentproto

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Frame kinds.
const (
	FrameJSON byte = 'J' // a JSON Request or Event
	FrameData byte = 'D' // raw bytes of a file body; an empty one ends the body
)

// MaxFrame bounds one frame (kind byte plus payload).
const MaxFrame = 4 << 20

// DataChunk is the size of the data frames writers produce.
const DataChunk = 256 << 10

// ErrFrameTooLarge reports a frame whose length exceeds MaxFrame.
var ErrFrameTooLarge = errors.New("agentproto: frame too large")

// ErrBadFrame reports a malformed frame.
var ErrBadFrame = errors.New("agentproto: malformed frame")

// WriteFrame writes one frame of the given kind.
func WriteFrame(w io.Writer, kind byte, payload []byte) error {
	if len(payload)+1 > MaxFrame {
		return ErrFrameTooLarge
	}
	buf := make([]byte, 5+len(payload))
	binary.BigEndian.PutUint32(buf, uint32(len(payload)+1))
	buf[4] = kind
	copy(buf[5:], payload)
	_, err := w.Write(buf)
	return err
}

// ReadFrame reads one frame. It returns io.EOF only when the stream ends
// cleanly before a frame starts.
func ReadFrame(r io.Reader) (kind byte, payload []byte, err error) {
	kind, payload, _, err = readFrame(r, nil)
	return kind, payload, err
}

// Admit is asked before a frame of n bytes (kind byte included) is read
// into memory. It may wait (that is backpressure: the peer's writes stall
// meanwhile) or fail; release gives the bytes back once the frame has been
// handled. Readers ask only for frames of at least AdmitFrom bytes, so
// that small frames (the usual case) cost nothing.
type Admit func(n int) (release func(), err error)

// AdmitFrom is the smallest frame for which an Admit is asked.
const AdmitFrom = 64 << 10

// readFrame is ReadFrame asking admit (when not nil) before a large frame
// is allocated; release is never nil on success.
func readFrame(r io.Reader, admit Admit) (kind byte, payload []byte, release func(), err error) {
	release = func() {}
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			return 0, nil, nil, ErrBadFrame
		}
		return 0, nil, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 {
		return 0, nil, nil, ErrBadFrame
	}
	if n > MaxFrame {
		return 0, nil, nil, ErrFrameTooLarge
	}
	if admit != nil && n >= AdmitFrom {
		if release, err = admit(int(n)); err != nil {
			return 0, nil, nil, err
		}
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		release()
		return 0, nil, nil, ErrBadFrame
	}
	switch buf[0] {
	case FrameJSON, FrameData:
	default:
		release()
		return 0, nil, nil, fmt.Errorf("%w: unknown kind %q", ErrBadFrame, buf[0])
	}
	return buf[0], buf[1:], release, nil
}

// Conn wraps a stream with frame reading and writing helpers. It is not safe
// for concurrent writers; callers serialise writes.
type Conn struct {
	r *bufio.Reader
	w io.Writer
}

// NewConn returns a Conn over rw.
func NewConn(rw io.ReadWriter) *Conn {
	return &Conn{r: bufio.NewReaderSize(rw, 64<<10), w: rw}
}

// WriteJSON writes v as a JSON frame. It returns ErrFrameTooLarge, having
// written nothing, when v's encoding does not fit in a frame.
func (c *Conn) WriteJSON(v any) error {
	b, err := MarshalJSON(v)
	if err != nil {
		return err
	}
	return WriteFrame(c.w, FrameJSON, b)
}

// MarshalJSON encodes v as a frame carries it: without escaping <, > and
// & (which would make HTML six times its size on the wire).
func MarshalJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// WriteData writes a data frame; an empty p marks the end of a body.
func (c *Conn) WriteData(p []byte) error {
	return WriteFrame(c.w, FrameData, p)
}

// ReadJSON reads a frame that must be a JSON frame and decodes it into v.
func (c *Conn) ReadJSON(v any) error {
	kind, p, err := ReadFrame(c.r)
	if err != nil {
		return err
	}
	if kind != FrameJSON {
		return fmt.Errorf("%w: want JSON frame, got %q", ErrBadFrame, kind)
	}
	if err := json.Unmarshal(p, v); err != nil {
		return fmt.Errorf("%w: %v", ErrBadFrame, err)
	}
	return nil
}

// ReadFrame reads the next frame of any kind.
func (c *Conn) ReadFrame() (byte, []byte, error) { return ReadFrame(c.r) }

// CopyBody writes r as data frames followed by the empty end frame.
func (c *Conn) CopyBody(r io.Reader) (int64, error) {
	buf := make([]byte, DataChunk)
	var n int64
	for {
		k, err := r.Read(buf)
		if k > 0 {
			n += int64(k)
			if werr := c.WriteData(buf[:k]); werr != nil {
				return n, werr
			}
		}
		if err == io.EOF {
			return n, c.WriteData(nil)
		}
		if err != nil {
			return n, err
		}
	}
}

// ReadBody copies data frames into w until the empty end frame, refusing
// more than limit bytes (limit <= 0 means no limit). It returns
// ErrBodyTooLarge when the limit is passed.
func (c *Conn) ReadBody(w io.Writer, limit int64) (int64, error) {
	var n int64
	for {
		kind, p, err := c.ReadFrame()
		if err != nil {
			if err == io.EOF {
				return n, ErrBadFrame
			}
			return n, err
		}
		if kind != FrameData {
			return n, fmt.Errorf("%w: want data frame, got %q", ErrBadFrame, kind)
		}
		if len(p) == 0 {
			return n, nil
		}
		n += int64(len(p))
		if limit > 0 && n > limit {
			return n, ErrBodyTooLarge
		}
		if _, err := w.Write(p); err != nil {
			return n, err
		}
	}
}

// ErrBodyTooLarge reports a file body over the caller's limit.
var ErrBodyTooLarge = errors.New("agentproto: body too large")

// Buffered returns (and consumes) what the Conn has read ahead of the
// frames it returned: the first bytes of a raw stream that follows them.
func (c *Conn) Buffered() []byte {
	n := c.r.Buffered()
	if n == 0 {
		return nil
	}
	p, _ := c.r.Peek(n)
	out := append([]byte(nil), p...)
	c.r.Discard(n)
	return out
}
