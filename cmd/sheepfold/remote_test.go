package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestSandboxCreateResources: `sheepfold sandbox create`'s resource flags
// become the request's resources, which the server grants within the
// account's ceiling (its refusal, naming the field, is the command's
// error).
func TestSandboxCreateResources(t *testing.T) {
	var got map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = nil
		if err := json.Unmarshal(b, &got); err != nil {
			t.Errorf("body %q: %v", b, err)
		}
		w.Header().Set("Content-Type", "application/json")
		if res, _ := got["resources"].(map[string]any); res["memory_mb"] == 257.0 {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":{"code":"ERR_BAD_REQUEST","message":"resources.memory_mb asks for 257 MiB, above this account's max_memory_mb of 256 MiB"}}`)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"sb1","template":"python","state":"running"}`)
	}))
	defer srv.Close()
	run := func(args ...string) (string, error) {
		cmd := sandboxCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"create", "--url", srv.URL, "--api-key", "k"}, args...))
		err := cmd.ExecuteContext(context.Background())
		return out.String(), err
	}
	if _, err := run("--cpus", "1.5", "--memory-mb", "256", "--disk-mb", "128", "--pids", "64"); err != nil {
		t.Fatal(err)
	}
	if res, _ := got["resources"].(map[string]any); res["cpus"] != 1.5 || res["memory_mb"] != 256.0 || res["disk_mb"] != 128.0 || res["pids"] != 64.0 {
		t.Fatalf("sent %v", got)
	}
	if _, err := run(); err != nil || got["resources"] != nil {
		t.Fatalf("no flags sent %v (%v)", got, err)
	}
	if _, err := run("--memory-mb", "257"); err == nil || !strings.Contains(err.Error(), "resources.memory_mb") {
		t.Fatalf("over the ceiling: %v", err)
	}
}
