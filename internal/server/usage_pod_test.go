package server_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/sheepfold/sheepfold/internal/server"
)

// A runtime that cannot measure its sandboxes (the kubernetes one: a
// Pod's cgroup is on its node): the E2B metrics and /v1's usage come from
// each sandbox's agent, which reads its own cgroup (here a fake v2 one).
func TestUsageOfUnmeasuredSandbox(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{})
	cg := t.TempDir()
	for name, content := range map[string]string{
		"cgroup.controllers": "cpu memory pids\n",
		"cpu.stat":           "usage_usec 3000000\n",
		"cpu.max":            "200000 100000\n",
		"memory.current":     "100663296\n",
		"memory.max":         "805306368\n", // a Pod's: 512 MiB and its 256 MiB disk in memory
		"memory.peak":        "134217728\n",
		"memory.stat":        "anon 1\nfile 33554432\n",
		"pids.current":       "7\n",
	} {
		if err := os.WriteFile(filepath.Join(cg, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	e.rt.Unmeasured, e.rt.CgroupRoot = true, cg

	sb := e.e2bCreate(e.keyA, map[string]any{"templateID": "python"})
	r := e.e2bDo("GET", "/sandboxes/"+sb.ID+"/metrics", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	var samples []map[string]any
	if err := json.Unmarshal(r.body, &samples); err != nil || len(samples) != 1 {
		t.Fatalf("metrics %s (%v)", r.body, err)
	}
	m := samples[0]
	if m["cpuCount"] != 2.0 || m["memUsed"] != float64(64<<20) || m["memCache"] != float64(32<<20) || m["memTotal"] != float64(512<<20) { // getInfo's
		t.Fatalf("metrics sample %v", m)
	}

	r = e.do("GET", "/v1/sandboxes/"+sb.ID+"?usage=1", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	u, _ := r.json(t)["usage"].(map[string]any)
	if u["cpu_seconds"] != 3.0 || u["memory_bytes"] != float64(96<<20) || u["memory_peak_bytes"] != float64(128<<20) || u["pids"] != 7.0 {
		t.Fatalf("usage %v (%s)", u, r.body)
	}
}
