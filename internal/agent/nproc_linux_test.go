package agent

import (
	"slices"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

func TestNprocCommand(t *testing.T) {
	t.Parallel()
	argv := []string{"python3", "-c", "pass"}
	s := &server{cfg: Config{Nproc: 64}, helper: "/agent"}
	path, got := s.nprocCommand("/usr/bin/python3", argv)
	if want := []string{"/agent", NprocExecCommand, "64", "/usr/bin/python3", "python3", "-c", "pass"}; path != "/agent" || !slices.Equal(got, want) {
		t.Fatalf("got %s %q, want /agent %q", path, got, want)
	}
	s = &server{helper: "/agent"}
	if path, got := s.nprocCommand("/usr/bin/python3", argv); path != "/usr/bin/python3" || !slices.Equal(got, argv) {
		t.Fatalf("without Nproc: %s %q", path, got)
	}
}

// With Nproc, a process the agent starts runs under that RLIMIT_NPROC,
// soft and hard; through a terminal too.
func TestProcessUnderNproc(t *testing.T) {
	t.Parallel()
	a := startAgent(t, Config{Nproc: 77, Helper: testutil.AgentBin(t)})
	r := a.call(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{
		Cmd: "cat", Args: []string{"/proc/self/limits"}}}).mustOK(t)
	if soft, hard := maxProcesses(r.output(agentproto.EventStdout)); soft != "77" || hard != "77" {
		t.Fatalf("limits %q, stderr %q", r.output(agentproto.EventStdout), r.output(agentproto.EventStderr))
	}
	r = a.call(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{
		Cmd: "cat", Args: []string{"/proc/self/limits"}, PTY: &agentproto.TermSize{Cols: 200, Rows: 24}}}).mustOK(t)
	if soft, hard := maxProcesses(r.output(agentproto.EventPTY)); soft != "77" || hard != "77" {
		t.Fatalf("limits on a terminal %q", r.output(agentproto.EventPTY))
	}

	// Without it, the agent's own limit.
	b := startAgent(t, Config{})
	r = b.call(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{
		Cmd: "cat", Args: []string{"/proc/self/limits"}}}).mustOK(t)
	if soft, hard := maxProcesses(r.output(agentproto.EventStdout)); soft == "" || soft == "77" || hard == "77" {
		t.Fatalf("limits without Nproc %q", r.output(agentproto.EventStdout))
	}
}

// maxProcesses reads the soft and hard "Max processes" of a
// /proc/PID/limits.
func maxProcesses(limits string) (soft, hard string) {
	for line := range strings.Lines(limits) {
		if rest, ok := strings.CutPrefix(line, "Max processes"); ok {
			if f := strings.Fields(rest); len(f) >= 2 {
				return f[0], f[1]
			}
		}
	}
	return "", ""
}
