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
	"github.com/sheepfold/sheepfold/internal/testutil/nodejs"
)

// TestDashboardHistory runs test/ui/history.mjs: what the seeds produce,
// run through the API, read in the dashboard's execution history in
// chromium: the Black-Friday cell's chart and its DataFrame as a table
// (its cells visible on a screenshot), an error and streamed text.
func TestDashboardHistory(t *testing.T) {
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
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "playwright-core")); err != nil {
		cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "npm_config_cache="+filepath.Join(t.TempDir(), "npm-cache"), "npm_config_update_notifier=false")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in test/ui: %v\n%s", err, out)
		}
	}
	c := client.New(s.url, s.key)
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(context.Background(), sb.ID)
	orders := "order_id,country,qty,price\n1,DE,2,10\n2,FR,1,20\n3,DE,1,5.5\n"
	if _, err := c.WriteFile(ctx, sb.ID, "orders.csv", strings.NewReader(orders)); err != nil {
		t.Fatal(err)
	}
	for _, code := range []string{
		// Seed 000's Black-Friday totals: a chart, then the frame.
		"# black-friday-totals\nimport pandas as pd\nimport matplotlib.pyplot as plt\n" +
			"df = pd.read_csv('orders.csv')\ntotals = (df.qty * df.price).groupby(df.country).sum().round(2)\n" +
			"totals.plot(kind='bar', title='CA par pays')\nplt.show()\n" +
			"totals.rename('total').reset_index()",
		"# history-error\n1 / 0",
		// Other HTML stays in a sandboxed frame.
		"# history-html\nclass Card:\n    def _repr_html_(self):\n        return '<p><b>html-result-ok</b></p>'\nCard()",
		"# history-stream\nimport sys, time\nfor p in (10, 50, 100):\n    print(f'\\rprogress {p}%', end='', flush=True)\n    time.sleep(0.05)\n" +
			"print()\nprint('\\x1b[31mred alert\\x1b[0m')",
	} {
		if _, err := c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: code}); err != nil {
			t.Fatal(err)
		}
	}
	artifacts := os.Getenv("SHEEPFOLD_ARTIFACTS")
	if artifacts == "" {
		artifacts = filepath.Join(dir, "artifacts")
	}
	cmd := exec.CommandContext(ctx, node, "history.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SHEEPFOLD_URL="+s.url, "SHEEPFOLD_API_KEY="+s.key, "HISTORY_SANDBOX="+sb.ID, "ARTIFACTS="+artifacts)
	out, err := cmd.CombinedOutput()
	t.Logf("history.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("history.mjs: %v", err)
	}
	t.Logf("screenshots in %s", artifacts)
}
