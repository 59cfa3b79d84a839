package policy

import (
	"bytes"
	"encoding/base64"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Output filtering (OutputFiltering): pure functions over text, applied by
// the engine on the host to an execution's stdout, stderr, results and
// error. Everything here is compiled once (package variables) or once per
// execution (NewOutputFilter); a chunk with nothing that could start a
// secret costs a few substring searches.
//
// Redaction (strip_sensitive_data) replaces each secret with
// "[REDACTED:<kind>]":
//
//	api_key            sk-... keys (OpenAI, Anthropic and the like)
//	aws_access_key     AKIA... / ASIA... access key ids
//	github_token       ghp_, gho_, ghu_, ghs_, ghr_ tokens and github_pat_...
//	slack_token        xoxa-, xoxb-, xoxp-, xoxo-, xoxs-, xoxr- tokens
//	bearer_token       the token after "Bearer " (the word is kept)
//	jwt                eyJ....eyJ....signature
//	private_key        a PEM private key block, BEGIN to END
//	url_password       the password of scheme://user:password@host (the rest is kept)
//	email              e-mail addresses
//	secret_env         the value of one of the sandbox's secret env vars
//	secret_env_base64  the same value base64-encoded (standard or URL alphabet,
//	                   at any alignment inside a longer encoded text)
//
// Which env vars are secret (SecretEnv): a name containing KEY, SECRET,
// TOKEN, PASS, CREDENTIAL, AUTH, PRIVATE, SESSION, COOKIE or DSN (any
// case), with a value of at least 8 bytes. Shorter values would redact
// ordinary words.
//
// Streams are redacted as they flow (Redactor): text is released a line
// at a time, so a secret split across two writes is still whole when it
// is matched. A line longer than MaxHold is released in pieces (cut at
// whitespace where there is some), so the hold-back stays bounded: a
// single token longer than that may be cut. Once a PEM private key block
// begins, everything up to its END line is dropped as it comes.
//
// A secret env value is also found with line breaks anywhere in it
// (print(key[:10]); print(key[10:]), or a value that has line breaks of
// its own printed with other ones): it is matched against the text with
// its line breaks (\n, \r) skipped, and the stream holds back a line
// whose end could be the start of one until what follows shows whether
// it is (at most MaxHold bytes of line breaks in between). The patterns
// and the base64 forms are matched within a line only.

// MaxHold bounds the text a Redactor holds back waiting for a line end.
const MaxHold = 4096

// minSecretLen is the shortest env value treated as a secret.
const minSecretLen = 8

var secretNameParts = []string{"KEY", "SECRET", "TOKEN", "PASS", "CREDENTIAL", "AUTH", "PRIVATE", "SESSION", "COOKIE", "DSN"}

// SecretEnv reports whether an env var's value is redacted as a secret.
func SecretEnv(name, value string) bool {
	if len(value) < minSecretLen {
		return false
	}
	up := strings.ToUpper(name)
	for _, p := range secretNameParts {
		if strings.Contains(up, p) {
			return true
		}
	}
	return false
}

// pattern is one kind of secret found by a regular expression. When the
// expression has a group, only the group is replaced.
type pattern struct {
	kind     string
	re       *regexp.Regexp
	triggers []string // the text can only match if it contains one of these
}

var patterns = []pattern{
	{"api_key", regexp.MustCompile(`\bsk-[A-Za-z0-9_-]{20,}`), []string{"sk-"}},
	{"aws_access_key", regexp.MustCompile(`\b(?:AKIA|ASIA)[A-Z0-9]{16}\b`), []string{"AKIA", "ASIA"}},
	{"github_token", regexp.MustCompile(`\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})`),
		[]string{"ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"}},
	{"slack_token", regexp.MustCompile(`\bxox[abposr]-[A-Za-z0-9-]{10,}`), []string{"xox"}},
	{"jwt", regexp.MustCompile(`\beyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*`), []string{"eyJ"}},
	{"bearer_token", regexp.MustCompile(`(?i)\bbearer[ \t]+([A-Za-z0-9._~+/-]{8,}=*)`), []string{"earer", "EARER"}},
	{"url_password", regexp.MustCompile(`\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:([^\s/@]+)@`), []string{"@"}},
	{"email", regexp.MustCompile(`\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b`), []string{"@"}},
}

var (
	pemBegin = regexp.MustCompile(`-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----`)
	pemEnd   = regexp.MustCompile(`-----END[A-Z0-9 ]*PRIVATE KEY-----`)
)

const pemTrigger = "-----BEGIN"

// pemEndHold is how much of a dropped PEM body is kept to find an END
// line split across writes.
const pemEndHold = 64

// literal is a secret known by value.
type literal struct {
	value []byte
	kind  string
	// split is the value without its line breaks, matched with line
	// breaks anywhere (secret_env values of at least minSecretLen other
	// bytes); nil when only the exact value is matched.
	split []byte
}

// OutputFilter is one execution's output filtering, built by
// NewOutputFilter. A nil *OutputFilter filters nothing. It is not
// changed after NewOutputFilter, so one may serve many streams at once.
type OutputFilter struct {
	maxLen   int64 // 0: no cap
	redact   bool
	sanitize bool
	literals []literal
	maxSplit int // the longest split form
}

// NewOutputFilter returns the filter of of with the sandbox's env vars
// (the secret ones are redacted), or nil when of asks for nothing.
func NewOutputFilter(of *OutputFiltering, env ...map[string]string) *OutputFilter {
	if of == nil {
		return nil
	}
	f := &OutputFilter{
		redact:   of.StripSensitiveData != nil && *of.StripSensitiveData,
		sanitize: of.SanitizeErrors != nil && *of.SanitizeErrors,
	}
	if of.MaxOutputLength != nil && *of.MaxOutputLength > 0 {
		f.maxLen = *of.MaxOutputLength
	}
	if !f.redact && !f.sanitize && f.maxLen == 0 {
		return nil
	}
	if f.redact {
		seen := map[string]bool{}
		for _, m := range env {
			for name, v := range m {
				if SecretEnv(name, v) && !seen[v] {
					seen[v] = true
					f.addSecret(v)
				}
			}
		}
	}
	return f
}

// addSecret adds a secret value and its base64 forms.
func (f *OutputFilter) addSecret(v string) {
	f.addLiteral(v, "secret_env")
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		for k := 0; k < 3; k++ {
			// The characters of base64(k other bytes + v) that depend on
			// v alone: char j covers bits [6j, 6j+6), v bits [8k, 8(k+len)).
			full := enc.EncodeToString(append(make([]byte, k), v...))
			from, to := (8*k+5)/6, (8*(k+len(v))-6)/6+1
			if to-from >= minSecretLen {
				f.addLiteral(full[from:to], "secret_env_base64")
			}
		}
	}
}

func (f *OutputFilter) addLiteral(v, kind string) {
	for _, l := range f.literals {
		if string(l.value) == v {
			return
		}
	}
	l := literal{value: []byte(v), kind: kind}
	if kind == "secret_env" {
		if c := dropBreaks([]byte(v)); len(c) >= minSecretLen {
			l.split = c
			f.maxSplit = max(f.maxSplit, len(c))
		}
	}
	f.literals = append(f.literals, l)
}

func isBreak(c byte) bool { return c == '\n' || c == '\r' }

// dropBreaks returns b without its line breaks (b itself when it has none).
func dropBreaks(b []byte) []byte {
	if !bytes.ContainsAny(b, "\r\n") {
		return b
	}
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if !isBreak(c) {
			out = append(out, c)
		}
	}
	return out
}

// MaxOutputLength is the cap on stdout plus stderr, in bytes (0: none).
func (f *OutputFilter) MaxOutputLength() int64 {
	if f == nil {
		return 0
	}
	return f.maxLen
}

// Redacts reports whether the filter redacts secrets.
func (f *OutputFilter) Redacts() bool { return f != nil && f.redact }

// Sanitizes reports whether the filter sanitizes errors.
func (f *OutputFilter) Sanitizes() bool { return f != nil && f.sanitize }

// Text filters a whole text (a result's rendering, an error's value):
// redaction, then the length cap with its marker.
func (f *OutputFilter) Text(s string) string {
	if f == nil {
		return s
	}
	if f.redact {
		s = f.Redact(s)
	}
	if f.maxLen > 0 {
		s, _ = CutText(s, f.maxLen)
	}
	return s
}

// JSON redacts a decoded JSON value (a result's application/json, a
// data frame's data): each string, key or value, at any depth, so the
// structure stays valid JSON. Numbers, booleans and null pass. v is not
// modified; the redacted copy is returned. The length cap applies to the
// whole value, not to each string (the caller's: Cap.TakeWhole).
func (f *OutputFilter) JSON(v any) any {
	if !f.Redacts() {
		return v
	}
	switch x := v.(type) {
	case string:
		return f.Redact(x)
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = f.JSON(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[f.Redact(k)] = f.JSON(e)
		}
		return out
	}
	return v
}

// TextualMIME reports whether a MIME type carries text (text/*, JSON,
// XML, JavaScript) rather than binary data such as a base64 image.
func TextualMIME(mime string) bool {
	mime, _, _ = strings.Cut(mime, ";")
	return strings.HasPrefix(mime, "text/") || strings.HasSuffix(mime, "/json") || strings.HasSuffix(mime, "+json") ||
		strings.HasSuffix(mime, "/xml") || strings.HasSuffix(mime, "+xml") || mime == "application/javascript"
}

// Redact redacts a whole text.
func (f *OutputFilter) Redact(s string) string {
	if !f.Redacts() || !f.mayMatch([]byte(s)) {
		return s
	}
	r := f.NewRedactor()
	out := r.Write([]byte(s))
	return string(append(out, r.Flush()...))
}

// mayMatch reports whether b could hold (the start of) a secret: the
// fast path for output with nothing to redact.
func (f *OutputFilter) mayMatch(b []byte) bool {
	for _, p := range patterns {
		for _, t := range p.triggers {
			if bytes.Contains(b, []byte(t)) {
				return true
			}
		}
	}
	if bytes.Contains(b, []byte(pemTrigger)) {
		return true
	}
	for _, l := range f.literals {
		if bytes.Contains(b, l.value) {
			return true
		}
	}
	if f.maxSplit > 0 && bytes.ContainsAny(b, "\r\n") {
		c := dropBreaks(b)
		for _, l := range f.literals {
			if l.split != nil && bytes.Contains(c, l.split) {
				return true
			}
		}
	}
	return false
}

// span is a secret found in a text: [start, end) is replaced by the
// marker of kind. open means it reaches the end of the text and might
// go on in what comes next.
type span struct {
	start, end int
	kind       string
	open       bool
	pemOpen    bool // a PEM block whose END has not come yet
}

// find returns the non-overlapping secrets of b, in order.
func (f *OutputFilter) find(b []byte) []span {
	var spans []span
	add := func(s span) {
		s.open = s.end == len(b)
		spans = append(spans, s)
	}
	if bytes.Contains(b, []byte(pemTrigger)) {
		for _, loc := range pemBegin.FindAllIndex(b, -1) {
			if len(spans) > 0 && loc[0] < spans[len(spans)-1].end {
				continue // inside the block before
			}
			if end := pemEnd.FindIndex(b[loc[1]:]); end != nil {
				add(span{start: loc[0], end: loc[1] + end[1], kind: "private_key"})
			} else {
				add(span{start: loc[0], end: len(b), kind: "private_key", pemOpen: true})
			}
		}
	}
	for _, p := range patterns {
		hit := false
		for _, t := range p.triggers {
			if bytes.Contains(b, []byte(t)) {
				hit = true
				break
			}
		}
		if !hit {
			continue
		}
		urls := len(spans)
		for _, loc := range p.re.FindAllSubmatchIndex(b, -1) {
			s, e := loc[0], loc[1]
			if len(loc) >= 4 && loc[2] >= 0 {
				s, e = loc[2], loc[3]
			}
			if p.kind == "email" && insideURL(spans[:urls], s) {
				continue // user:password@host is a url_password, not an address
			}
			add(span{start: s, end: e, kind: p.kind})
		}
	}
	for _, l := range f.literals {
		for off := 0; ; {
			i := bytes.Index(b[off:], l.value)
			if i < 0 {
				break
			}
			start, end := off+i, off+i+len(l.value)
			if l.kind == "secret_env_base64" {
				// The characters around the part that depends on the
				// secret alone still carry some of its bits.
				for n := 0; n < 3 && start > 0 && isBase64(b[start-1]); n++ {
					start--
				}
				for n := 0; n < 3 && end < len(b) && isBase64(b[end]); n++ {
					end++
				}
				for n := 0; n < 2 && end < len(b) && b[end] == '='; n++ {
					end++
				}
			}
			add(span{start: start, end: end, kind: l.kind})
			off = end
		}
	}
	if f.maxSplit > 0 && bytes.ContainsAny(b, "\r\n") {
		for _, s := range f.findSplit(b) {
			add(s)
		}
	}
	if len(spans) < 2 {
		return spans
	}
	// Earliest first, longest first at the same start; drop overlaps by
	// merging into the earlier span.
	sortSpans(spans)
	out := spans[:1]
	for _, s := range spans[1:] {
		last := &out[len(out)-1]
		if s.start < last.end {
			if s.end > last.end {
				last.end, last.open = s.end, s.open
				last.pemOpen = last.pemOpen || s.pemOpen
			}
			continue
		}
		out = append(out, s)
	}
	return out
}

// findSplit finds the secret env values of b with line breaks in them
// (b's, or the value's own in other places): each found in b without its
// line breaks, and mapped back to the span of b from its first byte to
// its last.
func (f *OutputFilter) findSplit(b []byte) []span {
	c := make([]byte, 0, len(b))
	at := make([]int32, 0, len(b)) // c[i] is b[at[i]]
	for i, ch := range b {
		if !isBreak(ch) {
			c = append(c, ch)
			at = append(at, int32(i))
		}
	}
	var out []span
	for _, l := range f.literals {
		if l.split == nil {
			continue
		}
		for off := 0; ; {
			i := bytes.Index(c[off:], l.split)
			if i < 0 {
				break
			}
			first, last := off+i, off+i+len(l.split)-1
			out = append(out, span{start: int(at[first]), end: int(at[last]) + 1, kind: l.kind})
			off = last + 1
		}
	}
	return out
}

// splitHold is where a stream must stop releasing b[:cut] so that a line
// end that could be the start of a secret env value waits for what
// follows: the start of the longest tail of b[:cut] (line breaks
// skipped) that begins a split value, or cut when none does. It looks
// back at most MaxHold bytes.
func (f *OutputFilter) splitHold(b []byte, cut int) int {
	if f.maxSplit == 0 || cut == 0 {
		return cut
	}
	// The last maxSplit-1 bytes before cut that are not line breaks,
	// and where each is in b.
	want := f.maxSplit - 1
	tail := make([]byte, 0, want)
	at := make([]int, 0, want)
	for i := cut - 1; i >= 0 && i >= cut-MaxHold && len(tail) < want; i-- {
		if !isBreak(b[i]) {
			tail = append(tail, b[i])
			at = append(at, i)
		}
	}
	slices.Reverse(tail)
	slices.Reverse(at)
	hold := cut
	for _, l := range f.literals {
		if l.split == nil {
			continue
		}
		// Each place in the tail where the value's first byte is: does
		// the rest of the tail begin the value?
		for j := 0; j < len(tail); j++ {
			k := bytes.IndexByte(tail[j:], l.split[0])
			if k < 0 {
				break
			}
			j += k
			if n := len(tail) - j; n < len(l.split) && bytes.Equal(tail[j:], l.split[:n]) {
				hold = min(hold, at[j])
				break // the earliest start for this value
			}
		}
	}
	return hold
}

func isBase64(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '+' || c == '/' || c == '-' || c == '_'
}

// insideURL reports whether a url_password span starts at pos.
func insideURL(spans []span, pos int) bool {
	for _, s := range spans {
		if s.kind == "url_password" && s.start == pos {
			return true
		}
	}
	return false
}

func sortSpans(s []span) {
	// Insertion sort: there are few spans.
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && (s[j].start < s[j-1].start || s[j].start == s[j-1].start && s[j].end > s[j-1].end); j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// marker is what replaces a secret of kind.
func marker(kind string) string { return "[REDACTED:" + kind + "]" }

// Redactor redacts one stream (stdout or stderr) as it is written. It is
// not safe for concurrent use.
type Redactor struct {
	f       *OutputFilter
	pending []byte // held back: the unfinished line
	inPEM   bool   // dropping a private key until its END line
}

// NewRedactor returns a stream redactor of f (nil f: text passes as is).
func (f *OutputFilter) NewRedactor() *Redactor { return &Redactor{f: f} }

// Write takes the next chunk of the stream and returns the text that can
// be released now, redacted. The rest is held back for the next Write or
// Flush.
func (r *Redactor) Write(p []byte) []byte {
	if !r.f.Redacts() {
		return p
	}
	return r.process(append(r.pending, p...), false)
}

// Flush releases everything held back, redacted: the end of the stream.
func (r *Redactor) Flush() []byte {
	if !r.f.Redacts() || len(r.pending) == 0 && !r.inPEM {
		return nil
	}
	out := r.process(r.pending, true)
	r.inPEM = false
	return out
}

func (r *Redactor) process(b []byte, final bool) []byte {
	var out []byte
	if r.inPEM {
		loc := pemEnd.FindIndex(b)
		if loc == nil {
			// Still inside the key: drop it, keeping a tail that might
			// hold the start of a split END line.
			if !final && len(b) > pemEndHold {
				b = b[len(b)-pemEndHold:]
			}
			r.pending = append(r.pending[:0], b...)
			if final {
				r.pending = nil
			}
			return nil
		}
		r.inPEM = false
		b = b[loc[1]:]
	}
	cut := len(b)
	if !final {
		cut = r.f.splitHold(b, releasePoint(b))
	}
	// Fast path: nothing that could be a secret.
	if !r.f.mayMatch(b) {
		out = append(out, b[:cut]...)
		r.pending = append([]byte(nil), b[cut:]...)
		return out
	}
	spans := r.f.find(b)
	if !final {
		for _, s := range spans {
			if s.start < cut && s.end > cut {
				if s.open && !s.pemOpen {
					cut = s.start // it may go on: wait for the rest
				} else {
					cut = s.end
				}
				break
			}
		}
	}
	pos := 0
	for _, s := range spans {
		if s.start >= cut {
			break
		}
		out = append(out, b[pos:s.start]...)
		out = append(out, marker(s.kind)...)
		pos = s.end
		if s.pemOpen {
			// The key's END has not come: drop what follows until it does.
			r.inPEM = !final
			r.pending = nil
			if !final && len(b)-s.start > pemEndHold {
				r.pending = append([]byte(nil), b[len(b)-pemEndHold:]...)
			}
			return out
		}
	}
	if pos < cut {
		out = append(out, b[pos:cut]...)
	}
	r.pending = append([]byte(nil), b[cut:]...)
	return out
}

// releasePoint is how much of b can be released: up to the last line
// end, or, when the unfinished line is longer than MaxHold, all but its
// last MaxHold/2 bytes, cut at whitespace where there is some.
func releasePoint(b []byte) int {
	cut := bytes.LastIndexAny(b, "\n\r") + 1
	if len(b)-cut <= MaxHold {
		return cut
	}
	force := len(b) - MaxHold/2
	if ws := bytes.LastIndexAny(b[cut:force], " \t"); ws >= 0 {
		return cut + ws + 1
	}
	return force
}

// Cap limits the bytes of one answer (an execution's stdout, stderr,
// results and error; a command's output) and counts what it drops. The
// truncation markers are not counted: an answer holds at most Limit
// bytes of output plus the marker of the one field the cap cut and the
// final one.
type Cap struct {
	Limit   int64 // 0: no limit
	Used    int64
	Dropped int64
}

// Take returns the part of p within the cap (never splitting a UTF-8
// sequence) and counts the rest as dropped.
func (c *Cap) Take(p []byte) []byte {
	if c.Limit <= 0 {
		return p
	}
	room := c.Limit - c.Used
	if room >= int64(len(p)) {
		c.Used += int64(len(p))
		return p
	}
	keep := utf8Prefix(p, max(room, 0))
	c.Used += int64(len(keep))
	c.Dropped += int64(len(p) - len(keep))
	return keep
}

// TakeText takes one whole field (a result's rendering, an error's
// value): all of it when it fits; else what fits, at a UTF-8 boundary,
// with the marker when anything of it is kept (the field that crosses
// the cap says so), or "" once the cap is spent.
func (c *Cap) TakeText(s string) string {
	if c.Limit <= 0 || int64(len(s)) <= c.Limit-c.Used {
		c.Used += int64(len(s))
		return s
	}
	keep := string(c.Take([]byte(s)))
	if keep == "" {
		return ""
	}
	return keep + truncMarker(int64(len(s)-len(keep)))
}

// TakeWhole takes n bytes that cannot be cut (an image, a JSON document):
// true when they fit; else they are counted as dropped and nothing is
// taken.
func (c *Cap) TakeWhole(n int64) bool {
	if c.Limit <= 0 || n <= c.Limit-c.Used {
		c.Used += n
		return true
	}
	c.Dropped += n
	return false
}

// Marker says how much was dropped, or is empty when nothing was.
func (c *Cap) Marker() string {
	if c.Dropped == 0 {
		return ""
	}
	return truncMarker(c.Dropped)
}

func truncMarker(n int64) string {
	return "\n[truncated: " + strconv.FormatInt(n, 10) + " more bytes dropped by max_output_length]\n"
}

// CutText cuts s to max bytes (at a UTF-8 boundary) and appends a marker
// saying how much was dropped; dropped is 0 when s fits.
func CutText(s string, max int64) (out string, dropped int64) {
	if max <= 0 || int64(len(s)) <= max {
		return s, 0
	}
	keep := utf8Prefix([]byte(s), max)
	dropped = int64(len(s) - len(keep))
	return string(keep) + truncMarker(dropped), dropped
}

// utf8Prefix returns the longest prefix of p of at most n bytes that does
// not end inside a UTF-8 sequence.
func utf8Prefix(p []byte, n int64) []byte {
	if int64(len(p)) <= n {
		return p
	}
	p = p[:n]
	// Step back over an incomplete trailing sequence.
	for i := len(p) - 1; i >= 0 && i >= len(p)-3; i-- {
		c := p[i]
		if c < 0x80 {
			break
		}
		if c >= 0xC0 { // a start byte: is its sequence complete?
			need := 2
			if c >= 0xF0 {
				need = 4
			} else if c >= 0xE0 {
				need = 3
			}
			if len(p)-i < need {
				p = p[:i]
			}
			break
		}
	}
	return p
}

// Sanitizing errors (sanitize_errors): the interpreter's own frames and
// the paths of the template's and the host's files leave tracebacks; the
// frames of the user's cells (and the lines of code they show) stay.

var (
	// A Python frame line; its source and caret lines follow, indented.
	pyFrame = regexp.MustCompile(`^  File "([^"]*)", line \d+`)
	// A Node stack frame.
	jsFrame = regexp.MustCompile(`^\s+at `)

	pathRules = []struct {
		re   *regexp.Regexp
		with string
	}{
		{regexp.MustCompile(`/var/lib/sheepfold[^\s"':,)]*`), "<host>"},
		{regexp.MustCompile(`/\.sheepfold/[^\s"':,)]*`), "<sheepfold>"},
		{regexp.MustCompile(`(?:/[^\s"':,()/]+)*/(?:site-packages|dist-packages|node_modules)/`), "<lib>/"},
		{regexp.MustCompile(`/usr/(?:local/)?lib/python3(?:\.\d+)?/`), "<stdlib>/"},
		{regexp.MustCompile(`/usr/(?:local/)?(?:lib|share)/nodejs/`), "<lib>/"},
	}
)

// driverFrame reports whether a frame belongs to the interpreter's driver
// or runtime internals rather than to user code or a library: the Python
// driver runs as "<string>" (python -c), the Node driver as "[eval]".
func driverFrame(file string) bool {
	return file == "<string>" || strings.HasPrefix(file, "<sheepfold") || strings.Contains(file, "sheepfold") ||
		strings.Contains(file, "[eval]") || strings.Contains(file, "node:internal") || strings.Contains(file, "node:vm") ||
		strings.Contains(file, "evalmachine.")
}

// SanitizeTraceback removes the driver's frames from a Python or Node
// traceback and replaces template and host paths.
func SanitizeTraceback(tb string) string {
	if tb == "" {
		return tb
	}
	lines := strings.SplitAfter(tb, "\n")
	out := make([]string, 0, len(lines))
	dropping := false
	for _, l := range lines {
		if m := pyFrame.FindStringSubmatch(l); m != nil {
			dropping = driverFrame(m[1])
			if !dropping {
				out = append(out, l)
			}
			continue
		}
		if dropping && strings.HasPrefix(l, "    ") {
			continue // the dropped frame's source and caret lines
		}
		dropping = false
		if jsFrame.MatchString(l) && driverFrame(l) {
			continue
		}
		out = append(out, l)
	}
	return SanitizePaths(strings.Join(out, ""))
}

// SanitizePaths replaces the paths of the template's libraries and of
// the host in s.
func SanitizePaths(s string) string {
	if !strings.Contains(s, "/") {
		return s
	}
	for _, r := range pathRules {
		s = r.re.ReplaceAllString(s, r.with)
	}
	return s
}
