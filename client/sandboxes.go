package client

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"time"

	"github.com/sheepfold/sheepfold/api"
)

// Resources are a sandbox's limits. Zero fields take the server's defaults.
type Resources = api.Resources

// SandboxConfig are a sandbox's policies.
type SandboxConfig struct {
	// MaxExecutionTime is the default and longest timeout of one execution.
	MaxExecutionTime time.Duration `json:"-"`
	MaxMemoryMB      int64         `json:"max_memory_mb,omitempty"`
	// NetworkRestricted false is the security policy's network mode
	// "public"; nil or true is "none".
	NetworkRestricted  *bool `json:"network_restricted,omitempty"`
	FilesystemReadonly bool  `json:"filesystem_readonly,omitempty"`
	// AllowedModules is the shorthand of the policy's
	// access_control.allowed_imports.
	AllowedModules []string `json:"allowed_modules,omitempty"`
	// FilesystemPathsWhitelist is the shorthand of the policy's
	// filesystem.writable_paths.
	FilesystemPathsWhitelist []string `json:"filesystem_paths_whitelist,omitempty"`
}

// CreateSandboxRequest describes a new sandbox; every field is optional.
type CreateSandboxRequest struct {
	Template      string
	Timeout       time.Duration // lifetime; the sandbox is stopped after it unless extended
	Resources     *Resources
	Env           map[string]string
	Metadata      map[string]string
	SandboxConfig *SandboxConfig
	// SecurityPolicy is the sandbox's security policy: the JSON object of
	// README "Policies and network" (a map, a struct or json.RawMessage).
	SecurityPolicy any
	// Runtime is how the sandbox is isolated, among the runtimes the
	// server offers (the Kubernetes backend's runtime classes, e.g.
	// gvisor); empty: the server's.
	Runtime string
	// VolumeMounts are the account's volumes to mount when the sandbox
	// starts (CreateVolume).
	VolumeMounts []VolumeMount
	// Snapshot starts the sandbox from a snapshot of the account's
	// (CreateSnapshot): its processes, memory and files, and the
	// template, resources, environment and policy it recorded, so that
	// Template, Resources, Env, SandboxConfig, SecurityPolicy and Runtime
	// must be left empty.
	Snapshot string
	// AutoPause pauses the sandbox instead of stopping it when its
	// lifetime (or the server's idle timeout) ends, once it is idle: no
	// request, no preview traffic, no CPU in use. Any request resumes it,
	// with its lifetime again. The server must be able to pause.
	AutoPause bool
}

type sandboxConfigJSON struct {
	MaxExecutionTime float64 `json:"max_execution_time,omitempty"`
	*SandboxConfig
}

// Sandbox is a sandbox as the server describes it.
type Sandbox = api.Sandbox

// LiveUsage is what a running sandbox uses now: on a listing only its
// CPU seconds and memory; for one sandbox every figure.
type LiveUsage = api.LiveUsage

// Pressure is a sandbox's pressure stall information (cgroup v2 only):
// the percent of the last 10 s in which some (or all) of its tasks
// stalled on the resource.
type Pressure = api.Pressure

func secs(d time.Duration) float64 { return math.Ceil(d.Seconds()*1000) / 1000 }

// CreateSandbox starts a sandbox.
func (c *Client) CreateSandbox(ctx context.Context, req CreateSandboxRequest) (*Sandbox, error) {
	body := api.CreateSandbox{Template: req.Template, Env: req.Env, Metadata: req.Metadata, Runtime: req.Runtime,
		VolumeMounts: req.VolumeMounts, Snapshot: req.Snapshot, AutoPause: req.AutoPause}
	if req.Timeout > 0 {
		t := secs(req.Timeout)
		body.Timeout = &t
	}
	body.Resources = req.Resources
	var err error
	if req.SandboxConfig != nil {
		if body.SandboxConfig, err = json.Marshal(sandboxConfigJSON{MaxExecutionTime: secs(req.SandboxConfig.MaxExecutionTime), SandboxConfig: req.SandboxConfig}); err != nil {
			return nil, err
		}
	}
	if req.SecurityPolicy != nil {
		if body.SecurityPolicy, err = json.Marshal(req.SecurityPolicy); err != nil {
			return nil, fmt.Errorf("security policy: %w", err)
		}
	}
	var sb Sandbox
	return &sb, c.call(ctx, request{method: "POST", path: "/v1/sandboxes", json: body}, &sb)
}

// GetSandbox describes a sandbox; one of the caller's that has stopped is
// returned with State "stopped" and its StopReason.
func (c *Client) GetSandbox(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	return &sb, c.call(ctx, request{method: "GET", path: sandboxPath(id)}, &sb)
}

// ListSandboxes lists the caller's running sandboxes; all adds the stopped
// ones the server remembers.
func (c *Client) ListSandboxes(ctx context.Context, all bool) ([]Sandbox, error) {
	var q url.Values
	if all {
		q = url.Values{"state": {"all"}}
	}
	var out struct {
		Sandboxes []Sandbox `json:"sandboxes"`
	}
	return out.Sandboxes, c.call(ctx, request{method: "GET", path: "/v1/sandboxes", query: q}, &out)
}

// ListSandboxesIn lists the caller's sandboxes in one state: "running",
// "paused", or "all" (the stopped ones the server remembers too).
func (c *Client) ListSandboxesIn(ctx context.Context, state string) ([]Sandbox, error) {
	var out struct {
		Sandboxes []Sandbox `json:"sandboxes"`
	}
	return out.Sandboxes, c.call(ctx, request{method: "GET", path: "/v1/sandboxes", query: url.Values{"state": {state}}}, &out)
}

// PauseSandbox checkpoints a sandbox to the server's disk and frees its
// memory and processes; its files stay and its lifetime stands still.
// Any request that needs it (an execution, a command, a file call), or
// ResumeSandbox, resumes it. ErrNotSupported: the server's runtime
// cannot checkpoint; ErrSandboxState: a request of it is in flight. A
// sandbox with a network keeps its policy and request count; its
// connections open at the pause are closed.
func (c *Client) PauseSandbox(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	return &sb, c.call(ctx, request{method: "POST", path: sandboxPath(id, "pause")}, &sb)
}

// FreezeSandbox pauses a sandbox with the cgroup freezer: its processes
// stop where they are and keep their memory (still charged and metered),
// so that its resume takes milliseconds. Resumed as after PauseSandbox.
func (c *Client) FreezeSandbox(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	return &sb, c.call(ctx, request{method: "POST", path: sandboxPath(id, "pause"), json: api.PauseRequest{Memory: "keep"}}, &sb)
}

// ResumeSandbox restores a paused sandbox as it was (its variables,
// background commands and files); a running one is left as it is.
func (c *Client) ResumeSandbox(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	return &sb, c.call(ctx, request{method: "POST", path: sandboxPath(id, "resume")}, &sb)
}

// SetTimeout keeps a sandbox alive: it now lives d from now.
func (c *Client) SetTimeout(ctx context.Context, id string, d time.Duration) (*Sandbox, error) {
	var sb Sandbox
	t := secs(d)
	return &sb, c.call(ctx, request{method: "POST", path: sandboxPath(id, "timeout"),
		json: api.SetTimeout{Timeout: &t}}, &sb)
}

// Kill stops a sandbox and removes everything in it.
func (c *Client) Kill(ctx context.Context, id string) error {
	return c.call(ctx, request{method: "DELETE", path: sandboxPath(id)}, nil)
}

// Version is what the server reports about itself.
type Version = api.Version

// PoolStats describes the server's warm pool of sandboxes started ahead.
type PoolStats = api.PoolStats

// Version asks the server for its version.
func (c *Client) Version(ctx context.Context) (*Version, error) {
	var v Version
	return &v, c.call(ctx, request{method: "GET", path: "/v1/version"}, &v)
}
