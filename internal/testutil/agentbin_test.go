package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

const agentChildEnv = "SHEEPFOLD_TESTUTIL_AGENT_CHILD"

// TestAgentBinChild is the test process TestAgentBinSharedNoLeak starts:
// it prints the agent's path.
func TestAgentBinChild(t *testing.T) {
	if os.Getenv(agentChildEnv) == "" {
		t.Skip("run by TestAgentBinSharedNoLeak")
	}
	os.Stdout.WriteString("agent=" + AgentBin(t) + "\n")
}

// TestAgentBinSharedNoLeak: two test processes get the same agent, which
// outlives them, and leave nothing else in the temporary directory.
func TestAgentBinSharedNoLeak(t *testing.T) {
	if os.Getenv(agentChildEnv) != "" {
		t.Skip("child")
	}
	tmp := t.TempDir()
	var paths []string
	for range 2 {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestAgentBinChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), agentChildEnv+"=1", "TMPDIR="+tmp, "SHEEPFOLD_AGENT_BIN=")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		_, p, ok := strings.Cut(string(out), "agent=")
		if !ok {
			t.Fatalf("child printed no path:\n%s", out)
		}
		paths = append(paths, strings.TrimSpace(strings.SplitN(p, "\n", 2)[0]))
	}
	if paths[0] != paths[1] {
		t.Errorf("two processes built two agents: %v", paths)
	}
	if fi, err := os.Stat(paths[0]); err != nil || fi.Mode()&0o111 == 0 {
		t.Errorf("the agent is gone or not executable after its processes: %v", err)
	}
	entries, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"sheepfold-test-agent"}) {
		t.Errorf("the temporary directory holds %v, want only the cache", names)
	}
	cached, err := os.ReadDir(filepath.Join(tmp, "sheepfold-test-agent"))
	if err != nil || len(cached) != 1 {
		t.Errorf("the cache holds %d entries (%v), want one", len(cached), err)
	}
}

// TestPruneAgents: a build removes entries unused for agentCacheAge, and
// keeps the recent ones and its own.
func TestPruneAgents(t *testing.T) {
	cache := t.TempDir()
	old := time.Now().Add(-agentCacheAge - time.Hour)
	for _, name := range []string{"old", "recent", "mine"} {
		d := filepath.Join(cache, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if name != "recent" {
			if err := os.Chtimes(d, old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	pruneAgents(cache, "mine")
	entries, _ := os.ReadDir(cache)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"mine", "recent"}) {
		t.Errorf("after pruning: %v, want [mine recent]", names)
	}
}
