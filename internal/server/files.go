package server

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"path"
	"strconv"
	"strings"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/abort"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// Paths are passed to the agent as given: it resolves relative ones under
// /home/user and confines every one to the sandbox's root.

func (s *Server) fileRoutes(add addFunc) {
	add("GET /v1/sandboxes/{id}/files", true, s.readFile)
	add("PUT /v1/sandboxes/{id}/files", true, s.writeFile)
	add("POST /v1/sandboxes/{id}/files", true, s.uploadFiles)
	add("DELETE /v1/sandboxes/{id}/files", true, s.removeFile)
	add("GET /v1/sandboxes/{id}/files/list", true, s.listDir)
	add("GET /v1/sandboxes/{id}/files/stat", true, s.statFile)
	add("POST /v1/sandboxes/{id}/files/mkdir", true, s.makeDir)
	add("POST /v1/sandboxes/{id}/files/move", true, s.moveFile)
}

func queryPath(r *http.Request) (string, error) {
	p := r.URL.Query().Get("path")
	if p == "" {
		return "", apierr.New(apierr.BadRequest, "the path query parameter is required")
	}
	if strings.ContainsRune(p, 0) {
		return "", apierr.New(apierr.BadRequest, "path must not contain NUL")
	}
	return p, nil
}

func (s *Server) tooLarge() error {
	return apierr.New(apierr.FileTooLarge, "the upload is larger than the limit of %d MiB (per file, and per request in all)", s.cfg.MaxUploadBytes>>20)
}

// lazyWriter sends the success headers with the first byte of a download,
// so that an error before it can still be a JSON error.
type lazyWriter struct {
	w       http.ResponseWriter
	started bool
}

func (lw *lazyWriter) Write(p []byte) (int, error) {
	if !lw.started {
		lw.start()
	}
	return lw.w.Write(p)
}

func (lw *lazyWriter) start() {
	lw.started = true
	lw.w.Header().Set("Content-Type", "application/octet-stream")
	lw.w.WriteHeader(http.StatusOK)
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request) error {
	p, err := queryPath(r)
	if err != nil {
		return err
	}
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	// Each write has the stream write deadline: a client that stops
	// reading ends the download, and the agent call behind it.
	dw := &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w)}
	defer dw.end()
	lw := &lazyWriter{w: dw}
	_, err = b.sb.ReadFile(r.Context(), p, lw, 0)
	if err != nil {
		if lw.started {
			// Too late for a status: cut the body short so the client sees
			// a broken transfer, not a short file.
			s.log.Warn("file read failed mid-body", "request_id", requestIDFrom(r.Context()), "err", err)
			abort.Response(r.Context())
			return nil
		}
		return err
	}
	if !lw.started {
		lw.start()
	}
	return nil
}

// errPartTooLarge is capReader's error.
var errPartTooLarge = errors.New("part too large")

// capReader reads at most left bytes and fails (rather than ending) past
// them.
type capReader struct {
	r    io.Reader
	left int64
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		// Probe for one more byte: EOF here means the part fit exactly.
		var one [1]byte
		n, err := c.r.Read(one[:])
		if n > 0 {
			return 0, errPartTooLarge
		}
		return 0, err
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}

// mapUploadErr turns a body that passed the upload limit (one file, or
// the request in all) into 413.
func (s *Server) mapUploadErr(err error) error {
	var mb *http.MaxBytesError
	if errors.As(err, &mb) || errors.Is(err, errPartTooLarge) {
		return s.tooLarge()
	}
	return err
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) error {
	p, err := queryPath(r)
	if err != nil {
		return err
	}
	if r.ContentLength > s.cfg.MaxUploadBytes {
		return s.tooLarge()
	}
	var mode uint32
	if m := r.URL.Query().Get("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil || v > 0o7777 {
			return apierr.New(apierr.BadRequest, "mode must be octal permission bits such as 0644")
		}
		mode = uint32(v)
	}
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	info, err := b.sb.WriteFile(r.Context(), p, &capReader{r: r.Body, left: s.cfg.MaxUploadBytes}, mode, s.cfg.MaxUploadBytes)
	if err != nil {
		return s.mapUploadErr(err)
	}
	writeJSON(w, http.StatusCreated, info)
	return nil
}

// maxUploadParts bounds the files of one multipart upload.
const maxUploadParts = 1000

// uploadFiles takes multipart/form-data parts named "file" and writes each
// into the directory ?path=DIR (default the home, /home/user) under its
// base name.
func (s *Server) uploadFiles(w http.ResponseWriter, r *http.Request) error {
	dir := r.URL.Query().Get("path") // "": the agent's home
	ct, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || ct != "multipart/form-data" {
		return apierr.New(apierr.BadRequest, "the body must be multipart/form-data with parts named file (use PUT for a raw body)")
	}
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	mr, err := r.MultipartReader()
	if err != nil {
		return apierr.Wrap(err, apierr.BadRequest, "malformed multipart body: %v", err)
	}
	files := []sandbox.FileInfo{}
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return apierr.Wrap(err, apierr.BadRequest, "malformed multipart body: %v", err)
		}
		if len(files) >= maxUploadParts {
			part.Close()
			return apierr.New(apierr.BadRequest, "at most %d files per upload", maxUploadParts)
		}
		if part.FormName() != "file" {
			part.Close()
			return apierr.New(apierr.BadRequest, "unexpected part %q: every part must be named file", part.FormName())
		}
		name := path.Base(strings.ReplaceAll(part.FileName(), "\\", "/"))
		if name == "" || name == "." || name == ".." || name == "/" {
			part.Close()
			return apierr.New(apierr.BadRequest, "every file part needs a file name")
		}
		// A part past the limit fails on the host side, before the agent
		// sees more than the limit; the agent's own limit is the backstop.
		info, err := b.sb.WriteFile(r.Context(), path.Join(dir, name),
			&capReader{r: part, left: s.cfg.MaxUploadBytes}, 0, s.cfg.MaxUploadBytes)
		part.Close()
		if err != nil {
			return s.mapUploadErr(err)
		}
		files = append(files, info)
	}
	if len(files) == 0 {
		return apierr.New(apierr.BadRequest, "no part named file in the body")
	}
	writeJSON(w, http.StatusCreated, map[string]any{"files": files})
	return nil
}

func (s *Server) removeFile(w http.ResponseWriter, r *http.Request) error {
	p, err := queryPath(r)
	if err != nil {
		return err
	}
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	if err := b.sb.Remove(r.Context(), p); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// maxListPage is the most entries one page of a directory listing holds
// (the sandbox agent's cap).
const maxListPage = 10000

// A listCursor continues a directory listing after its entry After; it
// is bound to the listing's path and depth. On the wire it is opaque:
// base64url of its JSON.
type listCursor struct {
	Path  string `json:"p"`
	Depth int    `json:"d"`
	After string `json:"a"`
}

func (c listCursor) String() string {
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

func parseListCursor(v, path string, depth int) (string, error) {
	if v == "" {
		return "", nil
	}
	var c listCursor
	b, err := base64.RawURLEncoding.DecodeString(v)
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err != nil || c.After == "" {
		return "", apierr.New(apierr.BadRequest, "cursor is not one a listing returned (next_cursor)")
	}
	if c.Path != path || c.Depth != depth {
		return "", apierr.New(apierr.BadRequest, "cursor belongs to another listing: pass the same path and depth as the listing that returned it")
	}
	return c.After, nil
}

func (s *Server) listDir(w http.ResponseWriter, r *http.Request) error {
	p, err := queryPath(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	depth := 1
	if d := q.Get("depth"); d != "" {
		if depth, err = strconv.Atoi(d); err != nil || depth < 1 || depth > 32 {
			return apierr.New(apierr.BadRequest, "depth must be an integer from 1 to 32")
		}
	}
	limit := maxListPage
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > maxListPage {
			return apierr.New(apierr.BadRequest, "limit must be an integer from 1 to %d", maxListPage)
		}
	}
	after, err := parseListCursor(q.Get("cursor"), p, depth)
	if err != nil {
		return err
	}
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	page, err := b.sb.ListDirPage(r.Context(), p, sandbox.ListOptions{Depth: depth, After: after, Limit: limit})
	if err != nil {
		return err
	}
	// truncated: more entries follow; next_cursor continues after the
	// last one (a page holds at most limit entries, and what fits one
	// reply of the sandbox's agent).
	out := map[string]any{"entries": page.Entries, "truncated": page.Truncated}
	if page.Truncated {
		out["next_cursor"] = listCursor{Path: p, Depth: depth, After: page.Entries[len(page.Entries)-1].Path}.String()
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request) error {
	p, err := queryPath(r)
	if err != nil {
		return err
	}
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	info, err := b.sb.Stat(r.Context(), p)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, info)
	return nil
}

func (s *Server) makeDir(w http.ResponseWriter, r *http.Request) error {
	var req api.PathRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.Path == "" {
		return apierr.New(apierr.BadRequest, "path is required")
	}
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	info, err := b.sb.MakeDir(r.Context(), req.Path)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, info)
	return nil
}

func (s *Server) moveFile(w http.ResponseWriter, r *http.Request) error {
	var req api.MoveRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.From == "" || req.To == "" {
		return apierr.New(apierr.BadRequest, "from and to are required")
	}
	b, err := s.lookup(r)
	if err != nil {
		return err
	}
	info, err := b.sb.Move(r.Context(), req.From, req.To)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, info)
	return nil
}
