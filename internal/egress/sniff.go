package egress

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
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

// h2Preface starts an HTTP/2 connection with prior knowledge (h2c).
const h2Preface = "PRI * HTTP/2.0\r\n"

// classify says what a stream starting with b is, or "" if more bytes are
// needed to tell. TLS is a handshake record. HTTP is read loosely here, so
// that nothing a server would take for an HTTP/1 request passes as
// something else: a first line that starts with a token and a space and
// ends (at its LF) with a word starting "HTTP/", whatever the method or
// its case; such a flow is then parsed strictly (http.go) and closed if
// it does not parse. Anything else, an HTTP/2 preface included, is other.
func classify(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if b[0] == 0x16 { // TLS handshake record
		return protoTLS
	}
	if len(b) < len(h2Preface) && h2Preface[:len(b)] == string(b) {
		return ""
	}
	if bytes.HasPrefix(b, []byte(h2Preface)) {
		return protoOther
	}
	i := 0
	for i < len(b) && tokenByte(b[i]) {
		i++
	}
	switch {
	case i == len(b):
		return "" // the method may go on
	case i == 0 || b[i] != ' ' && b[i] != '\t':
		return protoOther
	}
	for j := i; j < len(b); j++ {
		c := b[j]
		if c == '\n' {
			f := bytes.Fields(b[i:j])
			if len(f) > 0 && len(f[len(f)-1]) >= 5 && strings.EqualFold(string(f[len(f)-1][:5]), "HTTP/") {
				return protoHTTP
			}
			return protoOther
		}
		if c < 0x20 && c != '\t' && c != '\r' || c == 0x7f {
			return protoOther // binary: no server reads this as a request line
		}
	}
	return ""
}

// sniff reads the start of a client stream and returns what it is, the
// name a TLS ClientHello claims (its SNI; "" if none) and every byte it
// read, which the caller forwards before the rest (an HTTP flow's
// requests are read by the exchange, from the start). It waits as long
// as needed for the first byte (some protocols let the server speak
// first; the flow's idle timeout bounds that), then at most timeout to
// tell what the stream is and read a ClientHello. An error with proto ""
// means the stream could not be told (it ended, or was too long or too
// slow, while it could still be HTTP).
func sniff(c net.Conn, timeout time.Duration) (proto, name string, read []byte, err error) {
	rc := &recorder{r: c}
	one := make([]byte, 4096)
	armed := false
	defer c.SetReadDeadline(time.Time{})
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
	first := bytes.Clone(rc.buf.Bytes())
	stream := io.MultiReader(bytes.NewReader(first), rc)
	if proto == protoTLS {
		name, err = serverName(stream)
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
