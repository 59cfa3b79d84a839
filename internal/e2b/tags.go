package e2b

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// E2B's template list, aliases and tags, over the server's templates
// (internal/template: a tag is a frozen copy of a build, "NAME:TAG"):
//
//   - GET /templates lists the templates a key may start sandboxes of
//     (every key: the server's templates are shared);
//   - GET /templates/aliases/{alias} answers {templateID, public} for a
//     template name (or one of Config.Templates), 404 for another, which
//     the SDK's Template.exists reads as false;
//   - GET /templates/{templateID}/tags lists a template's tags, "default"
//     (its newest build) first;
//   - POST /templates/tags {target: "NAME[:TAG]", tags} points tags at
//     the target's build; DELETE /templates/tags {name, tags} removes
//     them (admin keys only, as builds);
//   - a build of "NAME:TAG" (or with tags) tags the build when it is done.
//
// A build's id is E2B's UUID: made from the build's hash (its inputs), so
// a tag and the build it was made from answer the same one.

// TemplateInfo is one of the server's templates, or one of its tags, for
// E2B's listings.
type TemplateInfo struct {
	Name    string // the template's, without a tag
	Tag     string // "" for the newest build
	Hash    string // of the build's inputs; "" for a template built otherwise
	Created time.Time
	Tagged  time.Time // when Tag was given
	CPUs    int       // a sandbox's default
	Memory  int64     // MiB, a sandbox's default
	Disk    int64     // MiB, a sandbox's default
}

// buildUUID is E2B's build id of t: a UUID of its hash (of its name and
// build time for a template with none).
func buildUUID(t TemplateInfo) string {
	src := t.Hash
	if src == "" {
		src = t.Name + "@" + t.Created.UTC().Format(time.RFC3339Nano)
	}
	s := sha256.Sum256([]byte(src))
	h := hex.EncodeToString(s[:16])
	return fmt.Sprintf("%s-%s-%s-%s-%s", h[:8], h[8:12], h[12:16], h[16:20], h[20:32])
}

// templateJSON is E2B's Template.
type templateJSON struct {
	TemplateID    string     `json:"templateID"`
	BuildID       string     `json:"buildID"`
	CPUCount      int        `json:"cpuCount"`
	MemoryMB      int64      `json:"memoryMB"`
	DiskSizeMB    int64      `json:"diskSizeMB"`
	Public        bool       `json:"public"`
	Aliases       []string   `json:"aliases"`
	Names         []string   `json:"names"`
	CreatedAt     time.Time  `json:"createdAt"`
	UpdatedAt     time.Time  `json:"updatedAt"`
	CreatedBy     *struct{}  `json:"createdBy"`
	LastSpawnedAt *time.Time `json:"lastSpawnedAt"`
	SpawnCount    int        `json:"spawnCount"`
	BuildCount    int        `json:"buildCount"`
	EnvdVersion   string     `json:"envdVersion"`
	BuildStatus   string     `json:"buildStatus"`
}

// templateTagJSON is E2B's TemplateTag.
type templateTagJSON struct {
	Tag       string    `json:"tag"`
	BuildID   string    `json:"buildID"`
	CreatedAt time.Time `json:"createdAt"`
}

func (h *Handler) tagRoutes(add func(string, func(http.ResponseWriter, *http.Request, string) error)) {
	add("GET /templates", h.listTemplates)
	// /templates/aliases/{alias} and /templates/{templateID}/tags overlap
	// (/templates/aliases/tags): one route takes both.
	add("GET /templates/{first}/{second}", h.aliasOrTags)
	add("POST /templates/tags", h.assignTags)
	add("DELETE /templates/tags", h.removeTags)
	// The GET above is no reason for a 405 to a DELETE of a snapshot or
	// template id holding a slash ("team/warm:v1"): no such one exists.
	add("DELETE /templates/{first}/{second}", func(w http.ResponseWriter, r *http.Request, owner string) error {
		return &statusError{http.StatusNotFound, fmt.Sprintf("no template %s/%s", r.PathValue("first"), r.PathValue("second"))}
	})
}

func (h *Handler) listTemplates(w http.ResponseWriter, r *http.Request, owner string) error {
	tb, err := h.templates()
	if err != nil {
		return err
	}
	keyID, _ := r.Context().Value(keyIDKey).(string)
	l, err := tb.Templates(r.Context(), keyID)
	if err != nil {
		return err
	}
	out := make([]templateJSON, 0, len(l))
	for _, t := range l {
		names := []string{t.Name}
		out = append(out, templateJSON{TemplateID: t.Name, BuildID: buildUUID(t), CPUCount: t.CPUs, MemoryMB: t.Memory,
			DiskSizeMB: t.Disk, Aliases: names, Names: names, CreatedAt: t.Created.UTC(), UpdatedAt: t.Created.UTC(),
			BuildCount: 1, EnvdVersion: EnvdVersion, BuildStatus: "ready"})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (h *Handler) aliasOrTags(w http.ResponseWriter, r *http.Request, owner string) error {
	first, second := r.PathValue("first"), r.PathValue("second")
	switch {
	case first == "aliases":
		return h.templateAlias(w, r, second)
	case second == "tags":
		return h.tags(w, r, first)
	}
	return &statusError{http.StatusNotFound, fmt.Sprintf("no route %s %s", r.Method, r.URL.Path)}
}

// templateAlias answers E2B's TemplateAliasResponse for a template name (or a
// name with a tag), 404 for an unknown one.
func (h *Handler) templateAlias(w http.ResponseWriter, r *http.Request, alias string) error {
	tb, err := h.templates()
	if err != nil {
		return err
	}
	name, tag, _ := strings.Cut(alias, ":")
	if _, ok := h.cfg.Templates[name]; ok && tag == "" {
		writeJSON(w, http.StatusOK, map[string]any{"templateID": name, "public": true})
		return nil
	}
	keyID, _ := r.Context().Value(keyIDKey).(string)
	var l []TemplateInfo
	if tag == "" || tag == "default" {
		l, err = tb.Templates(r.Context(), keyID)
	} else {
		l, err = tb.TemplateTags(r.Context(), keyID, name)
	}
	if err != nil && httpCode(err) != http.StatusNotFound {
		return err
	}
	for _, t := range l {
		if t.Name == name && (t.Tag == tag || tag == "default" && t.Tag == "") {
			writeJSON(w, http.StatusOK, map[string]any{"templateID": name, "public": false})
			return nil
		}
	}
	return &statusError{http.StatusNotFound, fmt.Sprintf("template %q not found", alias)}
}

func httpCode(err error) int {
	status, _, _ := httpStatus(err)
	return status
}

func (h *Handler) tags(w http.ResponseWriter, r *http.Request, templateID string) error {
	tb, err := h.templates()
	if err != nil {
		return err
	}
	keyID, _ := r.Context().Value(keyIDKey).(string)
	l, err := tb.TemplateTags(r.Context(), keyID, templateID)
	if err != nil {
		return err
	}
	out := make([]templateTagJSON, 0, len(l))
	for _, t := range l {
		tag, at := t.Tag, t.Tagged
		if tag == "" {
			tag, at = "default", t.Created
		}
		out = append(out, templateTagJSON{Tag: tag, BuildID: buildUUID(t), CreatedAt: at.UTC()})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (h *Handler) assignTags(w http.ResponseWriter, r *http.Request, owner string) error {
	tb, err := h.templates()
	if err != nil {
		return err
	}
	var req struct {
		Target string   `json:"target"`
		Tags   []string `json:"tags"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	if req.Target == "" || len(req.Tags) == 0 {
		return badRequest("target and tags are required")
	}
	keyID, _ := r.Context().Value(keyIDKey).(string)
	t, err := tb.AssignTags(r.Context(), keyID, req.Target, req.Tags)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, map[string]any{"buildID": buildUUID(t), "tags": req.Tags})
	return nil
}

func (h *Handler) removeTags(w http.ResponseWriter, r *http.Request, owner string) error {
	tb, err := h.templates()
	if err != nil {
		return err
	}
	var req struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	if req.Name == "" || len(req.Tags) == 0 {
		return badRequest("name and tags are required")
	}
	name, _, _ := strings.Cut(req.Name, ":")
	keyID, _ := r.Context().Value(keyIDKey).(string)
	if err := tb.RemoveTags(r.Context(), keyID, name, req.Tags); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// buildTags are the tags a build request names: the tag of its name
// ("NAME:TAG") and its tags, "default" (the build itself) left out.
func buildTags(name string, tags []string) []string {
	var out []string
	if _, tag, ok := strings.Cut(name, ":"); ok && tag != "" && tag != "default" {
		out = append(out, tag)
	}
	for _, t := range tags {
		if t != "default" && t != "" {
			out = append(out, t)
		}
	}
	return out
}
