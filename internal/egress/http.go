package egress

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
)

// Plain HTTP/1 flows. The gateway follows such a flow both ways: every
// request the sandbox sends is read whole (its header block) and judged
// before any byte of it goes on, its body carried by its own framing so
// that the next request is found exactly; the answers that come back are
// read only to learn whether a request that could end HTTP on the
// connection (an Upgrade, a CONNECT) did: only then does the flow become
// opaque. A request that would open it waits for its answer before any
// further byte of the sandbox's goes on.
//
// Requests are read strictly, so that the gateway and the server behind
// it cannot disagree on where one ends and the next begins: CRLF line
// ends only, header names that are tokens with the colon next to them,
// no folded lines, no control bytes, one Host, never both Content-Length
// and Transfer-Encoding. Anything else closes the flow. What a server
// answers is trusted: it is a destination the policy allows.

// errRefused ends a flow whose request the judge refused.
var errRefused = errors.New("request refused")

// errUnfollowed ends a flow that asked to leave HTTP (Upgrade, CONNECT)
// when the gateway could not follow the answers (the server spoke first
// or unasked, or answered what cannot be parsed).
var errUnfollowed = errors.New("cannot follow the answers to learn whether the protocol switched")

// malformedError is a request the gateway will not read as HTTP/1.
type malformedError struct{ msg string }

func (e *malformedError) Error() string { return e.msg }

func malformed(format string, a ...any) error { return &malformedError{fmt.Sprintf(format, a...)} }

// maxPipelined bounds the requests sent whose answers are still awaited.
const maxPipelined = 64

// exchange follows one plain HTTP/1 connection's requests and answers.
type exchange struct {
	sent chan *pending // requests forwarded, in order, whose answers are awaited
	lost chan struct{} // closed when the answers are no longer followed
	once sync.Once
	// forwarded counts the requests whose head went on, answered those
	// whose answer went back whole.
	forwarded, answered atomic.Int64
	answer              chan struct{} // signalled (never blocking) at each answer counted
}

// pending is a request forwarded and not yet answered.
type pending struct {
	method   string
	upgrade  bool      // it carries Upgrade
	opens    bool      // Upgrade or CONNECT: its answer may end HTTP on the connection
	switched chan bool // for opens: whether it did (101 to an Upgrade, 2xx to a CONNECT)
}

func newExchange() *exchange {
	return &exchange{sent: make(chan *pending, maxPipelined), lost: make(chan struct{}), answer: make(chan struct{}, 1)}
}

// stop says that the answers are no longer followed.
func (ex *exchange) stop() { ex.once.Do(func() { close(ex.lost) }) }

// judgeFunc decides a request before it is forwarded: names are the
// host names it claims (the authority of an absolute or CONNECT target,
// the Host header), without ports, deduplicated; head is its header
// block. It returns the header block to forward in its place, and
// whether to scan its body for secrets' placeholders (scan's refusal is
// the error its bad returns). A non-nil error refuses it and ends the
// flow.
type judgeFunc func(req *http.Request, names []string, head []byte) (out []byte, scan func(name string) error, err error)

// requests carries the requests read from r to w, judging each. After an
// Upgrade or a CONNECT that the server accepted, the rest is carried as
// it is (then upgraded is called, if set). It returns nil when r ends
// between requests.
func (ex *exchange) requests(r *bufio.Reader, w io.Writer, judge judgeFunc, upgraded func()) error {
	for {
		head, err := readHead(r)
		if err != nil {
			if errors.Is(err, io.EOF) && len(head) == 0 {
				return nil
			}
			return err
		}
		req, names, err := parseHead(head)
		if err != nil {
			return err
		}
		out, scan, err := judge(req, names, head)
		if err != nil {
			return err
		}
		p := &pending{method: req.Method, upgrade: req.Header.Get("Upgrade") != ""}
		p.opens = p.upgrade || req.Method == http.MethodConnect
		if p.opens {
			p.switched = make(chan bool, 1)
		}
		select {
		case ex.sent <- p:
		case <-ex.lost:
			if p.opens {
				return errUnfollowed
			}
		}
		if _, err := w.Write(out); err != nil {
			return err
		}
		ex.forwarded.Add(1)
		switch {
		case len(req.TransferEncoding) > 0 && scan != nil:
			if err := scanChunked(r, w, scan); err != nil {
				return err
			}
		case len(req.TransferEncoding) > 0:
			if err := forwardChunked(r, w); err != nil {
				return err
			}
		case req.ContentLength > 0 && scan != nil:
			sc := &scanWriter{w: w, bad: scan}
			if _, err := io.CopyN(sc, r, req.ContentLength); err != nil {
				return err
			}
			if err := sc.end(); err != nil {
				return err
			}
		case req.ContentLength > 0:
			if _, err := io.CopyN(w, r, req.ContentLength); err != nil {
				return err
			}
		}
		if !p.opens {
			continue
		}
		var sw, known bool
		select {
		case sw, known = <-p.switched:
		case <-ex.lost:
			// The verdict is sent before the answers stop being
			// followed: take it if it came.
			select {
			case sw, known = <-p.switched:
			default:
			}
		}
		if !known {
			return errUnfollowed
		}
		if sw {
			if upgraded != nil {
				upgraded()
			}
			_, err := io.Copy(w, r)
			return err
		}
	}
}

// answers reads the server's answers from r (which has forwarded every
// byte it read to the sandbox already) and tells each request that could
// open the connection whether it did. It returns when the answers can no
// longer be followed: r ended or failed, an answer could not be parsed,
// the server spoke unasked, or the protocol switched.
func (ex *exchange) answers(r *bufio.Reader) {
	defer ex.stop()
	for {
		if _, err := r.Peek(1); err != nil {
			return
		}
		var p *pending
		select {
		case p = <-ex.sent:
		default:
			return // an answer to nothing: the server spoke unasked
		}
		for {
			if !headComing(r) {
				return // a header block longer than the buffer: not followed
			}
			res, err := http.ReadResponse(r, &http.Request{Method: p.method})
			if err != nil {
				return
			}
			code := res.StatusCode
			if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
				continue // 100 Continue, 103 Early Hints: the answer follows
			}
			sw := code == http.StatusSwitchingProtocols && p.upgrade ||
				p.method == http.MethodConnect && code >= 200 && code < 300
			if p.opens {
				p.switched <- sw
			}
			if sw || code == http.StatusSwitchingProtocols {
				return // no longer HTTP (a 101 unasked too)
			}
			_, err = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if err != nil {
				return
			}
			ex.answered.Add(1)
			select {
			case ex.answer <- struct{}{}:
			default:
			}
			break
		}
	}
}

// headComing reports whether an answer's whole header block (up to its
// empty line) fits in r's buffer, reading as much as needed:
// http.ReadResponse itself would read a header of any length into
// memory, and in public mode a server is anyone's.
func headComing(r *bufio.Reader) bool {
	for {
		b, _ := r.Peek(r.Buffered())
		if !bytes.HasPrefix(b, []byte("HTTP/")) && (len(b) >= 5 || bytes.IndexByte(b, '\n') >= 0) {
			return false // not an answer: not followed
		}
		if bytes.Contains(b, []byte("\r\n\r\n")) || bytes.Contains(b, []byte("\n\n")) {
			return true
		}
		if len(b) == r.Size() {
			return false
		}
		if _, err := r.Peek(len(b) + 1); err != nil {
			return false
		}
	}
}

// maxEmptyLines is how many empty lines may come before a request line
// (RFC 9112 §2.2: a server ignores at least one); they are not forwarded.
const maxEmptyLines = 4

// readHead reads one header block, up to and including its empty line.
// Every line must end with CRLF and hold no other CR.
func readHead(r *bufio.Reader) ([]byte, error) {
	var head []byte
	empty := 0
	for {
		line, err := r.ReadSlice('\n')
		head = append(head, line...)
		if errors.Is(err, bufio.ErrBufferFull) && len(head) <= maxSniff {
			continue
		}
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				return head, malformed("a header block over %d bytes", maxSniff)
			}
			if errors.Is(err, io.EOF) && len(head) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return head, err
		}
		if len(head) > maxSniff {
			return head, malformed("a header block over %d bytes", maxSniff)
		}
		// head ends with this line, which ends with '\n'.
		start := bytes.LastIndexByte(head[:len(head)-1], '\n') + 1
		l := head[start:]
		if len(l) < 2 || l[len(l)-2] != '\r' || bytes.IndexByte(l[:len(l)-2], '\r') >= 0 {
			return head, malformed("a line of the request does not end with CRLF")
		}
		if len(l) == 2 {
			if start == 0 {
				if empty++; empty > maxEmptyLines {
					return head, malformed("too many empty lines before a request")
				}
				head = head[:0]
				continue
			}
			return head, nil
		}
	}
}

// parseHead checks a header block strictly and parses it; names are the
// host names the request claims.
func parseHead(head []byte) (*http.Request, []string, error) {
	lines := bytes.Split(head[:len(head)-4], []byte("\r\n"))
	if !validRequestLine(lines[0]) {
		return nil, nil, malformed("malformed request line %q", clip(lines[0]))
	}
	var hosts []string
	var length, transfer bool
	for _, l := range lines[1:] {
		i := bytes.IndexByte(l, ':')
		if i <= 0 || !isToken(l[:i]) {
			return nil, nil, malformed("malformed header line %q", clip(l))
		}
		for _, c := range l[i+1:] {
			if c < 0x20 && c != '\t' || c == 0x7f {
				return nil, nil, malformed("a control byte in header %q", clip(l[:i]))
			}
		}
		switch strings.ToLower(string(l[:i])) {
		case "host":
			hosts = append(hosts, strings.TrimSpace(string(l[i+1:])))
		case "content-length":
			length = true
		case "transfer-encoding":
			transfer = true
		}
	}
	if len(hosts) > 1 {
		return nil, nil, malformed("more than one Host header")
	}
	if length && transfer {
		return nil, nil, malformed("both Content-Length and Transfer-Encoding")
	}
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
	if err != nil {
		return nil, nil, malformed("%v", err)
	}
	if req.URL.Host != "" { // absolute or CONNECT target: it names the host too
		hosts = append([]string{req.URL.Host}, hosts...)
	}
	var names []string
	for _, h := range hosts {
		if n, _, err := net.SplitHostPort(h); err == nil {
			h = n
		}
		h = strings.Trim(h, "[]")
		if len(names) == 0 || !strings.EqualFold(names[0], h) {
			names = append(names, h)
		}
	}
	return req, names, nil
}

// clip shortens what an error quotes.
func clip(b []byte) []byte {
	if len(b) > 80 {
		return b[:80]
	}
	return b
}

// isToken reports whether b is a non-empty RFC 9110 token.
func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !tokenByte(c) {
			return false
		}
	}
	return true
}

func tokenByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// validRequestLine reports whether l (without its CRLF) is a strict
// HTTP/1.0 or HTTP/1.1 request line: a token method, one space, a target
// of visible ASCII, one space, the version.
func validRequestLine(l []byte) bool {
	sp := bytes.IndexByte(l, ' ')
	if sp <= 0 || !isToken(l[:sp]) {
		return false
	}
	rest := l[sp+1:]
	sp = bytes.IndexByte(rest, ' ')
	if sp <= 0 {
		return false
	}
	for _, c := range rest[:sp] {
		if c <= 0x20 || c >= 0x7f {
			return false
		}
	}
	v := string(rest[sp+1:])
	return v == "HTTP/1.1" || v == "HTTP/1.0"
}

// forwardChunked carries a chunked body and its trailer, strictly: each
// size line is hex digits with an optional extension, each chunk's data
// ends with CRLF.
func forwardChunked(r *bufio.Reader, w io.Writer) error {
	for {
		line, err := readLine(r)
		if err != nil {
			return err
		}
		if _, err := w.Write(line); err != nil {
			return err
		}
		size, err := chunkHeader(line)
		if err != nil {
			return err
		}
		if size == 0 {
			for { // trailer fields, then the empty line
				line, err := readLine(r)
				if err != nil {
					return err
				}
				if _, err := w.Write(line); err != nil {
					return err
				}
				if len(line) == 2 {
					return nil
				}
			}
		}
		if _, err := io.CopyN(w, r, size); err != nil {
			return err
		}
		var crlf [2]byte
		if _, err := io.ReadFull(r, crlf[:]); err != nil {
			return err
		}
		if crlf != [2]byte{'\r', '\n'} {
			return malformed("a chunk's data does not end with CRLF")
		}
		if _, err := w.Write(crlf[:]); err != nil {
			return err
		}
	}
}

// readLine reads one CRLF-ended line of a chunked body, at most 4 KiB.
func readLine(r *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		part, err := r.ReadSlice('\n')
		line = append(line, part...)
		if len(line) > 4096 {
			return nil, malformed("a chunk line over 4 KiB")
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if len(line) < 2 || line[len(line)-2] != '\r' || bytes.IndexByte(line[:len(line)-2], '\r') >= 0 {
			return nil, malformed("a chunk line does not end with CRLF")
		}
		return line, nil
	}
}

// chunkSize parses a chunk size: 1 to 15 hex digits.
// chunkHeader reads a chunk's size from its header line (extensions
// dropped).
func chunkHeader(line []byte) (int64, error) {
	field := line[:len(line)-2]
	if i := bytes.IndexByte(field, ';'); i >= 0 {
		field = field[:i]
	}
	size, ok := chunkSize(bytes.TrimRight(field, " \t"))
	if !ok {
		return 0, malformed("bad chunk size %q", clip(field))
	}
	return size, nil
}

func chunkSize(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 15 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		n = n<<4 | int64(d)
	}
	return n, true
}
