package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// What the first bytes of a connection turned out to be.
const (
	protoTLS   = "tls"
	protoHTTP  = "http"
	protoOther = "tcp"
)

// maxSniff bounds what is read to find a TLS SNI or an HTTP Host.
const maxSniff = 64 << 10

// errSniffTooLong reports a ClientHello or HTTP header block over maxSniff.
var errSniffTooLong = errors.New("first message too long to inspect")

// recorder keeps every byte read through it, up to maxSniff.
type recorder struct {
	r   io.Reader
	buf bytes.Buffer
}

func (rc *recorder) Read(p []byte) (int, error) {
	if rc.buf.Len() >= maxSniff {
		return 0, errSniffTooLong
	}
	if room := maxSniff - rc.buf.Len(); len(p) > room {
		p = p[:room]
	}
	n, err := rc.r.Read(p)
	rc.buf.Write(p[:n])
	return n, err
}

// httpMethods start an HTTP/1 request.
var httpMethods = []string{"GET ", "HEAD ", "POST ", "PUT ", "DELETE ", "OPTIONS ", "PATCH ", "CONNECT ", "TRACE "}

// classify says what a stream starting with b is, or "" if more bytes are
// needed to tell.
func classify(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if b[0] == 0x16 { // TLS handshake record
		return protoTLS
	}
	more := false
	for _, m := range httpMethods {
		switch {
		case len(b) >= len(m) && string(b[:len(m)]) == m:
			return protoHTTP
		case len(b) < len(m) && m[:len(b)] == string(b):
			more = true
		}
	}
	if more {
		return ""
	}
	return protoOther
}

// sniff reads the start of a client stream and returns what it is, the
// name it claims (TLS SNI or HTTP Host; "" if none) and every byte it
// read, which the caller forwards before the rest. It waits as long as
// needed for the first byte (some protocols let the server speak first),
// then at most timeout for the whole first message.
func sniff(c net.Conn, timeout time.Duration) (proto, name string, read []byte, err error) {
	rc := &recorder{r: c}
	one := make([]byte, 4096)
	armed := false
	for proto == "" {
		if _, err := rc.Read(one); err != nil {
			return "", "", rc.buf.Bytes(), err
		}
		if !armed {
			armed = true
			_ = c.SetReadDeadline(time.Now().Add(timeout))
		}
		proto = classify(rc.buf.Bytes())
	}
	defer c.SetReadDeadline(time.Time{})
	first := bytes.Clone(rc.buf.Bytes())
	stream := io.MultiReader(bytes.NewReader(first), rc)
	switch proto {
	case protoTLS:
		name, err = serverName(stream)
	case protoHTTP:
		name, err = httpHost(stream)
	}
	return proto, name, rc.buf.Bytes(), err
}

// errHelloRead stops crypto/tls once it has parsed the ClientHello.
var errHelloRead = errors.New("client hello read")

// serverName parses a TLS ClientHello with crypto/tls and returns its SNI.
func serverName(r io.Reader) (string, error) {
	var sni string
	var seen bool
	cfg := &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		sni, seen = h.ServerName, true
		return nil, errHelloRead
	}}
	err := tls.Server(readOnlyConn{r: r}, cfg).HandshakeContext(context.Background())
	if seen {
		return sni, nil
	}
	if err == nil {
		err = errors.New("no client hello")
	}
	return "", err
}

// httpHost parses an HTTP/1 request's header block and returns its Host
// without a port.
func httpHost(r io.Reader) (string, error) {
	req, err := http.ReadRequest(bufio.NewReaderSize(r, 4096))
	if err != nil {
		return "", err
	}
	host := req.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.Trim(host, "[]"), nil
}

// readOnlyConn feeds crypto/tls a recorded stream; nothing it writes (an
// alert) reaches the sandbox.
type readOnlyConn struct {
	net.Conn // nil: only the methods below are used
	r        io.Reader
}

func (c readOnlyConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c readOnlyConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c readOnlyConn) Close() error                     { return nil }
func (c readOnlyConn) SetDeadline(time.Time) error      { return nil }
func (c readOnlyConn) SetReadDeadline(time.Time) error  { return nil }
func (c readOnlyConn) SetWriteDeadline(time.Time) error { return nil }
func (c readOnlyConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c readOnlyConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }

// errRefused ends forwardHTTP when the judge refuses a request.
var errRefused = errors.New("request refused")

// forwardHTTP carries HTTP/1 requests from r to w unchanged. Each
// request's header block is read whole and judged (judge gets its Host
// without a port) before any byte of it is forwarded; bodies are carried
// by their framing (Content-Length or chunked), so the next request's
// header block is found exactly. After CONNECT or an Upgrade the stream
// is no longer HTTP and is carried as it is. It returns nil when r ends
// between requests.
func forwardHTTP(r *bufio.Reader, w io.Writer, judge func(host string) bool) error {
	for {
		head, err := readHead(r)
		if err != nil {
			if errors.Is(err, io.EOF) && len(head) == 0 {
				return nil
			}
			return err
		}
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
		if err != nil {
			return err
		}
		host := req.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if !judge(strings.Trim(host, "[]")) {
			return errRefused
		}
		if _, err := w.Write(head); err != nil {
			return err
		}
		switch {
		case req.Method == http.MethodConnect || req.Header.Get("Upgrade") != "":
			_, err := io.Copy(w, r)
			return err
		case len(req.TransferEncoding) > 0:
			if err := forwardChunked(r, w); err != nil {
				return err
			}
		case req.ContentLength > 0:
			if _, err := io.CopyN(w, r, req.ContentLength); err != nil {
				return err
			}
		}
	}
}

// readHead reads one header block, up to and including its empty line.
func readHead(r *bufio.Reader) ([]byte, error) {
	var head []byte
	for {
		line, err := r.ReadSlice('\n')
		head = append(head, line...)
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) && len(head) < maxSniff {
				continue
			}
			if errors.Is(err, bufio.ErrBufferFull) {
				return head, errSniffTooLong
			}
			return head, err
		}
		if len(head) > maxSniff {
			return head, errSniffTooLong
		}
		if string(line) == "\r\n" || string(line) == "\n" {
			if len(head) == len(line) {
				head = head[:0] // a stray empty line between requests
				continue
			}
			return head, nil
		}
	}
}

// forwardChunked carries a chunked body and its trailer.
func forwardChunked(r *bufio.Reader, w io.Writer) error {
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return err
		}
		if _, err := w.Write(line); err != nil {
			return err
		}
		field := strings.TrimSpace(string(line))
		if i := strings.IndexByte(field, ';'); i >= 0 {
			field = field[:i]
		}
		size, err := strconv.ParseInt(strings.TrimSpace(field), 16, 64)
		if err != nil || size < 0 {
			return fmt.Errorf("bad chunk size %q", field)
		}
		if size == 0 {
			for { // trailer fields, then the empty line
				line, err := r.ReadSlice('\n')
				if err != nil {
					return err
				}
				if _, err := w.Write(line); err != nil {
					return err
				}
				if string(line) == "\r\n" || string(line) == "\n" {
					return nil
				}
			}
		}
		if _, err := io.CopyN(w, r, size+2); err != nil { // data and its CRLF
			return err
		}
	}
}
