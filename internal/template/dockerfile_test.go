package template

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestParseDockerfileErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, src, want string
	}{
		{"unknown instruction", "FROM python\nRUN true\nFOO bar\n", "line 3: unknown instruction: FOO"},
		{"env without value", "FROM python\n\nENV a\n", "line 3: ENV must have two arguments"},
		{"copy without dest", "FROM python\nCOPY a\n", "line 2: COPY requires at least two arguments"},
		{"empty run", "FROM python\nRUN\n", "line 2: RUN needs a command"},
		{"run mount", "FROM python\nRUN --mount=type=cache,target=/x true\n", "line 2: RUN --mount is not supported"},
		{"run network", "FROM python\nRUN --network=host true\n", "line 2: RUN --network is not supported"},
		{"two stages", "FROM python\nRUN true\nFROM python\n", "line 3: a second FROM"},
		{"named stage", "FROM python AS b\n", "line 1: FROM ... AS is not supported"},
		{"before from", "ENV a=b\nFROM python\n", "line 1: ENV before FROM"},
		{"empty", "# nothing\n", "line 1: file with no instructions"},
		{"no from", "ARG X=1\n", "no FROM"},
		{"copy from", "FROM python\nCOPY --from=x a b\n", "line 2: COPY --from is not supported"},
		{"add url", "FROM python\nADD https://example.com/x /x\n", "line 2: ADD https://example.com/x: only files"},
		{"cmd", "FROM python\nCMD [\"x\"]\n", "line 2: CMD is not supported"},
		{"healthcheck", "FROM python\nHEALTHCHECK CMD true\n", "line 2: HEALTHCHECK is not supported"},
		{"copy heredoc", "FROM python\nCOPY <<EOF /x\nhi\nEOF\n", "line 2: COPY with a here-document"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseDockerfile(strings.NewReader(tc.src))
			if !errors.Is(err, ErrDockerfile) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrDockerfile with %q", err, tc.want)
			}
		})
	}
	df, err := ParseDockerfile(strings.NewReader("ARG BASE=python\nFROM $BASE\nRUN a \\\n  b\nCOPY x /y\nLABEL sheepfold.start=\"python -m http.server\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if df.From != "$BASE" || df.FromLine != 2 || len(df.MetaArgs) != 1 || len(df.Steps) != 3 || df.Steps[1].Line != 5 {
		t.Fatalf("parsed %+v", df)
	}
}

// hostRunner is a StepRunner for tests of the build's own logic: it runs
// RUN's shell script with the host's /bin/sh in the step's working
// directory under RootFS (no sandbox; the real one is oci.StepRunner,
// tested in internal/sandbox).
type hostRunner struct {
	mu     sync.Mutex
	calls  []string
	during func(s RunStep) // called before each step runs
}

func (r *hostRunner) RunStep(ctx context.Context, s RunStep, out io.Writer) error {
	r.mu.Lock()
	r.calls = append(r.calls, s.Args[len(s.Args)-1])
	r.mu.Unlock()
	if r.during != nil {
		r.during(s)
	}
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", s.Args[len(s.Args)-1])
	cmd.Dir = filepath.Join(s.RootFS, s.Cwd)
	cmd.Env = append(s.Env, "ROOT="+s.RootFS)
	cmd.Stdout, cmd.Stderr = out, out
	return cmd.Run()
}

func (r *hostRunner) ran() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

// dfSetup makes a data dir with a small base template "base" and a build
// context holding files.
func dfSetup(t *testing.T, files map[string]string) (dataDir, context string) {
	t.Helper()
	requireRoot(t)
	dataDir = t.TempDir()
	fakeTemplate(t, dataDir, Info{Name: "base", Suite: "bookworm", UIDShift: 1000, Version: FormatVersion})
	writeTree(t, filepath.Join(templatesDir(dataDir), "base", rootfsDir), map[string]string{
		"etc/passwd": "root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n",
		"etc/group":  "root:x:0:\nuser:x:1000:\n",
		"etc/keep":   "from the base\n",
		"etc/gone":   "deleted by a step\n",
	})
	context = t.TempDir()
	writeTree(t, context, files)
	return dataDir, context
}

func dfBuild(t *testing.T, dataDir, ctxDir, name, src string, r StepRunner) (Info, error) {
	t.Helper()
	return BuildDockerfile(context.Background(), []byte(src), DockerfileOptions{
		DataDir: dataDir, Name: name, Context: ctxDir, UIDShift: 1000, Runner: r,
	})
}

// TestDockerfileBuild builds a template with each supported instruction
// and checks its tree and Info.
func TestDockerfileBuild(t *testing.T) {
	dataDir, ctxDir := dfSetup(t, map[string]string{"app/main.py": "print(1)\n", "app/sub/x": "x\n", "note": "note\n"})
	r := &hostRunner{}
	src := `ARG WHO=world
FROM base
ARG GREETING=hello
ENV APP=/opt/app LANG=C.UTF-8
WORKDIR $APP
COPY app/ ./
COPY --chown=user:user --chmod=640 note /opt/notes/
RUN echo "$GREETING $APP" > made && rm "$ROOT/etc/gone"
USER user
LABEL sheepfold.start="python3 main.py" sheepfold.ready="port:8000" other=x
`
	info, err := BuildDockerfile(context.Background(), []byte(src), DockerfileOptions{
		DataDir: dataDir, Name: "app", Context: ctxDir, UIDShift: 1000, Runner: r,
		BuildArgs: map[string]string{"GREETING": "hi"},
	})
	if err != nil {
		t.Fatal(err)
	}
	root := info.Path
	for p, want := range map[string]string{
		"opt/app/main.py": "print(1)\n", "opt/app/sub/x": "x\n", "opt/notes/note": "note\n",
		"opt/app/made": "hi /opt/app\n", "etc/keep": "from the base\n",
	} {
		if got := readFile(t, filepath.Join(root, p)); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(root, "etc/gone")); !os.IsNotExist(err) {
		t.Errorf("etc/gone, deleted by RUN, is in the template: %v", err)
	}
	if uid, gid, mode := lstatOwner(t, filepath.Join(root, "opt/notes/note")); uid != 2000 || gid != 2000 || mode.Perm() != 0o640 {
		t.Errorf("note: %d:%d %v, want 2000:2000 -rw-r-----", uid, gid, mode)
	}
	if uid, _, _ := lstatOwner(t, filepath.Join(root, "opt/app/main.py")); uid != 1000 {
		t.Errorf("main.py owner %d, want 1000 (root shifted)", uid)
	}
	if info.Start != "python3 main.py" || info.Ready != "port:8000" || info.User != "user" || info.WorkDir != "/opt/app" ||
		info.From != "base" || !strings.HasPrefix(info.Hash, "sha256:") || info.StepsBuilt != 4 {
		t.Errorf("info = %+v", info)
	}
	if strings.Join(info.Env, " ") != "APP=/opt/app LANG=C.UTF-8" {
		t.Errorf("env = %q", info.Env)
	}
	got, err := Get(dataDir, "app")
	if err != nil || got.Hash != info.Hash {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	log, err := BuildLog(dataDir, "app")
	if err != nil || !bytes.Contains(log, []byte("RUN echo")) {
		t.Errorf("build log: %v\n%s", err, log)
	}
	// The base is untouched: its file deleted in the template is there.
	if got := readFile(t, filepath.Join(templatesDir(dataDir), "base", rootfsDir, "etc/gone")); got != "deleted by a step\n" {
		t.Errorf("base changed: %q", got)
	}
}

// TestDockerfileCache: a changed last step leaves the earlier ones cached;
// the same inputs give the same hash, rebuilt from nothing too; a changed
// context file rebuilds its COPY and what follows.
func TestDockerfileCache(t *testing.T) {
	dataDir, ctxDir := dfSetup(t, map[string]string{"f": "one\n"})
	r := &hostRunner{}
	v1 := "FROM base\nRUN echo first > first\nCOPY f /f\nRUN echo last > last\n"
	a, err := dfBuild(t, dataDir, ctxDir, "c", v1, r)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(r.ran()); n != 2 || a.StepsBuilt != 3 {
		t.Fatalf("first build ran %d steps, built %d; want 2, 3", n, a.StepsBuilt)
	}
	// The last step changed: only it runs.
	v2 := strings.Replace(v1, "echo last", "echo changed", 1)
	b, err := dfBuild(t, dataDir, ctxDir, "c", v2, r)
	if err != nil {
		t.Fatal(err)
	}
	if calls := r.ran(); len(calls) != 3 || calls[2] != "echo changed > last" || b.StepsBuilt != 1 {
		t.Fatalf("after changing the last step: calls %q, built %d", calls, b.StepsBuilt)
	}
	if b.Hash == a.Hash {
		t.Error("a changed Dockerfile kept the hash")
	}
	if got := readFile(t, filepath.Join(b.Path, "last")); got != "changed\n" {
		t.Errorf("last = %q", got)
	}
	// The same inputs again: all cached, same hash.
	c, err := dfBuild(t, dataDir, ctxDir, "c", v1, r)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.ran()) != 3 || c.StepsBuilt != 0 || c.Hash != a.Hash {
		t.Fatalf("same inputs: ran %d, built %d, hash %s want %s", len(r.ran()), c.StepsBuilt, c.Hash, a.Hash)
	}
	// From nothing (no cache, no template): the same hash.
	if err := os.RemoveAll(filepath.Join(templatesDir(dataDir), layersDir)); err != nil {
		t.Fatal(err)
	}
	if err := Remove(dataDir, "c"); err != nil {
		t.Fatal(err)
	}
	d, err := dfBuild(t, dataDir, ctxDir, "c", v1, r)
	if err != nil {
		t.Fatal(err)
	}
	if d.Hash != a.Hash || d.StepsBuilt != 3 {
		t.Fatalf("rebuilt from nothing: hash %s built %d, want %s and 3", d.Hash, d.StepsBuilt, a.Hash)
	}
	// A context file's content changed: its COPY and the RUN after it.
	writeTree(t, ctxDir, map[string]string{"f": "two\n"})
	e, err := dfBuild(t, dataDir, ctxDir, "c", v1, r)
	if err != nil {
		t.Fatal(err)
	}
	if e.StepsBuilt != 2 || e.Hash == a.Hash || readFile(t, filepath.Join(e.Path, "f")) != "two\n" {
		t.Fatalf("changed context: built %d, hash %s", e.StepsBuilt, e.Hash)
	}
	// A build arg is an input too.
	f, err := BuildDockerfile(context.Background(), []byte("FROM base\nARG X=1\nRUN echo $X > x\n"), DockerfileOptions{
		DataDir: dataDir, Name: "c", UIDShift: 1000, Runner: r, BuildArgs: map[string]string{"X": "2"},
	})
	if err != nil || readFile(t, filepath.Join(f.Path, "x")) != "2\n" {
		t.Fatalf("build arg: %v", err)
	}
}

// TestDockerfileFailingRun: a failing RUN reports its line, command and
// last output, and leaves no template, layer, staging dir or mount.
func TestDockerfileFailingRun(t *testing.T) {
	dataDir, ctxDir := dfSetup(t, nil)
	mounted := false
	r := &hostRunner{during: func(s RunStep) {
		// Control: the step's overlay is mounted while it runs, so the
		// check below that none is left can fail.
		mi, _ := os.ReadFile("/proc/self/mountinfo")
		mounted = mounted || bytes.Contains(mi, []byte(s.RootFS))
	}}
	src := "FROM base\nRUN echo ok > ok\nRUN echo partial-output; echo more > more; exit 3\nRUN echo never\n"
	_, err := dfBuild(t, dataDir, ctxDir, "bad", src, r)
	var be *BuildError
	if !errors.As(err, &be) {
		t.Fatalf("err = %v, want a *BuildError", err)
	}
	if !strings.Contains(be.Step, "line 3: RUN echo partial-output") || !strings.Contains(be.Output, "partial-output") ||
		!strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("error does not name the step, command and output:\n%v", err)
	}
	if !mounted {
		t.Fatal("control: the step's overlay was never seen mounted")
	}
	if n := len(r.ran()); n != 2 {
		t.Errorf("%d steps ran, want 2 (none after the failure)", n)
	}
	if _, err := Get(dataDir, "bad"); !errors.Is(err, ErrNotBuilt) {
		t.Errorf("template after a failed build: %v", err)
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if bytes.Contains(mi, []byte(dataDir)) {
		t.Error("a mount under the data dir is left")
	}
	if left := leftovers(t, dataDir, "base", layersDir, logsDir); len(left) != 0 {
		t.Errorf("left in templates: %v", left)
	}
	layers, _ := os.ReadDir(filepath.Join(templatesDir(dataDir), layersDir))
	if len(layers) != 1 || strings.HasPrefix(layers[0].Name(), ".") {
		t.Errorf("layers: %v, want only the first RUN's", layers)
	}
	log, _ := BuildLog(dataDir, "bad")
	if !bytes.Contains(log, []byte("partial-output")) || !bytes.Contains(log, []byte("build failed")) {
		t.Errorf("kept log:\n%s", log)
	}
	// The successful first step is cached: a fixed Dockerfile does not
	// redo it.
	if _, err := dfBuild(t, dataDir, ctxDir, "bad", strings.Replace(src, "exit 3", "true", 1), r); err != nil {
		t.Fatal(err)
	}
	if calls := r.ran(); len(calls) != 4 || calls[2] != "echo partial-output; echo more > more; true" {
		t.Errorf("calls after the fix: %q", calls)
	}
}

// TestDockerfileContextEscape: COPY reads nothing outside the build
// context (.., a symbolic link pointing out) and writes nothing outside
// the rootfs (a symbolic link a RUN planted).
func TestDockerfileContextEscape(t *testing.T) {
	outside := t.TempDir()
	writeTree(t, outside, map[string]string{"secret": "host secret\n"})
	dataDir, ctxDir := dfSetup(t, map[string]string{"ok": "ok\n", "dir/inner": "inner\n"})
	if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(ctxDir, "abs-link")); err != nil {
		t.Fatal(err)
	}
	rel, _ := filepath.Rel(ctxDir, filepath.Join(outside, "secret"))
	if err := os.Symlink(rel, filepath.Join(ctxDir, "rel-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(ctxDir, "dir-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(ctxDir, "dir", "planted")); err != nil {
		t.Fatal(err)
	}
	// Control: the links do reach the secret from the host's side.
	if b, err := os.ReadFile(filepath.Join(ctxDir, "rel-link")); err != nil || string(b) != "host secret\n" {
		t.Fatalf("control: rel-link reads %q, %v", b, err)
	}
	r := &hostRunner{}
	for _, src := range []string{
		"COPY ../" + filepath.Base(outside) + "/secret /x",
		"COPY ../../../../../../etc/passwd /x",
		"COPY abs-link /x",
		"COPY rel-link /x",
		"COPY dir-link/secret /x",
		"ADD rel-link /x",
		"COPY dir-link /x",
	} {
		_, err := dfBuild(t, dataDir, ctxDir, "esc", "FROM base\n"+src+"\n", r)
		if err == nil || !strings.Contains(err.Error(), "outside the build context") &&
			!strings.Contains(err.Error(), "no such file") {
			t.Errorf("%s: err = %v, want it refused", src, err)
		}
	}
	// A directory's symbolic link is copied as a link, not followed.
	info, err := dfBuild(t, dataDir, ctxDir, "esc", "FROM base\nCOPY dir /d\n", r)
	if err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(filepath.Join(info.Path, "d/planted")); err != nil || target != filepath.Join(outside, "secret") {
		t.Errorf("d/planted: %q, %v; want the link itself", target, err)
	}
	// Writing: a RUN plants /evil -> a host directory; COPY to /evil/x
	// must not reach it.
	hostDir := t.TempDir()
	src := "FROM base\nRUN ln -s " + hostDir + " evil && ln -s ../../../../../../../.." + hostDir + " evil2\nCOPY ok /evil/pwned\n"
	r2 := &hostRunner{during: func(s RunStep) {}}
	_, err = dfBuild(t, dataDir, ctxDir, "esc2", src, r2)
	if _, serr := os.Stat(filepath.Join(hostDir, "pwned")); serr == nil {
		t.Fatal("COPY wrote through a link the RUN planted into a host directory")
	}
	_, err2 := dfBuild(t, dataDir, ctxDir, "esc2", strings.Replace(src, "/evil/pwned", "/evil2/pwned", 1), r2)
	if _, serr := os.Stat(filepath.Join(hostDir, "pwned")); serr == nil {
		t.Fatal("COPY wrote through a relative link out of the rootfs")
	}
	for _, err := range []error{err, err2} {
		if err == nil || !strings.Contains(err.Error(), "leads out of the template's root filesystem") {
			t.Errorf("COPY through a planted link: err = %v, want it refused", err)
		}
	}
	// Control: the planted links do lead to the host directory when
	// followed on the host, as a naive join would.
	layers, _ := filepath.Glob(filepath.Join(templatesDir(dataDir), layersDir, "*", diffDir, "evil"))
	if len(layers) != 1 {
		t.Fatalf("control: the planted link's layer: %v", layers)
	}
	if err := os.WriteFile(filepath.Join(layers[0], "control"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(hostDir, "control")); err != nil {
		t.Fatalf("control: a naive write through the link did not reach the host dir: %v", err)
	}
}

// TestRemoveInUse: a template an engine holds (Use) is not removed; once
// released it is.
func TestRemoveInUse(t *testing.T) {
	requireRoot(t)
	dataDir := t.TempDir()
	fakeTemplate(t, dataDir, Info{Name: "held", Suite: "bookworm", Version: FormatVersion})
	release, err := Use(dataDir, "held")
	if err != nil {
		t.Fatal(err)
	}
	if err := Remove(dataDir, "held"); !errors.Is(err, ErrInUse) {
		t.Fatalf("Remove of a template in use: %v, want ErrInUse", err)
	}
	if _, err := Get(dataDir, "held"); err != nil {
		t.Fatalf("the template in use is gone: %v", err)
	}
	release()
	if err := Remove(dataDir, "held"); err != nil {
		t.Fatalf("Remove after release: %v", err)
	}
	if _, err := Get(dataDir, "held"); !errors.Is(err, ErrNotBuilt) {
		t.Fatalf("after Remove: %v", err)
	}
}
