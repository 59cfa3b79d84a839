package agent

import (
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

func TestUserCommand(t *testing.T) {
	t.Parallel()
	argv := []string{"python3", "-c", "pass"}
	wrapped := []string{"/agent", NprocExecCommand, "64", "/usr/bin/python3", "python3", "-c", "pass"}
	for _, tc := range []struct {
		name  string
		nproc int64
		cred  *syscall.Credential
		want  []string // argv; the path is its first element
	}{
		{"no limit", 0, &syscall.Credential{Uid: 1000}, argv},
		{"user", 64, &syscall.Credential{Uid: 1000}, wrapped},
		{"another user", 64, &syscall.Credential{Uid: 1001}, wrapped},
		{"root", 64, &syscall.Credential{Uid: 0}, argv},
		{"the agent itself", 64, nil, wrapped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &server{cfg: Config{UserNproc: tc.nproc}, helper: "/agent"}
			path, got := s.userCommand("/usr/bin/python3", argv, tc.cred)
			wantPath := "/usr/bin/python3"
			if len(tc.want) > len(argv) {
				wantPath = "/agent"
			}
			if path != wantPath || !slices.Equal(got, tc.want) {
				t.Fatalf("got %s %q, want %s %q", path, got, wantPath, tc.want)
			}
		})
	}
}

// With UserNproc, a process the agent starts (here as the agent itself,
// which does not switch users outside a sandbox) runs under that
// RLIMIT_NPROC, soft and hard; through a terminal too.
func TestProcessUnderUserNproc(t *testing.T) {
	t.Parallel()
	a := startAgent(t, Config{UserNproc: 77, Helper: testutil.AgentBin(t)})
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
		t.Fatalf("limits without UserNproc %q", r.output(agentproto.EventStdout))
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
