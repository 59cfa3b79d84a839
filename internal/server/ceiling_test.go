package server_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/llm"
	"github.com/sheepfold/sheepfold/internal/llm/llmtest"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
)

// The ceiling of TestOneCeiling: the account's per-sandbox maxima and the
// engine's most pids.
const (
	ceilCPUs    = 1
	ceilMemMB   = 256
	ceilDiskMB  = 128
	ceilTimeout = 600
	ceilPids    = 64
)

// ceilingRoute asks for one resource through one route: at (the ceiling)
// or over it (the ceiling plus one unit). It returns the sandbox created,
// or the refusal's status and message.
type ceilingRoute struct {
	name  string
	field string // what a refusal must name
	ask   func(e *env, over bool) (id string, status int, msg string)
	// granted is what the sandbox must be given when it asked at the
	// ceiling (the fields not asked are the defaults cut to the ceiling).
	granted runtime.Limits
}

// atOrOver is at when !over, else over.
func atOrOver[T any](over bool, at, above T) T {
	if over {
		return above
	}
	return at
}

// v1 asks through POST /v1/sandboxes (or /v1/sessions) with body.
func v1(path string, body func(over bool) map[string]any) func(e *env, over bool) (string, int, string) {
	return func(e *env, over bool) (string, int, string) {
		r := e.do("POST", path, e.keyA, body(over))
		if r.status != http.StatusCreated {
			return "", r.status, errMessage(e.t, r)
		}
		return r.json(e.t)["id"].(string), r.status, ""
	}
}

// e2bAsk asks through E2B's POST /v2/sandboxes.
func e2bAsk(body func(over bool) map[string]any) func(e *env, over bool) (string, int, string) {
	return func(e *env, over bool) (string, int, string) {
		b := body(over)
		b["templateID"] = "base"
		r := e.e2bDo("POST", "/v2/sandboxes", e.keyA, b)
		if r.status != http.StatusCreated {
			return "", r.status, fmt.Sprint(r.json(e.t)["message"])
		}
		return r.json(e.t)["sandboxID"].(string), r.status, ""
	}
}

// mcpAsk asks through the MCP tool create_sandbox.
func mcpAsk(args func(over bool) map[string]any) func(e *env, over bool) (string, int, string) {
	return func(e *env, over bool) (string, int, string) {
		cs, err := e.mcpConnect(e.keyA)
		if err != nil {
			e.t.Fatal(err)
		}
		defer cs.Close()
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "create_sandbox", Arguments: args(over)})
		if err != nil {
			e.t.Fatal(err)
		}
		if res.IsError {
			text := res.Content[0].(*mcp.TextContent).Text
			if strings.HasPrefix(text, "ERR_BAD_REQUEST: ") {
				return "", http.StatusBadRequest, text
			}
			return "", 0, text
		}
		return res.StructuredContent.(map[string]any)["sandbox_id"].(string), http.StatusCreated, ""
	}
}

func errMessage(t testing.TB, r resp) string {
	t.Helper()
	return fmt.Sprint(r.json(t)["error"].(map[string]any)["message"])
}

// TestOneCeiling: every way of asking for a sandbox's resources is held
// to one ceiling, the account's (max_cpus, max_memory_mb, max_disk_mb,
// max_timeout) and the engine's (pids): asking one unit over it is 400
// naming the field the caller wrote, asking exactly for it is granted,
// and what the runtime is given (the cgroup's limits, the disk's size)
// is what was granted. The control for the policy's routes: before the
// one ceiling, security_policy.resource_limits and sandbox_config raised
// memory and disk past the account's maxima (a 256 MB account got a
// 4096 MiB cgroup), which the over cases catch.
func TestOneCeiling(t *testing.T) {
	t.Parallel()
	// The engine's defaults are below the ceiling, so that what each
	// route asks for shows in what the runtime is given.
	defaults := runtime.Limits{CPUs: 0.5, MemoryBytes: 128 << 20, DiskBytes: 64 << 20, Pids: 32}
	prov := llmtest.New(nil)
	t.Cleanup(prov.Close)
	relay, err := llm.New([]llm.Provider{{Name: "p", BaseURL: prov.URL, APIKeyEnv: "K", Models: []string{"small"}}},
		func(string) string { return "sk-provider" })
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, server.Config{Models: relay, Accounts: account.Config{Defaults: account.Limits{
		MaxCPUs: ceilCPUs, MaxMemoryMB: ceilMemMB, MaxDiskMB: ceilDiskMB, MaxTimeout: ceilTimeout}}},
		func(c *sandbox.Config) {
			c.MaxLimits.Pids = ceilPids
			c.DefaultLimits = defaults
		})

	// What a sandbox that asks for nothing gets, and what each route asks
	// for at the ceiling.
	base := defaults
	mem := func(l runtime.Limits) runtime.Limits { l.MemoryBytes = ceilMemMB << 20; return l }(base)
	disk := func(l runtime.Limits) runtime.Limits { l.DiskBytes = ceilDiskMB << 20; return l }(base)
	cpus := func(l runtime.Limits) runtime.Limits { l.CPUs = ceilCPUs; return l }(base)
	pids := func(l runtime.Limits) runtime.Limits { l.Pids = ceilPids; return l }(base)
	policy := func(k string, over bool, at int) map[string]any {
		return map[string]any{"security_policy": map[string]any{"resource_limits": map[string]any{k: atOrOver(over, at, at+1)}}}
	}
	routes := []ceilingRoute{
		{"v1 resources.memory_mb", "resources.memory_mb", v1("/v1/sandboxes", func(over bool) map[string]any {
			return map[string]any{"resources": map[string]any{"memory_mb": atOrOver(over, ceilMemMB, ceilMemMB+1)}}
		}), mem},
		{"v1 resources.disk_mb", "resources.disk_mb", v1("/v1/sandboxes", func(over bool) map[string]any {
			return map[string]any{"resources": map[string]any{"disk_mb": atOrOver(over, ceilDiskMB, ceilDiskMB+1)}}
		}), disk},
		{"v1 resources.cpus", "resources.cpus", v1("/v1/sandboxes", func(over bool) map[string]any {
			return map[string]any{"resources": map[string]any{"cpus": atOrOver(over, 1.0, 1.01)}}
		}), cpus},
		{"v1 resources.pids", "resources.pids", v1("/v1/sandboxes", func(over bool) map[string]any {
			return map[string]any{"resources": map[string]any{"pids": atOrOver(over, ceilPids, ceilPids+1)}}
		}), pids},
		{"v1 timeout", "timeout", v1("/v1/sandboxes", func(over bool) map[string]any {
			return map[string]any{"timeout": atOrOver(over, ceilTimeout, ceilTimeout+1)}
		}), base},
		{"v1 security_policy memory_mb", "security_policy.resource_limits.memory_mb", v1("/v1/sandboxes", func(over bool) map[string]any {
			return policy("memory_mb", over, ceilMemMB)
		}), mem},
		{"v1 security_policy disk_write_mb", "security_policy.resource_limits.disk_write_mb", v1("/v1/sandboxes", func(over bool) map[string]any {
			return policy("disk_write_mb", over, ceilDiskMB)
		}), disk},
		{"v1 sandbox_config max_memory_mb", "sandbox_config.max_memory_mb", v1("/v1/sandboxes", func(over bool) map[string]any {
			return map[string]any{"sandbox_config": map[string]any{"max_memory_mb": atOrOver(over, ceilMemMB, ceilMemMB+1)}}
		}), mem},
		{"v1 policy over resources", "security_policy.resource_limits.memory_mb", v1("/v1/sandboxes", func(over bool) map[string]any {
			b := policy("memory_mb", over, ceilMemMB)
			b["resources"] = map[string]any{"memory_mb": 64}
			return b
		}), mem},
		{"session resources.memory_mb", "resources.memory_mb", v1("/v1/sessions", func(over bool) map[string]any {
			return map[string]any{"model": "small", "resources": map[string]any{"memory_mb": atOrOver(over, ceilMemMB, ceilMemMB+1)}}
		}), mem},
		{"session sandbox_config max_memory_mb", "sandbox_config.max_memory_mb", v1("/v1/sessions", func(over bool) map[string]any {
			return map[string]any{"model": "small", "sandbox_config": map[string]any{"max_memory_mb": atOrOver(over, ceilMemMB, ceilMemMB+1)}}
		}), mem},
		{"session security_policy disk_write_mb", "security_policy.resource_limits.disk_write_mb", v1("/v1/sessions", func(over bool) map[string]any {
			b := policy("disk_write_mb", over, ceilDiskMB)
			b["model"] = "small"
			return b
		}), disk},
		{"e2b memoryMB", "memoryMB", e2bAsk(func(over bool) map[string]any {
			return map[string]any{"memoryMB": atOrOver(over, ceilMemMB, ceilMemMB+1)}
		}), mem},
		{"e2b diskSizeMB", "diskSizeMB", e2bAsk(func(over bool) map[string]any {
			return map[string]any{"diskSizeMB": atOrOver(over, ceilDiskMB, ceilDiskMB+1)}
		}), disk},
		{"e2b cpuCount", "cpuCount", e2bAsk(func(over bool) map[string]any {
			return map[string]any{"cpuCount": atOrOver(over, 1, 2)}
		}), cpus},
		{"e2b timeout", "timeout", e2bAsk(func(over bool) map[string]any {
			return map[string]any{"timeout": atOrOver(over, ceilTimeout, ceilTimeout+1)}
		}), base},
		{"mcp resources.memory_mb", "resources.memory_mb", mcpAsk(func(over bool) map[string]any {
			return map[string]any{"resources": map[string]any{"memory_mb": atOrOver(over, ceilMemMB, ceilMemMB+1)}}
		}), mem},
		{"mcp security_policy memory_mb", "security_policy.resource_limits.memory_mb", mcpAsk(func(over bool) map[string]any {
			return policy("memory_mb", over, ceilMemMB)
		}), mem},
		{"mcp security_policy disk_write_mb", "security_policy.resource_limits.disk_write_mb", mcpAsk(func(over bool) map[string]any {
			return policy("disk_write_mb", over, ceilDiskMB)
		}), disk},
	}
	for _, rt := range routes {
		t.Run(rt.name, func(t *testing.T) {
			e.t = t
			_, status, msg := rt.ask(e, true)
			if status != http.StatusBadRequest || !strings.Contains(msg, rt.field) {
				t.Fatalf("one over the ceiling: status %d, message %q; want 400 naming %s", status, msg, rt.field)
			}
			id, status, msg := rt.ask(e, false)
			if status != http.StatusCreated {
				t.Fatalf("at the ceiling: status %d: %s", status, msg)
			}
			if got := e.rt.Spec(id).Limits; got != rt.granted {
				t.Fatalf("the runtime was given %+v, want %+v", got, rt.granted)
			}
			if rt.field == "timeout" {
				sb, err := e.engine.Get(id)
				if err != nil {
					t.Fatal(err)
				}
				if left := time.Until(sb.Deadline()); left < (ceilTimeout-10)*time.Second || left > ceilTimeout*time.Second {
					t.Fatalf("a lifetime of %v, want %d s", left, ceilTimeout)
				}
			}
			want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
		})
	}

	// A lifetime asked later, and a policy replaced, pass the same ceiling.
	e.t = t
	id := e.create(e.keyA, policy("memory_mb", false, ceilMemMB))
	for _, c := range []struct {
		path, key string
		body      any
		e2b       bool
		field     string
	}{
		{"/v1/sandboxes/" + id + "/timeout", e.keyA, map[string]any{"timeout": ceilTimeout + 1}, false, "timeout"},
		{"/sandboxes/" + id + "/timeout", e.keyA, map[string]any{"timeout": ceilTimeout + 1}, true, "timeout"},
		{"/v1/sandboxes/" + id + "/policy", e.keyA, map[string]any{"resource_limits": map[string]any{"memory_mb": ceilMemMB + 1}}, false, "resource_limits.memory_mb"},
		{"/v1/sandboxes/" + id + "/policy", e.keyA, map[string]any{"resource_limits": map[string]any{"disk_write_mb": ceilDiskMB + 1}}, false, "resource_limits.disk_write_mb"},
	} {
		method := "POST"
		if strings.HasSuffix(c.path, "/policy") {
			method = "PUT"
		}
		var r resp
		var msg string
		if c.e2b {
			r = e.e2bDo(method, c.path, c.key, c.body)
			msg = fmt.Sprint(r.json(t)["message"])
		} else {
			r = e.do(method, c.path, c.key, c.body)
			msg = errMessage(t, r)
		}
		if r.status != http.StatusBadRequest || !strings.Contains(msg, c.field) || !strings.Contains(msg, "above this account's") {
			t.Fatalf("%s %s: status %d, %q; want 400 naming %s above the account's ceiling", method, c.path, r.status, msg, c.field)
		}
	}
	want(t, e.do("POST", "/v1/sandboxes/"+id+"/timeout", e.keyA, map[string]any{"timeout": ceilTimeout}), http.StatusOK, "")
	want(t, e.e2bDo("POST", "/sandboxes/"+id+"/timeout", e.keyA, map[string]any{"timeout": ceilTimeout}), http.StatusNoContent, "")
	want(t, e.do("PUT", "/v1/sandboxes/"+id+"/policy", e.keyA, map[string]any{"resource_limits": map[string]any{"memory_mb": ceilMemMB,
		"cpu_time_seconds": 5}}), http.StatusOK, "")
}

// TestHostCeiling: with disks kept in memory, admission counts a
// sandbox's memory plus disk against the host's memory times the
// overcommit (with disks of their own, the memory alone:
// TestAdmissionDiskNotMemory), and that count is of what the
// sandbox is granted, the policy's memory and disk included. Before the
// one ceiling, admission counted `resources` alone and the policy raised
// the cgroup after it (the over cases of the policy's fields were
// admitted). One sandbox larger than the host could ever hold is 400
// naming the field; exactly the host's size is admitted.
func TestHostCeiling(t *testing.T) {
	t.Parallel()
	// 512 MiB in all; the default disk is 256 MiB, so 256 MiB of memory is the most.
	e := newEnv(t, server.Config{HostMemoryBytes: 512 << 20, Overcommit: 1, NoAccounting: true})
	e.rt.DiskMemory.Store(true)
	for _, c := range []struct {
		field string
		body  func(mb int) map[string]any
		at    int
		got   func(runtime.Limits) int64
	}{
		{"resources.memory_mb", func(mb int) map[string]any { return map[string]any{"resources": map[string]any{"memory_mb": mb}} },
			256, func(l runtime.Limits) int64 { return l.MemoryBytes }},
		{"security_policy.resource_limits.memory_mb", func(mb int) map[string]any {
			return map[string]any{"security_policy": map[string]any{"resource_limits": map[string]any{"memory_mb": mb}}}
		}, 256, func(l runtime.Limits) int64 { return l.MemoryBytes }},
		{"sandbox_config.max_memory_mb", func(mb int) map[string]any {
			return map[string]any{"sandbox_config": map[string]any{"max_memory_mb": mb}}
		},
			256, func(l runtime.Limits) int64 { return l.MemoryBytes }},
		{"security_policy.resource_limits.disk_write_mb", func(mb int) map[string]any {
			return map[string]any{"security_policy": map[string]any{"resource_limits": map[string]any{"disk_write_mb": mb}}}
		}, 0, func(l runtime.Limits) int64 { return l.DiskBytes }}, // beside 512 MiB of memory: nothing fits
		{"resources.disk_mb", func(mb int) map[string]any {
			return map[string]any{"resources": map[string]any{"memory_mb": 64, "disk_mb": mb}}
		}, 448, func(l runtime.Limits) int64 { return l.DiskBytes }},
	} {
		r := e.do("POST", "/v1/sandboxes", e.keyA, c.body(c.at+1))
		if r.status != http.StatusBadRequest || !strings.Contains(errMessage(t, r), c.field) ||
			!strings.Contains(errMessage(t, r), "more than this host can hold") {
			t.Fatalf("%s one over the host: %d %s", c.field, r.status, r.body)
		}
		if c.at == 0 {
			continue
		}
		id := e.create(e.keyA, c.body(c.at))
		if got := c.got(e.rt.Spec(id).Limits); got != int64(c.at)<<20 {
			t.Fatalf("%s: the runtime was given %d MiB, want %d", c.field, got>>20, c.at)
		}
		want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	}
}
