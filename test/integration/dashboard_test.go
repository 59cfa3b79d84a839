package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/client"
)

// TestDashboardBrowser runs test/ui/dashboard.mjs: the dashboard in
// Debian's chromium, driven by playwright-core, against a real server.
// Screenshots of each step go to $SHEEPFOLD_ARTIFACTS (default
// test/ui/artifacts).
func TestDashboardBrowser(t *testing.T) {
	s := start(t)
	node := lookNode(t)
	if _, err := os.Stat("/usr/bin/chromium"); err != nil {
		t.Fatalf("chromium is missing (scripts/setup.sh installs it): %v", err)
	}
	dir, err := filepath.Abs("../ui")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "playwright-core")); err != nil {
		cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "npm_config_cache="+filepath.Join(t.TempDir(), "npm-cache"), "npm_config_update_notifier=false")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in test/ui: %v\n%s", err, out)
		}
	}
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
