package e2b

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
)

// E2B's template builder (the SDK's Template().from_template(...)
// .run_cmd(...) and Template.build) over the server's Dockerfile builds:
//
//   - POST /v3/templates {name} makes a build (templateID: the name
//     without its tag, buildID: a new id), "waiting";
//   - GET /templates/{templateID}/files/{hash} answers an upload link for
//     the files of a COPY step (present: false: every build uploads its
//     files again; the layer cache still finds unchanged content), a URL
//     carrying a token of the build: PUT stores the tar there, bounded by
//     MaxUploadBytes;
//   - POST /v2/templates/{templateID}/builds/{buildID} translates the
//     steps into a Dockerfile (translate) and starts the build
//     (TemplateBackend.BuildTemplate), with each uploaded tar unpacked as
//     a directory of the build context named by its hash;
//   - GET /templates/{templateID}/builds/{buildID}/status answers its
//     status (waiting, building, ready, error with the failed step's
//     message) and the build log's lines from logsOffset.
//
// A sandbox of the template is then created by its name. Only admin keys
// build (the backend checks), as on /v1.

// TemplateBackend is implemented by a Backend that builds templates;
// without it the routes answer 501.
type TemplateBackend interface {
	// CanBuildTemplate is nil when the key keyID may build template
	// name (an admin key, a valid name, a server that builds).
	CanBuildTemplate(ctx context.Context, keyID, name string) error
	// BuildTemplate starts building template name from dockerfile, with
	// a build context holding each tar of uploads (directory name → tar
	// file, gzip or not) unpacked as that directory, and gives the build
	// tags once it is done; it returns the build's id. The tars may be
	// removed once it returns.
	BuildTemplate(ctx context.Context, keyID, name string, dockerfile []byte, uploads map[string]string, noCache bool, tags []string) (string, error)
	// TemplateBuild is the state of a build BuildTemplate started.
	TemplateBuild(ctx context.Context, keyID, id string) (TemplateBuildState, error)

	// Templates lists the templates key keyID may start sandboxes of
	// (tags.go), Tag "" each.
	Templates(ctx context.Context, keyID string) ([]TemplateInfo, error)
	// TemplateTags lists template name's newest build (Tag "") and its
	// tags; an unknown template is a not-found error.
	TemplateTags(ctx context.Context, keyID, name string) ([]TemplateInfo, error)
	// AssignTags points tags of target's template at target ("NAME" or
	// "NAME:TAG") and returns target.
	AssignTags(ctx context.Context, keyID, target string, tags []string) (TemplateInfo, error)
	// RemoveTags removes tags of template name.
	RemoveTags(ctx context.Context, keyID, name string, tags []string) error
}

// TemplateBuildState is a build's state for E2B's status.
type TemplateBuildState struct {
	Done, Failed bool
	Error        string // a failed build's
	Log          []byte // the build's log so far
}

// maxPendingBuilds bounds the builds made (POST /v3/templates) and not yet
// started: the oldest is dropped, with its uploads, past it.
const maxPendingBuilds = 64

// e2bBuild is one E2B build, from its request to its start.
type e2bBuild struct {
	id, template, keyID string
	tags                []string // given the build when it is done
	token               string   // of its upload links
	dir                 string   // its uploads: <dir>/<hash>.tar
	made                time.Time
	// started is the backend's build id once started.
	started string
}

type templateBuilds struct {
	// mu guards everything below.
	mu    sync.Mutex
	byID  map[string]*e2bBuild
	order []string // ids, oldest first
}

func (h *Handler) templateRoutes(add func(string, func(http.ResponseWriter, *http.Request, string) error), mux *http.ServeMux) {
	h.tagRoutes(add) // tags.go
	add("POST /v3/templates", h.requestBuild)
	add("GET /templates/{templateID}/files/{hash}", h.uploadLink)
	add("POST /v2/templates/{templateID}/builds/{buildID}", h.startBuild)
	add("GET /templates/{templateID}/builds/{buildID}/status", h.buildStatus)
	// The upload links carry their build's token, not the API key.
	h.route("", "PUT /templates/{templateID}/files/{hash}")
	mux.HandleFunc("PUT /templates/{templateID}/files/{hash}", func(w http.ResponseWriter, r *http.Request) {
		if err := h.uploadBuildFiles(w, r); err != nil {
			writeControlError(w, err)
		}
	})
}

func (h *Handler) templates() (TemplateBackend, error) {
	tb, ok := h.backend.(TemplateBackend)
	if !ok {
		return nil, &statusError{http.StatusNotImplemented, "this server builds no templates"}
	}
	return tb, nil
}

func newBuildID() string {
	return strings.ToLower(rand.Text())
}

func (h *Handler) requestBuild(w http.ResponseWriter, r *http.Request, owner string) error {
	tb, err := h.templates()
	if err != nil {
		return err
	}
	var req struct {
		Name  string   `json:"name"`
		Alias string   `json:"alias"`
		Tags  []string `json:"tags"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	if req.Name == "" {
		req.Name = req.Alias
	}
	name, _, _ := strings.Cut(req.Name, ":")
	tags := buildTags(req.Name, req.Tags)
	keyID, _ := r.Context().Value(keyIDKey).(string)
	if err := tb.CanBuildTemplate(r.Context(), keyID, name); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "sheepfold-e2b-build-")
	if err != nil {
		return err
	}
	b := &e2bBuild{id: newBuildID(), template: name, keyID: keyID, tags: tags, token: newBuildID() + newBuildID(), dir: dir, made: time.Now()}
	tbs := &h.tbuilds
	tbs.mu.Lock()
	if tbs.byID == nil {
		tbs.byID = map[string]*e2bBuild{}
	}
	tbs.byID[b.id] = b
	tbs.order = append(tbs.order, b.id)
	var drop []string
	for len(tbs.order) > maxPendingBuilds {
		old := tbs.byID[tbs.order[0]]
		drop = append(drop, old.dir)
		delete(tbs.byID, old.id)
		tbs.order = tbs.order[1:]
	}
	tbs.mu.Unlock()
	for _, d := range drop {
		os.RemoveAll(d)
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"templateID": name, "buildID": b.id, "aliases": []string{name},
		"names": []string{name}, "tags": append([]string{}, tags...), "public": false})
	return nil
}

// build finds a build of templateID made with the key of the request
// (buildID "" the newest not yet started).
func (h *Handler) build(r *http.Request, templateID, buildID string) (*e2bBuild, error) {
	keyID, _ := r.Context().Value(keyIDKey).(string)
	tbs := &h.tbuilds
	tbs.mu.Lock()
	defer tbs.mu.Unlock()
	if buildID == "" {
		for i := len(tbs.order) - 1; i >= 0; i-- {
			if b := tbs.byID[tbs.order[i]]; b.template == templateID && b.keyID == keyID && b.started == "" {
				return b, nil
			}
		}
	} else if b, ok := tbs.byID[buildID]; ok && b.template == templateID && b.keyID == keyID {
		return b, nil
	}
	return nil, &statusError{http.StatusNotFound, fmt.Sprintf("no build %q of template %q", buildID, templateID)}
}

var hashRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

func (h *Handler) uploadLink(w http.ResponseWriter, r *http.Request, owner string) error {
	if _, err := h.templates(); err != nil {
		return err
	}
	hash := r.PathValue("hash")
	if !hashRE.MatchString(hash) {
		return badRequest("files hash %q: want 64 hex digits", hash)
	}
	b, err := h.build(r, r.PathValue("templateID"), "")
	if err != nil {
		return err
	}
	scheme := "http"
	if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
		scheme = "https"
	}
	u := fmt.Sprintf("%s://%s/templates/%s/files/%s?build=%s&token=%s", scheme, r.Host, b.template, hash, b.id, b.token)
	writeJSON(w, http.StatusCreated, map[string]any{"present": false, "url": u})
	return nil
}

func (h *Handler) uploadBuildFiles(w http.ResponseWriter, r *http.Request) error {
	hash, q := r.PathValue("hash"), r.URL.Query()
	tbs := &h.tbuilds
	tbs.mu.Lock()
	b, ok := tbs.byID[q.Get("build")]
	tbs.mu.Unlock()
	if !ok || b.template != r.PathValue("templateID") || subtle.ConstantTimeCompare([]byte(b.token), []byte(q.Get("token"))) != 1 {
		return &statusError{http.StatusUnauthorized, "the upload link is not valid"}
	}
	if !hashRE.MatchString(hash) {
		return badRequest("files hash %q: want 64 hex digits", hash)
	}
	f, err := os.CreateTemp(b.dir, ".upload-")
	if err != nil {
		return err
	}
	_, err = io.Copy(f, http.MaxBytesReader(w, r.Body, h.cfg.MaxUploadBytes))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(b.dir, hash+".tar"))
	}
	if err != nil {
		os.Remove(f.Name())
		return badRequest("upload: %v", err)
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// buildSpec is E2B's TemplateBuildStartV2.
type buildSpec struct {
	FromImage         string          `json:"fromImage"`
	FromTemplate      string          `json:"fromTemplate"`
	FromImageRegistry json.RawMessage `json:"fromImageRegistry"`
	StartCmd          string          `json:"startCmd"`
	ReadyCmd          string          `json:"readyCmd"`
	Force             bool            `json:"force"`
	Steps             []struct {
		Type      string   `json:"type"`
		Args      []string `json:"args"`
		Force     bool     `json:"force"`
		FilesHash string   `json:"filesHash"`
	} `json:"steps"`
}

// e2bBaseImage is the image the SDK's Template() starts from
// (from_base_image): E2B's base, which is the template "base" here.
const e2bBaseImage = "e2bdev/base"

var envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// dfQuote is s as a double-quoted Dockerfile word (ENV, LABEL).
func dfQuote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, `$`, `\$`)
	return `"` + r.Replace(s) + `"`
}

// dfJSON is the JSON (exec) form of args.
func dfJSON(args ...string) string {
	b, _ := json.Marshal(args)
	return string(b)
}

// translate is the Dockerfile of an E2B build's steps (templates maps E2B
// template names to Sheepfold's), with the hashes of the uploads its COPY
// steps read, and whether any step asked to skip the cache.
func translate(spec buildSpec, templates map[string]string) (df string, hashes []string, noCache bool, err error) {
	var sb strings.Builder
	line := func(format string, a ...any) { fmt.Fprintf(&sb, format+"\n", a...) }
	oneLine := func(what, s string) error {
		if strings.ContainsAny(s, "\n\r") {
			return badRequest("%s: a line break is not supported here", what)
		}
		return nil
	}
	if len(spec.FromImageRegistry) > 0 && string(spec.FromImageRegistry) != "null" {
		return "", nil, false, badRequest("fromImageRegistry: registry credentials are the server's (sheepfold serve --registry-auth), not a build's")
	}
	from := spec.FromTemplate
	switch {
	case from != "":
		if t, ok := templates[from]; ok {
			from = t
		}
	case spec.FromImage == e2bBaseImage || spec.FromImage == e2bBaseImage+":latest":
		from = templates["base"]
	case spec.FromImage != "":
		from = spec.FromImage
	default:
		return "", nil, false, badRequest("fromImage or fromTemplate is required")
	}
	if err := oneLine("from", from); err != nil {
		return "", nil, false, err
	}
	line("FROM %s", from)
	noCache = spec.Force
	user := "" // the USER so far ("": the base's)
	for i, st := range spec.Steps {
		noCache = noCache || st.Force
		bad := func(format string, a ...any) error {
			return badRequest("step %d (%s): %s", i+1, st.Type, fmt.Sprintf(format, a...))
		}
		switch st.Type {
		case "RUN":
			if len(st.Args) < 1 || len(st.Args) > 2 || strings.TrimSpace(st.Args[0]) == "" {
				return "", nil, false, bad("want a command and an optional user")
			}
			if len(st.Args) == 2 && st.Args[1] != "" && st.Args[1] != user {
				if err := oneLine("user", st.Args[1]); err != nil {
					return "", nil, false, err
				}
				line("USER %s", st.Args[1])
				line("RUN %s", dfJSON("/bin/sh", "-c", st.Args[0]))
				back := user
				if back == "" {
					back = "root"
				}
				line("USER %s", back)
				continue
			}
			line("RUN %s", dfJSON("/bin/sh", "-c", st.Args[0]))
		case "COPY":
			if len(st.Args) < 2 || !hashRE.MatchString(st.FilesHash) {
				return "", nil, false, bad("want a source, a destination and the files' hash")
			}
			src, dest := path.Clean(st.Args[0]), st.Args[1]
			if path.IsAbs(src) || src == ".." || strings.HasPrefix(src, "../") {
				return "", nil, false, bad("source %q: a path inside the build's files", st.Args[0])
			}
			flags := ""
			if len(st.Args) > 2 && st.Args[2] != "" {
				flags += " --chown=" + st.Args[2]
			}
			if len(st.Args) > 3 && st.Args[3] != "" {
				flags += " --chmod=" + st.Args[3]
			}
			if err := oneLine("copy", flags); err != nil {
				return "", nil, false, err
			}
			line("COPY%s %s", flags, dfJSON(st.FilesHash+"/"+src, dest))
			hashes = append(hashes, st.FilesHash)
		case "ENV":
			if len(st.Args) == 0 || len(st.Args)%2 != 0 {
				return "", nil, false, bad("want key and value pairs")
			}
			var kv []string
			for j := 0; j < len(st.Args); j += 2 {
				if !envKeyRE.MatchString(st.Args[j]) {
					return "", nil, false, bad("%q is not a variable name", st.Args[j])
				}
				if err := oneLine("env "+st.Args[j], st.Args[j+1]); err != nil {
					return "", nil, false, err
				}
				kv = append(kv, st.Args[j]+"="+dfQuote(st.Args[j+1]))
			}
			line("ENV %s", strings.Join(kv, " "))
		case "WORKDIR":
			if len(st.Args) != 1 || st.Args[0] == "" {
				return "", nil, false, bad("want a directory")
			}
			if err := oneLine("workdir", st.Args[0]); err != nil {
				return "", nil, false, err
			}
			line("WORKDIR %s", st.Args[0])
		case "USER":
			if len(st.Args) != 1 || st.Args[0] == "" {
				return "", nil, false, bad("want a user")
			}
			if err := oneLine("user", st.Args[0]); err != nil {
				return "", nil, false, err
			}
			user = st.Args[0]
			line("USER %s", user)
		default:
			return "", nil, false, bad("not a step this server builds (RUN, COPY, ENV, WORKDIR, USER)")
		}
	}
	if spec.StartCmd != "" {
		if err := oneLine("startCmd", spec.StartCmd); err != nil {
			return "", nil, false, err
		}
		line("LABEL sheepfold.start=%s", dfQuote(spec.StartCmd))
	}
	if spec.ReadyCmd != "" {
		if err := oneLine("readyCmd", spec.ReadyCmd); err != nil {
			return "", nil, false, err
		}
		line("LABEL sheepfold.ready=%s", dfQuote("cmd:"+spec.ReadyCmd))
	}
	return sb.String(), hashes, noCache, nil
}

func (h *Handler) startBuild(w http.ResponseWriter, r *http.Request, owner string) error {
	tb, err := h.templates()
	if err != nil {
		return err
	}
	b, err := h.build(r, r.PathValue("templateID"), r.PathValue("buildID"))
	if err != nil {
		return err
	}
	var spec buildSpec
	if err := decodeBody(r, &spec); err != nil {
		return err
	}
	df, hashes, noCache, err := translate(spec, h.cfg.Templates)
	if err != nil {
		return err
	}
	uploads := map[string]string{}
	for _, hash := range hashes {
		p := filepath.Join(b.dir, hash+".tar")
		if _, err := os.Stat(p); err != nil {
			return badRequest("the files of hash %s were not uploaded", hash)
		}
		uploads[hash] = p
	}
	h.tbuilds.mu.Lock()
	if b.started != "" {
		h.tbuilds.mu.Unlock()
		return &statusError{http.StatusConflict, "build " + b.id + " was started already"}
	}
	b.started = "starting"
	h.tbuilds.mu.Unlock()
	id, err := tb.BuildTemplate(r.Context(), b.keyID, b.template, []byte(df), uploads, noCache, b.tags)
	os.RemoveAll(b.dir)
	h.tbuilds.mu.Lock()
	b.started = id
	if err != nil {
		b.started = "failed"
	}
	h.tbuilds.mu.Unlock()
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusAccepted)
	return nil
}

// logEntry is E2B's BuildLogEntry.
type logEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
}

func (h *Handler) buildStatus(w http.ResponseWriter, r *http.Request, owner string) error {
	tb, err := h.templates()
	if err != nil {
		return err
	}
	b, err := h.build(r, r.PathValue("templateID"), r.PathValue("buildID"))
	if err != nil {
		return err
	}
	h.tbuilds.mu.Lock()
	started := b.started
	h.tbuilds.mu.Unlock()
	out := map[string]any{"buildID": b.id, "templateID": b.template, "status": "waiting",
		"logEntries": []logEntry{}, "logs": []string{}}
	switch started {
	case "", "starting":
		writeJSON(w, http.StatusOK, out)
		return nil
	case "failed":
		out["status"] = "error"
		out["reason"] = map[string]any{"message": "the build could not start"}
		writeJSON(w, http.StatusOK, out)
		return nil
	}
	st, err := tb.TemplateBuild(r.Context(), b.keyID, started)
	if err != nil {
		return err
	}
	var offset int
	fmt.Sscan(r.URL.Query().Get("logsOffset"), &offset)
	lines := strings.Split(strings.TrimRight(string(st.Log), "\n"), "\n")
	if len(st.Log) == 0 {
		lines = nil
	}
	var entries []logEntry
	var raw []string
	now := time.Now().UTC()
	for i := max(offset, 0); i < len(lines) && len(entries) < 100; i++ {
		entries = append(entries, logEntry{Timestamp: now, Level: "info", Message: lines[i]})
		raw = append(raw, lines[i])
	}
	if entries == nil {
		entries, raw = []logEntry{}, []string{}
	}
	out["logEntries"], out["logs"] = entries, raw
	switch {
	case st.Failed:
		out["status"] = "error"
		out["reason"] = map[string]any{"message": st.Error}
	case st.Done:
		out["status"] = "ready"
	default:
		out["status"] = "building"
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
