package e2b

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/bound"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// Default lifetimes of E2B's two create endpoints.
const (
	defaultTimeoutV1 = 15 * time.Second
	defaultTimeoutV2 = 300 * time.Second
	// maxListLimit is the largest page of GET /v2/sandboxes.
	maxListLimit = 100
)

// clientID is reported where E2B's schema requires a (deprecated) client id.
const clientID = "sheepfold"

func (h *Handler) controlMux() http.Handler {
	mux := http.NewServeMux()
	add := func(pattern string, f func(w http.ResponseWriter, r *http.Request, owner string) error) {
		h.route("", pattern)
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			owner, keyID, err := h.backend.Authenticate(r.Context(), r.Header.Get("X-API-Key"))
			if err == nil {
				ctx := context.WithValue(context.WithValue(r.Context(), keyIDKey, keyID), hostKey, r.Host)
				err = f(w, r.WithContext(ctx), owner)
			}
			if err != nil {
				writeControlError(w, err)
			}
		})
	}
	add("POST /sandboxes", func(w http.ResponseWriter, r *http.Request, o string) error {
		return h.create(w, r, o, defaultTimeoutV1)
	})
	add("POST /v2/sandboxes", func(w http.ResponseWriter, r *http.Request, o string) error {
		return h.create(w, r, o, defaultTimeoutV2)
	})
	// E2B's Volume API (volumes.go).
	add("POST /volumes", h.createVolume)
	add("GET /volumes", h.listVolumes)
	add("GET /volumes/{volumeID}", h.getVolume)
	add("DELETE /volumes/{volumeID}", h.deleteVolume)
	add("GET /sandboxes", h.listV1)
	add("GET /v2/sandboxes", h.listV2)
	add("GET /sandboxes/{id}", h.get)
	add("DELETE /sandboxes/{id}", h.kill)
	add("POST /sandboxes/{id}/timeout", h.setTimeout)
	add("POST /sandboxes/{id}/refreshes", h.refresh)
	add("GET /sandboxes/{id}/metrics", h.getMetrics)
	add("POST /sandboxes/{id}/connect", h.connect)
	add("POST /v2/sandboxes/{id}/connect", h.connect)
	add("POST /sandboxes/{id}/resume", h.connect)
	add("POST /sandboxes/{id}/pause", h.pause)
	add("GET /secrets", h.listSecrets)
	add("POST /secrets", h.createSecret)
	add("GET /secrets/{secretID}", h.getSecret)
	add("POST /secrets/{secretID}", h.updateSecret)
	add("DELETE /secrets/{secretID}", h.deleteSecret)
	h.snapshotRoutes(add)
	h.templateRoutes(add, mux) // templates.go
	// Signed file URLs arrive without sandbox headers.
	h.route("", "GET /files", "POST /files")
	mux.Handle("/files", writeDeadlines(http.HandlerFunc(h.signedFiles), h.cfg.WriteTimeout))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeControlError(w, noRoute(w, mux, r))
	})
	return mux
}

// writeControlError renders err in E2B's control-plane shape. The SDK reads
// the numeric code from the body (404 makes kill return false).
func writeControlError(w http.ResponseWriter, err error) {
	status, msg, retry := httpStatus(err)
	setRetryAfter(w, retry)
	writeJSON(w, status, map[string]any{"code": status, "message": msg})
}

// noRoute is the answer for a request no route of mux takes: 405 with
// Allow when another method of its path has one, else 404.
func noRoute(w http.ResponseWriter, mux *http.ServeMux, r *http.Request) *statusError {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		probe := *r
		probe.Method = m
		if _, pattern := mux.Handler(&probe); pattern != "" && pattern != "/" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		return &statusError{http.StatusMethodNotAllowed, fmt.Sprintf("%s %s is not allowed; use %s", r.Method, r.URL.Path, strings.Join(allow, " or "))}
	}
	return &statusError{http.StatusNotFound, fmt.Sprintf("no route %s %s", r.Method, r.URL.Path)}
}

func badRequest(format string, args ...any) error {
	return &statusError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

// decodeBody reads an optional JSON body; unknown fields are accepted, as
// the SDKs add fields over time.
func decodeBody(r *http.Request, v any) error {
	b, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, 1<<20))
	if err != nil {
		return badRequest("read the request body: %v", err)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		var typ *json.UnmarshalTypeError
		if errors.As(err, &typ) && typ.Field != "" {
			// A number past float64 (1e309), a string for a number: the
			// field by the caller's name.
			return bound.Error(typ.Field, "must be a JSON %s, not %s", typ.Type.Kind(), typ.Value)
		}
		return badRequest("malformed JSON body: %v", err)
	}
	return nil
}

type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *struct {
		AllowOut []string `json:"allowOut"`
		DenyOut  []string `json:"denyOut"`
		// AllowPublicTraffic false makes the ports need the traffic
		// token (E2B-Traffic-Access-Token); E2B's default is true.
		AllowPublicTraffic *bool `json:"allowPublicTraffic"`
		// Rules are E2B's rules per host: headers set on its requests,
		// whose values may name the account's secrets as E2B's
		// ${e2b.secrets.NAME} or ${secrets.NAME} (network.rules of the
		// policy: internal/egress, inject.go).
		Rules map[string][]e2bRule `json:"rules"`
	} `json:"network"`
	// IAM is E2B's workload identity: named token definitions that
	// rules' headers name as ${e2b.identity.tokens.NAME}; each becomes
	// the gateway's ${identity.token} with the definition's audience.
	IAM *struct {
		Tokens map[string]e2bIAMToken `json:"tokens"`
	} `json:"iam"`
	// AutoPause pauses the sandbox at its timeout instead of killing it
	// (internal/sandbox, autopause.go); AutoPauseMemory false (a
	// filesystem-only snapshot) has no equivalent; AutoResume's enabled
	// is what every paused sandbox does here (a request resumes it).
	AutoPause       *bool `json:"autoPause"`
	AutoPauseMemory *bool `json:"autoPauseMemory"`
	AutoResume      *struct {
		Enabled *bool `json:"enabled"`
	} `json:"autoResume"`
	MCP          json.RawMessage `json:"mcp"`
	VolumeMounts []volumeMount   `json:"volumeMounts"`
	// CPUCount, MemoryMB and DiskSizeMB (E2B's names in a sandbox's
	// description, set by its template there) ask for resources here,
	// granted within the account's ceiling like /v1's resources.
	CPUCount   *float64 `json:"cpuCount"`
	MemoryMB   *int64   `json:"memoryMB"`
	DiskSizeMB *int64   `json:"diskSizeMB"`
}

// volumeMount is E2B's SandboxVolumeMount: the account's volume name,
// mounted read-write at path (the server's volumes, /v1/volumes).
type volumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// maxResourceMB bounds memoryMB and diskSizeMB before the ceiling, so
// that their bytes cannot overflow (1 PiB).
const maxResourceMB = 1 << 30

// sandboxJSON is E2B's Sandbox (create and connect answers).
type sandboxJSON struct {
	SandboxID       string `json:"sandboxID"`
	TemplateID      string `json:"templateID"`
	ClientID        string `json:"clientID"`
	EnvdVersion     string `json:"envdVersion"`
	EnvdAccessToken string `json:"envdAccessToken"`
	// TrafficAccessToken makes the code-interpreter SDK authenticate
	// every call to port 49999.
	TrafficAccessToken string  `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
	Alias              string  `json:"alias,omitempty"`
}

// listedJSON is E2B's ListedSandbox; detailJSON adds SandboxDetail's fields.
type listedJSON struct {
	SandboxID   string            `json:"sandboxID"`
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	ClientID    string            `json:"clientID"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int64             `json:"memoryMB"`
	DiskSizeMB  int64             `json:"diskSizeMB"`
	EnvdVersion string            `json:"envdVersion"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	State       string            `json:"state"`
	Metadata    map[string]string `json:"metadata"`
	// VolumeMounts are the volumes the sandbox mounted at create.
	VolumeMounts []volumeMount `json:"volumeMounts,omitempty"`
}

type detailJSON struct {
	listedJSON
	Domain              *string `json:"domain"`
	EnvdAccessToken     string  `json:"envdAccessToken"`
	AllowInternetAccess bool    `json:"allowInternetAccess"`
	Lifecycle           struct {
		OnTimeout  string `json:"onTimeout"`
		AutoResume bool   `json:"autoResume"`
	} `json:"lifecycle"`
}

func (h *Handler) alias(sb *sandbox.Sandbox) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if a, ok := h.aliases[sb.ID]; ok {
		return a
	}
	return sb.Template
}

// sandboxOf describes sb to the key of ctx, with its tokens for that key.
func (h *Handler) sandboxOf(ctx context.Context, sb *sandbox.Sandbox) sandboxJSON {
	a := h.alias(sb)
	keyID, _ := ctx.Value(keyIDKey).(string)
	return sandboxJSON{SandboxID: sb.ID, TemplateID: a, Alias: a, ClientID: clientID, Domain: h.domain(ctx),
		EnvdVersion: EnvdVersion, EnvdAccessToken: h.issue(sb.ID, keyID), TrafficAccessToken: h.trafficToken(sb.ID, keyID)}
}

// domain is the domain sandboxes report (nil: none, so the SDK uses its
// own): Config.Domain, with the port the request came to, so that
// getHost(port) names a host a browser reaches (previews share the
// API's listener): 3000-{id}.localhost:8080 by default.
func (h *Handler) domain(ctx context.Context) *string {
	if h.cfg.Domain == "" {
		return nil
	}
	d := h.cfg.Domain
	if host, _ := ctx.Value(hostKey).(string); host != "" {
		if _, port, err := net.SplitHostPort(host); err == nil && port != "" {
			d = net.JoinHostPort(d, port)
		}
	}
	return &d
}

func (h *Handler) listedOf(sb *sandbox.Sandbox) listedJSON {
	in := sb.Info()
	md := in.Metadata
	if md == nil {
		md = map[string]string{}
	}
	cpus := int(math.Ceil(in.Limits.CPUs))
	a := h.alias(sb)
	return listedJSON{SandboxID: in.ID, TemplateID: a, Alias: a, ClientID: clientID, CPUCount: cpus,
		MemoryMB: in.Limits.MemoryBytes >> 20, DiskSizeMB: in.Limits.DiskBytes >> 20, EnvdVersion: EnvdVersion,
		StartedAt: in.Created.UTC(), EndAt: in.Deadline.UTC(), State: e2bState(in.State), Metadata: md,
		VolumeMounts: e2bVolumeMounts(in.Volumes)}
}

// e2bVolumeMounts are a sandbox's volumes in E2B's SandboxVolumeMount
// shape (name and path).
func e2bVolumeMounts(in []sandbox.VolumeMount) []volumeMount {
	var out []volumeMount
	for _, m := range in {
		out = append(out, volumeMount{Name: m.Name, Path: m.Path})
	}
	return out
}

// e2bState is a sandbox's state in E2B's words: running or paused.
func e2bState(st sandbox.State) string {
	if st == sandbox.StatePaused {
		return "paused"
	}
	return "running"
}

// pause pauses a sandbox (internal/sandbox, pause.go): 204, or 409 when
// it is paused already or busy, as E2B answers; a server that cannot
// pause, and a pause without memory, answer 501.
func (h *Handler) pause(w http.ResponseWriter, r *http.Request, owner string) error {
	var req struct {
		Memory *bool `json:"memory"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	sb, err := h.backend.Sandbox(r.Context(), owner, r.PathValue("id"))
	if err != nil {
		return err
	}
	if req.Memory != nil && !*req.Memory {
		// A filesystem-only pause (resumed by a cold boot) has no
		// equivalent: a pause here always keeps the memory.
		return &statusError{http.StatusNotImplemented, "a pause without memory (keepMemory: false) is not supported by this server"}
	}
	if sb.State() == sandbox.StatePaused {
		return &statusError{http.StatusConflict, fmt.Sprintf("sandbox %s is already paused", sb.ID)}
	}
	if err := sb.Pause(context.WithoutCancel(r.Context())); err != nil {
		if e := apierr.From(err); e.Code == apierr.SandboxState && sb.State() == sandbox.StateRunning {
			// Busy: it runs on (a stopped one is gone, 404, as elsewhere).
			return &statusError{http.StatusConflict, e.Message}
		}
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// timeoutOf converts E2B's whole seconds of field.
func (h *Handler) timeoutOf(field string, s int64) (time.Duration, error) {
	return bound.WholeSeconds(field, s, time.Second, h.cfg.MaxTimeout)
}

// RuntimeMetadata is the metadata key by which an E2B client chooses its
// sandbox's runtime (the /v1 create's "runtime"), e.g.
// metadata={"sheepfold.runtime": "gvisor"}.
const RuntimeMetadata = "sheepfold.runtime"

func (h *Handler) create(w http.ResponseWriter, r *http.Request, owner string, def time.Duration) error {
	var req newSandbox
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	netPolicy, err := networkOf(req)
	if err != nil {
		return err
	}
	autoPause := req.AutoPause != nil && *req.AutoPause
	switch {
	case req.AutoPauseMemory != nil && !*req.AutoPauseMemory:
		return badRequest("autoPauseMemory false (a filesystem-only pause) is not supported by this server: an auto-pause keeps the memory")
	case req.AutoResume != nil && req.AutoResume.Enabled != nil && *req.AutoResume.Enabled && !autoPause:
		return badRequest("autoResume needs autoPause")
	}
	opt := sandbox.CreateOptions{Template: req.TemplateID, Timeout: def, Env: req.EnvVars, Metadata: req.Metadata, AutoPause: autoPause,
		Runtime: req.Metadata[RuntimeMetadata],
		Names:   sandbox.FieldNames{CPUs: "cpuCount", Memory: "memoryMB", Disk: "diskSizeMB", Timeout: "timeout"}}
	for _, v := range req.VolumeMounts {
		opt.Volumes = append(opt.Volumes, sandbox.VolumeMount{Name: v.Name, Path: v.Path})
	}
	if req.CPUCount != nil {
		opt.Limits.CPUs = *req.CPUCount
		if *req.CPUCount <= 0 {
			return badRequest("cpuCount must be positive")
		}
	}
	for _, f := range []struct {
		name  string
		v     *int64
		bytes *int64
	}{{"memoryMB", req.MemoryMB, &opt.Limits.MemoryBytes}, {"diskSizeMB", req.DiskSizeMB, &opt.Limits.DiskBytes}} {
		if f.v == nil {
			continue
		}
		if *f.v <= 0 || *f.v > maxResourceMB {
			return badRequest("%s must be between 1 and %d", f.name, maxResourceMB)
		}
		*f.bytes = *f.v << 20
	}
	if netPolicy != nil {
		opt.Policy = &policy.Policy{Network: netPolicy}
	}
	if t, ok := h.cfg.Templates[req.TemplateID]; ok {
		opt.Template = t
	}
	if req.Timeout != nil {
		d, err := h.timeoutOf("timeout", *req.Timeout)
		if err != nil {
			return err
		}
		opt.Timeout = d
	}
	h.prune(r.Context())
	origin := Origin{Alias: req.TemplateID,
		PublicTraffic: req.Network == nil || req.Network.AllowPublicTraffic == nil || *req.Network.AllowPublicTraffic}
	sb, err := h.backend.Create(context.WithoutCancel(r.Context()), owner, opt, origin)
	if err != nil {
		return err
	}
	h.Adopted(sb.ID, origin)
	go h.watchMetrics(sb)
	writeJSON(w, http.StatusCreated, h.sandboxOf(r.Context(), sb))
	return nil
}

// allTraffic is E2B's ALL_TRAFFIC, the deny-out entry that shuts every
// destination out.
const allTraffic = "0.0.0.0/0"

// e2bIAMToken is one of E2B's workload token definitions.
type e2bIAMToken struct {
	Audience  string `json:"audience"`
	TokenType string `json:"tokenType"`
}

// e2bIdentityPrefix starts E2B's workload token placeholder,
// ${e2b.identity.tokens.NAME}: NAME is everything up to the next brace.
const e2bIdentityPrefix = "${e2b.identity.tokens."

// identityOf rewrites a header value's E2B token placeholders into the
// gateway's ${identity.token} and returns the audience they share ("":
// none in v). A name iam.tokens does not define, a token type other than
// a JWT, or two audiences in one rule are refused.
func identityOf(field, v string, tokens map[string]e2bIAMToken, aud string) (string, string, error) {
	var out strings.Builder
	for {
		i := strings.Index(v, e2bIdentityPrefix)
		if i < 0 {
			out.WriteString(v)
			return out.String(), aud, nil
		}
		rest := v[i+len(e2bIdentityPrefix):]
		j := strings.IndexByte(rest, '}')
		if j < 0 {
			return "", "", badRequest("%s holds a malformed workload token placeholder: write ${e2b.identity.tokens.NAME}", field)
		}
		name := rest[:j]
		tok, ok := tokens[name]
		switch {
		case !ok:
			return "", "", badRequest("%s names workload token %q, which iam.tokens does not define", field, name)
		case !strings.EqualFold(tok.TokenType, "JWT-SVID") && !strings.EqualFold(tok.TokenType, "JWT"):
			return "", "", badRequest("iam.tokens.%s.tokenType %q is not supported: this server mints JWTs (JWT-SVID or JWT)", name, tok.TokenType)
		case tok.Audience == "":
			return "", "", badRequest("iam.tokens.%s.audience is required", name)
		case aud != "" && aud != tok.Audience:
			return "", "", badRequest("%s: one rule's workload tokens must share one audience on this server (%q, %q)", field, aud, tok.Audience)
		}
		aud = tok.Audience
		out.WriteString(v[:i])
		out.WriteString(policy.IdentityPlaceholder)
		v = rest[j+1:]
	}
}

// e2bRule is one of E2B's rules for a host.
type e2bRule struct {
	Transform *struct {
		Headers map[string]string `json:"headers"`
	} `json:"transform"`
}

// networkOf maps E2B's network options onto a network policy (nil: none,
// Sheepfold's default, where E2B's is open): allowOut becomes an
// allowlist, allow_internet_access true (with no allowOut) mode public.
// Deny lists other than ALL_TRAFFIC have no equivalent and are refused.
// Rules become the policy's rules, by host; their headers' E2B workload
// token placeholders become ${identity.token} with the audience of the
// token iam.tokens defines (identityOf).
func networkOf(req newSandbox) (*policy.Network, error) {
	var allow, denyOut []string
	if req.Network != nil {
		allow, denyOut = req.Network.AllowOut, req.Network.DenyOut
	}
	denyAll := false
	for _, d := range denyOut {
		if d != allTraffic {
			return nil, badRequest("network.denyOut supports only %q on this server (ERR_NETWORK_RESTRICTED)", allTraffic)
		}
		denyAll = true
	}
	var n *policy.Network
	switch {
	case len(allow) > 0:
		n = &policy.Network{Mode: policy.NetworkAllowlist, Allow: allow}
	case req.AllowInternetAccess != nil && *req.AllowInternetAccess && !denyAll:
		n = &policy.Network{Mode: policy.NetworkPublic}
	default:
		if req.Network != nil && len(req.Network.Rules) > 0 {
			return nil, badRequest("network.rules need network.allowOut or allow_internet_access: a rule grants no access")
		}
		return nil, nil
	}
	if req.Network != nil {
		hosts := make([]string, 0, len(req.Network.Rules))
		for h := range req.Network.Rules {
			hosts = append(hosts, h)
		}
		slices.Sort(hosts)
		var tokens map[string]e2bIAMToken
		if req.IAM != nil {
			tokens = req.IAM.Tokens
		}
		for _, h := range hosts {
			for i, r := range req.Network.Rules[h] {
				nr := policy.NetworkRule{Host: h}
				if r.Transform != nil {
					nr.Transform = &policy.Transform{Headers: make(map[string]string, len(r.Transform.Headers))}
					for k, v := range r.Transform.Headers {
						field := fmt.Sprintf("network.rules[%q][%d].transform.headers.%s", h, i, k)
						hv, aud, err := identityOf(field, v, tokens, nr.Audience)
						if err != nil {
							return nil, err
						}
						nr.Transform.Headers[k], nr.Audience = hv, aud
					}
				}
				n.Rules = append(n.Rules, nr)
			}
		}
	}
	if _, err := policy.CompileEgress(n); err != nil {
		return nil, badRequest("%v", err)
	}
	return n, nil
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request, owner string) error {
	sb, err := h.backend.Sandbox(r.Context(), owner, r.PathValue("id"))
	if err != nil {
		return err
	}
	keyID, _ := r.Context().Value(keyIDKey).(string)
	d := detailJSON{listedJSON: h.listedOf(sb), Domain: h.domain(r.Context()), EnvdAccessToken: h.issue(sb.ID, keyID), AllowInternetAccess: sb.NetworkMode() != policy.NetworkNone}
	d.Lifecycle.OnTimeout = "kill"
	if sb.AutoPause() {
		// Paused at its timeout; any request resumes it.
		d.Lifecycle.OnTimeout, d.Lifecycle.AutoResume = "pause", true
	}
	writeJSON(w, http.StatusOK, d)
	return nil
}

func (h *Handler) listV1(w http.ResponseWriter, r *http.Request, owner string) error {
	md, err := metadataFilter(r.URL.Query().Get("metadata"))
	if err != nil {
		return err
	}
	out := []listedJSON{}
	for _, sb := range h.sorted(r.Context(), owner, false) {
		if l := h.listedOf(sb); matches(l.Metadata, md) {
			out = append(out, l)
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// sorted lists owner's sandboxes by start time (then id).
func (h *Handler) sorted(ctx context.Context, owner string, asc bool) []*sandbox.Sandbox {
	all := h.backend.Sandboxes(ctx, owner)
	slices.SortFunc(all, func(a, b *sandbox.Sandbox) int {
		c := a.Created.Compare(b.Created)
		if c == 0 {
			c = strings.Compare(a.ID, b.ID)
		}
		if !asc {
			c = -c
		}
		return c
	})
	return all
}

// listV2 pages through running and paused sandboxes, newest first
// unless order=asc; state=running or state=paused lists only those.
// The page token is the base64url of the last listed sandbox's start time
// and id.
func (h *Handler) listV2(w http.ResponseWriter, r *http.Request, owner string) error {
	q := r.URL.Query()
	md, err := metadataFilter(q.Get("metadata"))
	if err != nil {
		return err
	}
	wantRunning, wantPaused := true, true
	if st := q.Get("state"); st != "" {
		wantRunning, wantPaused = false, false
		for s := range strings.SplitSeq(st, ",") {
			switch strings.TrimSpace(s) {
			case "running":
				wantRunning = true
			case "paused":
				wantPaused = true
			default:
				return badRequest("state must be running or paused")
			}
		}
	}
	asc := false
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		asc = true
	default:
		return badRequest("order must be asc or desc")
	}
	var after time.Time
	if s := q.Get("startedAfter"); s != "" {
		if after, err = time.Parse(time.RFC3339, s); err != nil {
			return badRequest("startedAfter must be an RFC 3339 time")
		}
	}
	limit := maxListLimit
	if s := q.Get("limit"); s != "" {
		if limit, err = strconv.Atoi(s); err != nil || limit < 1 || limit > maxListLimit {
			return badRequest("limit must be between 1 and %d", maxListLimit)
		}
	}
	var cursor *pageCursor
	if s := q.Get("nextToken"); s != "" {
		c, err := parseCursor(s)
		if err != nil {
			return err
		}
		cursor = &c
	}
	template := q.Get("template")

	out := []listedJSON{}
	next := ""
	if wantRunning || wantPaused {
		for _, sb := range h.sorted(r.Context(), owner, asc) {
			if cursor != nil && !cursor.before(sb, asc) {
				continue
			}
			if paused := sb.State() == sandbox.StatePaused; paused && !wantPaused || !paused && !wantRunning {
				continue
			}
			if !after.IsZero() && sb.Created.Before(after) {
				continue
			}
			l := h.listedOf(sb)
			if template != "" && template != l.TemplateID && template != sb.Template {
				continue
			}
			if !matches(l.Metadata, md) {
				continue
			}
			if len(out) == limit {
				last := out[len(out)-1]
				next = pageCursor{Started: last.StartedAt, ID: last.SandboxID}.String()
				break
			}
			out = append(out, l)
		}
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// pageCursor is the position after the last sandbox of a page.
type pageCursor struct {
	Started time.Time
	ID      string
}

func (c pageCursor) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte(c.Started.Format(time.RFC3339Nano) + "__" + c.ID))
}

func parseCursor(s string) (pageCursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		ts, id, ok := strings.Cut(string(b), "__")
		if t, terr := time.Parse(time.RFC3339Nano, ts); ok && terr == nil {
			return pageCursor{Started: t, ID: id}, nil
		}
	}
	return pageCursor{}, badRequest("nextToken is not a token this server issued")
}

// before reports whether sb comes after the cursor in the listing order.
func (c pageCursor) before(sb *sandbox.Sandbox, asc bool) bool {
	cmp := sb.Created.UTC().Compare(c.Started)
	if cmp == 0 {
		cmp = strings.Compare(sb.ID, c.ID)
	}
	if asc {
		return cmp > 0
	}
	return cmp < 0
}

// metadataFilter parses the SDK's doubly encoded metadata query: the value,
// once more percent-decoded, is a form string of percent-encoded pairs.
func metadataFilter(raw string) (map[string]string, error) {
	if raw == "" {
		return nil, nil
	}
	form, err := url.QueryUnescape(raw)
	if err != nil {
		return nil, badRequest("malformed metadata filter")
	}
	out := map[string]string{}
	for pair := range strings.SplitSeq(form, "&") {
		if pair == "" {
			continue
		}
		k, v, _ := strings.Cut(pair, "=")
		if k, err = url.QueryUnescape(k); err == nil {
			v, err = url.QueryUnescape(v)
		}
		if err != nil {
			return nil, badRequest("malformed metadata filter")
		}
		out[k] = v
	}
	return out, nil
}

func matches(md, want map[string]string) bool {
	for k, v := range want {
		if got, ok := md[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func (h *Handler) kill(w http.ResponseWriter, r *http.Request, owner string) error {
	id := r.PathValue("id")
	if err := h.backend.Kill(context.WithoutCancel(r.Context()), owner, id); err != nil {
		return err
	}
	h.forget(id)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *Handler) setTimeout(w http.ResponseWriter, r *http.Request, owner string) error {
	var req struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	if req.Timeout == nil {
		return badRequest("timeout is required")
	}
	d, err := h.timeoutOf("timeout", *req.Timeout)
	if err != nil {
		return err
	}
	if err := h.backend.SetTimeout(r.Context(), owner, r.PathValue("id"), d); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// refresh is the legacy keep-alive: it extends the end, never shortens it.
func (h *Handler) refresh(w http.ResponseWriter, r *http.Request, owner string) error {
	var req struct {
		Duration *int64 `json:"duration"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	d := defaultTimeoutV1
	if req.Duration != nil {
		var err error
		if d, err = h.timeoutOf("duration", *req.Duration); err != nil {
			return err
		}
	}
	if _, err := h.extend(r.Context(), owner, r.PathValue("id"), d); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// connect answers with the sandbox, extending its end to now + timeout if
// that is later (default 300 s).
func (h *Handler) connect(w http.ResponseWriter, r *http.Request, owner string) error {
	var req struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	d := defaultTimeoutV2
	if req.Timeout != nil {
		var err error
		if d, err = h.timeoutOf("timeout", *req.Timeout); err != nil {
			return err
		}
	}
	sb, err := h.extend(r.Context(), owner, r.PathValue("id"), d)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, h.sandboxOf(r.Context(), sb))
	return nil
}

func (h *Handler) extend(ctx context.Context, owner, id string, d time.Duration) (*sandbox.Sandbox, error) {
	sb, err := h.backend.Sandbox(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	// Connecting to a paused sandbox resumes it, as on E2B.
	if err := sb.Resume(context.WithoutCancel(ctx)); err != nil {
		return nil, err
	}
	if time.Now().Add(d).After(sb.Deadline()) {
		if err := h.backend.SetTimeout(ctx, owner, id, d); err != nil {
			return nil, err
		}
	}
	return sb, nil
}
