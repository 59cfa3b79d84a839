package egress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/sheepfold/sheepfold/internal/events"
)

// Proxied egress. A sandbox whose runtime gives it no interface of the
// host's (a Pod: its NetworkPolicy denies every egress) reaches the
// network through an HTTP proxy its agent listens for on the sandbox's
// loopback (runtime.ProxyAddr, which its HTTP_PROXY and HTTPS_PROXY name,
// runtime.ProxyEnv); the
// server fetches each such connection through the agent and serves it
// here (ServeProxy). A connection's first request names its destination
// (CONNECT host:port, or an absolute http:// URL), which is decided as
// the TUN path decides a name and then a connection: the name as a DNS
// question (dns_denied, tunnelling), the address it resolved to by
// checkConn (forbidden ranges, the host, the allowlist, the port), the
// server's own listeners refused, the flow cap kept, network_requests
// counted. An allowed connection is a flow as on the TUN path (flow.go):
// every request judged, SNI and Host checked where names are required,
// idle timeout, byte counts and rate, closed by a tightened policy.
// Clients that ignore the proxy variables reach nothing: the sandbox has
// no other route out.

// HalfConn is a connection whose sending side can be closed alone (a
// TCP, unix or TLS connection).
type HalfConn interface {
	net.Conn
	CloseWrite() error
}

// maxProxyHeaders bounds the header lines of a CONNECT request.
const maxProxyHeaders = 100

// ServeProxy serves one connection the sandbox made to its egress
// listener: it reads the proxy request, decides it, and carries the
// connection or answers why not (403 with ERR_NETWORK_RESTRICTED, 429
// past network_requests or the flow cap, 502 when the destination does
// not answer, 400 for anything but a proxy request). It returns when the connection is
// done, and closes c.
func (g *Gateway) ServeProxy(c HalfConn) {
	defer c.Close()
	stop := context.AfterFunc(g.ctx, func() { c.Close() })
	defer stop()
	_ = c.SetReadDeadline(time.Now().Add(sniffTimeout))
	br := bufio.NewReaderSize(c, maxSniff)
	line, err := br.ReadSlice('\n')
	if err != nil {
		proxyReply(c, http.StatusBadRequest, "ERR_BAD_REQUEST", "not an HTTP proxy request")
		return
	}
	method, uri, proto, ok := requestLine(string(line))
	if !ok {
		proxyReply(c, http.StatusBadRequest, "ERR_BAD_REQUEST", "not an HTTP proxy request")
		return
	}
	var host, port string
	var in io.Reader = br
	connect := method == http.MethodConnect
	if connect {
		if host, port, err = net.SplitHostPort(uri); err != nil {
			proxyReply(c, http.StatusBadRequest, "ERR_BAD_REQUEST", "CONNECT needs host:port")
			return
		}
		// The CONNECT's own headers go no further.
		for n := 0; ; n++ {
			h, err := br.ReadSlice('\n')
			if err != nil || n == maxProxyHeaders {
				proxyReply(c, http.StatusBadRequest, "ERR_BAD_REQUEST", "malformed CONNECT request")
				return
			}
			if len(strings.TrimRight(string(h), "\r\n")) == 0 {
				break
			}
		}
	} else {
		u, err := url.Parse(uri)
		if err != nil || u.Scheme != "http" || u.Host == "" {
			proxyReply(c, http.StatusBadRequest, "ERR_BAD_REQUEST", "a proxy request names an absolute http:// URL (https goes through CONNECT)")
			return
		}
		host, port = u.Hostname(), u.Port()
		if port == "" {
			port = "80"
		}
		// The request goes on in origin form; the rest of it as it came.
		in = io.MultiReader(strings.NewReader(method+" "+u.RequestURI()+" "+proto+"\r\n"), br)
	}
	_ = c.SetReadDeadline(time.Time{})
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		proxyReply(c, http.StatusBadRequest, "ERR_BAD_REQUEST", "bad port "+strconv.Quote(port))
		return
	}
	target := net.JoinHostPort(host, port)
	addr, d := g.proxyResolve(host)
	if !d.ok {
		g.seen.syns.Add(1)
		g.seen.refused.Add(1)
		proxyReply(c, http.StatusForbidden, "ERR_NETWORK_RESTRICTED", d.rule)
		return
	}
	dst := netip.AddrPortFrom(addr, uint16(p))
	f, up, why := g.connect(dst, target, target+" ("+dst.String()+")")
	if why != nil {
		proxyReply(c, why.status, "ERR_NETWORK_RESTRICTED", why.msg)
		return
	}
	if connect {
		if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
			f.end()
			up.Close()
			return
		}
	}
	g.seen.carried.Add(1)
	f.splice(readerConn{HalfConn: c, r: in}, up)
}

// proxyResolve decides the host a proxy request names and resolves it:
// an address as it is (checkConn judges it), a name as the sandbox's DNS
// question for it would be (A records, its first answer).
func (g *Gateway) proxyResolve(host string) (netip.Addr, decision) {
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return a.Unmap(), allow("")
	}
	name, err := dnsmessage.NewName(strings.TrimSuffix(host, ".") + ".")
	if err != nil {
		g.report(deny(events.KindDNSDenied, "not a valid host name"), "dns", host)
		return netip.Addr{}, deny(events.KindDNSDenied, "not a valid host name")
	}
	rcode, addrs := g.resolveQuestion(g.ctx, dnsmessage.Header{}, dnsmessage.Question{Name: name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	if rcode != dnsmessage.RCodeSuccess || len(addrs) == 0 {
		return netip.Addr{}, deny(events.KindDNSDenied, fmt.Sprintf("%s does not resolve for this sandbox (%s)", host, rcode))
	}
	return addrs[0], allow("")
}

// requestLine splits an HTTP request line.
func requestLine(line string) (method, uri, proto string, ok bool) {
	f := strings.Fields(strings.TrimRight(line, "\r\n"))
	if len(f) != 3 || !strings.HasPrefix(f[2], "HTTP/1.") {
		return "", "", "", false
	}
	return f[0], f[1], f[2], true
}

// proxyReply answers a proxy request the gateway refuses.
func proxyReply(w io.Writer, status int, code, msg string) {
	body := code + ": " + msg + "\n"
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\nX-Sheepfold-Error: %s\r\n\r\n%s",
		status, http.StatusText(status), len(body), code, body)
}

// readerConn is a connection read through r (what a bufio.Reader over it
// already holds comes first).
type readerConn struct {
	HalfConn
	r io.Reader
}

func (c readerConn) Read(p []byte) (int, error) { return c.r.Read(p) }
