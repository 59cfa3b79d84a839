package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/config"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConfigPrecedence: a flag beats the environment, which beats the
// file, which beats the default; '_' may stand for '-'; lists are lists.
func TestConfigPrecedence(t *testing.T) {
	var cfg config.Config
	cmd := serveCmd(&cfg)
	if err := cmd.ParseFlags([]string{"--pool", "0", "--listen", "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	path := writeConfig(t, `
listen = "127.0.0.1:2"          # the flag wins
idle-timeout = "1m"             # the environment wins
max_sandboxes = 7               # '_' for '-'
account-max-sandboxes = 5
webhook-allow-hosts = ["a.example", "10.0.0.0/8"]
`)
	env := map[string]string{"SHEEPFOLD_IDLE_TIMEOUT": "3m", "SHEEPFOLD_RETENTION": "48h"}
	settings, err := applyConfig(cmd.Flags(), path, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]setting{}
	for _, s := range settings {
		got[s.Name] = s
	}
	want := map[string][2]string{
		"listen":                {"127.0.0.1:1", sourceFlag},
		"pool":                  {"0", sourceFlag},
		"idle-timeout":          {"3m0s", sourceEnv},
		"retention":             {"48h0m0s", sourceEnv},
		"max-sandboxes":         {"7", sourceFile},
		"account-max-sandboxes": {"5", sourceFile},
		"webhook-allow-hosts":   {"[a.example,10.0.0.0/8]", sourceFile},
		"shutdown-timeout":      {"10s", sourceDefault},
	}
	for name, w := range want {
		if s := got[name]; s.Value != w[0] || s.Source != w[1] {
			t.Errorf("%s = %q from %s, want %q from %s", name, s.Value, s.Source, w[0], w[1])
		}
	}
	if v, _ := cmd.Flags().GetInt("max-sandboxes"); v != 7 {
		t.Errorf("the flag's variable holds %d, not the file's 7", v)
	}
	var out bytes.Buffer
	printSettings(&out, settings)
	if !strings.Contains(out.String(), `max-sandboxes = "7"  # file`) {
		t.Errorf("print:\n%s", out.String())
	}
}

func TestConfigErrors(t *testing.T) {
	for name, c := range map[string]struct{ body, want string }{
		"unknown key":  {"max-sandbox = 3\n", `unknown key "max-sandbox"`},
		"bad value":    {"max-sandboxes = \"many\"\n", "max-sandboxes"},
		"table":        {"[limits]\nx = 1\n", "limits"},
		"twice":        {"max-sandboxes = 1\nmax_sandboxes = 2\n", "given twice"},
		"not toml":     {"max-sandboxes = = 1\n", "config file"},
		"config in it": {"config = \"/etc/other.toml\"\n", `unknown key "config"`},
	} {
		t.Run(name, func(t *testing.T) {
			var cfg config.Config
			cmd := serveCmd(&cfg)
			_, err := applyConfig(cmd.Flags(), writeConfig(t, c.body), func(string) string { return "" })
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one naming %q", err, c.want)
			}
		})
	}
	var cfg config.Config
	if _, err := applyConfig(serveCmd(&cfg).Flags(), filepath.Join(t.TempDir(), "none.toml"), os.Getenv); err == nil {
		t.Fatal("a named config file that does not exist is no error")
	}
}

// TestFreeCreditsFromConfig: an account the CLI makes (a key's own, or
// accounts create without --credits) starts with the server's configured
// free credits, from the environment or the config file.
func TestFreeCreditsFromConfig(t *testing.T) {
	cfg := config.Config{DataDir: t.TempDir() + "/data"}
	t.Setenv("SHEEPFOLD_CONFIG", writeConfig(t, `free-credits = "1.25"`+"\n"))
	if got, err := configuredFreeCredits(&cfg); err != nil || got != 1_250_000 {
		t.Fatalf("from the file: %d, %v", got, err)
	}
	t.Setenv("SHEEPFOLD_FREE_CREDITS", "2.50")
	if got, err := configuredFreeCredits(&cfg); err != nil || got != 2_500_000 {
		t.Fatalf("from the environment: %d, %v", got, err)
	}
	// Through the command: the key's new account holds them.
	root := keysCmd(&cfg)
	root.SetArgs([]string{"create", "--name", "free"})
	var out bytes.Buffer
	root.SetOut(&out)
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	st, err := openStore(context.Background(), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	keys, err := st.ListKeys(context.Background())
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys %+v, %v", keys, err)
	}
	ct, err := st.CreditTotals(context.Background(), keys[0].Owner)
	if err != nil || ct.FreeMicros != 2_500_000 {
		t.Fatalf("the new account's credits %+v, %v", ct, err)
	}
	t.Setenv("SHEEPFOLD_FREE_CREDITS", "-1")
	if _, err := configuredFreeCredits(&cfg); err == nil {
		t.Fatal("negative free credits accepted")
	}
}

// TestConfigProviders: [[providers]] tables sit beside the flags' keys;
// the key comes from the environment, never the file; mistakes name
// themselves.
func TestConfigProviders(t *testing.T) {
	path := writeConfig(t, `
max-sandboxes = 3

[[providers]]
name = "deepseek"
base_url = "https://api.deepseek.com/v1"
api_key_env = "DEEPSEEK_API_KEY"
models = ["deepseek-chat", "deepseek-reasoner"]
price_input_per_mtok = 0.27
price_output_per_mtok = 1.10
monthly_token_quota = 1000000
quota_fallback_model = "deepseek-chat"
timeout_seconds = 30
`)
	var cfg config.Config
	cmd := serveCmd(&cfg)
	if _, err := applyConfig(cmd.Flags(), path, func(string) string { return "" }); err != nil {
		t.Fatalf("the providers table upset the flags: %v", err)
	}
	ps, err := readProviders(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 || ps[0].Name != "deepseek" || len(ps[0].Models) != 2 || ps[0].PriceOutputPerMTok != 1.10 ||
		ps[0].MonthlyTokenQuota != 1000000 || ps[0].Timeout().Seconds() != 30 {
		t.Fatalf("providers %+v", ps)
	}
	for name, c := range map[string]struct{ body, want string }{
		"a key in the file": {"[[providers]]\nname = \"x\"\nbase_url = \"http://h/v1\"\nmodels = [\"m\"]\napi_key = \"sk-1\"\n", `unknown key "providers.api_key"`},
		"no models":         {"[[providers]]\nname = \"x\"\nbase_url = \"http://h/v1\"\n", "models must name at least one model"},
		"bad url":           {"[[providers]]\nname = \"x\"\nbase_url = \"h\"\nmodels = [\"m\"]\n", "base_url"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := readProviders(writeConfig(t, c.body)); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one naming %q", err, c.want)
			}
		})
	}
}
