package template

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// requireRoot skips a test that needs root (chown, mounts, chroot). CI runs
// as root, so there these tests run.
func requireRoot(t *testing.T) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("needs Linux")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}

// writeTree creates files under root: a path ending in "/" is a directory,
// "->target" makes a symlink, anything else is a regular file's content.
func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch {
		case strings.HasSuffix(p, "/"):
			err = os.MkdirAll(full, 0o755)
		case strings.HasPrefix(content, "->"):
			err = os.Symlink(strings.TrimPrefix(content, "->"), full)
		default:
			err = os.WriteFile(full, []byte(content), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestBuiltinAndLookup(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, d := range Builtin() {
		if err := d.validate(); err != nil {
			t.Errorf("builtin %s: %v", d.Name, err)
		}
		if seen[d.Name] {
			t.Errorf("builtin %s defined twice", d.Name)
		}
		seen[d.Name] = true
	}
	tests := []struct {
		name    string
		wantErr error
		want    []string // packages that must be in the definition
	}{
		{name: "python", want: []string{"python3", "python3-numpy", "python3-pandas", "python3-matplotlib", "nodejs", "bash", "coreutils", "procps"}},
		{name: "nope", wantErr: ErrUnknown},
		{name: "", wantErr: ErrUnknown},
		{name: "Python", wantErr: ErrUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Lookup(tt.name)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Lookup(%q) error = %v, want %v", tt.name, err, tt.wantErr)
			}
			if err != nil {
				if !strings.Contains(err.Error(), "python") {
					t.Errorf("error %q does not list the known templates", err)
				}
				return
			}
			if d.Name != tt.name || d.Suite != "bookworm" {
				t.Errorf("Lookup(%q) = %+v", tt.name, d)
			}
			for _, p := range tt.want {
				if !slices.Contains(d.Packages, p) {
					t.Errorf("Lookup(%q).Packages = %v, missing %s", tt.name, d.Packages, p)
				}
			}
		})
	}
}

func TestDefinitionValidate(t *testing.T) {
	t.Parallel()
	ok := Definition{Name: "py-3_x", Suite: "bookworm", Packages: []string{"python3", "libstdc++6", "g++-12"}}
	tests := []struct {
		name   string
		modify func(*Definition)
		valid  bool
	}{
		{"ok", func(*Definition) {}, true},
		{"no packages", func(d *Definition) { d.Packages = nil }, true},
		{"empty name", func(d *Definition) { d.Name = "" }, false},
		{"dot name", func(d *Definition) { d.Name = ".hidden" }, false},
		{"path name", func(d *Definition) { d.Name = "../etc" }, false},
		{"upper name", func(d *Definition) { d.Name = "Python" }, false},
		{"long name", func(d *Definition) { d.Name = strings.Repeat("a", 64) }, false},
		{"bad suite", func(d *Definition) { d.Suite = "bookworm main" }, false},
		{"empty suite", func(d *Definition) { d.Suite = "" }, false},
		{"comma package", func(d *Definition) { d.Packages = []string{"a,b"} }, false},
		{"option package", func(d *Definition) { d.Packages = []string{"--no-check-gpg"} }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := ok
			d.Packages = slices.Clone(ok.Packages)
			tt.modify(&d)
			if err := d.validate(); (err == nil) != tt.valid {
				t.Errorf("validate(%+v) = %v, want valid=%v", d, err, tt.valid)
			}
		})
	}
}

func TestDefaultMirror(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"nothing", nil, DefaultMirror},
		{"one-line", map[string]string{
			"sources.list": "# comment\ndeb-src http://src.example/debian bookworm main\n" +
				"deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian/ bookworm main contrib\n",
		}, "http://mirror.example/debian"},
		{"other suites only", map[string]string{
			"sources.list":                         "deb http://security.example/debian-security bookworm-security main\n",
			"sources.list.d/nodesource.sources":    "Types: deb\nURIs: https://deb.nodesource.com/node_20.x\nSuites: nodistro\nComponents: main\n",
			"sources.list.d/google-cloud-sdk.list": "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n",
		}, DefaultMirror},
		{"deb822", map[string]string{
			"sources.list.d/debian.sources": "Types: deb\n# http://snapshot.debian.org/archive/debian/20250520T000000Z\n" +
				"URIs: http://deb822.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n" +
				"Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n" +
				"Types: deb\nURIs: http://deb822.example/debian-security\nSuites: bookworm-security\nComponents: main\n",
		}, "http://deb822.example/debian"},
		{"deb822 disabled and deb-src", map[string]string{
			"sources.list.d/a.sources": "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nEnabled: no\n\n" +
				"Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n\n" +
				"Types: deb deb-src\nURIs: https://on.example/debian\nSuites: bookworm\n",
		}, "https://on.example/debian"},
		{"sources.list first", map[string]string{
			"sources.list":                  "deb http://first.example/debian bookworm main\n",
			"sources.list.d/debian.sources": "Types: deb\nURIs: http://second.example/debian\nSuites: bookworm\n",
		}, "http://first.example/debian"},
		{"unusable scheme skipped", map[string]string{
			"sources.list": "deb cdrom:[Debian]/ bookworm main\ndeb http://usable.example/debian bookworm main\n",
		}, "http://usable.example/debian"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			writeTree(t, dir, tt.files)
			if got := defaultMirror(dir, "bookworm"); got != tt.want {
				t.Errorf("defaultMirror = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestValidMirror(t *testing.T) {
	t.Parallel()
	tests := []struct {
		mirror string
		valid  bool
	}{
		{"http://deb.debian.org/debian", true},
		{"https://deb.debian.org/debian/", true},
		{"file:///srv/mirror", true},
		{"", false},
		{"--no-check-gpg", false},
		{"ftp://ftp.debian.org/debian", false},
		{"http://", false},
		{"deb.debian.org/debian", false},
	}
	for _, tt := range tests {
		t.Run(tt.mirror, func(t *testing.T) {
			if err := validMirror(tt.mirror); (err == nil) != tt.valid {
				t.Errorf("validMirror(%q) = %v, want valid=%v", tt.mirror, err, tt.valid)
			}
		})
	}
}

// fakeRootfs is a tiny tree shaped like debootstrap's output.
func fakeRootfs(t *testing.T) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "rootfs")
	writeTree(t, root, map[string]string{
		"etc/passwd":                      "root:x:0:0:root:/root:/bin/bash\nolduser:x:1000:1000::/home/old:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin", // no final newline
		"etc/group":                       "root:x:0:\nuser:x:1001:\nnogroup:x:65534:\n",
		"etc/shadow":                      "root:*:19000:0:99999:7:::\nuser:$6$old:19000:0:99999:7:::\n",
		"etc/gshadow":                     "root:*::\n",
		"etc/hostname":                    "buildhost.internal\n",
		"etc/hosts":                       "127.0.0.1 localhost\n10.1.2.3 buildhost.internal\n",
		"etc/resolv.conf":                 "nameserver 10.0.0.53\nsearch internal\n",
		"etc/machine-id":                  "0123456789abcdef\n",
		"etc/apt/sources.list":            "deb http://apt-cache.internal:3142/debian bookworm main\n",
		"etc/skel/.bashrc":                "# bashrc\n",
		"etc/skel/.config/app.conf":       "x=1\n",
		"var/lib/apt/lists/partial/":      "",
		"var/lib/apt/lists/deb_Packages":  "Package: x\n",
		"var/lib/apt/lists/lock":          "",
		"var/cache/apt/archives/partial/": "",
		"var/cache/apt/archives/x_1.deb":  "deb",
		"var/cache/apt/archives/lock":     "",
		"var/cache/apt/pkgcache.bin":      "bin",
		"var/log/bootstrap.log":           "I: extracting into /var/lib/sheepfold/templates/.python.build-1/rootfs\n",
		"home/":                           "",
	})
	if err := os.Chmod(filepath.Join(root, "etc/shadow"), 0o640); err != nil {
		t.Fatal(err)
	}
	return root
}

func TestConfigureRootfs(t *testing.T) {
	t.Parallel()
	root := fakeRootfs(t)
	now := time.Date(2025, 5, 20, 12, 0, 0, 0, time.UTC)
	// The hostname is a symlink out of the rootfs: configure must replace
	// the link, not write through it.
	outside := filepath.Join(t.TempDir(), "host-hostname")
	writeTree(t, filepath.Dir(outside), map[string]string{"host-hostname": "host\n"})
	os.Remove(filepath.Join(root, "etc/hostname"))
	if err := os.Symlink(outside, filepath.Join(root, "etc/hostname")); err != nil {
		t.Fatal(err)
	}
	// Twice: a second run must not add a second user.
	for i := range 2 {
		if err := configureRootfs(root, "bookworm", now); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
	}

	days := fmt.Sprint(now.Unix() / 86400)
	files := []struct {
		path string
		want string
	}{
		{"etc/passwd", "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\nuser:x:1000:1000::/home/user:/bin/bash\n"},
		{"etc/group", "root:x:0:\nnogroup:x:65534:\nuser:x:1000:\n"},
		{"etc/shadow", "root:*:19000:0:99999:7:::\nuser:!:" + days + ":0:99999:7:::\n"},
		{"etc/gshadow", "root:*::\nuser:!::\n"},
		{"etc/hostname", "sandbox\n"},
		{"etc/hosts", "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost\n"},
		{"etc/resolv.conf", ""},
		{"etc/machine-id", ""},
		{"etc/apt/sources.list", "deb http://deb.debian.org/debian bookworm main\n"},
		{"home/user/.bashrc", "# bashrc\n"},
		{"home/user/.config/app.conf", "x=1\n"},
	}
	for _, f := range files {
		if got := readFile(t, filepath.Join(root, f.path)); got != f.want {
			t.Errorf("%s = %q, want %q", f.path, got, f.want)
		}
	}
	if got := readFile(t, outside); got != "host\n" {
		t.Errorf("write went through the symlink: host file now %q", got)
	}
	if fi, err := os.Lstat(filepath.Join(root, "etc/hostname")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("etc/hostname is not a regular file: %v %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(root, "etc/shadow")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("etc/shadow mode = %v (%v), want it kept at 0640", fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Join(root, "home/user")); err != nil || fi.Mode().Perm() != 0o755 || !fi.IsDir() {
		t.Errorf("home/user = %v (%v), want a 0755 directory", fi.Mode(), err)
	}
	gone := []string{"var/lib/apt/lists/deb_Packages", "var/lib/apt/lists/lock", "var/cache/apt/archives/x_1.deb",
		"var/cache/apt/pkgcache.bin", "var/log/bootstrap.log"}
	for _, p := range gone {
		if _, err := os.Lstat(filepath.Join(root, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s not removed (%v)", p, err)
		}
	}
	kept := []string{"var/lib/apt/lists/partial", "var/cache/apt/archives/partial", "var/cache/apt/archives/lock"}
	for _, p := range kept {
		if _, err := os.Lstat(filepath.Join(root, p)); err != nil {
			t.Errorf("%s removed: %v", p, err)
		}
	}
}

func TestConfigureRootfsRefusesSymlinkedDirs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		link string // a directory of the rootfs made a symlink to a host dir
	}{
		{"etc", "etc"},
		{"home", "home"},
		{"apt lists", "var/lib/apt/lists"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			root := fakeRootfs(t)
			host := t.TempDir()
			// Give the host dir the files configure looks for, to see
			// whether any were touched.
			src := filepath.Join(root, tt.link)
			if err := os.Rename(src, filepath.Join(host, "moved")); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(host, "moved"), src); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, host)
			if err := configureRootfs(root, "bookworm", time.Now()); err == nil {
				t.Errorf("configureRootfs succeeded with %s a symlink", tt.link)
			}
			if after := snapshot(t, host); !reflect.DeepEqual(before, after) {
				t.Errorf("host dir changed through the %s symlink:\nbefore %v\nafter  %v", tt.link, before, after)
			}
		})
	}
}

// snapshot maps every path under dir to its content (or "dir").
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			m[p] = "dir"
			return nil
		}
		b, err := os.ReadFile(p)
		m[p] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestStripSetid(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"usr/bin/passwd": "suid", "usr/bin/wall": "sgid", "usr/bin/plain": "x",
		"var/mail/": "", "tmp/": "", "usr/bin/link": "->passwd",
	})
	modes := map[string]fs.FileMode{
		"usr/bin/passwd": 0o755 | fs.ModeSetuid,
		"usr/bin/wall":   0o755 | fs.ModeSetgid,
		"usr/bin/plain":  0o755,
		"var/mail":       0o775 | fs.ModeSetgid | fs.ModeDir,
		"tmp":            0o777 | fs.ModeSticky | fs.ModeDir,
	}
	for p, m := range modes {
		if err := os.Chmod(filepath.Join(root, p), m); err != nil {
			t.Fatal(err)
		}
	}
	n, err := stripSetid(root)
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Errorf("stripSetid changed %d files, want 3", n)
	}
	want := map[string]fs.FileMode{
		"usr/bin/passwd": 0o755,
		"usr/bin/wall":   0o755,
		"usr/bin/plain":  0o755,
		"var/mail":       0o775 | fs.ModeDir,
		"tmp":            0o777 | fs.ModeSticky | fs.ModeDir,
	}
	for p, w := range want {
		fi, err := os.Lstat(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != w {
			t.Errorf("%s mode = %v, want %v", p, fi.Mode(), w)
		}
	}
}

func TestBuildLogTail(t *testing.T) {
	t.Parallel()
	var all bytes.Buffer
	l := newBuildLog(&all)
	var in strings.Builder
	for i := 1; i <= 120; i++ {
		fmt.Fprintf(&in, "line %d\n", i)
	}
	in.WriteString(strings.Repeat("x", 3000) + "\n")
	in.WriteString("unfinished")
	// Odd-sized writes, splitting lines.
	s := in.String()
	for len(s) > 0 {
		n := min(len(s), 7)
		l.Write([]byte(s[:n]))
		s = s[n:]
	}
	if all.String() != in.String() {
		t.Errorf("Log got %d bytes, want all %d", all.Len(), in.Len())
	}
	lines := strings.Split(l.Tail(), "\n")
	if len(lines) != tailLines+1 {
		t.Fatalf("Tail has %d lines, want %d", len(lines), tailLines+1)
	}
	if lines[0] != "line 72" || lines[tailLines-2] != "line 120" {
		t.Errorf("Tail starts %q, has %q before the long line; want line 72 and line 120", lines[0], lines[tailLines-2])
	}
	if got := lines[tailLines-1]; got != strings.Repeat("x", maxLine) {
		t.Errorf("long line kept as %d bytes, want %d", len(got), maxLine)
	}
	if lines[tailLines] != "unfinished" {
		t.Errorf("last line %q, want the unfinished one", lines[tailLines])
	}
}

func TestDIReader(t *testing.T) {
	t.Parallel()
	in := strings.Join([]string{
		"P: 0 100 DOWNREL", "PF: Downloading Release file",
		"I: RETRIEVING", "IA: libc6", "IA: 2.36-9", "IF: Retrieving %s %s",
		"P: 100 100 DOWNREL", "PF: Downloading Release file",
		"P: 0 4 SIZEDEBS", "P: 4 4 SIZEDEBS",
		"P: 0 1000 DOWNDEBS", "PF: Downloading packages",
		"P: 900 1000", // byte counts of one package: not used
		"I: VALIDATING", "IA: a", "IA: 1", "IF: Validating %s %s",
		"P: 10 1000",
		"I: VALIDATING", "IF: Validating",
		"P: 10 20 NOSUCHPHASE",
		"garbage line",
		"W: MKNOD", "WF: Could not create %s: 100%% sure", "WA: ignored-after-F",
		"P: 3 10 CONFBASE", "PA: x", "PF: Configuring base system",
		"E: COULDNTDL", "EA: python3", "EF: Couldn't download package %s",
	}, "\n") + "\n"
	type call struct {
		step string
		done int
	}
	var calls []call
	prog := &progress{fn: func(step string, done, total int) {
		if total != progressTotal {
			t.Errorf("total = %d, want %d", total, progressTotal)
		}
		calls = append(calls, call{step, done})
	}}
	var log bytes.Buffer
	diReader(strings.NewReader(in), prog, &log)

	want := []call{
		{"debootstrap: downloading release file", 0},
		{"debootstrap: downloading release file", 2},
		{"debootstrap: finding package sizes", 68},
		{"debootstrap: finding package sizes", 71},
		{"debootstrap: downloading packages", 71},
		{"debootstrap: downloading packages", 71},
		{"debootstrap: downloading packages", 71 + (610-71)*1/4},
		{"debootstrap: downloading packages", 71 + (610-71)*1/4},
		{"debootstrap: downloading packages", 71 + (610-71)*2/4},
		{"debootstrap: configuring base system", 860 + (985-860)*3/10},
	}
	if !reflect.DeepEqual(calls, want) {
		t.Errorf("progress calls\n got %v\nwant %v", calls, want)
	}
	wantLog := "I: Retrieving libc6 2.36-9\nI: Validating a 1\nI: Validating\n" +
		"W: Could not create %s: 100% sure\nE: Couldn't download package python3\n"
	if log.String() != wantLog {
		t.Errorf("log = %q, want %q", log.String(), wantLog)
	}
}

func TestDebootstrapPhasesInOrder(t *testing.T) {
	t.Parallel()
	order := []string{"DOWNREL", "DOWNRELSIG", "DOWNPKGS", "SIZEDEBS", "DOWNDEBS", "EXTRACTPKGS",
		"INSTCORE", "UNPACKREQ", "CONFREQ", "UNPACKBASE", "CONFBASE"}
	at := progressDebootstrap
	for _, name := range order {
		ph, ok := debootstrapPhases[name]
		if !ok || ph.from != at || ph.to < ph.from || ph.label == "" {
			t.Errorf("phase %s = %+v (known %v), want it to start at %d", name, ph, ok, at)
		}
		at = ph.to
	}
	steps := []int{at, progressConfigure, progressPython, progressStrip, progressShift, progressFinish, progressTotal}
	if at != progressConfigure || !slices.IsSorted(steps) {
		t.Errorf("steps after debootstrap %v are not in order from %d", steps, at)
	}
}

func TestProgressNeverGoesBack(t *testing.T) {
	t.Parallel()
	var got []int
	p := &progress{fn: func(_ string, done, _ int) { got = append(got, done) }}
	for _, d := range []int{0, 50, 40, 2000, 10} {
		p.report("x", d)
	}
	if want := []int{0, 50, 50, progressTotal, progressTotal}; !reflect.DeepEqual(got, want) {
		t.Errorf("reported %v, want %v", got, want)
	}
	(&progress{}).report("no callback", 1) // must not panic
}

// fakeTemplate writes a built template's files into dataDir.
func fakeTemplate(t *testing.T, dataDir string, info Info) {
	t.Helper()
	dir := filepath.Join(templatesDir(dataDir), info.Name)
	if err := os.MkdirAll(filepath.Join(dir, rootfsDir, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeInfo(dir, info); err != nil {
		t.Fatal(err)
	}
}

func TestGetListRemove(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	created := time.Date(2025, 5, 20, 12, 0, 0, 0, time.UTC)
	a := Info{Name: "a", Path: "/elsewhere/rootfs", Suite: "bookworm", Packages: []string{"python3"}, Created: created, SizeBytes: 42, UIDShift: 1000000, Version: FormatVersion}
	b := Info{Name: "b", Suite: "bookworm", Created: created, Version: FormatVersion}
	fakeTemplate(t, data, a)
	fakeTemplate(t, data, b)
	fakeTemplate(t, data, Info{Name: "old", Suite: "bookworm", Version: FormatVersion + 1})
	writeTree(t, templatesDir(data), map[string]string{
		"notemplate/rootfs/":         "", // no template.json: not a template
		"broken/template.json":       "{not json",
		".a.build-123/template.json": `{"name":"a"}`, // staging: ignored
		".a.lock":                    "",
		"Upper/template.json":        `{"name":"Upper"}`, // not a valid name: ignored
		"norootfs/template.json":     `{"name":"norootfs","version":1}`,
		"wrongname/rootfs/":          "",
		"wrongname/template.json":    `{"name":"other","version":1}`,
	})

	wantA := a
	wantA.Path = filepath.Join(data, "templates", "a", "rootfs")
	got, err := Get(data, "a")
	if err != nil || !reflect.DeepEqual(got, wantA) {
		t.Errorf("Get(a) = %+v, %v; want %+v", got, err, wantA)
	}

	gets := []struct {
		name    string
		wantErr error
		msg     string
	}{
		{"missing", ErrNotBuilt, "sheepfold template build missing"},
		{"notemplate", ErrNotBuilt, "sheepfold template build notemplate"},
		{"norootfs", ErrNotBuilt, "rootfs"},
		{"old", ErrStale, "--force"},
		{"broken", nil, "template.json"},
		{"wrongname", nil, "other"},
		{"../a", nil, "invalid template name"},
	}
	for _, tt := range gets {
		t.Run("Get "+tt.name, func(t *testing.T) {
			_, err := Get(data, tt.name)
			if err == nil {
				t.Fatalf("Get(%s) succeeded", tt.name)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("Get(%s) = %v, want %v", tt.name, err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("Get(%s) = %q, want it to mention %q", tt.name, err, tt.msg)
			}
		})
	}

	infos, err := List(data)
	var names []string
	for _, i := range infos {
		names = append(names, i.Name)
	}
	if want := []string{"a", "b"}; !reflect.DeepEqual(names, want) {
		t.Errorf("List names = %v, want %v", names, want)
	}
	for _, bad := range []string{"broken", "old", "wrongname"} {
		if err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("List error %v does not report %s", err, bad)
		}
	}
	if len(infos) > 0 && !reflect.DeepEqual(infos[0], wantA) {
		t.Errorf("List()[0] = %+v, want %+v", infos[0], wantA)
	}

	if err := Remove(data, "a"); err != nil {
		t.Fatalf("Remove(a): %v", err)
	}
	if _, err := Get(data, "a"); !errors.Is(err, ErrNotBuilt) {
		t.Errorf("Get(a) after Remove = %v, want ErrNotBuilt", err)
	}
	if err := Remove(data, "a"); !errors.Is(err, ErrNotBuilt) {
		t.Errorf("second Remove(a) = %v, want ErrNotBuilt", err)
	}
	if err := Remove(data, "../templates"); err == nil {
		t.Errorf("Remove(../templates) succeeded")
	}
	if _, err := os.Stat(filepath.Join(templatesDir(data), "b", infoFile)); err != nil {
		t.Errorf("Remove(a) touched b: %v", err)
	}
	left, _ := filepath.Glob(filepath.Join(templatesDir(data), ".a.old-*"))
	if len(left) > 0 {
		t.Errorf("Remove left %v", left)
	}

	if infos, err := List(filepath.Join(data, "nothing-here")); err != nil || infos != nil {
		t.Errorf("List of a missing dir = %v, %v; want nothing", infos, err)
	}
}

func TestInfoMismatch(t *testing.T) {
	t.Parallel()
	info := Info{Suite: "bookworm", Packages: []string{"b", "a", "a"}, UIDShift: 1000000}
	def := Definition{Suite: "bookworm", Packages: []string{"a", "b"}}
	tests := []struct {
		name  string
		def   Definition
		shift uint32
		want  string
	}{
		{"same", def, 1000000, ""},
		{"shift", def, 2000000, "uid shift"},
		{"suite", Definition{Suite: "trixie", Packages: def.Packages}, 1000000, "suite"},
		{"packages", Definition{Suite: "bookworm", Packages: []string{"a"}}, 1000000, "packages"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := info.mismatch(tt.def, tt.shift)
			if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
				t.Errorf("mismatch = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestBuildRejectsBadOptions(t *testing.T) {
	t.Parallel()
	def := Definition{Name: "tiny", Suite: "bookworm"}
	data := t.TempDir()
	tests := []struct {
		name string
		def  Definition
		opt  BuildOptions
	}{
		{"no data dir", def, BuildOptions{}},
		{"bad name", Definition{Name: "../x", Suite: "bookworm"}, BuildOptions{DataDir: data}},
		{"bad mirror", def, BuildOptions{DataDir: data, Mirror: "-x"}},
		{"shift overflows", def, BuildOptions{DataDir: data, UIDShift: 1<<32 - 100}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opt := tt.opt
			opt.debootstrap = "/bin/false"
			if _, err := Build(context.Background(), tt.def, opt); err == nil {
				t.Errorf("Build succeeded")
			}
		})
	}
	if ents, _ := os.ReadDir(templatesDir(data)); len(ents) > 0 {
		t.Errorf("rejected builds left %v", ents)
	}
}

// fakeDebootstrap writes an executable shell script standing in for
// debootstrap. In the script, $target is the rootfs it was asked to build.
func fakeDebootstrap(t *testing.T, body string) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("building needs Linux")
	}
	p := filepath.Join(t.TempDir(), "debootstrap")
	script := "#!/bin/sh\nset -e\neval target=\\${$(($# - 1))}\n" + body + "\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// leftovers lists what a build left in the templates dir besides lock files
// and the named templates.
func leftovers(t *testing.T, dataDir string, templates ...string) []string {
	t.Helper()
	ents, err := os.ReadDir(templatesDir(dataDir))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".lock") || strings.HasSuffix(e.Name(), ".use") || slices.Contains(templates, e.Name()) {
			continue
		}
		out = append(out, e.Name())
	}
	return out
}

func TestBuildFailureCleansUp(t *testing.T) {
	t.Parallel()
	script := fakeDebootstrap(t, `mkdir -p "$target/etc"; echo data > "$target/etc/file"
for i in $(seq 1 80); do echo "output line $i"; done
echo "P: 10 100 DOWNDEBS" >&3
exit 3`)
	data := t.TempDir()
	var steps []string
	opt := BuildOptions{DataDir: data, debootstrap: script, Progress: func(step string, _, _ int) { steps = append(steps, step) }}
	_, err := Build(context.Background(), Definition{Name: "tiny", Suite: "bookworm"}, opt)
	var be *BuildError
	if !errors.As(err, &be) {
		t.Fatalf("Build error = %v (%T), want a *BuildError", err, err)
	}
	if be.Step != "debootstrap" || be.Template != "tiny" {
		t.Errorf("BuildError step %q template %q, want debootstrap, tiny", be.Step, be.Template)
	}
	if !strings.Contains(be.Output, "output line 80") || strings.Contains(be.Output, "output line 10\n") {
		t.Errorf("BuildError output does not end with the last lines:\n%s", be.Output)
	}
	if !strings.Contains(err.Error(), "exit status 3") || !strings.Contains(err.Error(), "output line 80") {
		t.Errorf("error text %q lacks the cause or the output", err)
	}
	if left := leftovers(t, data); len(left) > 0 {
		t.Errorf("failed build left %v", left)
	}
	if _, err := Get(data, "tiny"); !errors.Is(err, ErrNotBuilt) {
		t.Errorf("Get after failed build = %v, want ErrNotBuilt", err)
	}
	if !slices.Contains(steps, "debootstrap") {
		t.Errorf("progress steps %v, want debootstrap reported", steps)
	}
}

func TestBuildCancelKillsDebootstrap(t *testing.T) {
	t.Parallel()
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	script := fakeDebootstrap(t, `mkdir -p "$target"
sleep 60 & echo $! > `+pidFile+`
echo "P: 1 10 DOWNDEBS" >&3
wait`)
	data := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var once sync.Once
	opt := BuildOptions{DataDir: data, debootstrap: script, Progress: func(step string, done, _ int) {
		if done > 0 {
			once.Do(cancel) // debootstrap is running and has its child
		}
	}}
	start := time.Now()
	_, err := Build(ctx, Definition{Name: "tiny", Suite: "bookworm"}, opt)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Build error = %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Build took %s to return after cancel", d)
	}
	if left := leftovers(t, data); len(left) > 0 {
		t.Errorf("cancelled build left %v", left)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	fmt.Sscan(string(b), &pid)
	deadline := time.Now().Add(3 * time.Second)
	for processAlive(pid) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("debootstrap's child %d survived the cancel", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// processAlive reports whether pid runs (a zombie counts as dead).
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, after, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(after, "Z") && !strings.HasPrefix(after, "X")
}

func TestShiftedIDsLimit(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("building needs Linux")
	}
	t.Parallel()
	// The largest shift that keeps every mapped id below 2^32-1 (the
	// invalid id) is accepted past validation; one more is not.
	def := Definition{Name: "tiny", Suite: "bookworm"}
	for _, tt := range []struct {
		shift uint32
		ok    bool
	}{{1<<32 - 1 - maxMappedID - 1, true}, {1<<32 - 1 - maxMappedID, false}} {
		opt := BuildOptions{DataDir: t.TempDir(), UIDShift: tt.shift, debootstrap: "/bin/false"}
		_, err := Build(context.Background(), def, opt)
		var be *BuildError
		if got := errors.As(err, &be); got != tt.ok { // past validation, it fails in debootstrap
			t.Errorf("shift %d: error %v, want validation to pass=%v", tt.shift, err, tt.ok)
		}
	}
}

// --- root only ---

func lstatOwner(t *testing.T, p string) (uid, gid uint32, mode fs.FileMode) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid, fi.Mode()
}

func TestShiftOwnership(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	root := t.TempDir()
	outside := filepath.Join(t.TempDir(), "host-file")
	writeTree(t, root, map[string]string{
		"etc/passwd": "root", "home/user/.bashrc": "x", "usr/bin/su": "suid", "usr/bin/wall": "sgid",
		"tmp/": "", "nobody": "n", "usr/bin/perl": "perl", "link-out": "->" + outside, "dangling": "->/nonexistent",
	})
	writeTree(t, filepath.Dir(outside), map[string]string{"host-file": "host"})
	if err := os.Link(filepath.Join(root, "usr/bin/perl"), filepath.Join(root, "usr/bin/perl5.36")); err != nil {
		t.Fatal(err)
	}
	chown := map[string][2]int{"home/user": {1000, 1000}, "home/user/.bashrc": {1000, 1000}, "usr/bin/wall": {0, 5}, "nobody": {65534, 65534}}
	for p, o := range chown {
		if err := os.Lchown(filepath.Join(root, p), o[0], o[1]); err != nil {
			t.Fatal(err)
		}
	}
	modes := map[string]fs.FileMode{
		"usr/bin/su":   0o755 | fs.ModeSetuid,
		"usr/bin/wall": 0o755 | fs.ModeSetgid,
		"tmp":          0o777 | fs.ModeSticky,
	}
	for p, m := range modes {
		if err := os.Chmod(filepath.Join(root, p), m); err != nil {
			t.Fatal(err)
		}
	}
	before := map[string]fs.FileMode{}
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		_, _, m := lstatOwner(t, p)
		before[p] = m
		return err
	})

	const shift = 1000000
	size, err := shiftOwnership(context.Background(), root, shift)
	if err != nil {
		t.Fatal(err)
	}
	if size <= 0 {
		t.Errorf("size = %d, want > 0", size)
	}
	want := map[string][2]uint32{
		".": {shift, shift}, "etc/passwd": {shift, shift}, "home/user": {shift + 1000, shift + 1000},
		"home/user/.bashrc": {shift + 1000, shift + 1000}, "usr/bin/wall": {shift, shift + 5},
		"nobody": {shift + 65534, shift + 65534}, "link-out": {shift, shift}, "dangling": {shift, shift},
		"usr/bin/perl": {shift, shift}, // hard link: shifted once, not twice
	}
	for p, w := range want {
		uid, gid, _ := lstatOwner(t, filepath.Join(root, p))
		if uid != w[0] || gid != w[1] {
			t.Errorf("%s owner = %d:%d, want %d:%d", p, uid, gid, w[0], w[1])
		}
	}
	for p, m := range before {
		if _, _, got := lstatOwner(t, p); got != m {
			t.Errorf("%s mode = %v, want %v kept", p, got, m)
		}
	}
	if uid, _, _ := lstatOwner(t, outside); uid != 0 {
		t.Errorf("the symlink's target outside the tree was chowned to %d", uid)
	}

	// Shifting by 0 measures without changing anything.
	size0, err := shiftOwnership(context.Background(), root, 0)
	if err != nil || size0 != size {
		t.Errorf("shift 0: size %d, %v; want %d", size0, err, size)
	}
	if uid, _, _ := lstatOwner(t, filepath.Join(root, "etc/passwd")); uid != shift {
		t.Errorf("shift 0 changed an owner to %d", uid)
	}
	// Now every id is above 65535: a second shift must refuse.
	if _, err := shiftOwnership(context.Background(), root, shift); err == nil || !strings.Contains(err.Error(), "outside") {
		t.Errorf("shifting ids above %d: %v, want an error", maxMappedID, err)
	}
}

func TestChownTree(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	home := filepath.Join(t.TempDir(), "user")
	outside := filepath.Join(t.TempDir(), "host")
	writeTree(t, home, map[string]string{".config/matplotlib/fontlist.json": "{}", "link": "->" + outside})
	writeTree(t, filepath.Dir(outside), map[string]string{"host": "x"})
	if err := chownTree(home, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{".", ".config", ".config/matplotlib", ".config/matplotlib/fontlist.json", "link"} {
		if uid, gid, _ := lstatOwner(t, filepath.Join(home, p)); uid != 1000 || gid != 1000 {
			t.Errorf("%s owner %d:%d, want 1000:1000", p, uid, gid)
		}
	}
	if uid, _, _ := lstatOwner(t, outside); uid != 0 {
		t.Errorf("chownTree followed a symlink out")
	}
}

func TestRemoveStagingUnmounts(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	staging := filepath.Join(t.TempDir(), ".x.build-1")
	host := t.TempDir() // stands for host /dev: bind-mounted in, must survive
	writeTree(t, host, map[string]string{"null": "precious"})
	writeTree(t, staging, map[string]string{"rootfs/proc/": "", "rootfs/dev/null": "", "rootfs/sys/fs/": ""})
	t.Cleanup(func() { // if the test fails, leave no mounts behind
		mps, _ := mountsUnder(staging)
		slices.Reverse(mps)
		for _, mp := range mps {
			exec.Command("umount", "-l", mp).Run()
		}
	})
	mounts := []struct{ src, dst, fstype string }{
		{"tmpfs", "rootfs/proc", "tmpfs"},
		{"tmpfs", "rootfs/sys", "tmpfs"},
		{host + "/null", "rootfs/dev/null", ""},
	}
	for _, m := range mounts {
		mount(t, m.src, filepath.Join(staging, m.dst), m.fstype)
	}
	// A mount on top of a mount, deeper.
	if err := os.MkdirAll(filepath.Join(staging, "rootfs/sys/fs/cgroup"), 0o755); err != nil {
		t.Fatal(err)
	}
	mount(t, "tmpfs", filepath.Join(staging, "rootfs/sys/fs/cgroup"), "tmpfs")
	// A name mountinfo escapes (space, tab, backslash), and a sibling
	// whose name starts like the staging dir's, which is not under it.
	odd := filepath.Join(staging, "rootfs/a b\\c\td")
	if err := os.MkdirAll(odd, 0o755); err != nil {
		t.Fatal(err)
	}
	mount(t, "tmpfs", odd, "tmpfs")
	sibling := staging + "x"
	if err := os.MkdirAll(sibling, 0o755); err != nil {
		t.Fatal(err)
	}
	mount(t, "tmpfs", sibling, "tmpfs")
	defer exec.Command("umount", "-l", sibling).Run()
	if mps, _ := mountsUnder(staging); len(mps) != 5 || !slices.Contains(mps, odd) {
		t.Fatalf("set up %d mounts, want 5 with %q: %q", len(mps), odd, mps)
	}
	if err := removeStaging(staging); err != nil {
		t.Fatal(err)
	}
	if mps, _ := mountsUnder(staging); len(mps) > 0 {
		t.Errorf("mounts left: %v", mps)
	}
	if _, err := os.Lstat(staging); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("staging dir not removed: %v", err)
	}
	if got := readFile(t, filepath.Join(host, "null")); got != "precious" {
		t.Errorf("host file behind a bind mount = %q", got)
	}
}

// mount mounts a small tmpfs (fstype "tmpfs") or binds src (fstype "") on
// dst, with mount(8) so the test builds on every OS.
func mount(t *testing.T, src, dst, fstype string) {
	t.Helper()
	args := []string{"--bind", src, dst}
	if fstype != "" {
		args = []string{"-t", fstype, "-o", "size=1m", src, dst}
	}
	if out, err := exec.Command("mount", args...).CombinedOutput(); err != nil {
		t.Fatalf("mount %s: %v\n%s", dst, err, out)
	}
}

// tinyRootfsScript makes a fake debootstrap build a rootfs with the files
// configure edits, a setuid binary, a hard link and a mount it leaves.
const tinyRootfsScript = `mkdir -p "$target/etc/skel" "$target/home" "$target/usr/bin" "$target/proc" "$target/tmp" "$target/var/lib/apt/lists"
printf 'root:x:0:0:root:/root:/bin/bash\n' > "$target/etc/passwd"
printf 'root:x:0:\nshadow:x:42:\n' > "$target/etc/group"
printf 'root:*:19000:0:99999:7:::\n' > "$target/etc/shadow"
printf 'buildhost\n' > "$target/etc/hostname"
printf 'nameserver 10.0.0.53\n' > "$target/etc/resolv.conf"
printf 'x' > "$target/usr/bin/passwd"; chmod 4755 "$target/usr/bin/passwd"
printf 'perl' > "$target/usr/bin/perl"; ln "$target/usr/bin/perl" "$target/usr/bin/perl5.36"
chmod 1777 "$target/tmp"
mount -t tmpfs proc "$target/proc"
echo "P: 5 5 CONFBASE" >&3
sleep 0.3 # the mount stays while the test looks for it from outside
echo "I: Base system installed successfully."`

func TestBuildWithFakeDebootstrap(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	script := fakeDebootstrap(t, tinyRootfsScript)
	data := filepath.Join(t.TempDir(), "data")
	def := Definition{Name: "tiny", Suite: "bookworm", Packages: []string{"bash"}}
	var log bytes.Buffer
	var last int
	var seenMount []string
	opt := BuildOptions{DataDir: data, UIDShift: 1000000, Log: &log, debootstrap: script,
		Progress: func(step string, done, total int) {
			if done < last || total != progressTotal {
				t.Errorf("progress %d/%d after %d", done, total, last)
			}
			last = done
			if strings.Contains(step, "configuring base system") {
				// debootstrap has mounted its proc and still runs: the
				// mount must not show in the host's mount namespace.
				seenMount, _ = mountsUnder(data)
			}
		}}
	info, err := Build(context.Background(), def, opt)
	if err != nil {
		t.Fatalf("Build: %v\nlog:\n%s", err, log.String())
	}
	if last != progressTotal {
		t.Errorf("progress ended at %d, want %d", last, progressTotal)
	}
	checkBuilt(t, data, def, info, 1000000)
	if !strings.Contains(log.String(), "I: Base system installed successfully.") {
		t.Errorf("debootstrap messages missing from Log:\n%s", log.String())
	}
	if mps, _ := mountsUnder(data); len(mps) > 0 || len(seenMount) > 0 {
		t.Errorf("debootstrap's mount leaked to the host: %v during the build, %v after", seenMount, mps)
	}

	// Built once: reused, not rebuilt.
	opt.Progress = nil
	opt.debootstrap = "/bin/false"
	again, err := Build(context.Background(), def, opt)
	if err != nil || !again.Created.Equal(info.Created) {
		t.Errorf("second Build = %+v, %v; want the first one reused", again, err)
	}
	// Another shift or package list: stale.
	other := opt
	other.UIDShift = 2000000
	if _, err := Build(context.Background(), def, other); !errors.Is(err, ErrStale) {
		t.Errorf("Build with another shift = %v, want ErrStale", err)
	}
	more := def
	more.Packages = []string{"bash", "procps"}
	if _, err := Build(context.Background(), more, opt); !errors.Is(err, ErrStale) {
		t.Errorf("Build with other packages = %v, want ErrStale", err)
	}
	// A forced rebuild that fails keeps the old template.
	opt.Force = true
	if _, err := Build(context.Background(), def, opt); err == nil {
		t.Fatalf("forced Build with a failing debootstrap succeeded")
	}
	if got, err := Get(data, "tiny"); err != nil || !got.Created.Equal(info.Created) {
		t.Errorf("after a failed forced rebuild Get = %+v, %v; want the old template", got, err)
	}
	// A forced rebuild replaces it.
	opt.debootstrap = script
	opt.UIDShift = 2000000
	rebuilt, err := Build(context.Background(), def, opt)
	if err != nil {
		t.Fatalf("forced Build: %v", err)
	}
	if !rebuilt.Created.After(info.Created) {
		t.Errorf("forced Build returned Created %v, not after %v", rebuilt.Created, info.Created)
	}
	checkBuilt(t, data, def, rebuilt, 2000000)
	if left := leftovers(t, data, "tiny"); len(left) > 0 {
		t.Errorf("builds left %v", left)
	}
}

// checkBuilt checks a template built from tinyRootfsScript or by debootstrap.
func checkBuilt(t *testing.T, data string, def Definition, info Info, shift uint32) {
	t.Helper()
	want := Info{Name: def.Name, Path: filepath.Join(data, "templates", def.Name, "rootfs"), Suite: def.Suite,
		Packages: def.Packages, Created: info.Created, SizeBytes: info.SizeBytes, UIDShift: shift, Version: FormatVersion}
	if !reflect.DeepEqual(info, want) {
		t.Errorf("Info = %+v, want %+v", info, want)
	}
	if info.SizeBytes <= 0 || time.Since(info.Created) > time.Hour {
		t.Errorf("Info size %d created %v", info.SizeBytes, info.Created)
	}
	if got, err := Get(data, def.Name); err != nil || !reflect.DeepEqual(got, info) {
		t.Errorf("Get = %+v, %v; want %+v", got, err, info)
	}
	var onDisk Info
	if err := json.Unmarshal([]byte(readFile(t, filepath.Join(data, "templates", def.Name, infoFile))), &onDisk); err != nil || onDisk.Version != FormatVersion {
		t.Errorf("template.json: %+v, %v", onDisk, err)
	}
	root := info.Path
	if !strings.Contains(readFile(t, filepath.Join(root, "etc/passwd")), "\nuser:x:1000:1000::/home/user:/bin/bash\n") {
		t.Errorf("no sandbox user in etc/passwd:\n%s", readFile(t, filepath.Join(root, "etc/passwd")))
	}
	if got := readFile(t, filepath.Join(root, "etc/hostname")); got != "sandbox\n" {
		t.Errorf("etc/hostname = %q", got)
	}
	if got := readFile(t, filepath.Join(root, "etc/resolv.conf")); got != "" {
		t.Errorf("etc/resolv.conf = %q, want empty", got)
	}
	owners := map[string][2]uint32{".": {shift, shift}, "etc/passwd": {shift, shift}, "home/user": {shift + 1000, shift + 1000}}
	for p, w := range owners {
		if uid, gid, _ := lstatOwner(t, filepath.Join(root, p)); uid != w[0] || gid != w[1] {
			t.Errorf("%s owner %d:%d, want %d:%d", p, uid, gid, w[0], w[1])
		}
	}
	if _, _, m := lstatOwner(t, filepath.Join(root, "tmp")); m != fs.ModeDir|fs.ModeSticky|0o777 {
		t.Errorf("tmp mode %v", m)
	}
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Error(err)
			return err
		}
		uid, gid, m := lstatOwner(t, p)
		if m&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
			t.Errorf("%s keeps mode %v", p, m)
		}
		if uid < shift || gid < shift || uid > shift+maxMappedID || gid > shift+maxMappedID {
			t.Errorf("%s owner %d:%d not shifted into %d..%d", p, uid, gid, shift, shift+maxMappedID)
		}
		return nil
	})
}

// TestBuildReal runs debootstrap against the network. It runs as root when
// SHEEPFOLD_TEMPLATE_BUILD_TEST is set: to 1 for a minbase template built
// in a temporary dir (about a minute), or to the name of a builtin
// definition. SHEEPFOLD_TEMPLATE_DATA_DIR keeps the result in that data
// dir (e.g. /var/lib/sheepfold) with SHEEPFOLD_TEMPLATE_UID_SHIFT or 1000000.
func TestBuildReal(t *testing.T) {
	which := os.Getenv("SHEEPFOLD_TEMPLATE_BUILD_TEST")
	if which == "" {
		t.Skip("set SHEEPFOLD_TEMPLATE_BUILD_TEST=1 (or a builtin template name) to build from the network")
	}
	requireRoot(t)
	def := Definition{Name: "minbase-test", Suite: "bookworm"}
	if which != "1" {
		var err error
		if def, err = Lookup(which); err != nil {
			t.Fatal(err)
		}
	}
	data := os.Getenv("SHEEPFOLD_TEMPLATE_DATA_DIR")
	if data == "" {
		data = t.TempDir()
	}
	shift := uint32(1000000)
	if s := os.Getenv("SHEEPFOLD_TEMPLATE_UID_SHIFT"); s != "" {
		if _, err := fmt.Sscan(s, &shift); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	var mu sync.Mutex
	lastStep := ""
	opt := BuildOptions{DataDir: data, UIDShift: shift, Force: true, Log: testLog{t},
		Progress: func(step string, done, total int) {
			mu.Lock()
			defer mu.Unlock()
			if step != lastStep {
				t.Logf("progress %4d/%d %s", done, total, step)
				lastStep = step
			}
		}}
	start := time.Now()
	info, err := Build(ctx, def, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built %s in %s: %d MiB", def.Name, time.Since(start).Round(time.Second), info.SizeBytes>>20)
	checkBuilt(t, data, def, info, shift)
	if mps, _ := mountsUnder(data); len(mps) > 0 {
		t.Errorf("mounts left under the data dir: %v", mps)
	}
	if left := leftovers(t, data, def.Name); len(left) > 0 {
		t.Errorf("build left %v", left)
	}
	for _, p := range []string{"var/log/bootstrap.log", "debootstrap"} {
		if _, err := os.Lstat(filepath.Join(info.Path, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s left in the rootfs", p)
		}
	}
	if slices.Contains(def.Packages, "python3-matplotlib") {
		cache, _ := filepath.Glob(filepath.Join(info.Path, "home/user/.config/matplotlib/fontlist-*.json"))
		if len(cache) != 1 {
			t.Fatalf("matplotlib font cache: %v", cache)
		}
		if uid, _, _ := lstatOwner(t, cache[0]); uid != shift+1000 {
			t.Errorf("font cache owner %d, want %d", uid, shift+1000)
		}
		// The interpreter works in the shifted rootfs (root on the host
		// may read everything).
		cmd := exec.Command("/usr/bin/python3", "-c", "import matplotlib.pyplot, pandas, numpy; print(numpy.__version__)")
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: info.Path}
		cmd.Dir = "/"
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/home/user", "MPLCONFIGDIR=/home/user/.config/matplotlib", "MPLBACKEND=Agg"}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("python in the rootfs: %v\n%s", err, out)
		}
	}
}

// testLog sends build output to the test log.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestSetRuntime: a template's runtime is kept in its template.json and
// read back; an unknown runtime is refused and changes nothing.
func TestSetRuntime(t *testing.T) {
	data := t.TempDir()
	dir := filepath.Join(templatesDir(data), "python")
	if err := os.MkdirAll(filepath.Join(dir, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeInfo(dir, Info{Name: "python", Version: FormatVersion}); err != nil {
		t.Fatal(err)
	}
	if err := SetRuntime(data, "python", "gvisor"); err != nil {
		t.Fatal(err)
	}
	if err := SetRuntime(data, "python", "kata"); err == nil {
		t.Fatal("runtime kata was set")
	}
	if info, err := Get(data, "python"); err != nil || info.Runtime != "gvisor" {
		t.Fatalf("Get: %+v %v", info, err)
	}
	if err := SetRuntime(data, "python", ""); err != nil {
		t.Fatal(err)
	}
	if info, err := Get(data, "python"); err != nil || info.Runtime != "" {
		t.Fatalf("Get after reset: %+v %v", info, err)
	}
}
