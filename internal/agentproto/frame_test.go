package agentproto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
)

func frame(kind byte, payload []byte) []byte {
	var b bytes.Buffer
	if err := WriteFrame(&b, kind, payload); err != nil {
		panic(err)
	}
	return b.Bytes()
}

func rawFrame(n uint32, rest []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, n)
	return append(b, rest...)
}

func TestReadFrame(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      []byte
		kind    byte
		payload []byte
		err     error
	}{
		{"json", frame(FrameJSON, []byte(`{"op":"ping"}`)), FrameJSON, []byte(`{"op":"ping"}`), nil},
		{"data", frame(FrameData, []byte{0, 1, 2}), FrameData, []byte{0, 1, 2}, nil},
		{"empty data ends a body", frame(FrameData, nil), FrameData, []byte{}, nil},
		{"clean EOF", nil, 0, nil, io.EOF},
		{"short header", []byte{0, 0}, 0, nil, ErrBadFrame},
		{"zero length", rawFrame(0, nil), 0, nil, ErrBadFrame},
		{"too large", rawFrame(MaxFrame+1, []byte{FrameData}), 0, nil, ErrFrameTooLarge},
		{"huge length", rawFrame(0xffffffff, nil), 0, nil, ErrFrameTooLarge},
		{"truncated payload", rawFrame(10, []byte{FrameJSON, '{'}), 0, nil, ErrBadFrame},
		{"unknown kind", rawFrame(2, []byte{'X', 'y'}), 0, nil, ErrBadFrame},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kind, payload, err := ReadFrame(bytes.NewReader(tt.in))
			if !errors.Is(err, tt.err) {
				t.Fatalf("err = %v, want %v", err, tt.err)
			}
			if kind != tt.kind || !bytes.Equal(payload, tt.payload) {
				t.Fatalf("got %q %q, want %q %q", kind, payload, tt.kind, tt.payload)
			}
		})
	}
}

func TestWriteFrameTooLarge(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := WriteFrame(&b, FrameData, make([]byte, MaxFrame)); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("err = %v, want ErrFrameTooLarge", err)
	}
	if b.Len() != 0 {
		t.Fatalf("wrote %d bytes of a refused frame", b.Len())
	}
	if err := WriteFrame(&b, FrameData, make([]byte, MaxFrame-1)); err != nil {
		t.Fatalf("largest frame: %v", err)
	}
}

func TestBodyRoundTrip(t *testing.T) {
	t.Parallel()
	body := bytes.Repeat([]byte("0123456789abcdef"), DataChunk/8+3) // several chunks
	var wire bytes.Buffer
	c := NewConn(&wire)
	n, err := c.CopyBody(bytes.NewReader(body))
	if err != nil || n != int64(len(body)) {
		t.Fatalf("CopyBody = %d, %v", n, err)
	}
	var got bytes.Buffer
	n, err = NewConn(&wire).ReadBody(&got, 0)
	if err != nil || n != int64(len(body)) || !bytes.Equal(got.Bytes(), body) {
		t.Fatalf("ReadBody = %d, %v (equal %v)", n, err, bytes.Equal(got.Bytes(), body))
	}
}

func TestReadBodyErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		wire  []byte
		limit int64
		err   error
	}{
		{"over limit", append(frame(FrameData, make([]byte, 10)), frame(FrameData, nil)...), 9, ErrBodyTooLarge},
		{"at limit", append(frame(FrameData, make([]byte, 10)), frame(FrameData, nil)...), 10, nil},
		{"ends without end frame", frame(FrameData, make([]byte, 10)), 0, ErrBadFrame},
		{"JSON inside body", frame(FrameJSON, []byte(`{}`)), 0, ErrBadFrame},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewConn(bytes.NewBuffer(tt.wire)).ReadBody(io.Discard, tt.limit)
			if !errors.Is(err, tt.err) {
				t.Fatalf("err = %v, want %v", err, tt.err)
			}
		})
	}
}

func TestReadJSON(t *testing.T) {
	t.Parallel()
	var req Request
	if err := NewConn(bytes.NewBuffer(frame(FrameData, []byte("x")))).ReadJSON(&req); !errors.Is(err, ErrBadFrame) {
		t.Fatalf("data frame as JSON: err = %v", err)
	}
	if err := NewConn(bytes.NewBuffer(frame(FrameJSON, []byte("{")))).ReadJSON(&req); !errors.Is(err, ErrBadFrame) {
		t.Fatalf("bad JSON: err = %v", err)
	}
	if err := NewConn(bytes.NewBuffer(frame(FrameJSON, []byte(`{"op":"ping","pid":7}`)))).ReadJSON(&req); err != nil || req.Op != OpPing || req.PID != 7 {
		t.Fatalf("ReadJSON = %+v, %v", req, err)
	}
}

// TestCall drives Call against a scripted peer on a unix socket: events,
// data frames, then a Done, for an upload far larger than the socket's
// buffers that the peer refuses without reading.
func TestCall(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("unix", t.TempDir()+"/s")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		server, err := ln.Accept()
		if err != nil {
			return
		}
		defer server.Close()
		c := NewConn(server)
		var req Request
		if err := c.ReadJSON(&req); err != nil {
			return
		}
		c.WriteJSON(Event{Type: EventFile, Entry: &FileInfo{Name: "f"}})
		c.WriteData([]byte("hello "))
		c.WriteData([]byte("world"))
		c.WriteData(nil)
		c.WriteJSON(Event{Type: EventDone, Code: CodeTooLarge})
	}()
	client, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	var got bytes.Buffer
	var events []string
	body := bytes.NewReader(make([]byte, 16<<20))
	done, err := Call(client, Request{Op: OpFileWrite}, body, Handlers{
		Data: func(p []byte) error { got.Write(p); return nil },
		Event: func(ev Event) error {
			events = append(events, ev.Type)
			return nil
		}})
	if err != nil {
		t.Fatalf("Call: %v", err)
	}
	if done.Code != CodeTooLarge || got.String() != "hello world" || strings.Join(events, ",") != EventFile {
		t.Fatalf("done %+v, body %q, events %v", done, got.String(), events)
	}
}

func TestDecodeEvent(t *testing.T) {
	t.Parallel()
	for _, in := range []string{``, `[]`, `{}`, `{"type":""}`, `{"type":1}`} {
		if _, err := DecodeEvent([]byte(in)); !errors.Is(err, ErrBadFrame) {
			t.Errorf("DecodeEvent(%q): err = %v, want ErrBadFrame", in, err)
		}
	}
}

// FuzzReadFrame feeds arbitrary bytes to the frame reader: it must never
// panic, never return a frame over MaxFrame or of an unknown kind, and
// every frame it returns must survive a write/read round trip.
func FuzzReadFrame(f *testing.F) {
	f.Add(frame(FrameJSON, []byte(`{"op":"ping"}`)))
	f.Add(append(frame(FrameData, []byte("abc")), frame(FrameData, nil)...))
	f.Add(rawFrame(0, nil))
	f.Add(rawFrame(MaxFrame+1, nil))
	f.Add(rawFrame(3, []byte{'Z', 0, 0}))
	f.Add([]byte{0, 0, 0, 5, 'J', '{', '}'})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		for range 64 {
			kind, payload, err := ReadFrame(r)
			if err != nil {
				if kind != 0 || payload != nil {
					t.Fatalf("error %v with a frame", err)
				}
				return
			}
			if kind != FrameJSON && kind != FrameData {
				t.Fatalf("kind %q accepted", kind)
			}
			if len(payload)+1 > MaxFrame {
				t.Fatalf("payload of %d bytes accepted", len(payload))
			}
			var b bytes.Buffer
			if err := WriteFrame(&b, kind, payload); err != nil {
				t.Fatalf("rewrite: %v", err)
			}
			k2, p2, err := ReadFrame(&b)
			if err != nil || k2 != kind || !bytes.Equal(p2, payload) {
				t.Fatalf("round trip: %q %q %v", k2, p2, err)
			}
			if kind == FrameJSON {
				DecodeEvent(payload) // must not panic
			}
		}
	})
}
