package e2b

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/internal/abort"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// fileEntry is the entry /files answers an upload with.
type fileEntry struct {
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Path     string            `json:"path"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// writeFilesError renders an error of /files: {"code": <status>, "message"}.
func writeFilesError(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, map[string]any{"code": status, "message": fmt.Sprintf(format, args...)})
}

// signedURL is what a signed /files request says, read once: the
// SHA-256 its signature carries, and the SDK's preimage around the token
// it was made with ("path:operation:user:" token [":expiration"]).
type signedURL struct {
	before, after string
	sum           []byte // nil: the signature cannot be one (no SHA-256 made it)
	expiration    string
}

// signedOf reads a signed /files request; ok is false without a
// signature.
func signedOf(r *http.Request) (s signedURL, ok bool) {
	q := r.URL.Query()
	sig := q.Get("signature")
	if sig == "" {
		return signedURL{}, false
	}
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	s = signedURL{before: q.Get("path") + ":" + op + ":" + q.Get("username") + ":", expiration: q.Get("signature_expiration")}
	if s.expiration != "" {
		s.after = ":" + s.expiration
	}
	// v1_ and the SHA-256 in base64 without its padding.
	if b64, ok := strings.CutPrefix(sig, "v1_"); ok {
		if sum, err := base64.RawStdEncoding.DecodeString(b64); err == nil && len(sum) == sha256.Size {
			s.sum = sum
		}
	}
	return s, true
}

// by reports whether tok made the signature: one SHA-256 (none for a
// signature no SHA-256 made). buf is scratch space, returned for reuse.
func (s signedURL) by(tok string, buf []byte) (bool, []byte) {
	if s.sum == nil {
		return false, buf
	}
	buf = append(append(append(buf[:0], s.before...), tok...), s.after...)
	sum := sha256.Sum256(buf)
	return subtle.ConstantTimeCompare(sum[:], s.sum) == 1, buf
}

// expired reports whether the signature's expiration has passed (or is
// not a time).
func (s signedURL) expired() bool {
	if s.expiration == "" {
		return false
	}
	exp, err := strconv.ParseInt(s.expiration, 10, 64)
	return err != nil || time.Now().Unix() > exp
}

// signer finds the access token that made s: among those of sandbox id
// when the request names it, else among every token known here. Each
// candidate costs one SHA-256; nothing is looked up. When none matches,
// the tokens of the other replicas are learned (learn, at most once per
// LearnInterval) and searched once more. It returns the sandbox and the
// key of the token, or a message for the 401.
func (h *Handler) signer(ctx context.Context, id string, s signedURL) (sandboxID, keyID, msg string) {
	if s.sum == nil {
		return "", "", "invalid signature"
	}
	for try := 0; try < 2; try++ {
		began := time.Now()
		if sandboxID, keyID = h.signedBy(id, s); keyID != "" {
			if s.expired() {
				return "", "", "signature is already expired"
			}
			return sandboxID, keyID, ""
		}
		if try == 0 && !h.learn(ctx, began) {
			break
		}
	}
	return "", "", "invalid signature"
}

// signedBy is one search of signer's: the tokens issued here, then those
// learned.
func (h *Handler) signedBy(id string, s signedURL) (sandboxID, keyID string) {
	h.tokMu.RLock()
	defer h.tokMu.RUnlock()
	var buf []byte
	search := func(sid string, toks map[string]string) bool {
		for k, tok := range toks {
			var ok bool
			if ok, buf = s.by(tok, buf); ok {
				sandboxID, keyID = sid, k
				return true
			}
		}
		return false
	}
	for _, known := range []map[string]map[string]string{h.issued, h.learned} {
		if id != "" {
			if search(id, known[id]) {
				break
			}
			continue
		}
		for sid, toks := range known {
			if search(sid, toks) {
				return sandboxID, keyID
			}
		}
	}
	return sandboxID, keyID
}

// learn replaces the learned tokens with the access tokens other replicas
// may have issued (every running sandbox's, for each key of its owner).
// It reports whether a learning ended after since, so that a search begun
// then is worth repeating; it learns at most once per LearnInterval,
// however many ask.
func (h *Handler) learn(ctx context.Context, since time.Time) bool {
	h.learnMu.Lock()
	defer h.learnMu.Unlock()
	h.tokMu.RLock()
	last := h.learnedAt
	h.tokMu.RUnlock()
	if last.After(since) {
		return true
	}
	if !last.IsZero() && time.Since(last) < h.cfg.LearnInterval {
		return false
	}
	keys := h.backend.SignerKeys(ctx)
	toks := make(map[string]map[string]string, len(keys))
	for id, ks := range keys {
		toks[id] = make(map[string]string, len(ks))
		for _, k := range ks {
			toks[id][k] = h.token(id, k)
		}
	}
	h.tokMu.Lock()
	defer h.tokMu.Unlock()
	h.learned, h.learnedAt = toks, time.Now()
	return len(toks) > 0
}

// signedFiles serves /files requests that arrived without sandbox
// headers (signed URLs fetched by plain HTTP clients): the sandbox is the
// one whose access token made the signature.
func (h *Handler) signedFiles(w http.ResponseWriter, r *http.Request) {
	s, ok := signedOf(r)
	if !ok {
		writeFilesError(w, http.StatusUnauthorized, "a signature or the E2b-Sandbox-Id and X-Access-Token headers are required")
		return
	}
	id, keyID, msg := h.signer(r.Context(), "", s)
	if keyID == "" {
		writeFilesError(w, http.StatusUnauthorized, "%s", msg)
		return
	}
	owner, ok := h.keyOwner(r.Context(), keyID)
	if !ok {
		writeFilesError(w, http.StatusUnauthorized, "the signature's key was revoked")
		return
	}
	sb := h.target(w, r, owner, id)
	if sb == nil {
		return
	}
	release, err := h.hold(r.Context(), owner, keyID)
	if err != nil {
		status, msg, retry := httpStatus(err)
		setRetryAfter(w, retry)
		writeFilesError(w, status, "%s", msg)
		return
	}
	defer release()
	h.serveFiles(w, r.WithContext(context.WithValue(r.Context(), sandboxKey, sb)))
}

func (h *Handler) serveFiles(w http.ResponseWriter, r *http.Request) {
	user, err := checkUser(r.URL.Query().Get("username"))
	if err != nil {
		writeFilesError(w, http.StatusUnauthorized, "%v", err)
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), userKey, user))
	switch r.Method {
	case http.MethodGet:
		h.download(w, r)
	case http.MethodPost:
		h.upload(w, r)
	default:
		w.Header().Set("Allow", "GET, POST")
		writeFilesError(w, http.StatusMethodNotAllowed, "/files takes GET or POST")
	}
}

// filesError answers a /files request with an engine error.
func filesError(w http.ResponseWriter, err error) {
	status, msg, retry := httpStatus(err)
	setRetryAfter(w, retry)
	writeFilesError(w, status, "%s", msg)
}

func (h *Handler) download(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	sb := sandboxFrom(ctx)
	p := homePath(ctx, r.URL.Query().Get("path"))
	if p == "" {
		writeFilesError(w, http.StatusBadRequest, "path is required")
		return
	}
	fi, err := sb.Stat(ctx, p, as(ctx))
	if err != nil {
		if !abortIfGone(ctx) {
			filesError(w, err)
		}
		return
	}
	if fi.Type == "dir" {
		writeFilesError(w, http.StatusBadRequest, "path %s is a directory", fi.Path)
		return
	}
	// The success headers go out with the first byte of the file, so that
	// a file that cannot be read (permissions) still gets its error status.
	out := &lazyBody{w: w, gzip: acceptsGzip(r.Header.Get("Accept-Encoding")), size: fi.Size, name: path.Base(fi.Path)}
	if _, err := sb.ReadFile(ctx, p, out, 0, as(ctx)); err != nil {
		if !out.started {
			filesError(w, err)
			return
		}
		abort.Response(ctx) // the body is cut short: make it visible
		return
	}
	out.finish()
}

// lazyBody writes a download's headers at its first byte (or at finish,
// for an empty file), gzip-encoding the body when the client accepts it.
type lazyBody struct {
	w       http.ResponseWriter
	gzip    bool
	size    int64
	name    string
	started bool
	zw      *gzip.Writer
}

func (b *lazyBody) start() {
	b.started = true
	h := b.w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": b.name}))
	// A signed URL opens without a header, on the API's origin too: the
	// sandbox's file is data there, never a page (docs/security.md, 2).
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "sandbox")
	if b.gzip {
		h.Set("Content-Encoding", "gzip")
		b.zw = gzip.NewWriter(b.w)
	} else {
		h.Set("Content-Length", strconv.FormatInt(b.size, 10))
	}
	b.w.WriteHeader(http.StatusOK)
}

func (b *lazyBody) Write(p []byte) (int, error) {
	if !b.started {
		b.start()
	}
	if b.zw != nil {
		return b.zw.Write(p)
	}
	return b.w.Write(p)
}

func (b *lazyBody) finish() {
	if !b.started {
		b.start()
	}
	if b.zw != nil {
		b.zw.Close()
	}
}

func acceptsGzip(h string) bool {
	for part := range strings.SplitSeq(h, ",") {
		enc, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(enc), "gzip") && strings.ReplaceAll(params, " ", "") != "q=0" {
			return true
		}
	}
	return false
}

// abortIfGone breaks the connection off when the sandbox died under a
// request, and reports whether it did: the caller then returns.
func abortIfGone(ctx context.Context) bool {
	if sb := sandboxFrom(ctx); sb != nil && (sb.State() == sandbox.StateStopping || sb.State() == sandbox.StateStopped) {
		abort.Response(ctx)
		return true
	}
	return false
}

// upload writes files: a multipart form (one part named "file" per file,
// its filename the path unless ?path= is given) or a raw body for ?path=,
// either possibly gzip-encoded. Files are 0644, parents are created.
func (h *Handler) upload(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	sb := sandboxFrom(ctx)
	qpath := r.URL.Query().Get("path")
	meta := metadataHeaders(r.Header)
	var body io.Reader = r.Body
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			writeFilesError(w, http.StatusBadRequest, "malformed gzip body: %v", err)
			return
		}
		defer zr.Close()
		body = zr
	default:
		writeFilesError(w, http.StatusUnsupportedMediaType, "unsupported Content-Encoding %q", enc)
		return
	}
	// However many files, and however well the body compresses, one
	// upload writes at most the upload limit plus its framing in all.
	body = &totalReader{r: body, left: h.cfg.MaxUploadBytes + uploadFraming}
	write := func(p string, data io.Reader) (fileEntry, bool) {
		fi, err := sb.WriteFileWith(ctx, homePath(ctx, p), data, sandbox.WriteOptions{Limit: h.cfg.MaxUploadBytes, Metadata: meta}, owned(ctx))
		var mb *http.MaxBytesError
		if errors.As(err, &mb) || errors.Is(err, errUploadTooLarge) {
			writeFilesError(w, http.StatusRequestEntityTooLarge, "the upload is larger than the limit of %d MiB (per file, and per request in all)", h.cfg.MaxUploadBytes>>20)
			return fileEntry{}, false
		}
		if err != nil {
			if !abortIfGone(ctx) {
				filesError(w, err)
			}
			return fileEntry{}, false
		}
		return fileEntry{Name: fi.Name, Type: "file", Path: fi.Path, Metadata: fi.Metadata}, true
	}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []fileEntry
	if mt == "multipart/form-data" {
		mr := multipart.NewReader(body, params["boundary"])
		seen := map[string]bool{}
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				writeFilesError(w, http.StatusBadRequest, "malformed multipart body: %v", err)
				return
			}
			if part.FormName() != "file" {
				continue
			}
			p := qpath
			if p == "" {
				p = partPath(part)
			}
			if p == "" {
				writeFilesError(w, http.StatusBadRequest, "each file part needs a filename (its path) when ?path= is not given")
				return
			}
			if seen[p] {
				writeFilesError(w, http.StatusBadRequest, "path %s is given twice", p)
				return
			}
			seen[p] = true
			e, ok := write(p, part)
			if !ok {
				return
			}
			out = append(out, e)
		}
		if len(out) == 0 {
			writeFilesError(w, http.StatusBadRequest, "the form has no part named file")
			return
		}
	} else {
		if qpath == "" {
			writeFilesError(w, http.StatusBadRequest, "path is required for a raw upload")
			return
		}
		e, ok := write(qpath, body)
		if !ok {
			return
		}
		out = append(out, e)
	}
	writeJSON(w, http.StatusOK, out)
}

// uploadFraming is what a multipart upload may add to its files' bytes.
const uploadFraming = 1 << 20

var errUploadTooLarge = errors.New("upload too large")

// totalReader fails (rather than ending) past left bytes.
type totalReader struct {
	r    io.Reader
	left int64
}

func (t *totalReader) Read(p []byte) (int, error) {
	if t.left <= 0 {
		var one [1]byte
		if n, err := t.r.Read(one[:]); n > 0 {
			return 0, errUploadTooLarge
		} else {
			return 0, err
		}
	}
	if int64(len(p)) > t.left {
		p = p[:t.left]
	}
	n, err := t.r.Read(p)
	t.left -= int64(n)
	return n, err
}

// partPath is a part's filename as sent: the target path. (Part.FileName
// keeps only the last element.)
func partPath(part *multipart.Part) string {
	_, params, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}

// metadataHeaders collects X-Metadata-<key> headers (keys lower-cased).
func metadataHeaders(hd http.Header) map[string]string {
	var md map[string]string
	for k, v := range hd {
		if key, ok := strings.CutPrefix(strings.ToLower(k), "x-metadata-"); ok && key != "" && len(v) > 0 {
			if md == nil {
				md = map[string]string{}
			}
			md[key] = v[0]
		}
	}
	return md
}
