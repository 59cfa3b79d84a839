package sandbox

import (
	"os"
	"path/filepath"
	"testing"
)

// TestProjectPath: with a project root, an absolute path whose first
// component is not in the root filesystem (nor a volume's mount) is the
// project's; the rest, relative paths included, are left as they are.
func TestProjectPath(t *testing.T) {
	rootfs := t.TempDir()
	for _, d := range []string{"home", "tmp", "etc", "usr"} {
		if err := os.Mkdir(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s := &Sandbox{project: newProject(TemplateStart{Root: "/home/user/app"}, rootfs, []string{"/data/sets"})}
	for in, want := range map[string]string{
		"/src/App.tsx":         "/home/user/app/src/App.tsx",
		"/index.html":          "/home/user/app/index.html",
		"/home/user/x.py":      "/home/user/x.py",
		"/tmp/a":               "/tmp/a",
		"/etc/hostname":        "/etc/hostname",
		"/data/sets/a.csv":     "/data/sets/a.csv",
		"/":                    "/",
		"src/App.tsx":          "src/App.tsx",
		"/../etc/passwd":       "/../etc/passwd",
		"//src//App.tsx":       "/home/user/app/src/App.tsx",
		"/home/user/app/x.tsx": "/home/user/app/x.tsx",
	} {
		if got := s.projectPath(in); got != want {
			t.Errorf("projectPath(%q) = %q, want %q", in, got, want)
		}
	}
	// Control: without a root, nothing is mapped.
	if got := (&Sandbox{}).projectPath("/src/App.tsx"); got != "/src/App.tsx" {
		t.Errorf("no project: %q", got)
	}
	// A rootfs that cannot be read (a cluster's) maps nothing.
	if p := newProject(TemplateStart{Root: "/home/user/app"}, filepath.Join(rootfs, "missing"), nil); p != nil {
		t.Errorf("unreadable rootfs: %+v", p)
	}
}
