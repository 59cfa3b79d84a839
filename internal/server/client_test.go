package server_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/server"
)

// TestGoSDK drives the public Go SDK against the server.
func TestGoSDK(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{MaxUploadBytes: 1 << 20})
	ctx := context.Background()
	c := client.New(e.url, e.keyA)
	other := client.New(e.url, e.keyB)

	v, err := c.Version(ctx)
	if err != nil || v.API != "v1" {
		t.Fatalf("Version = %+v, %v", v, err)
	}
	_, err = client.New(e.url, e.revoked).ListSandboxes(ctx, false)
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Code != "ERR_AUTHENTICATION_FAILED" || apiErr.Status != 401 || apiErr.RequestID == "" {
		t.Fatalf("revoked key: %#v", err)
	}

	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: time.Minute, Metadata: map[string]string{"a": "b"},
		Resources: &client.Resources{MemoryMB: 256}, SandboxConfig: &client.SandboxConfig{MaxExecutionTime: 20 * time.Second}})
	if err != nil || sb.State != "running" || sb.Resources.MemoryMB != 256 || sb.Metadata["a"] != "b" {
		t.Fatalf("CreateSandbox = %+v, %v", sb, err)
	}
	if _, err := other.GetSandbox(ctx, sb.ID); !errors.As(err, &apiErr) || apiErr.Code != "ERR_SANDBOX_NOT_FOUND" {
		t.Fatalf("other owner: %v", err)
	}
	if l, err := c.ListSandboxes(ctx, false); err != nil || len(l) != 1 || l[0].ID != sb.ID {
		t.Fatalf("ListSandboxes = %+v, %v", l, err)
	}
	if sb2, err := c.SetTimeout(ctx, sb.ID, time.Hour); err != nil || time.Until(sb2.ExpiresAt) < 59*time.Minute {
		t.Fatalf("SetTimeout = %+v, %v", sb2, err)
	}

	ex, err := c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "print(6*7)"})
	if err != nil || ex.Status != client.StatusSuccess || ex.Stdout != "42\n" {
		t.Fatalf("Execute = %+v, %v", ex, err)
	}
	var out, errOut strings.Builder
	var excs []client.ExecError
	ex, err = c.ExecuteStream(ctx, sb.ID, client.ExecuteRequest{Code: "import sys\nprint('o')\nprint('e', file=sys.stderr)\n1/0"},
		client.ExecuteHandlers{OnStdout: func(s string) { out.WriteString(s) }, OnStderr: func(s string) { errOut.WriteString(s) },
			OnError: func(e client.ExecError) { excs = append(excs, e) }})
	if err != nil || ex.Status != client.StatusError || out.String() != "o\n" || !strings.Contains(errOut.String(), "e\n") ||
		len(excs) != 1 || excs[0].Name != "ZeroDivisionError" {
		t.Fatalf("ExecuteStream = %+v, %v; out %q err %q excs %+v", ex, err, out.String(), errOut.String(), excs)
	}
	if _, err := c.ExecuteStream(ctx, sb.ID, client.ExecuteRequest{Code: "1", Language: "cobol"}, client.ExecuteHandlers{}); !errors.As(err, &apiErr) || apiErr.Code != "ERR_UNSUPPORTED_LANGUAGE" {
		t.Fatalf("stream with unknown language: %v", err)
	}

	cx, err := c.CreateContext(ctx, sb.ID, client.ContextRequest{Language: "bash"})
	if err != nil || cx.Language != "bash" {
		t.Fatalf("CreateContext = %+v, %v", cx, err)
	}
	if l, err := c.ListContexts(ctx, sb.ID); err != nil || len(l) == 0 {
		t.Fatalf("ListContexts = %+v, %v", l, err)
	}
	if _, err := c.RestartContext(ctx, sb.ID, cx.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteContext(ctx, sb.ID, cx.ID); err != nil {
		t.Fatal(err)
	}

	// Files.
	if fi, err := c.WriteFile(ctx, sb.ID, "d/f.txt", strings.NewReader("data")); err != nil || fi.Size != 4 {
		t.Fatalf("WriteFile = %+v, %v", fi, err)
	}
	if b, err := c.ReadFile(ctx, sb.ID, "d/f.txt"); err != nil || string(b) != "data" {
		t.Fatalf("ReadFile = %q, %v", b, err)
	}
	if fis, err := c.UploadFiles(ctx, sb.ID, "up", client.Upload{Name: "a", Reader: strings.NewReader("A")},
		client.Upload{Name: "b", Reader: strings.NewReader("BB")}); err != nil || len(fis) != 2 {
		t.Fatalf("UploadFiles = %+v, %v", fis, err)
	}
	if l, err := c.ListFiles(ctx, sb.ID, "up", 1); err != nil || len(l) != 2 {
		t.Fatalf("ListFiles = %+v, %v", l, err)
	}
	// By pages of one: a cursor each, none on the last; ListFiles
	// follows them.
	p, err := c.ListFilesPage(ctx, sb.ID, ".", client.FileListQuery{Depth: 2, Limit: 1})
	if err != nil || len(p.Entries) != 1 || p.Entries[0].Path != "/home/user/d" || p.NextCursor == "" {
		t.Fatalf("ListFilesPage = %+v, %v", p, err)
	}
	if p, err = c.ListFilesPage(ctx, sb.ID, ".", client.FileListQuery{Depth: 2, Limit: 1, Cursor: p.NextCursor}); err != nil ||
		len(p.Entries) != 1 || p.Entries[0].Path != "/home/user/d/f.txt" || p.NextCursor == "" {
		t.Fatalf("ListFilesPage (second) = %+v, %v", p, err)
	}
	if _, err := c.ListFilesPage(ctx, sb.ID, "up", client.FileListQuery{Cursor: p.NextCursor}); !errors.As(err, &apiErr) || apiErr.Code != "ERR_BAD_REQUEST" {
		t.Fatalf("a cursor of another listing: %v", err)
	}
	if _, err := c.MakeDir(ctx, sb.ID, "m/n"); err != nil {
		t.Fatal(err)
	}
	if fi, err := c.MoveFile(ctx, sb.ID, "d/f.txt", "m/n/g.txt"); err != nil || fi.Name != "g.txt" {
		t.Fatalf("MoveFile = %+v, %v", fi, err)
	}
	if fi, err := c.StatFile(ctx, sb.ID, "m/n/g.txt"); err != nil || fi.Type != "file" {
		t.Fatalf("StatFile = %+v, %v", fi, err)
	}
	if err := c.RemoveFile(ctx, sb.ID, "m"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StatFile(ctx, sb.ID, "m"); !errors.As(err, &apiErr) || apiErr.Code != "ERR_NOT_FOUND" {
		t.Fatalf("stat removed: %v", err)
	}
	if _, err := c.WriteFile(ctx, sb.ID, "big", strings.NewReader(strings.Repeat("x", 1<<20+1))); !errors.As(err, &apiErr) || apiErr.Code != "ERR_FILE_TOO_LARGE" || apiErr.Status != 413 {
		t.Fatalf("big write: %v", err)
	}

	// Commands.
	home := "/home/user" // a sandbox path; the fake runtime puts it under its root
	res, err := c.RunCommand(ctx, sb.ID, client.CommandRequest{Cmd: "sh", Args: []string{"-c", "echo hi; exit 2"}, Cwd: home})
	if err != nil || res.Stdout != "hi\n" || res.ExitCode != 2 || res.Status != "exited" {
		t.Fatalf("RunCommand = %+v, %v", res, err)
	}
	var started int
	out.Reset()
	res, err = c.RunCommandStream(ctx, sb.ID, client.CommandRequest{Cmd: "echo", Args: []string{"streamed"}, Cwd: home},
		client.CommandHandlers{OnStart: func(pid int) { started = pid }, OnStdout: func(s string) { out.WriteString(s) }})
	if err != nil || started == 0 || res.PID != started || out.String() != "streamed\n" {
		t.Fatalf("RunCommandStream = %+v, %v (start %d, out %q)", res, err, started, out.String())
	}
	pid, err := c.StartCommand(ctx, sb.ID, client.CommandRequest{Cmd: "cat", Stdin: true, Cwd: home, Tag: "t"})
	if err != nil || pid == 0 {
		t.Fatalf("StartCommand = %d, %v", pid, err)
	}
	if ps, err := c.ListCommands(ctx, sb.ID); err != nil || len(ps) != 1 || ps[0].PID != pid || ps[0].Tag != "t" {
		t.Fatalf("ListCommands = %+v, %v", ps, err)
	}
	got := make(chan string, 1)
	attached := make(chan struct{})
	go func() {
		var b strings.Builder
		_, err := c.ConnectCommand(ctx, sb.ID, pid, client.CommandHandlers{
			OnStart:  func(int) { close(attached) },
			OnStdout: func(s string) { b.WriteString(s) }})
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		got <- b.String()
	}()
	select {
	case <-attached:
	case <-time.After(10 * time.Second):
		t.Fatal("ConnectCommand never attached")
	}
	if err := c.SendInput(ctx, sb.ID, pid, []byte("ping\n"), true); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		if s != "ping\n" {
			t.Fatalf("ConnectCommand got %q", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ConnectCommand did not end")
	}
	pid, _ = c.StartCommand(ctx, sb.ID, client.CommandRequest{Cmd: "sleep", Args: []string{"30"}, Cwd: home})
	if err := c.Signal(ctx, sb.ID, pid, "SIGKILL"); err != nil {
		t.Fatal(err)
	}

	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.State != "stopped" || got.StopReason != "killed" {
		t.Fatalf("after Kill: %+v, %v", got, err)
	}
	if _, err := c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "1"}); !errors.As(err, &apiErr) || apiErr.Code != "ERR_SANDBOX_STATE" || apiErr.Status != 409 {
		t.Fatalf("execute after kill: %v", err)
	}
}
