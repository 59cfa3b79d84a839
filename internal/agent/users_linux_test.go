package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

func TestUnknownUserRefused(t *testing.T) {
	t.Parallel()
	a := startAgent(t, Config{})
	os.MkdirAll(filepath.Join(a.cfg.Root, "etc"), 0o755)
	os.WriteFile(filepath.Join(a.cfg.Root, "etc/passwd"), []byte("guest:x:1001:1001::/home/guest:/bin/sh\n"), 0o644)
	for _, req := range []agentproto.Request{
		{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{Cmd: "true", User: "nosuch"}},
		{Op: agentproto.OpFileStat, Path: "/", User: "nosuch"},
		{Op: agentproto.OpFileWrite, Path: "/x", User: "a:b"},
	} {
		if r := a.call(t, req); r.done.Code != agentproto.CodeBadRequest || !strings.Contains(r.done.Message, "unknown user") {
			t.Errorf("%s as %q: %+v", req.Op, req.User, r.done)
		}
	}
	// Known users are accepted; an agent that does not switch users (not
	// uid 0 of a user namespace) acts as itself for all of them.
	for _, u := range []string{"", "user", "root", "guest"} {
		a.call(t, agentproto.Request{Op: agentproto.OpFileStat, Path: "/etc", User: u}).mustOK(t)
	}
}

// TestActAsUser runs an agent on the host that switches users (as in a
// sandbox) with its files confined to a temporary root.
func TestActAsUser(t *testing.T) {
	testutil.RequireRoot(t)
	old := canSwitchUsers
	canSwitchUsers = func(string) bool { return true }
	t.Cleanup(func() { canSwitchUsers = old })

	root := testutil.ShortTempDir(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Chmod(root, 0o755))
	for _, d := range []struct {
		path     string
		uid, gid int
		mode     os.FileMode
	}{{"etc", 0, 0, 0o755}, {"root", 0, 0, 0o700}, {"home/user", 1000, 1000, 0o755}, {"home/guest", 1001, 1001, 0o755}, {"tmp", 0, 0, 0o777}} {
		p := filepath.Join(root, d.path)
		must(os.MkdirAll(p, 0o755))
		must(os.Chown(p, d.uid, d.gid))
		must(os.Chmod(p, d.mode))
	}
	must(os.Chmod(filepath.Join(root, "tmp"), 0o777|os.ModeSticky))
	passwd := "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\nguest:x:1001:1001::/home/guest:/bin/sh\n"
	must(os.WriteFile(filepath.Join(root, "etc/passwd"), []byte(passwd), 0o644))
	must(os.WriteFile(filepath.Join(root, "root/secret"), []byte("s"), 0o600))

	a := startAgent(t, Config{Root: root, Home: "/home/user", Env: []string{"PATH=/usr/bin:/bin"}})
	owner := func(rel string) (uint32, uint32, os.FileMode) {
		t.Helper()
		fi, err := os.Lstat(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		return st.Uid, st.Gid, fi.Mode().Perm()
	}
	write := func(p, user string) result {
		return a.callBody(t, agentproto.Request{Op: agentproto.OpFileWrite, Path: p, User: user}, strings.NewReader("data"))
	}

	// The default user's files and directories are its own, 0644 / 0755.
	if r := write("/home/user/a.txt", ""); r.done.Code != "" || r.done.Entry.Owner != "user" {
		t.Fatalf("write as user: %+v", r.done)
	}
	if u, g, m := owner("home/user/a.txt"); u != 1000 || g != 1000 || m != 0o644 {
		t.Errorf("a.txt: %d:%d %o", u, g, m)
	}
	a.call(t, agentproto.Request{Op: agentproto.OpFileMkdir, Path: "d/e"}).mustOK(t)
	for _, p := range []string{"home/user/d", "home/user/d/e"} {
		if u, g, m := owner(p); u != 1000 || g != 1000 || m != 0o755 {
			t.Errorf("%s: %d:%d %o", p, u, g, m)
		}
	}
	// ... and its permission checks are its own: not /etc, not root's files.
	for _, r := range []result{
		write("/etc/passwd", "user"),
		write("/etc/new", ""),
		a.call(t, agentproto.Request{Op: agentproto.OpFileRemove, Path: "/etc/passwd"}),
		a.call(t, agentproto.Request{Op: agentproto.OpFileMove, Path: "/etc/passwd", NewPath: "/home/user/p"}),
		a.call(t, agentproto.Request{Op: agentproto.OpFileRead, Path: "/root/secret"}),
		a.call(t, agentproto.Request{Op: agentproto.OpFileList, Path: "/root"}),
	} {
		if r.done.Code != agentproto.CodePermission {
			t.Errorf("as user: %+v, want %s", r.done, agentproto.CodePermission)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(root, "etc/passwd")); string(b) != passwd {
		t.Fatalf("user changed /etc/passwd: %q", b)
	}

	// Root may do all of that; relative paths start at /root.
	if r := write("/etc/new", "root"); r.done.Code != "" || r.done.Entry.Owner != "root" {
		t.Fatalf("write /etc/new as root: %+v", r.done)
	}
	if r := a.call(t, agentproto.Request{Op: agentproto.OpFileRead, Path: "/root/secret", User: "root"}); r.done.Code != "" || string(r.data) != "s" {
		t.Errorf("read as root: %+v %q", r.done, r.data)
	}
	if r := write("rel.txt", "root"); r.done.Code != "" || r.done.Entry.Path != "/root/rel.txt" {
		t.Errorf("relative write as root: %+v", r.done)
	}
	if r := write("/home/user/a.txt", "root"); r.done.Code != "" {
		t.Errorf("root replacing user's file: %+v", r.done)
	}
	if u, _, m := owner("home/user/a.txt"); u != 0 || m != 0o644 {
		t.Errorf("a.txt rewritten by root: uid %d mode %o", u, m)
	}
	// Another user from passwd: its own home and ids.
	if r := write("g.txt", "guest"); r.done.Code != "" || r.done.Entry.Path != "/home/guest/g.txt" {
		t.Errorf("write as guest: %+v", r.done)
	}
	if u, g, _ := owner("home/guest/g.txt"); u != 1001 || g != 1001 {
		t.Errorf("g.txt: %d:%d", u, g)
	}
	if r := write("/home/user/g.txt", "guest"); r.done.Code != agentproto.CodePermission {
		t.Errorf("guest writing user's home: %+v", r.done)
	}

	// Owner: root's permissions, the user's ownership of all it makes
	// (E2B's envd); relative paths at the owner's home; only for writes
	// and mkdirs.
	if r := a.callBody(t, agentproto.Request{Op: agentproto.OpFileWrite, Path: "/srv/new/deep/o.txt", Owner: "user"}, strings.NewReader("o")); r.done.Code != "" || r.done.Entry.Owner != "user" {
		t.Fatalf("owned write: %+v", r.done)
	}
	for _, p := range []string{"srv", "srv/new", "srv/new/deep", "srv/new/deep/o.txt"} {
		if u, g, _ := owner(p); u != 1000 || g != 1000 {
			t.Errorf("owned write: %s is %d:%d", p, u, g)
		}
	}
	if r := a.callBody(t, agentproto.Request{Op: agentproto.OpFileWrite, Path: "o.txt", Owner: "guest"}, strings.NewReader("o")); r.done.Code != "" || r.done.Entry.Path != "/home/guest/o.txt" {
		t.Errorf("owned relative write: %+v", r.done)
	}
	a.call(t, agentproto.Request{Op: agentproto.OpFileMkdir, Path: "/etc/made/here", Owner: "user"}).mustOK(t)
	if u, _, _ := owner("etc"); u != 0 {
		t.Errorf("owned mkdir gave away an existing parent: /etc is %d", u)
	}
	for _, p := range []string{"etc/made", "etc/made/here"} {
		if u, g, m := owner(p); u != 1000 || g != 1000 || m != 0o755 {
			t.Errorf("owned mkdir: %s is %d:%d %o", p, u, g, m)
		}
	}
	if r := a.call(t, agentproto.Request{Op: agentproto.OpFileRead, Path: "/root/secret", Owner: "user"}); r.done.Code != agentproto.CodeBadRequest {
		t.Errorf("owner on a read: %+v", r.done)
	}

	// A watch is the user's too.
	if r := a.call(t, agentproto.Request{Op: agentproto.OpFileWatch, Path: "/root"}); r.done.Code != agentproto.CodePermission {
		t.Errorf("user watching /root: %+v", r.done)
	}
	w := a.open(t, agentproto.Request{Op: agentproto.OpFileWatch, Path: "/root", User: "root"})
	if ev := w.next(); ev.Type != agentproto.EventWatchStart {
		t.Errorf("root watching /root: %+v", ev)
	}
	w.nc.Close()

	// Processes: the user's ids, groups, environment and home; no
	// capabilities unless root.
	status := func(user string) (string, string) {
		t.Helper()
		r := a.call(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{
			Cmd: "sh", Args: []string{"-c", `grep -E '^(Uid|Gid|Groups|CapEff|CapPrm):' /proc/self/status; echo "$HOME $USER $LOGNAME $(pwd)"`}, User: user}})
		r.mustOK(t)
		return r.output(agentproto.EventStdout), r.output(agentproto.EventStderr)
	}
	out, errOut := status("")
	for _, want := range []string{"Uid:\t1000\t1000\t1000\t1000", "Gid:\t1000\t1000\t1000\t1000", "Groups:\t1000",
		"CapEff:\t0000000000000000", "CapPrm:\t0000000000000000", "/home/user user user " + filepath.Join(root, "home/user")} {
		if !strings.Contains(out, want) {
			t.Errorf("user process: no %q in\n%s%s", want, out, errOut)
		}
	}
	out, errOut = status("root")
	for _, want := range []string{"Uid:\t0\t0\t0\t0", "/root root root " + filepath.Join(root, "root")} {
		if !strings.Contains(out, want) {
			t.Errorf("root process: no %q in\n%s%s", want, out, errOut)
		}
	}
	if strings.Contains(out, "CapEff:\t0000000000000000") {
		t.Errorf("root process without capabilities:\n%s", out)
	}

	// Every thread of the agent is back to its own credentials (once the
	// watch's handler has seen its client leave).
	var bad []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		bad = nil
		tasks, _ := filepath.Glob("/proc/self/task/*/status")
		for _, f := range tasks {
			b, err := os.ReadFile(f)
			if err != nil {
				continue // the thread ended
			}
			for _, line := range strings.Split(string(b), "\n") {
				if (strings.HasPrefix(line, "Uid:") || strings.HasPrefix(line, "Gid:")) && line[4:] != "\t0\t0\t0\t0" {
					bad = append(bad, f+": "+line)
				}
			}
		}
		if len(bad) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(bad) > 0 {
		t.Errorf("threads left with a user's credentials: %q", bad)
	}
}

// TestStartInDirUserCannotEnter: StartIn starts a process as a user in a
// directory that user may not enter; it runs there (getcwd names it) and
// still may not read it. Started the ordinary way (Dir, which Go enters
// after taking the credential), the same process fails.
func TestStartInDirUserCannotEnter(t *testing.T) {
	testutil.RequireRoot(t)
	dir := filepath.Join(t.TempDir(), "private")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "secret"), []byte("s"), 0o644); err != nil {
		t.Fatal(err)
	}
	cred := &syscall.Credential{Uid: defaultUID, Gid: defaultGID, Groups: []uint32{defaultGID}}
	script := `pwd -P; id -u; cat secret 2>/dev/null || echo no-read; cat /proc/self/status | grep ^CapBnd`
	run := func(start func(attr *os.ProcAttr) (*os.Process, error), attr *os.ProcAttr) (string, error) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		attr.Files = []*os.File{nil, w, w}
		attr.Sys = &syscall.SysProcAttr{Credential: cred}
		p, err := start(attr)
		w.Close()
		if err != nil {
			return "", err
		}
		var out strings.Builder
		buf := make([]byte, 4096)
		for {
			n, err := r.Read(buf)
			out.Write(buf[:n])
			if err != nil {
				break
			}
		}
		if _, err := p.Wait(); err != nil {
			t.Fatal(err)
		}
		return out.String(), nil
	}
	startSh := func(attr *os.ProcAttr) (*os.Process, error) {
		return os.StartProcess("/bin/sh", []string{"sh", "-c", script}, attr)
	}

	if _, err := run(startSh, &os.ProcAttr{Dir: dir}); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("started the ordinary way in %s: %v, want EACCES (the test's directory does not shut the user out)", dir, err)
	}
	var out string
	err := StartIn(cred, dir, func() (err error) {
		out, err = run(startSh, &os.ProcAttr{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := dir + "\n1000\nno-read\nCapBnd:\t0000000000000000\n"
	if out != want {
		t.Fatalf("got %q, want %q", out, want)
	}
	// The caller's thread and process keep their working directory.
	if wd, _ := os.Getwd(); wd == dir {
		t.Fatalf("the test process moved to %s", dir)
	}
	// A directory that does not exist fails before anything starts.
	started := false
	err = StartIn(cred, filepath.Join(dir, "nope"), func() error { started = true; return nil })
	if err == nil || started {
		t.Fatalf("StartIn in a missing dir: %v, started %v", err, started)
	}
}
