package agentproto

import (
	"bufio"
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
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			return 0, nil, ErrBadFrame
		}
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 {
		return 0, nil, ErrBadFrame
	}
	if n > MaxFrame {
		return 0, nil, ErrFrameTooLarge
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		return 0, nil, ErrBadFrame
	}
	switch buf[0] {
	case FrameJSON, FrameData:
	default:
		return 0, nil, fmt.Errorf("%w: unknown kind %q", ErrBadFrame, buf[0])
	}
	return buf[0], buf[1:], nil
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

// WriteJSON writes v as a JSON frame.
func (c *Conn) WriteJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return WriteFrame(c.w, FrameJSON, b)
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
