package api

import (
	"encoding/json"
	"time"
)

// Resources are a sandbox's limits (schema Resources). The server shows
// every field; in a request a zero field takes the server's default.
type Resources struct {
	CPUs     float64 `json:"cpus"`
	MemoryMB int64   `json:"memory_mb"`
	DiskMB   int64   `json:"disk_mb"`
	Pids     int64   `json:"pids"`
	// GPU asks for a number of GPUs (devices of the server's GPU class);
	// Devices for devices by their CDI names in a request, and lists
	// every device the sandbox holds in an answer (those drawn for GPU
	// included).
	GPU     int      `json:"gpu,omitempty"`
	Devices []string `json:"devices,omitempty"`
}

// Sandbox is a sandbox as the server describes it (schema Sandbox).
type Sandbox struct {
	ID         string            `json:"id"`
	Template   string            `json:"template"`
	State      string            `json:"state"` // running, paused, stopped, ...
	CreatedAt  time.Time         `json:"created_at"`
	ExpiresAt  time.Time         `json:"expires_at"`
	Resources  Resources         `json:"resources"`
	Metadata   map[string]string `json:"metadata"`
	StopReason string            `json:"stop_reason,omitempty"`
	// Usage is what the sandbox uses now, when asked for (?usage=1, for
	// running sandboxes; nil otherwise).
	Usage *LiveUsage `json:"usage,omitempty"`
	// AutoPause says the sandbox pauses instead of stopping at its end.
	AutoPause bool `json:"auto_pause,omitempty"`
	// VolumeMounts are the volumes a live sandbox mounted at create.
	VolumeMounts []VolumeMount `json:"volume_mounts,omitempty"`
}

// LiveUsage is what a running sandbox uses now (schema Sandbox.usage):
// on a listing only its CPU seconds and memory; for one sandbox every
// figure, read from its cgroup and writable layer at the call.
type LiveUsage struct {
	CPUSeconds       float64   `json:"cpu_seconds"`
	MemoryBytes      int64     `json:"memory_bytes"`
	MemoryPeakBytes  int64     `json:"memory_peak_bytes,omitempty"`
	MemoryLimitBytes int64     `json:"memory_limit_bytes,omitempty"`
	Pids             int64     `json:"pids,omitempty"`
	DiskBytes        int64     `json:"disk_bytes,omitempty"`
	OOMKills         int64     `json:"oom_kills,omitempty"`
	Pressure         *Pressure `json:"pressure,omitempty"` // cgroup v2 only
}

// Pressure is a sandbox's pressure stall information (cgroup v2 only;
// schema Sandbox.usage.pressure): the percent of the last 10 s in which
// some (or all) of its tasks stalled on the resource.
type Pressure struct {
	CPUSomeAvg10    float64 `json:"cpu_some_avg10"`
	MemorySomeAvg10 float64 `json:"memory_some_avg10"`
	MemoryFullAvg10 float64 `json:"memory_full_avg10"`
	IOSomeAvg10     float64 `json:"io_some_avg10"`
	IOFullAvg10     float64 `json:"io_full_avg10"`
}

// CreateSandbox is the body of POST /v1/sandboxes as the server reads
// it (schema CreateSandbox); every field is optional. The shorthand and
// the policy stay raw: internal/policy parses them strictly.
type CreateSandbox struct {
	Template  string            `json:"template,omitempty"`
	Timeout   *float64          `json:"timeout,omitempty"` // seconds
	Resources *Resources        `json:"resources,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	// Runtime chooses the sandbox's isolation among those the server
	// offers ("runc", and "gvisor" where runsc is installed or with
	// --kubernetes-runtime-classes); "" is the server's default.
	Runtime        string          `json:"runtime,omitempty"`
	SandboxConfig  json.RawMessage `json:"sandbox_config,omitempty"`
	SecurityPolicy json.RawMessage `json:"security_policy,omitempty"`
	// VolumeMounts are the account's volumes to mount when the sandbox
	// starts.
	VolumeMounts []VolumeMount `json:"volume_mounts,omitempty"`
	// Snapshot names a snapshot of the caller's account to start the
	// sandbox from: its processes, memory and files, and the template,
	// resources, environment and policy it recorded.
	Snapshot string `json:"snapshot,omitempty"`
	// AutoPause pauses the sandbox instead of stopping it when its
	// lifetime or the idle timeout ends, once it is idle.
	AutoPause bool `json:"auto_pause,omitempty"`
}

// VolumeMount mounts one of the account's volumes at Path (absolute,
// not in a system directory) in a new sandbox (schema VolumeMount).
// ReadOnly mounts it read-only; Shared lets other sandboxes that set it
// too write it at the same time (one writer at a time otherwise).
type VolumeMount struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
	Shared   bool   `json:"shared,omitempty"`
}

// PolicyAnswer is a sandbox's security policy as the server reports it
// (schema PolicyAnswer).
type PolicyAnswer struct {
	Policy json.RawMessage `json:"policy"`
	// RestartRequired: the last change loosened a rule a running
	// interpreter cannot drop; each code context restarts (losing its
	// state) before its next execution. Loosened names the rules.
	RestartRequired bool     `json:"restart_required"`
	Loosened        []string `json:"loosened,omitempty"`
}

// Port is a port of a sandbox and its preview URLs (schema Port).
type Port struct {
	Port      int      `json:"port"`
	Listening bool     `json:"listening"` // something listens on it inside the sandbox
	Addresses []string `json:"addresses"` // what its listeners are bound to
	Public    bool     `json:"public"`    // its preview needs no credential
	// URL is the preview's own origin, http://{port}-{id}.{preview
	// domain}:{server port}/ (empty without a preview domain); ProxyURL
	// the path form, for programs (browsers are sent to URL).
	URL      string `json:"url"`
	ProxyURL string `json:"proxy_url"`
	// SignedURL opens the preview in a browser (it sets a cookie) until
	// ExpiresAt, private or not.
	SignedURL string    `json:"signed_url"`
	ExpiresAt time.Time `json:"signed_url_expires_at"`
}

// PortList are a sandbox's listening and public ports, and its preview
// token (schema PortList).
type PortList struct {
	Ports []Port `json:"ports"`
	// Token opens any private port of the sandbox when sent in the
	// TokenHeader header (Sheepfold-Preview-Token).
	Token       string `json:"token"`
	TokenHeader string `json:"token_header"`
}

// Version is what the server reports about itself (GET /v1/version;
// schema Version). Its fields stand in the order of their names, as the
// server has always sent them.
type Version struct {
	API     string     `json:"api"`
	Cgroups string     `json:"cgroups"`
	Pool    *PoolStats `json:"pool,omitempty"` // the warm pool; nil without an engine
	Runtime string     `json:"runtime"`
	Version string     `json:"version"`
}

// PoolStats describes the server's warm pool of sandboxes started ahead
// (schema PoolStats).
type PoolStats struct {
	Size   int    `json:"size"`            // members always kept per pooled template (per node, with Nodes); 0: no pool
	Max    int    `json:"max"`             // the most members one pool grows to on demand (Size: it does not adapt)
	Wanted int    `json:"wanted"`          // members the pools aim to hold now: the floors and what demand added within the budget
	Nodes  int    `json:"nodes,omitempty"` // nodes the members are kept on (the kubernetes backend)
	Ready  int    `json:"ready"`           // members ready now
	Hits   uint64 `json:"hits"`            // creates served from the pool
	Misses uint64 `json:"misses"`          // creates that started a sandbox themselves
}
