package testutil

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// agentCacheDir holds the agents AgentBin built, one directory per hash of
// their source: every test process of a checkout shares one build, and
// nothing is left per process. It lies under the temporary directory, and
// it and its entries are 0755, so that a sandbox's unprivileged root can
// traverse to its bind mount.
func agentCacheDir() string { return filepath.Join(os.TempDir(), "sheepfold-test-agent") }

// agentCacheAge is how long an entry no test has used stays: each use
// touches its directory, and a build of a new source removes the entries
// older than this (those of old commits and other checkouts' edits).
const agentCacheAge = 48 * time.Hour

const agentPkg = "github.com/sheepfold/sheepfold/cmd/sheepfold-agent"

var (
	agentOnce sync.Once
	agentPath string
	agentErr  error
)

// AgentBin returns the path of the static agent built from this checkout's
// source, building it when no test process has built that source yet
// (BuildAgent). Where there is no Go toolchain (the cgroup v2 guest runs
// compiled test binaries), SHEEPFOLD_AGENT_BIN names a built agent instead.
func AgentBin(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("SHEEPFOLD_AGENT_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("SHEEPFOLD_AGENT_BIN: %v", err)
		}
		return p
	}
	p, err := BuildAgent()
	if err != nil {
		t.Fatalf("build agent: %v", err)
	}
	return p
}

// BuildAgent is AgentBin for a TestMain: the agent's path, built once per
// process and once per source (keyed by the SHA-256 of every file the
// agent is built from and the toolchain's version) in a cache shared by
// every test process.
func BuildAgent() (string, error) {
	agentOnce.Do(func() { agentPath, agentErr = buildAgent(agentCacheDir()) })
	return agentPath, agentErr
}

func buildAgent(cache string) (string, error) {
	env := append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goruntime.GOARCH)
	key, err := agentSourceHash(env)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, key)
	bin := filepath.Join(dir, "sheepfold-agent")
	if _, err := os.Stat(bin); err == nil {
		now := time.Now()
		_ = os.Chtimes(dir, now, now) // in use: not pruned
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for _, d := range []string{cache, dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			return "", err
		}
	}
	// Built beside its final name and renamed onto it: another process
	// building the same source at once renames the same bytes.
	tmp, err := os.CreateTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.Command("go", "build", "-trimpath", "-o", tmp.Name(), agentPkg)
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%w\n%s", err, out)
	}
	if err := os.Chmod(tmp.Name(), 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), bin); err != nil {
		return "", err
	}
	pruneAgents(cache, key)
	return bin, nil
}

// agentSourceHash hashes what the agent is built from: the toolchain's
// version and, for every package it imports outside the standard library,
// the package's path and the contents of its Go and embedded files.
func agentSourceHash(env []string) (string, error) {
	cmd := exec.Command("go", "list", "-deps", "-f",
		`{{if not .Standard}}{{.ImportPath}}{{"\t"}}{{.Dir}}{{range .GoFiles}}{{"\t"}}{{.}}{{end}}{{range .EmbedFiles}}{{"\t"}}{{.}}{{end}}{{end}}`, agentPkg)
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list %s: %w", agentPkg, err)
	}
	h := sha256.New()
	fmt.Fprintln(h, goruntime.Version(), goruntime.GOARCH)
	for line := range strings.Lines(string(out)) {
		f := strings.Split(strings.TrimSpace(line), "\t")
		if len(f) < 2 {
			continue
		}
		fmt.Fprintln(h, f[0])
		for _, name := range f[2:] {
			if err := hashFile(h, f[1], name); err != nil {
				return "", err
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:32], nil
}

func hashFile(h io.Writer, dir, name string) error {
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintln(h, name)
	_, err = io.Copy(h, f)
	return err
}

// pruneAgents removes the cache's entries but keep that no test has used
// for agentCacheAge.
func pruneAgents(cache, keep string) {
	entries, err := os.ReadDir(cache)
	if err != nil {
		return
	}
	for _, e := range entries {
		if e.Name() == keep {
			continue
		}
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > agentCacheAge {
			os.RemoveAll(filepath.Join(cache, e.Name()))
		}
	}
}
