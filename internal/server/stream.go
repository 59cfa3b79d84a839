package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/sheepfold/sheepfold/api"
)

type streamMode int

const (
	streamNone streamMode = iota
	streamSSE
	streamNDJSON
)

// wantStream reads how the caller wants a response streamed: SSE with
// Accept: text/event-stream, NDJSON with ?stream=1 or Accept:
// application/x-ndjson. def applies when the caller says nothing.
func wantStream(r *http.Request, def streamMode) streamMode {
	accept := r.Header.Get("Accept")
	switch {
	case strings.Contains(accept, "text/event-stream"):
		return streamSSE
	case strings.Contains(accept, "application/x-ndjson"):
		return streamNDJSON
	}
	switch strings.ToLower(r.URL.Query().Get("stream")) {
	case "1", "true", "ndjson":
		return streamNDJSON
	case "sse":
		return streamSSE
	}
	return def
}

// commitDelay is how long a stream waits for its first event before it
// sends its headers anyway, so that an error found at once can still be
// a plain JSON error with its status, and a quiet stream is not left
// without headers.
var commitDelay = 200 * time.Millisecond

// streamWriteTimeout bounds each write of a stream to its client: a
// client that stops reading breaks its stream (and so stops what feeds
// it) instead of pinning it.
var streamWriteTimeout = 30 * time.Second

// streamer writes events to a streaming response as they come, flushing
// each one. Safe for concurrent use.
type streamer struct {
	w    http.ResponseWriter
	rc   *http.ResponseController
	mode streamMode

	// mu guards the fields below.
	mu        sync.Mutex
	committed bool
	done      bool
	timer     *time.Timer
	werr      error // the first failed write; later writes are skipped
}

func newStreamer(w http.ResponseWriter, mode streamMode) *streamer {
	st := &streamer{w: w, rc: http.NewResponseController(w), mode: mode}
	st.timer = time.AfterFunc(commitDelay, func() {
		st.mu.Lock()
		defer st.mu.Unlock()
		if !st.done {
			st.rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
			st.commitLocked()
			st.flushLocked()
		}
	})
	return st
}

func (st *streamer) commitLocked() {
	if st.committed {
		return
	}
	st.committed = true
	h := st.w.Header()
	if st.mode == streamSSE {
		h.Set("Content-Type", "text/event-stream")
	} else {
		h.Set("Content-Type", "application/x-ndjson")
	}
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	st.w.WriteHeader(http.StatusOK)
	if st.mode == streamSSE {
		st.w.Write([]byte(": stream\n\n"))
	}
}

// send writes one event while the stream runs. For SSE, event is the
// event name and data its JSON; for NDJSON, line is written as one line.
func (st *streamer) send(event string, data any, line any) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.done {
		return
	}
	st.writeLocked(event, data, line)
}

func (st *streamer) writeLocked(event string, data any, line any) {
	if st.werr != nil {
		return
	}
	st.rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
	st.commitLocked()
	var b []byte
	if st.mode == streamSSE {
		j, _ := json.Marshal(data)
		b = make([]byte, 0, len(event)+len(j)+16)
		b = append(append(append(append(b, "event: "...), event...), "\ndata: "...), j...)
		b = append(b, "\n\n"...)
	} else {
		b, _ = json.Marshal(line)
		b = append(b, '\n')
	}
	if _, err := st.w.Write(b); err != nil {
		st.werr = err
		return
	}
	st.flushLocked()
}

func (st *streamer) flushLocked() {
	if err := st.rc.Flush(); err != nil && st.werr == nil {
		st.werr = err
	}
}

// err returns the error of the first write that failed (the client is
// gone or stopped reading), nil while the stream is healthy.
func (st *streamer) err() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.werr
}

// finish stops the stream's events and its timer and reports whether the
// response was committed: if not, an error can still be a plain JSON
// error response.
func (st *streamer) finish() bool {
	st.timer.Stop()
	st.mu.Lock()
	defer st.mu.Unlock()
	st.done = true
	return st.committed
}

// last writes the final event, after finish, and clears the write
// deadline (the connection may serve another request).
func (st *streamer) last(event string, data any, line any) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.writeLocked(event, data, line)
	if st.werr == nil {
		st.rc.SetWriteDeadline(time.Time{})
	}
}

// end finishes a stream: with err nil, the final event; else a plain error
// response if nothing was sent yet, or a last "failure" event
// ({"error":{code,message,request_id}}) if the stream had begun.
func (s *Server) end(st *streamer, w http.ResponseWriter, r *http.Request, err error, event string, data any, line any) {
	committed := st.finish()
	if err == nil {
		st.last(event, data, line)
		return
	}
	if !committed {
		s.writeError(w, r, err)
		return
	}
	_, body := s.errorJSON(r, err)
	st.last("failure", api.Error{Error: body}, map[string]any{"type": "failure", "error": body})
}

// textCarry turns a byte stream into text chunks that never split a UTF-8
// sequence (which JSON would turn into U+FFFD): an incomplete sequence at
// the end of a chunk waits for the next one. One that never completes is
// invalid anyway and is dropped.
type textCarry struct{ rest []byte }

func (c *textCarry) text(p []byte) string {
	b := append(c.rest, p...)
	c.rest = nil
	for j := len(b) - 1; j >= 0 && j >= len(b)-utf8.UTFMax; j-- {
		if utf8.RuneStart(b[j]) {
			if !utf8.FullRune(b[j:]) {
				c.rest = append([]byte(nil), b[j:]...)
				b = b[:j]
			}
			break
		}
	}
	return string(b)
}

// textStreams holds a carry per stream (stdout, stderr).
type textStreams map[string]*textCarry

func (ts textStreams) text(typ string, p []byte) string {
	c := ts[typ]
	if c == nil {
		c = &textCarry{}
		ts[typ] = c
	}
	return c.text(p)
}

// deadlineWriter gives each write and flush of a response the stream
// write deadline (streamWriteTimeout); once one fails, every later one
// fails the same. end clears the deadline after a stream that ended well.
type deadlineWriter struct {
	http.ResponseWriter
	rc  *http.ResponseController
	err error // the first failed write or flush
}

func (d *deadlineWriter) Write(p []byte) (int, error) {
	if d.err != nil {
		return 0, d.err
	}
	d.rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
	n, err := d.ResponseWriter.Write(p)
	d.err = err
	return n, err
}

// FlushError lets http.ResponseController flush with a deadline too.
func (d *deadlineWriter) FlushError() error {
	if d.err != nil {
		return d.err
	}
	d.rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
	d.err = d.rc.Flush()
	return d.err
}

// Unwrap lets http.ResponseController reach the connection.
func (d *deadlineWriter) Unwrap() http.ResponseWriter { return d.ResponseWriter }

func (d *deadlineWriter) end() {
	if d.err == nil {
		d.rc.SetWriteDeadline(time.Time{})
	}
}
