package egress

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
)

// Secrets injected at the gateway (issue 33). A policy's rules per
// destination (policy.NetworkRule) set headers on the plain HTTP requests
// that match them, their values holding ${secrets.NAME}; the sandbox
// holds at most the placeholder (an environment variable set to it, for
// one), never the value. For a sandbox whose policy has rules, each
// request is judged before any byte of it goes on:
//
//   - It matches a rule when every name it claims (Host, an absolute
//     target) is covered by the rule's host, the address the sandbox
//     dialled is one that a name the rule covers resolved to in this
//     sandbox (so Host: api.example.com sent to another address matches
//     nothing), its method is one of the rule's and its path (free of dot
//     segments, empty segments and escaped slashes) starts with the
//     rule's prefix.
//   - A matching request gets the rule's headers, any of the same name
//     the sandbox sent dropped, with each placeholder replaced by the
//     secret's current value (Secrets.Resolve, on every request: a new
//     version applies to the next request, a deleted one fails closed),
//     and placeholders the sandbox put in its own header values are
//     replaced too if they name a secret of that rule.
//   - A placeholder anywhere else (the request line, a header of a
//     request that matches no rule, a secret another rule names, the
//     body) refuses the request: the sandbox is answered 403
//     ERR_SECRET_MISDIRECTED, the flow closes, a security_violation
//     event (kind secret_misdirected) is emitted. The body is scanned as
//     it streams, holding back the last bytes of each write so that no
//     placeholder's start goes on before it is judged. The forms looked
//     for are ${secrets., E2B's ${e2b.secrets. and their
//     percent-encodings.
//   - A secret that cannot be resolved (deleted, unreadable, a value that
//     cannot be a header's) refuses the request, 502
//     ERR_SECRET_UNAVAILABLE: the placeholder is never sent instead.
//   - Every use, and every refused one, is given to Secrets.Used and
//     emitted as a secret.used event (secret, host, method, path,
//     outcome). No value is ever logged or in an event.
//
// Workload identity (issue 33, item 4) takes the same path: a rule's
// header may hold ${identity.token}, which becomes, on every request the
// rule covers, a token minted for this sandbox (Identity.Token: a JWT of
// the server's issuer, audience the rule's or the request's host, a life
// of minutes). The token exists only in that request, on the wire to the
// rule's host; the sandbox never holds it nor any key. The placeholder
// anywhere else is refused as a misdirected secret's is (its pseudo-name
// is identity.token, which no secret can have). Each mint is logged
// (jti, subject, audience, expiry) and emitted as a secret.used event of
// the secret identity.token with outcome minted.
//
// A sandbox whose policy has no rules takes none of these steps.

// Identity mints a sandbox's identity tokens.
type Identity interface {
	// Token returns a new token for the sandbox, for audience; an error
	// fails the request closed.
	Token(ctx context.Context, sandboxID, audience string) (IdentityToken, error)
}

// IdentityToken is a minted token and what the audit keeps of it.
type IdentityToken struct {
	JWT     string
	ID      string // jti
	Subject string
	Expires time.Time
}

// IdentitySecret is the pseudo-name of the identity placeholder in
// refusals, uses and events: no secret's name has a dot.
const IdentitySecret = "identity.token"

// OutcomeMinted is the outcome of a secret.used event of IdentitySecret:
// a token was minted into a request.
const OutcomeMinted = "minted"

// Secrets resolves the secrets a sandbox's rules inject, and records
// their uses.
type Secrets interface {
	// Resolve returns the current value of the secret name of the
	// account that owns the sandbox; an error fails the request closed.
	Resolve(ctx context.Context, sandboxID, name string) ([]byte, error)
	// Used records a use of a secret, or a refused one. It must not
	// block.
	Used(u SecretUse)
}

// SecretUse is one use of a secret by a sandbox's request.
type SecretUse struct {
	Secret    string
	SandboxID string
	Host      string
	Method    string
	Path      string
	Outcome   string // OutcomeInjected, OutcomeMisdirected, OutcomeUnavailable
	At        time.Time
}

// Outcomes of a SecretUse.
const (
	OutcomeInjected    = "injected"
	OutcomeMisdirected = "misdirected"
	OutcomeUnavailable = "unavailable"
)

// secretError refuses a request for a secret's sake, with the answer the
// sandbox gets.
type secretError struct {
	status int
	code   string
	msg    string
}

func (e *secretError) Error() string { return e.msg }

// answer is the HTTP answer that tells the sandbox why.
func (e *secretError) answer() []byte {
	body := e.code + ": " + e.msg + "\n"
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nX-Sheepfold-Error: %s\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		e.status, http.StatusText(e.status), e.code, len(body), body)
}

// Error codes of the answers (X-Sheepfold-Error).
const (
	codeMisdirected = "ERR_SECRET_MISDIRECTED"
	codeUnavailable = "ERR_SECRET_UNAVAILABLE"
)

var (
	secretsDot  = []byte("secrets.")
	identityDot = []byte("identity.")
)

// findPlaceholder returns where the first placeholder in b starts and
// the secret it names ("" when cut off), or -1: ${secrets.NAME},
// ${e2b.secrets.NAME} (E2B's form: "e2b." in any case, NAME lower-cased
// as E2B's names are), ${identity.NAME} (named IdentitySecret, whatever
// NAME) and their percent-encoded forms ($%7B, %24{, %24%7B, any case).
func findPlaceholder(b []byte) (int, string) {
	i, name := findMarked(b, secretsDot)
	if j, _ := findMarked(b, identityDot); j >= 0 && (i < 0 || j < i) {
		return j, IdentitySecret
	}
	return i, name
}

// findMarked is findPlaceholder for the placeholders whose name follows
// dot (optionally after E2B's "e2b.").
func findMarked(b, dot []byte) (int, string) {
	off := 0
	for {
		i := bytes.Index(b[off:], dot)
		if i < 0 {
			return -1, ""
		}
		i += off
		e2b := false
		if m := i - 4; m >= 0 && (b[m]|0x20) == 'e' && b[m+1] == '2' && (b[m+2]|0x20) == 'b' && b[m+3] == '.' {
			i, e2b = m, true
		}
		start := -1
		switch {
		case i >= 2 && b[i-2] == '$' && b[i-1] == '{':
			start = i - 2
		case i >= 4 && b[i-4] == '%' && b[i-3] == '2' && b[i-2] == '4' && b[i-1] == '{':
			start = i - 4
		case i >= 4 && b[i-4] == '$' && b[i-3] == '%' && b[i-2] == '7' && (b[i-1]|0x20) == 'b':
			start = i - 4
		case i >= 6 && b[i-6] == '%' && b[i-5] == '2' && b[i-4] == '4' && b[i-3] == '%' && b[i-2] == '7' && (b[i-1]|0x20) == 'b':
			start = i - 6
		}
		if e2b {
			i += 4
		}
		if start >= 0 {
			j := i + len(dot)
			k := j
			for k < len(b) && k-j < 64 && (b[k] == '_' || b[k] == '-' || b[k] >= 'a' && b[k] <= 'z' || b[k] >= 'A' && b[k] <= 'Z' || b[k] >= '0' && b[k] <= '9') {
				k++
			}
			name := string(b[j:k])
			if e2b {
				name = strings.ToLower(name)
			}
			return start, name
		}
		off = i + 1
	}
}

// scanHold is what a body scanner holds back of each write: the longest
// placeholder start (%24%7Be2b.secrets.) and a name, so that a
// placeholder cut between writes is seen whole.
const scanHold = 18 + 64

// scanWriter forwards a request's body, refusing it at the first
// placeholder before any byte of the placeholder goes on.
type scanWriter struct {
	w   io.Writer
	buf []byte
	bad func(name string) error // the refusal, given the secret named
}

func (s *scanWriter) Write(p []byte) (int, error) {
	s.buf = append(s.buf, p...)
	if i, name := findPlaceholder(s.buf); i >= 0 {
		return 0, s.bad(name)
	}
	if n := len(s.buf) - scanHold; n > 0 {
		if _, err := s.w.Write(s.buf[:n]); err != nil {
			return 0, err
		}
		s.buf = s.buf[:copy(s.buf, s.buf[n:])]
	}
	return len(p), nil
}

// end forwards what is held back once the body is done.
func (s *scanWriter) end() error {
	if len(s.buf) == 0 {
		return nil
	}
	_, err := s.w.Write(s.buf)
	s.buf = s.buf[:0]
	return err
}

// scanChunked carries a chunked body whose data is scanned as one stream
// (a placeholder may be cut between chunks): it is read strictly, as
// forwardChunked reads, and sent again in chunks of what the scanner lets
// through; chunk extensions are dropped, trailer fields are scanned too.
func scanChunked(r *bufio.Reader, w io.Writer, bad func(name string) error) error {
	sc := &scanWriter{w: chunkWriter{w}, bad: bad}
	for {
		line, err := readLine(r)
		if err != nil {
			return err
		}
		size, err := chunkHeader(line)
		if err != nil {
			return err
		}
		if size == 0 {
			break
		}
		if _, err := io.CopyN(sc, r, size); err != nil {
			return err
		}
		var crlf [2]byte
		if _, err := io.ReadFull(r, crlf[:]); err != nil {
			return err
		}
		if crlf != [2]byte{'\r', '\n'} {
			return malformed("a chunk's data does not end with CRLF")
		}
	}
	var trailer []byte
	for {
		line, err := readLine(r)
		if err != nil {
			return err
		}
		if i, name := findPlaceholder(line); i >= 0 {
			return bad(name)
		}
		if trailer = append(trailer, line...); len(trailer) > maxSniff {
			return malformed("a trailer over %d bytes", maxSniff)
		}
		if len(line) == 2 {
			break
		}
	}
	if err := sc.end(); err != nil {
		return err
	}
	_, err := w.Write(append([]byte("0\r\n"), trailer...))
	return err
}

// chunkWriter writes each write as one chunk.
type chunkWriter struct{ w io.Writer }

func (c chunkWriter) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	b := make([]byte, 0, len(p)+20)
	b = append(strconv.AppendInt(b, int64(len(p)), 16), '\r', '\n')
	b = append(append(b, p...), '\r', '\n')
	if _, err := c.w.Write(b); err != nil {
		return 0, err
	}
	return len(p), nil
}

// injection is a request's judgement under a policy with rules.
type injection struct {
	host, method, path string
}

// inject judges a request of a sandbox whose policy has rules and
// returns the header block to forward in its place.
func (f *flow) inject(pol *policy.Egress, req *http.Request, names []string, head []byte) ([]byte, error) {
	g := f.g
	in := injection{method: req.Method, path: req.URL.EscapedPath()}
	if len(names) > 0 {
		in.host, _ = policy.NormalizeName(names[0])
	}
	rule := g.ruleFor(pol, f.dst.Addr(), names, in)
	if f.sni != "" && in.host != f.sni {
		rule = nil // over terminated TLS, only the name the real host's certificate was verified for
	}
	if rule == nil {
		if i, name := findPlaceholder(head); i >= 0 {
			where := "a header"
			if i < bytes.IndexByte(head, '\n') {
				where = "the request line"
			}
			return nil, f.misdirected(in, name, where+" of a request no rule of the policy covers")
		}
		return head, nil
	}
	lines := bytes.Split(head[:len(head)-4], []byte("\r\n"))
	if i, name := findPlaceholder(lines[0]); i >= 0 {
		return nil, f.misdirected(in, name, "the request line (placeholders are only substituted in headers)")
	}
	// The secrets this request uses: the rule's headers', and those the
	// sandbox's own headers name.
	use := slices.Clone(rule.Secrets)
	kept := make([][]byte, 0, len(lines)+len(rule.Headers))
	kept = append(kept, lines[0])
	for _, l := range lines[1:] {
		colon := bytes.IndexByte(l, ':')
		name := http.CanonicalHeaderKey(string(l[:colon]))
		if slices.ContainsFunc(rule.Headers, func(h policy.HeaderTransform) bool { return h.Name == name }) {
			continue // replaced
		}
		if i, _ := findPlaceholder(l); i >= 0 {
			v := string(l[colon+1:])
			named, _ := policy.Placeholders(v)
			for _, s := range named {
				if !slices.Contains(rule.Secrets, s) {
					return nil, f.misdirected(in, s, fmt.Sprintf("header %s (rule %d does not name this secret)", name, rule.Index))
				}
			}
			rest := policy.Substitute(v, func(string) string { return "" })
			if strings.Contains(rest, policy.IdentityPlaceholder) && !rule.Identity {
				return nil, f.misdirected(in, IdentitySecret, fmt.Sprintf("header %s (rule %d mints no identity token)", name, rule.Index))
			}
			if rule.Identity {
				rest = strings.ReplaceAll(rest, policy.IdentityPlaceholder, "")
			}
			// Whatever is left once the rule's placeholders are gone is
			// a misdirected one (percent-encoded, malformed).
			if j, s := findPlaceholder([]byte(rest)); j >= 0 {
				return nil, f.misdirected(in, s, "header "+name+" (only ${secrets.NAME}, ${e2b.secrets.NAME} and "+policy.IdentityPlaceholder+" are substituted)")
			}
		}
		kept = append(kept, l)
	}
	values := make(map[string]string, len(use))
	for _, s := range use {
		v, err := g.resolve(f.ctx, s)
		if err != nil {
			g.log.Warn("egress denied: a secret could not be resolved", "secret", s, "host", in.host, "method", in.method, "path", in.path, "err", err)
			f.used(in, s, OutcomeUnavailable)
			return nil, &secretError{status: http.StatusBadGateway, code: codeUnavailable,
				msg: fmt.Sprintf("secret %q is not available (deleted, or its value cannot be a header's): the request was not sent", s)}
		}
		values[s] = v
	}
	var tok IdentityToken
	if rule.Identity {
		aud := rule.Audience
		if aud == "" {
			aud = in.host
		}
		var err error
		if tok, err = g.mint(f.ctx, aud); err != nil {
			g.log.Warn("egress denied: an identity token could not be minted", "host", in.host, "method", in.method, "path", in.path, "err", err)
			f.used(in, IdentitySecret, OutcomeUnavailable)
			return nil, &secretError{status: http.StatusBadGateway, code: codeUnavailable,
				msg: "no identity token could be minted: the request was not sent"}
		}
		g.log.Info("egress identity token minted", "host", in.host, "method", in.method, "path", in.path, "rule", rule.Index,
			"jti", tok.ID, "sub", tok.Subject, "aud", aud, "exp", tok.Expires)
		g.opt.Events.Emit(events.Event{
			Type: events.SecretUsed, SandboxID: g.id,
			Details: map[string]any{"secret": IdentitySecret, "host": in.host, "method": in.method, "path": clipPath(in.path), "outcome": OutcomeMinted,
				"jti": tok.ID, "subject": tok.Subject, "audience": aud, "expires_at": tok.Expires.UTC().Format(time.RFC3339)},
		})
	}
	sub := func(v string) string {
		if rule.Identity {
			v = strings.ReplaceAll(v, policy.IdentityPlaceholder, tok.JWT)
		}
		return policy.Substitute(v, func(n string) string { return values[n] })
	}
	out := make([]byte, 0, len(head)+256)
	for i, l := range kept {
		if i > 0 && (policy.HasPlaceholder(l) || rule.Identity && bytes.Contains(l, []byte(policy.IdentityPlaceholder))) {
			colon := bytes.IndexByte(l, ':')
			l = append(l[:colon+1:colon+1], sub(string(l[colon+1:]))...)
		}
		out = append(append(out, l...), '\r', '\n')
	}
	for _, h := range rule.Headers {
		out = append(append(append(append(out, h.Name...), ": "...), sub(h.Value)...), '\r', '\n')
	}
	out = append(out, '\r', '\n')
	for _, s := range use {
		f.used(in, s, OutcomeInjected)
	}
	g.log.Info("egress secrets injected", "host", in.host, "method", in.method, "path", in.path, "rule", rule.Index, "secrets", use)
	return out, nil
}

// mint returns a new identity token of the sandbox for audience.
func (g *Gateway) mint(ctx context.Context, audience string) (IdentityToken, error) {
	if g.opt.Identity == nil {
		return IdentityToken{}, fmt.Errorf("the gateway has no identity")
	}
	tok, err := g.opt.Identity.Token(ctx, g.id, audience)
	if err != nil {
		return IdentityToken{}, err
	}
	// A token is base64url segments and dots; anything else could not
	// be a header's value.
	for _, c := range []byte(tok.JWT) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return IdentityToken{}, fmt.Errorf("the token holds %q", c)
		}
	}
	return tok, nil
}

// ruleFor returns the rule that covers the request, or nil: every name
// it claims is the rule's host, and the address dialled is one a name the
// rule covers resolved to in this sandbox.
func (g *Gateway) ruleFor(pol *policy.Egress, dst netip.Addr, names []string, in injection) *policy.InjectRule {
	if in.host == "" {
		return nil
	}
	for _, n := range names[1:] {
		if m, _ := policy.NormalizeName(n); m != in.host {
			return nil
		}
	}
	rule := pol.Rule(in.host, in.method, in.path)
	if rule == nil {
		return nil
	}
	for _, n := range g.namesOf(dst) {
		if rule.MatchName(n) {
			return rule
		}
	}
	return nil
}

// resolve returns a secret's value, fit for a header.
func (g *Gateway) resolve(ctx context.Context, name string) (string, error) {
	if g.opt.Secrets == nil {
		return "", fmt.Errorf("the gateway has no secrets")
	}
	v, err := g.opt.Secrets.Resolve(ctx, g.id, name)
	if err != nil {
		return "", err
	}
	for _, c := range v {
		if c < 0x20 && c != '\t' || c == 0x7f {
			return "", fmt.Errorf("the value holds a control byte")
		}
	}
	return string(v), nil
}

// misdirected refuses a request that carries a placeholder where it is
// not substituted.
func (f *flow) misdirected(in injection, secret, where string) error {
	g := f.g
	g.report(deny(events.KindSecretMisdirected, fmt.Sprintf("placeholder of secret %q in %s", secret, where)), protoHTTP, in.host+" at "+f.target)
	f.used(in, secret, OutcomeMisdirected)
	return &secretError{status: http.StatusForbidden, code: codeMisdirected,
		msg: fmt.Sprintf("a placeholder of secret %q in %s: refused, the connection is closed", secret, where)}
}

// used records a use of a secret and emits it as an event.
func (f *flow) used(in injection, secret, outcome string) {
	g := f.g
	u := SecretUse{Secret: secret, SandboxID: g.id, Host: in.host, Method: in.method, Path: clipPath(in.path), Outcome: outcome, At: time.Now().UTC()}
	if g.opt.Secrets != nil {
		g.opt.Secrets.Used(u)
	}
	g.opt.Events.Emit(events.Event{
		Type: events.SecretUsed, SandboxID: g.id,
		Details: map[string]any{"secret": u.Secret, "host": u.Host, "method": u.Method, "path": u.Path, "outcome": u.Outcome},
	})
}

// clipPath bounds a path recorded with a use.
func clipPath(p string) string {
	if len(p) > 256 {
		p = p[:256]
	}
	return strings.ToValidUTF8(p, "?")
}
