package server

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/e2b"
	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/template"
)

// Templates: the server's built templates (GET /v1/templates, any key) and
// builds from a Dockerfile (admin keys only): POST /v1/templates takes the
// build context as a tar (gzip or not) holding the Dockerfile, answers 202
// at once with the build, which GET /v1/templates/builds/{id} polls and
// whose log GET /v1/templates/builds/{id}/log reads (the log of the last
// build of the name, kept in the data dir). The context is unpacked in a
// temporary directory through an os.Root (no entry lands outside it) and
// the build is template.BuildDockerfile's, with Config.TemplateRunner for
// RUN.

// maxTemplateContext bounds a build context's tar, and maxContextEntries
// its entries.
const (
	maxTemplateContext = 512 << 20
	maxContextEntries  = 100_000
	keptBuilds         = 64 // finished builds GET /v1/templates/builds/{id} still knows
)

func (s *Server) templateRoutes(add addFunc) {
	add("GET /v1/templates", true, s.listTemplates)
	add("POST /v1/templates", true, s.admin(s.buildTemplate))
	add("GET /v1/templates/builds/{id}", true, s.admin(s.getTemplateBuild))
	add("GET /v1/templates/builds/{id}/log", true, s.admin(s.templateBuildLog))
}

// templateBuilds are the server's builds, running and recent.
type templateBuilds struct {
	// mu guards everything below.
	mu     sync.Mutex
	byID   map[string]*templateBuild
	order  []string // ids, oldest first
	active map[string]bool
}

type templateBuild struct {
	// mu guards out.
	mu  sync.Mutex
	out api.TemplateBuild
}

func (b *templateBuild) view() api.TemplateBuild {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.out
}

func templateOut(i template.Info) api.Template {
	return api.Template{Name: i.Name, SizeBytes: i.SizeBytes, CreatedAt: i.Created, BuildSeconds: i.BuildSeconds,
		Hash: i.Hash, Runtime: "runc", From: i.From, Start: i.Start, Ready: i.Ready}
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) error {
	out := api.TemplateList{Templates: []api.Template{}}
	if s.cfg.DataDir != "" {
		infos, err := template.List(s.cfg.DataDir)
		if err != nil && len(infos) == 0 {
			return err
		}
		for _, i := range infos {
			out.Templates = append(out.Templates, templateOut(i))
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) buildTemplate(w http.ResponseWriter, r *http.Request) error {
	if s.cfg.TemplateRunner == nil || s.cfg.DataDir == "" {
		return apierr.New(apierr.NotSupported, "this server does not build templates (no step runner: the Kubernetes runtime, or no data dir)")
	}
	q := r.URL.Query()
	name := q.Get("name")
	if err := template.ValidName(name); err != nil {
		return apierr.Wrap(err, apierr.BadRequest, "name: %v", err)
	}
	dfName := q.Get("dockerfile")
	if dfName == "" {
		dfName = "Dockerfile"
	}
	dir, err := os.MkdirTemp("", "sheepfold-context-")
	if err != nil {
		return err
	}
	keep := false
	defer func() {
		if !keep {
			os.RemoveAll(dir)
		}
	}()
	if err := unpackContext(http.MaxBytesReader(w, r.Body, maxTemplateContext), dir); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return apierr.Wrap(err, apierr.FileTooLarge, "the build context is larger than %d MiB", maxTemplateContext>>20)
		}
		return apierr.Wrap(err, apierr.BadRequest, "build context: %v", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	src, err := root.ReadFile(path.Clean(strings.TrimPrefix(dfName, "/")))
	root.Close()
	if err != nil {
		return apierr.Wrap(err, apierr.BadRequest, "the build context has no Dockerfile %q", dfName)
	}
	b, err := s.startTemplateBuild(name, src, dir, q.Get("no_cache") == "true", nil)
	if err != nil {
		return err
	}
	keep = true // the build removes it
	writeJSON(w, http.StatusAccepted, b.view())
	return nil
}

// startTemplateBuild checks the Dockerfile src (its FROM's registry
// included) and starts building template name from it in the context dir,
// which is the build's from then on (removed when it ends); on an error
// dir is the caller's. A build done is given tags (template.Tag) before
// it is reported done; a tag refused fails it.
func (s *Server) startTemplateBuild(name string, src []byte, dir string, noCache bool, tags []string) (*templateBuild, error) {
	for _, t := range tags {
		if err := template.ValidTag(t); err != nil || t == template.DefaultTag {
			return nil, apierr.New(apierr.BadRequest, "tag %q: want [a-z0-9][a-z0-9._-]*, at most 63 characters, not %q", t, template.DefaultTag)
		}
	}
	if err := template.CheckFrom(src, nil, s.cfg.TemplateRegistries); errors.Is(err, template.ErrRegistryNotAllowed) {
		return nil, apierr.Wrap(err, apierr.RegistryNotAllowed, "%v", err)
	} else if err != nil {
		return nil, apierr.Wrap(err, apierr.BadRequest, "%v", err)
	}
	b := &templateBuild{out: api.TemplateBuild{ID: "tb_" + strings.ToLower(rand.Text()[:16]), Name: name,
		Status: api.TemplateBuildRunning, StartedAt: time.Now().UTC()}}
	tb := &s.templates
	tb.mu.Lock()
	if tb.active[name] {
		tb.mu.Unlock()
		return nil, apierr.New(apierr.Conflict, "template %s is being built", name)
	}
	if tb.byID == nil {
		tb.byID, tb.active = map[string]*templateBuild{}, map[string]bool{}
	}
	tb.active[name] = true
	tb.byID[b.out.ID] = b
	tb.order = append(tb.order, b.out.ID)
	for len(tb.order) > keptBuilds {
		old := tb.order[0]
		if tb.byID[old].view().Status == api.TemplateBuildRunning {
			break
		}
		delete(tb.byID, old)
		tb.order = tb.order[1:]
	}
	tb.mu.Unlock()
	opt := template.DockerfileOptions{
		DataDir: s.cfg.DataDir, Name: name, Context: dir, UIDShift: s.cfg.TemplateUIDShift,
		Runner: s.cfg.TemplateRunner, NoCache: noCache, Registries: s.cfg.TemplateRegistries,
		Progress: func(step string, done, total int) {
			b.mu.Lock()
			b.out.Step, b.out.Done, b.out.Total = step, done, total
			b.mu.Unlock()
		},
	}
	s.sweeper.Add(1)
	go func() {
		defer s.sweeper.Done()
		defer os.RemoveAll(dir)
		info, err := template.BuildDockerfile(s.base, src, opt)
		if err == nil && len(tags) > 0 {
			_, err = template.Tag(s.base, s.cfg.DataDir, name, tags)
		}
		now := time.Now().UTC()
		b.mu.Lock()
		b.out.EndedAt = &now
		if err != nil {
			b.out.Status, b.out.Error = api.TemplateBuildFailed, err.Error()
		} else {
			t := templateOut(info)
			b.out.Status, b.out.Template = api.TemplateBuildDone, &t
		}
		b.mu.Unlock()
		tb.mu.Lock()
		delete(tb.active, name)
		tb.mu.Unlock()
		s.log.Info("template build ended", "template", name, "build", b.out.ID, "err", err)
	}()
	return b, nil
}

func (s *Server) templateBuild(id string) (*templateBuild, error) {
	s.templates.mu.Lock()
	defer s.templates.mu.Unlock()
	b, ok := s.templates.byID[id]
	if !ok {
		return nil, apierr.New(apierr.NotFound, "no template build %q", id)
	}
	return b, nil
}

func (s *Server) getTemplateBuild(w http.ResponseWriter, r *http.Request) error {
	b, err := s.templateBuild(r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, b.view())
	return nil
}

func (s *Server) templateBuildLog(w http.ResponseWriter, r *http.Request) error {
	b, err := s.templateBuild(r.PathValue("id"))
	if err != nil {
		return err
	}
	log, err := template.BuildLog(s.cfg.DataDir, b.view().Name)
	if errors.Is(err, fs.ErrNotExist) {
		log = nil // not started writing yet
	} else if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	w.Write(log)
	return nil
}

// unpackContext unpacks a tar (gzip or not) into dir. Every entry is made
// through an os.Root of dir: a name with .. or an absolute name, or one
// under a symbolic link an earlier entry made, cannot land outside it.
// Regular files, directories and symbolic links are kept; other types are
// refused.
func unpackContext(r io.Reader, dir string) error {
	r, closeGz, err := template.MaybeGunzip(r)
	if err != nil {
		return err
	}
	defer closeGz()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	for n := 0; ; n++ {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if n >= maxContextEntries {
			return fmt.Errorf("more than %d entries", maxContextEntries)
		}
		name := path.Clean(h.Name)
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("entry %q: outside the build context", h.Name)
		}
		if name == "." {
			continue
		}
		if d := path.Dir(name); d != "." {
			if err := root.MkdirAll(d, 0o755); err != nil {
				return fmt.Errorf("entry %q: %w", h.Name, err)
			}
		}
		mode := fs.FileMode(h.Mode).Perm()
		switch h.Typeflag {
		case tar.TypeDir:
			err = root.MkdirAll(name, 0o755)
			if err == nil {
				err = root.Chmod(name, mode|0o700)
			}
		case tar.TypeReg:
			var f *os.File
			f, err = root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode|0o600)
			if err == nil {
				_, err = io.Copy(f, tr)
				err = errors.Join(err, f.Close())
			}
		case tar.TypeSymlink:
			err = root.Symlink(h.Linkname, name)
		default:
			err = fmt.Errorf("type %q is not supported (files, directories and symbolic links only)", h.Typeflag)
		}
		if err != nil {
			return fmt.Errorf("entry %q: %w", h.Name, err)
		}
	}
}

var _ e2b.TemplateBackend = e2bBackend{}

// CanBuildTemplate implements e2b.TemplateBackend: admin keys build, as on
// POST /v1/templates.
func (b e2bBackend) CanBuildTemplate(ctx context.Context, keyID, name string) error {
	s := b.s
	if s.cfg.TemplateRunner == nil || s.cfg.DataDir == "" {
		return apierr.New(apierr.NotSupported, "this server does not build templates (no step runner: the Kubernetes runtime, or no data dir)")
	}
	k, err := s.store.KeyByID(ctx, keyID)
	if err != nil {
		return classify(err)
	}
	if k.RevokedAt != nil || k.Role != store.RoleAdmin {
		return apierr.New(apierr.Forbidden, "building templates needs an admin key")
	}
	if err := template.ValidName(name); err != nil {
		return apierr.Wrap(err, apierr.BadRequest, "name: %v", err)
	}
	return nil
}

// BuildTemplate implements e2b.TemplateBackend: each upload is unpacked
// as unpackContext unpacks a /v1 build's context, in a directory of its
// own.
func (b e2bBackend) BuildTemplate(ctx context.Context, keyID, name string, dockerfile []byte, uploads map[string]string, noCache bool, tags []string) (string, error) {
	if err := b.CanBuildTemplate(ctx, keyID, name); err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "sheepfold-context-")
	if err != nil {
		return "", err
	}
	unpack := func(sub, tarPath string) error {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			return err
		}
		f, err := os.Open(tarPath)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := unpackContext(f, filepath.Join(dir, sub)); err != nil {
			return apierr.Wrap(err, apierr.BadRequest, "the files of hash %s: %v", sub, err)
		}
		return nil
	}
	for sub, p := range uploads {
		if err := unpack(sub, p); err != nil {
			os.RemoveAll(dir)
			return "", err
		}
	}
	tb, err := b.s.startTemplateBuild(name, dockerfile, dir, noCache, tags)
	if err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return tb.view().ID, nil
}

// TemplateBuild implements e2b.TemplateBackend.
func (b e2bBackend) TemplateBuild(ctx context.Context, keyID, id string) (e2b.TemplateBuildState, error) {
	if err := b.CanBuildTemplate(ctx, keyID, "x"); err != nil {
		return e2b.TemplateBuildState{}, err
	}
	tb, err := b.s.templateBuild(id)
	if err != nil {
		return e2b.TemplateBuildState{}, err
	}
	v := tb.view()
	log, err := template.BuildLog(b.s.cfg.DataDir, v.Name)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return e2b.TemplateBuildState{}, err
	}
	return e2b.TemplateBuildState{Done: v.Status == api.TemplateBuildDone, Failed: v.Status == api.TemplateBuildFailed,
		Error: v.Error, Log: log}, nil
}

// e2bTemplate is info as E2B's listings see it, with the server's default
// resources.
func (b e2bBackend) e2bTemplate(info template.Info) e2b.TemplateInfo {
	name, tag, _ := strings.Cut(info.Name, ":")
	t := e2b.TemplateInfo{Name: name, Tag: tag, Hash: info.Hash, Created: info.Created, Tagged: info.Tagged,
		CPUs: 1, Memory: 512, Disk: 256}
	if b.s.engine != nil {
		l := b.s.engine.DefaultLimits()
		t.CPUs, t.Memory, t.Disk = max(int(l.CPUs), 1), l.MemoryBytes>>20, l.DiskBytes>>20
	}
	return t
}

// templateError codes an error of internal/template.
func templateError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, template.ErrNotBuilt):
		return apierr.Wrap(err, apierr.TemplateNotFound, "%v", err)
	case errors.Is(err, template.ErrInUse):
		return apierr.Wrap(err, apierr.Conflict, "%v", err)
	}
	var ae *apierr.Error
	if errors.As(err, &ae) {
		return err
	}
	return apierr.Wrap(err, apierr.BadRequest, "%v", err)
}

// Templates implements e2b.TemplateBackend: every key may start
// sandboxes of every template of the server.
func (b e2bBackend) Templates(ctx context.Context, keyID string) ([]e2b.TemplateInfo, error) {
	out := []e2b.TemplateInfo{}
	if b.s.cfg.DataDir == "" {
		return out, nil
	}
	infos, err := template.List(b.s.cfg.DataDir)
	if err != nil && len(infos) == 0 {
		return nil, err
	}
	for _, i := range infos {
		out = append(out, b.e2bTemplate(i))
	}
	return out, nil
}

// TemplateTags implements e2b.TemplateBackend.
func (b e2bBackend) TemplateTags(ctx context.Context, keyID, name string) ([]e2b.TemplateInfo, error) {
	if b.s.cfg.DataDir == "" {
		return nil, apierr.New(apierr.TemplateNotFound, "template %q not found", name)
	}
	info, err := template.Get(b.s.cfg.DataDir, name)
	if err != nil {
		return nil, templateError(err)
	}
	if template.TagOf(info) != "" {
		return nil, apierr.New(apierr.BadRequest, "%q: a template's name, without a tag", name)
	}
	out := []e2b.TemplateInfo{b.e2bTemplate(info)}
	tags, err := template.Tags(b.s.cfg.DataDir, info.Name)
	if err != nil && len(tags) == 0 {
		return nil, err
	}
	for _, t := range tags {
		out = append(out, b.e2bTemplate(t))
	}
	return out, nil
}

// AssignTags implements e2b.TemplateBackend: admin keys, as builds.
func (b e2bBackend) AssignTags(ctx context.Context, keyID, target string, tags []string) (e2b.TemplateInfo, error) {
	name, _, _ := strings.Cut(target, ":")
	if err := b.CanBuildTemplate(ctx, keyID, name); err != nil {
		return e2b.TemplateInfo{}, err
	}
	info, err := template.Tag(ctx, b.s.cfg.DataDir, target, tags)
	if err != nil {
		return e2b.TemplateInfo{}, templateError(err)
	}
	return b.e2bTemplate(info), nil
}

// RemoveTags implements e2b.TemplateBackend: admin keys, as builds. An
// unknown tag is a not-found error; the tags before it are removed.
func (b e2bBackend) RemoveTags(ctx context.Context, keyID, name string, tags []string) error {
	if err := b.CanBuildTemplate(ctx, keyID, name); err != nil {
		return err
	}
	for _, t := range tags {
		if err := template.Untag(b.s.cfg.DataDir, name, t); err != nil {
			return templateError(err)
		}
	}
	return nil
}
