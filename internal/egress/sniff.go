package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
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
