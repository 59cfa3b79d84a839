package sheepfold_test

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The floors of the module's packages, lowest first. A package imports
// packages of its own floor or of floors below it, never above: the
// arrows point down. Runtime and store implementations sit above the
// transport, so that only the wiring reaches them (the engine and the
// server are handed an interface); the agent's own packages are the
// agent binary's alone (agentOnly). A package missing here fails the
// test: place it on its floor.
var floors = [][]string{
	// 1. Words: vocabularies and small mechanisms every layer may use,
	// of the standard library and golang.org/x (x/sys; x/net/bpf for
	// policy's seccomp program) only.
	{"api", "client", "internal/abort", "internal/agentproto", "internal/agenttls", "internal/apierr",
		"internal/backoff", "internal/bound", "internal/cgroup", "internal/config", "internal/events", "internal/identity",
		"internal/fdpass", "internal/homeseed", "internal/lang", "internal/osthread", "internal/pidfd", "internal/policy",
		"internal/psi", "internal/ratelimit", "internal/ui", "internal/e2b/envdpb/...", "internal/testutil/..."},
	// 2. Interfaces and machinery under the engine: the Runtime and
	// store interfaces, templates, the egress gateway, TypeScript, the
	// kernels' drivers, the model relay.
	{"internal/runtime", "internal/store", "internal/template", "internal/template/ociimage", "internal/doctor",
		"internal/egress", "internal/typescript", "internal/kernel", "internal/llm", "internal/volume"},
	// 3. The engine (host side) and the agent (sandbox side), which speak
	// through agentproto alone.
	{"internal/sandbox", "internal/agent"},
	// 4. Services over the engine and the store.
	{"internal/account", "internal/alerts", "internal/auth", "internal/batch", "internal/metering", "internal/metrics", "internal/preview", "internal/secrets", "internal/session", "internal/webhooks", "internal/store/storetest", "internal/llm/llmtest"},
	// 5. Transport: HTTP, E2B's protocols, MCP.
	{"internal/server", "internal/e2b", "internal/mcpserver"},
	// 6. Implementations of the interfaces of floor 2, handed in by the
	// wiring, and the Kubernetes runtime's node plugin.
	{"internal/runtime/oci", "internal/runtime/kubernetes", "internal/runtime/kubernetes/nri", "internal/runtime/fake",
		"internal/store/sqlite", "internal/store/postgres", "internal/store/transfer"},
	// 7. Wiring and binaries: they build everything and hand it round.
	{"internal/engine", "internal/bench", "cmd/sheepfold", "cmd/sheepfold-agent", "examples/...", "test/..."},
}

// narrow are packages that may import, of the module, only the words
// (floor 1) and what is listed: a runtime knows nothing of the engine's
// services (the egress gateway, policies' enforcement), only how to start
// and reach an agent.
var narrow = map[string][]string{
	"internal/runtime/oci":        {"internal/runtime"},
	"internal/runtime/kubernetes": {"internal/runtime", "internal/runtime/oci"},
	"internal/runtime/fake":       {"internal/runtime"},
	// The node's NRI plugin knows only the annotation it acts on.
	"internal/runtime/kubernetes/nri": {"internal/runtime/kubernetes"},
}

// allowedNarrow reports whether narrow package pkg may import imp.
func allowedNarrow(pkg, imp string) bool {
	allowed, ok := narrow[pkg]
	return !ok || floorOf(imp) == 1 || slices.Contains(allowed, imp)
}

// agentOnly are the agent's own packages: only the agent binary imports
// them (the host speaks to the agent through agentproto).
var agentOnly = map[string][]string{
	"internal/agent":  {"cmd/sheepfold-agent"},
	"internal/kernel": {"cmd/sheepfold-agent"},
}

// agentSide is all of the module the agent binary may contain: it knows
// nothing of the server, the engine or a runtime (api is the words of the
// wire: agentproto carries its Result, ExecError and FileInfo).
var agentSide = []string{"cmd/sheepfold-agent", "internal/agent", "internal/kernel", "internal/agentproto", "api",
	"internal/agenttls", "internal/lang", "internal/fdpass", "internal/osthread", "internal/pidfd", "internal/psi", "internal/cgroup",
	"internal/backoff", "internal/homeseed", "internal/ratelimit"}

const module = "github.com/sheepfold/sheepfold"

// floorOf returns the floor (1-based) of a package path relative to the
// module, or 0 when it has none.
func floorOf(pkg string) int {
	for i, f := range floors {
		for _, p := range f {
			if p == pkg || strings.HasSuffix(p, "/...") && strings.HasPrefix(pkg+"/", strings.TrimSuffix(p, "...")) {
				return i + 1
			}
		}
	}
	return 0
}

// imports lists each package of the module with the packages of the
// module it imports (its own code's, not its tests').
func imports(t *testing.T, patterns ...string) map[string][]string {
	t.Helper()
	args := append([]string{"list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`}, patterns...)
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	g := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		pkg, ok := strings.CutPrefix(f[0], module+"/")
		if !ok {
			continue // the module's root: this test
		}
		g[pkg] = []string{}
		for _, imp := range f[1:] {
			if rel, ok := strings.CutPrefix(imp, module+"/"); ok {
				g[pkg] = append(g[pkg], rel)
			}
		}
	}
	return g
}

// TestLayers: every package has a floor, every import points to its own
// floor or below, runtimes import narrowly, the agent's packages are the
// agent binary's alone, and the agent binary holds nothing of the host.
func TestLayers(t *testing.T) {
	t.Parallel()
	g := imports(t, "./...")
	if len(g) < 40 {
		t.Fatalf("go list found %d packages", len(g))
	}
	for _, pkg := range slices.Sorted(func(yield func(string) bool) {
		for p := range g {
			if !yield(p) {
				return
			}
		}
	}) {
		fl := floorOf(pkg)
		if fl == 0 {
			t.Errorf("%s is on no floor: place it in layers_test.go", pkg)
			continue
		}
		for _, imp := range g[pkg] {
			if fi := floorOf(imp); fi > fl {
				t.Errorf("%s (floor %d) imports %s (floor %d): an arrow upward", pkg, fl, imp, fi)
			}
			if !allowedNarrow(pkg, imp) {
				t.Errorf("%s imports %s: it may import only the words and %v", pkg, imp, narrow[pkg])
			}
			if importers, ok := agentOnly[imp]; ok && !slices.Contains(importers, pkg) {
				t.Errorf("%s imports %s, which is the agent's own", pkg, imp)
			}
		}
	}
	// The public SDK stands alone: it imports the API's types, nothing
	// internal.
	for _, imp := range g["client"] {
		if imp != "api" {
			t.Errorf("client imports %s", imp)
		}
	}

	out, err := exec.Command("go", "list", "-deps", "./cmd/sheepfold-agent").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for dep := range strings.FieldsSeq(string(out)) {
		if rel, ok := strings.CutPrefix(dep, module+"/"); ok && !slices.Contains(agentSide, rel) {
			t.Errorf("the agent binary contains %s", rel)
		}
	}
}

// TestLayersCatch: the rules catch what they are for, on a graph with
// one of each fault.
func TestLayersCatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ pkg, imp string }{
		{"internal/server", "internal/runtime/oci"}, // transport reaching an implementation
		{"internal/sandbox", "internal/server"},     // the engine reaching the transport
		{"internal/runtime/kubernetes", "internal/engine"},
		{"internal/apierr", "internal/store"}, // a word reaching a layer above
	} {
		if floorOf(tc.imp) <= floorOf(tc.pkg) {
			t.Errorf("%s importing %s would pass", tc.pkg, tc.imp)
		}
	}
	if allowedNarrow("internal/runtime/kubernetes", "internal/egress") || !allowedNarrow("internal/runtime/kubernetes", "internal/agentproto") {
		t.Error("a runtime's narrow imports are off")
	}
	if floorOf("internal/newthing") != 0 || floorOf("internal/testutil/pgtest") != 1 || floorOf("test/integration") != 7 {
		t.Error("floorOf places packages wrongly")
	}
	if _, ok := agentOnly["internal/agent"]; !ok || slices.Contains(agentSide, "internal/sandbox") {
		t.Error("the agent's rules are off")
	}
}

// TestArchitectureMap keeps docs/ARCHITECTURE.md a true map: at most 300
// lines, its table of floors the floors above, and every file it names
// there.
func TestArchitectureMap(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("docs/ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	if n := strings.Count(doc, "\n"); n > 300 {
		t.Errorf("docs/ARCHITECTURE.md has %d lines; a map has at most 300 (details go to package docs)", n)
	}
	got := docFloors(doc)
	if len(got) != len(floors) {
		t.Fatalf("docs/ARCHITECTURE.md's table has %d floors, layers_test.go %d", len(got), len(floors))
	}
	for i, f := range floors {
		want := slices.Sorted(slices.Values(f))
		if !slices.Equal(got[i], want) {
			t.Errorf("floor %d: docs/ARCHITECTURE.md says %v, layers_test.go %v", i+1, got[i], want)
		}
	}
	for _, m := range docPath.FindAllString(doc, -1) {
		if _, err := os.Stat(m); err != nil {
			t.Errorf("docs/ARCHITECTURE.md names %s: %v", m, err)
		}
	}
}

// docPath matches a file named by its path from the module's root.
var docPath = regexp.MustCompile(`\b(internal|cmd|api|client|test|scripts|sdk)/[A-Za-z0-9_./-]*[A-Za-z0-9_]\.(go|py|sh|json|proto|sql)\b`)

// docFloors reads the table of floors of docs/ARCHITECTURE.md ("| 1 |
// what | api, client, abort, ... |"), each package as floors spells it
// (internal/ but for api, client, cmd, examples and test), sorted.
func docFloors(doc string) [][]string {
	var out [][]string
	for line := range strings.Lines(doc) {
		cells := strings.Split(strings.TrimSpace(line), "|")
		if len(cells) != 5 || strings.TrimSpace(cells[1]) != fmt.Sprint(len(out)+1) {
			continue
		}
		var pkgs []string
		for p := range strings.SplitSeq(cells[3], ",") {
			p = strings.TrimSpace(p)
			switch top, _, _ := strings.Cut(p, "/"); top {
			case "api", "client", "cmd", "examples", "test":
			default:
				p = "internal/" + p
			}
			pkgs = append(pkgs, p)
		}
		slices.Sort(pkgs)
		out = append(out, pkgs)
	}
	return out
}
