package sandbox_test

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// short is a WatchEvent in short: "create sub/f.txt".
func short(ev sandbox.WatchEvent) string { return ev.Op + " " + ev.Name }

// awaitEvents reads w's events until all of want were seen (in any order)
// and returns them all, by their short form; it fails after 20 s or when
// the watch ends first, and on events of the agent's upload temporaries.
func awaitEvents(t *testing.T, w *sandbox.Watcher, want ...string) map[string]sandbox.WatchEvent {
	t.Helper()
	seen := map[string]sandbox.WatchEvent{}
	var order []string
	timeout := time.After(20 * time.Second)
	for {
		missing := false
		for _, e := range want {
			if _, ok := seen[e]; !ok {
				missing = true
			}
		}
		if !missing {
			return seen
		}
		select {
		case ev, ok := <-w.Events():
			if !ok {
				t.Fatalf("watch ended (%v) after %q, want %q", w.Err(), order, want)
			}
			if strings.Contains(ev.Name, ".sheepfold-upload") {
				t.Fatalf("event of an upload temporary: %s", short(ev))
			}
			seen[short(ev)] = ev
			order = append(order, short(ev))
		case <-timeout:
			t.Fatalf("events %q, want %q", order, want)
		}
	}
}

// drain reads w's events until the channel closes (at most 20 s).
func drain(t *testing.T, w *sandbox.Watcher) []string {
	t.Helper()
	var got []string
	timeout := time.After(20 * time.Second)
	for {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				return got
			}
			got = append(got, short(ev))
		case <-timeout:
			t.Fatalf("the watch did not end; events %q", got)
		}
	}
}

// watchAndMetadata is the scenario both engines run: a recursive watch
// with entries, an upload with metadata, a command's changes, the end of
// the watch by Close.
func watchAndMetadata(t *testing.T, s *sandbox.Sandbox) {
	ctx := context.Background()
	if _, err := s.MakeDir(ctx, "/home/user/w"); err != nil {
		t.Fatal(err)
	}
	w, err := s.WatchDir(ctx, "/home/user/w", sandbox.WatchOptions{Recursive: true, IncludeEntry: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	md := map[string]string{"origin": "suite", "kind": "note"}
	fi, err := s.WriteFileWith(ctx, "w/m.txt", strings.NewReader("hello"), sandbox.WriteOptions{Metadata: md})
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(fi.Metadata, md) {
		t.Fatalf("written entry metadata %v", fi.Metadata)
	}
	evs := awaitEvents(t, w, "create m.txt", "write m.txt")
	if e := evs["write m.txt"].Entry; e == nil || e.Path != "/home/user/w/m.txt" || e.Size != 5 || !maps.Equal(e.Metadata, md) {
		t.Fatalf("entry of the write event: %+v", e)
	}
	if fi, err := s.Stat(ctx, "w/m.txt"); err != nil || !maps.Equal(fi.Metadata, md) {
		t.Fatalf("stat: %+v, %v", fi, err)
	}
	// The metadata are real extended attributes, seen by code inside.
	// (Relative paths: under the fake runtime, processes see the host's
	// filesystem, in the sandbox's home.)
	res, out := runOutput(t, s, `python3 -c 'import os; print(os.getxattr("w/m.txt", "user.e2b.origin").decode(), end="")'`)
	if res.ExitCode != 0 || out != "suite" {
		t.Fatalf("xattr seen inside: exit %d, %q", res.ExitCode, out)
	}

	// Changes made by code, in a directory made after the watch started.
	// A file made there before the agent has added its watch is reported
	// as created by the scan of the new directory; a write that came first
	// is not seen (as with any inotify watcher), so the test writes again
	// once the create was seen.
	if res, out := runOutput(t, s, `mkdir w/sub && echo x > w/sub/f.txt`); res.ExitCode != 0 {
		t.Fatalf("command: %d %q", res.ExitCode, out)
	}
	evs = awaitEvents(t, w, "create sub", "create sub/f.txt")
	if res, out := runOutput(t, s, `echo y >> w/sub/f.txt`); res.ExitCode != 0 {
		t.Fatalf("command: %d %q", res.ExitCode, out)
	}
	awaitEvents(t, w, "write sub/f.txt")
	if e := evs["create sub"].Entry; e == nil || e.Type != agentproto.FileTypeDir {
		t.Fatalf("entry of the directory: %+v", e)
	}

	// A rewrite without metadata leaves none.
	if fi, err := s.WriteFile(ctx, "w/m.txt", strings.NewReader("again"), 0, 0); err != nil || fi.Metadata != nil {
		t.Fatalf("rewrite: %+v, %v", fi, err)
	}

	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	drain(t, w)
	if err := w.Err(); err != nil {
		t.Fatalf("Err after Close: %v", err)
	}
}

// runOutput runs a shell command and returns its result and stdout.
func runOutput(t *testing.T, s *sandbox.Sandbox, script string) (*sandbox.ProcessResult, string) {
	t.Helper()
	var out strings.Builder
	res, err := s.Run(context.Background(), sandbox.ProcessSpec{Cmd: "/bin/sh", Args: []string{"-c", script}},
		func(ev agentproto.Event) {
			if ev.Type == "stdout" {
				out.Write(ev.Data)
			}
		})
	if err != nil {
		t.Fatal(err)
	}
	return res, out.String()
}

func TestWatchDir(t *testing.T) {
	t.Parallel()
	m, _ := fakeEngine(t, sandbox.Config{})
	s, err := m.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	watchAndMetadata(t, s)
}

// TestWatchDirEnds: how a watch ends, and what Err says of it.
func TestWatchDirEnds(t *testing.T) {
	t.Parallel()
	m, _ := fakeEngine(t, sandbox.Config{})
	ctx := context.Background()
	s, err := m.Create(ctx, sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.WriteFile(ctx, "file.txt", strings.NewReader("x"), 0, 0)
	for path, code := range map[string]apierr.Code{
		"missing":  apierr.NotFound,
		"file.txt": apierr.BadRequest,
		"":         apierr.BadRequest,
	} {
		if _, err := s.WatchDir(ctx, path, sandbox.WatchOptions{}); apierr.CodeOf(err) != code {
			t.Errorf("watch %q: %v, want %s", path, err, code)
		}
	}

	// The context ending.
	cctx, cancel := context.WithCancel(ctx)
	w, err := s.WatchDir(cctx, "~", sandbox.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	drain(t, w)
	if !errors.Is(w.Err(), context.Canceled) {
		t.Fatalf("Err after cancel: %v", w.Err())
	}

	// The watched directory removed: its removal, then the end.
	s.MakeDir(ctx, "gone")
	w, err = s.WatchDir(ctx, "gone", sandbox.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	if got := drain(t, w); len(got) == 0 || got[len(got)-1] != "remove " || w.Err() != nil {
		t.Fatalf("watched directory removed: events %q, Err %v", got, w.Err())
	}

	// The sandbox stopping. Close after the end is harmless.
	w, err = s.WatchDir(ctx, "~", sandbox.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Kill(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	drain(t, w)
	if code := apierr.CodeOf(w.Err()); code != apierr.SandboxState {
		t.Fatalf("Err after kill: %v (%s)", w.Err(), code)
	}
	w.Close()
	if _, err := s.WatchDir(ctx, "~", sandbox.WatchOptions{}); apierr.CodeOf(err) != apierr.SandboxState {
		t.Fatalf("watch in a stopped sandbox: %v", err)
	}
}

// TestRuncWatchAndMetadata: the same in a real sandbox, where metadata
// are xattrs on an overlay whose upper layer is a tmpfs, set by uid 1000
// in a user namespace.
func TestRuncWatchAndMetadata(t *testing.T) {
	m := runcEngine(t)
	s := newSandbox(t, m, sandbox.CreateOptions{})
	watchAndMetadata(t, s)
	// Code's own writes show too; nothing of the agent's temporaries does.
	ctx := context.Background()
	w, err := s.WatchDir(ctx, "/home/user", sandbox.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteFile(ctx, "/home/user/up.txt", strings.NewReader("u"), 0, 0); err != nil {
		t.Fatal(err)
	}
	runOutput(t, s, "touch end")
	awaitEvents(t, w, "create up.txt", "write up.txt", "create end")
	w.Close()
}
