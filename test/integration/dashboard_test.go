package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/testutil/nodejs"
	"golang.org/x/sync/errgroup"
)

// TestDashboardBrowser runs test/ui/dashboard.mjs: the dashboard in
// Debian's chromium, driven by playwright-core, against a real server.
// Screenshots of each step go to $SHEEPFOLD_ARTIFACTS (default
// test/ui/artifacts).
func TestDashboardBrowser(t *testing.T) {
	s := start(t)
	node := nodejs.LookNode(t)
	if _, err := os.Stat("/usr/bin/chromium"); err != nil {
		t.Fatalf("chromium is missing (scripts/setup.sh installs it): %v", err)
	}
	dir, err := filepath.Abs("../ui")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Under the lock internal/server's TestPreviewBrowserIsolation takes
	// too: neither reinstalls while the other runs the browser.
	nodejs.NpmCI(t, dir)
	c := client.New(s.url, s.key)
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: 5 * time.Minute,
		SecurityPolicy: map[string]any{"access_control": map[string]any{"blocked_modules": []string{"socket"}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(context.Background(), sb.ID)

	// A sandbox serving HTTP on port 8000, for the previews panel.
	web, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(context.Background(), web.ID)
	if _, err := c.WriteFile(ctx, web.ID, "site/index.html", strings.NewReader("<h1>hello from the sandbox</h1>")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartCommand(ctx, web.ID, client.CommandRequest{Cmd: "python3", Args: []string{"-m", "http.server", "8000"}, Cwd: "/home/user/site"}); err != nil {
		t.Fatal(err)
	}

	// A plot run through the API, not the page: the sandbox page shows it
	// from the server's execution history.
	ex, err := c.Execute(ctx, web.ID, client.ExecuteRequest{Code: "import matplotlib.pyplot as plt\nplt.plot([2, 7, 1, 8])\nplt.title(\"from the API\")\nplt.show()\nprint(\"plotted-by-api\")"})
	if err != nil || ex.Status != "success" || len(ex.Results) == 0 || ex.Results[0].PNG == "" {
		t.Fatalf("plot through the API: %+v, %v", ex, err)
	}

	artifacts := os.Getenv("SHEEPFOLD_ARTIFACTS")
	if artifacts == "" {
		artifacts = filepath.Join(dir, "artifacts")
	}
	cmd := exec.CommandContext(ctx, node, "dashboard.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SHEEPFOLD_URL="+s.url, "SHEEPFOLD_API_KEY="+s.key, "POLICY_SANDBOX="+sb.ID, "PREVIEW_SANDBOX="+web.ID, "ARTIFACTS="+artifacts)
	out, err := cmd.CombinedOutput()
	t.Logf("dashboard.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("dashboard.mjs: %v", err)
	}
	t.Logf("screenshots in %s", artifacts)
}

// TestDashboardList200: with 200 running sandboxes (small ones, on a
// server of its own that allows that many), the dashboard's list, a
// sandbox's page and the metrics page are loaded afresh in the browser
// and timed. The goal is under 1 s each on the development machine; the
// figures are logged (and recorded in BENCHMARKS.md), not asserted, since
// a loaded machine may be slower; the test checks that every sandbox is
// listed.
func TestDashboardList200(t *testing.T) {
	const n = 200
	node := nodejs.LookNode(t)
	dir, err := filepath.Abs("../ui")
	if err != nil {
		t.Fatal(err)
	}
	nodejs.NpmCI(t, dir)
	s := newCrashServer(t)
	s.extra = []string{"--max-sandboxes", strconv.Itoa(n + 10)}
	s.start(0)
	c := s.client()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	ids := make([]string, n)
	begin := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	for i := range n {
		g.Go(func() error {
			sb, err := c.CreateSandbox(gctx, client.CreateSandboxRequest{Timeout: 20 * time.Minute,
				Resources: &client.Resources{CPUs: 0.25, MemoryMB: 128, DiskMB: 64}})
			if err != nil {
				return fmt.Errorf("sandbox %d: %w", i, err)
			}
			ids[i] = sb.ID
			return nil
		})
	}
	err = g.Wait()
	defer func() {
		var kg errgroup.Group
		kg.SetLimit(8)
		for _, id := range ids {
			if id != "" {
				kg.Go(func() error { c.Kill(context.Background(), id); return nil })
			}
		}
		kg.Wait()
	}()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("created %d sandboxes in %v", n, time.Since(begin).Round(time.Millisecond))

	artifacts := os.Getenv("SHEEPFOLD_ARTIFACTS")
	if artifacts == "" {
		artifacts = filepath.Join(dir, "artifacts")
	}
	cmd := exec.CommandContext(ctx, node, "list.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SHEEPFOLD_URL=http://"+s.addr, "SHEEPFOLD_API_KEY="+s.key, "SANDBOXES="+strconv.Itoa(n),
		"SANDBOX="+ids[0], "ARTIFACTS="+artifacts)
	out, err := cmd.CombinedOutput()
	t.Logf("list.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("list.mjs: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var times map[string][]float64
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &times); err != nil {
		t.Fatalf("list.mjs printed no timings: %v", err)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	for _, page := range []string{"list", "sandbox", "metrics"} {
		v := slices.Clone(times[page])
		slices.Sort(v)
		if len(v) == 0 {
			t.Fatalf("no timings of %s", page)
		}
		t.Logf("%s page with %d sandboxes: median %.0f ms, max %.0f ms over %d loads (goal < 1000 ms; load %s)",
			page, n, v[len(v)/2], v[len(v)-1], len(v), strings.Fields(string(load))[0])
	}
}
