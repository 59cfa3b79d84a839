package integration

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// TestPausedSurvivesKill9 pauses a sandbox of a real `sheepfold serve`
// that holds a Python variable, a file and a background process, kills
// the server with SIGKILL, and starts it again on the same data dir: the
// sandbox is shown and listed paused, and resumes with all three.
func TestPausedSurvivesKill9(t *testing.T) {
	s := newCrashServer(t)
	// CRIU beside runc, where the runtime looks for it.
	if err := os.Symlink(filepath.Join(filepath.Dir(testutil.Runc(t)), "criu"), filepath.Join(filepath.Dir(s.bin), "criu")); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s.start(0)
	c := s.client()
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ex, err := c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: `
import subprocess
x = 6 * 7
open("/home/user/kept.txt", "w").write("kept")
loop = subprocess.Popen(["sh", "-c", "while true; do echo tick >> /tmp/ticks; sleep 0.05; done"], start_new_session=True)
print(loop.pid, end="")`})
	if err != nil || ex.Error != nil {
		t.Fatalf("execute: %v %+v", err, ex)
	}
	pid := ex.Stdout
	if p, err := c.PauseSandbox(ctx, sb.ID); err != nil || p.State != "paused" {
		t.Fatalf("pause: %+v %v", p, err)
	}

	s.kill9()
	s.start(0)
	if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.State != "paused" {
		t.Fatalf("after kill -9 and restart: %+v %v, want paused", got, err)
	}
	list, err := c.ListSandboxes(ctx, false)
	if err != nil || len(list) != 1 || list[0].ID != sb.ID || list[0].State != "paused" {
		t.Fatalf("listed after kill -9 and restart: %+v %v", list, err)
	}
	if r, err := c.ResumeSandbox(ctx, sb.ID); err != nil || r.State != "running" {
		t.Fatalf("resume after kill -9 and restart: %+v %v", r, err)
	}
	ex, err = c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: `
import os, time
os.kill(` + pid + `, 0)
n = len(open("/tmp/ticks").readlines())
for _ in range(200):
    if len(open("/tmp/ticks").readlines()) > n:
        break
    time.sleep(0.05)
print(x, open("/home/user/kept.txt").read(), len(open("/tmp/ticks").readlines()) > n)`})
	if err != nil || ex.Error != nil || ex.Stdout != "42 kept True\n" {
		t.Fatalf("after kill -9, restart and resume: %v %+v, want the variable, the file and the loop writing on", err, ex)
	}
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}
