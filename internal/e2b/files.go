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

// sign computes a file URL signature as E2B clients do:
// v1_ + base64(sha256("path:operation:user:token[:expiration]")), unpadded.
func sign(p, operation, user, token, expiration string) string {
	raw := p + ":" + operation + ":" + user + ":" + token
	if expiration != "" {
		raw += ":" + expiration
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
}

// checkSignature validates a signed /files request against an access
// token: the signature first, then its expiry.
func checkSignature(tok string, r *http.Request) (ok bool, msg string) {
	q := r.URL.Query()
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	want := sign(q.Get("path"), op, q.Get("username"), tok, q.Get("signature_expiration"))
	if subtle.ConstantTimeCompare([]byte(want), []byte(q.Get("signature"))) != 1 {
		return false, "invalid signature"
	}
	if s := q.Get("signature_expiration"); s != "" {
		exp, err := strconv.ParseInt(s, 10, 64)
		if err != nil || time.Now().Unix() > exp {
			return false, "signature is already expired"
		}
	}
	return true, ""
}

// signedBy finds the token issued for sandbox id that signed r, and checks
// that its key may still use the sandbox.
func (h *Handler) signedBy(id string, r *http.Request) (ok bool, msg string) {
	ok, msg = h.signedByAny(id, r, h.issuedTokens(id))
	if ok || msg != "invalid signature" {
		return ok, msg
	}
	// Issued by another replica, or before a restart: the tokens of the
	// owner's keys.
	return h.signedByAny(id, r, h.ownerTokens(id, h.backend.SignerKeys(r.Context(), id)[id]))
}

// ownerTokens are the access tokens of sandbox id for these keys.
func (h *Handler) ownerTokens(id string, keyIDs []string) []string {
	toks := make([]string, len(keyIDs))
	for i, k := range keyIDs {
		toks[i] = h.token(id, k)
	}
	return toks
}

// signedByAny is signedBy over toks.
func (h *Handler) signedByAny(id string, r *http.Request, toks []string) (ok bool, msg string) {
	for _, tok := range toks {
		if ok, msg := checkSignature(tok, r); ok || msg != "invalid signature" {
			if ok {
				keyID, _, _ := strings.Cut(tok, ".")
				if !h.keyMayUse(id, keyID) {
					return false, "the signature's key was revoked"
				}
			}
			return ok, msg
		}
	}
	return false, "invalid signature"
}

// signedFiles serves /files requests that arrived without sandbox headers
// (signed URLs fetched by plain HTTP clients): the sandbox is the one an
// access token of which reproduces the signature: one issued here, else
// one of a running sandbox's owner's keys (issued by another replica).
func (h *Handler) signedFiles(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("signature") == "" {
		writeFilesError(w, http.StatusUnauthorized, "a signature or the E2b-Sandbox-Id and X-Access-Token headers are required")
		return
	}
	serve := func(id string, ok bool, msg string) bool {
		if !ok && msg == "invalid signature" {
			return false
		}
		if !ok {
			writeFilesError(w, http.StatusUnauthorized, "%s", msg)
			return true
		}
		sb, err := h.backend.Sandbox(r.Context(), "", id)
		if err != nil || sb.State() != sandbox.StateRunning {
			sandboxGone(w, id)
			return true
		}
		h.serveFiles(w, r.WithContext(context.WithValue(r.Context(), sandboxKey, sb)))
		return true
	}
	h.mu.Lock()
	ids := make([]string, 0, len(h.issued))
	for id := range h.issued {
		ids = append(ids, id)
	}
	h.mu.Unlock()
	for _, id := range ids {
		if ok, msg := h.signedByAny(id, r, h.issuedTokens(id)); serve(id, ok, msg) {
			return
		}
	}
	for id, keys := range h.backend.SignerKeys(r.Context(), "") {
		if ok, msg := h.signedByAny(id, r, h.ownerTokens(id, keys)); serve(id, ok, msg) {
			return
		}
	}
	writeFilesError(w, http.StatusUnauthorized, "invalid signature")
}

// files serves /files for a request routed to a sandbox: the access token
// or a signature authorizes it.
func (h *Handler) files(w http.ResponseWriter, r *http.Request) {
	sb := sandboxFrom(r.Context())
	if !h.validToken(sb.ID, r.Header.Get("X-Access-Token")) {
		if r.URL.Query().Get("signature") == "" {
			writeFilesError(w, http.StatusUnauthorized, "unauthorized access, please provide a valid access token or method signing if supported")
			return
		}
		if ok, msg := h.signedBy(sb.ID, r); !ok {
			writeFilesError(w, http.StatusUnauthorized, "%s", msg)
			return
		}
	}
	h.serveFiles(w, r)
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
		abortIfGone(ctx)
		filesError(w, err)
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
		panic(http.ErrAbortHandler) // the body is cut short: make it visible
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

// abortIfGone aborts the connection when the sandbox died under a request.
func abortIfGone(ctx context.Context) {
	if sb := sandboxFrom(ctx); sb != nil && sb.State() != sandbox.StateRunning {
		panic(http.ErrAbortHandler)
	}
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
			abortIfGone(ctx)
			filesError(w, err)
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
