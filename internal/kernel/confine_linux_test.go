package kernel

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// waitFile waits up to 10 s for path to exist.
func waitFile(path string) bool {
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return true
		}
	}
	return false
}

// TestPythonPlantedFilesRunUnderTheFilter: code under the no-subprocess
// filter writes what a fresh interpreter runs before anything else (a .pth
// file in the user's site directory; a module named like one the driver
// imports, in the working directory), then ends its interpreter, which the
// next execution restarts. What it planted must not run before the filter
// is back on. Unconfined, the plants run (the .pth at the restart; the
// module in a Python started in that directory).
func TestPythonPlantedFilesRunUnderTheFilter(t *testing.T) {
	t.Parallel()
	plants := []struct{ name, code string }{
		{"a .pth file in the user site", "import os, site\nd = site.getusersitepackages()\nos.makedirs(d, exist_ok=True)\n" +
			"open(os.path.join(d, 'plant.pth'), 'w').write('import os; os.system(\"touch %s\")\\n' % MARK)\nos._exit(0)"},
		{"a module the driver imports, in the working directory", "import os\n" +
			"open('json.py', 'w').write('import os; os.system(\"touch %s\")\\nfrom _json import *\\n' % MARK)\nos._exit(0)"},
	}
	for _, p := range plants {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			home := t.TempDir()
			mark := filepath.Join(t.TempDir(), "ran")
			plant := "MARK = " + fmt.Sprintf("%q", mark) + "\n" + p.code
			if strings.Contains(p.name, ".pth") {
				free := start(t, "python", map[string]string{"HOME": home})
				run(t, free, code(plant)) // the interpreter exits
				run(t, free, code("1"))   // restarted: the .pth runs
				if !waitFile(mark) {
					t.Fatal("unconfined, the planted .pth must run at the restart")
				}
				os.Remove(mark)
				home = t.TempDir()
			} else {
				dir := t.TempDir()
				src := fmt.Sprintf("import os; os.system(\"touch %s\")\nfrom _json import *\n", mark)
				if err := os.WriteFile(filepath.Join(dir, "json.py"), []byte(src), 0o644); err != nil {
					t.Fatal(err)
				}
				cmd := exec.Command("/usr/bin/python3", "-c", "import json")
				cmd.Dir = dir
				if out, err := cmd.CombinedOutput(); err != nil || !waitFile(mark) {
					t.Fatalf("unconfined, a Python started in that directory runs the planted module: %v %s", err, out)
				}
				os.Remove(mark)
			}
			k := start(t, "python", map[string]string{"HOME": home})
			pol := noSubprocess(t)
			if r := run(t, k, withPolicy(plant, pol)); r.err == nil || r.err.Name != "KernelDied" {
				t.Fatalf("the plant ends its interpreter: %v", r)
			}
			r := run(t, k, withPolicy("import json\njson.dumps([1])", pol))
			if _, err := os.Stat(mark); err == nil {
				t.Fatal("what the confined code planted ran outside the filter")
			}
			if main(r) != "'[1]'" {
				t.Fatalf("the restarted interpreter works: %v", r)
			}
			if strings.Contains(p.name, ".pth") && !strings.Contains(r.stderr, "SubprocessDeniedError") {
				t.Fatalf("the .pth runs under the filter, refused: %q", r.stderr)
			}
		})
	}
}

// TestSeccompConfinedCannotReachOtherProcesses: code under the
// no-subprocess filter cannot make another interpreter of the same user
// (an idle context's, not under the filter) run code for it by writing a
// request into that interpreter's control pipe through /proc, nor open its
// memory: the filtered interpreter (Python, Node, R or Java) is in a
// Landlock domain of its own.
// Unconfined, the injected request runs and starts a process.
func TestSeccompConfinedCannotReachOtherProcesses(t *testing.T) {
	t.Parallel()
	if !landlockAvailable() {
		t.Skip("no Landlock on this kernel")
	}
	inject := func(victim *Kernel, mark string, lang string) string {
		req, _ := json.Marshal(map[string]string{"code": fmt.Sprintf("import subprocess\nsubprocess.run(['touch', %q])", mark), "marker": "x"})
		pid := victim.p.cmd.Process.Pid
		if lang == "javascript" {
			return fmt.Sprintf("const fs = require('fs');\nconst fd = fs.openSync('/proc/%d/fd/3', 'w');\nfs.writeSync(fd, %q);\nfs.closeSync(fd); 'sent'", pid, string(req)+"\n")
		}
		switch lang {
		case "r":
			return fmt.Sprintf("con <- file('/proc/%d/fd/3', 'w')\nwriteLines(%q, con)\nclose(con)\n'sent'", pid, string(req))
		case "java":
			return fmt.Sprintf("try (var o = new java.io.FileOutputStream(\"/proc/%d/fd/3\")) { o.write(%q.getBytes()); }\n\"sent\"", pid, string(req)+"\n")
		}
		return fmt.Sprintf("import os\nfd = os.open('/proc/%d/fd/3', os.O_WRONLY)\nos.write(fd, %q.encode())\nos.close(fd)\n'sent'", pid, string(req)+"\n")
	}
	for _, lang := range []string{"python", "javascript", "r", "java"} {
		t.Run(lang, func(t *testing.T) {
			t.Parallel()
			victim := start(t, "python", nil)
			mark := filepath.Join(t.TempDir(), "ran")
			free := startWithHelper(t, lang)
			if r := run(t, free, code(inject(victim, mark, lang))); r.err != nil || !waitFile(mark) {
				t.Fatalf("unconfined, the injected request runs in the other interpreter: %v", r)
			}
			victim = start(t, "python", nil)
			mark = filepath.Join(t.TempDir(), "ran")
			k := startWithHelper(t, lang)
			r := run(t, k, withPolicy(inject(victim, mark, lang), noSubprocess(t)))
			if r.err == nil || !strings.Contains(r.err.Value+r.stderr, "ermission denied") && !strings.Contains(r.err.Value, "EACCES") {
				t.Fatalf("confined, the other interpreter's /proc must be closed: %v", r)
			}
			mem := fmt.Sprintf("import os\nos.open('/proc/%d/mem', os.O_RDWR)", victim.p.cmd.Process.Pid)
			switch lang {
			case "javascript":
				mem = fmt.Sprintf("require('fs').openSync('/proc/%d/mem', 'r+')", victim.p.cmd.Process.Pid)
			case "r":
				mem = fmt.Sprintf("file('/proc/%d/mem', 'r+b')", victim.p.cmd.Process.Pid)
			case "java":
				mem = fmt.Sprintf("new java.io.RandomAccessFile(\"/proc/%d/mem\", \"rw\")", victim.p.cmd.Process.Pid)
			}
			if r := run(t, k, code(mem)); r.err == nil {
				t.Fatalf("confined, another process's memory must stay closed: %v", r)
			}
			if r := run(t, k, code(map[string]string{"python": "open('/proc/self/status').read().count('\\n') > 5",
				"javascript": "require('fs').readFileSync('/proc/self/status', 'utf8').split('\\n').length > 5",
				"r":          "length(readLines('/proc/self/status')) > 5",
				"java":       "java.nio.file.Files.readAllLines(java.nio.file.Path.of(\"/proc/self/status\")).size() > 5"}[lang])); main(r) != "True" && main(r) != "true" && main(r) != "[1] TRUE" {
				t.Fatalf("its own /proc stays open: %v", r)
			}
			if _, err := os.Stat(mark); err == nil {
				t.Fatal("the injected request ran")
			}
		})
	}
}

// landlockAvailable asks the kernel for its Landlock ABI version.
func landlockAvailable() bool {
	v, _, errno := syscallLandlockVersion()
	return errno == 0 && v > 0
}

func syscallLandlockVersion() (uintptr, uintptr, unix.Errno) {
	return unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
}

// TestPythonUserPaths: with the working directory and the user site left
// out until the first request's policy is applied, both are back for the
// user's code where Python puts them: a module in the working directory
// imports, and so does one in the user site (ahead of the system's
// site-packages), whose .pth files run.
func TestPythonUserPaths(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	site := filepath.Join(home, ".local", "lib", "python3."+pythonMinor(t), "site-packages")
	if err := os.MkdirAll(site, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(site, "usersitemod.py"), []byte("X = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(site, "flag.pth"), []byte("import builtins; builtins.PTH_RAN = True\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	k := start(t, "python", map[string]string{"HOME": home})
	if err := os.WriteFile(filepath.Join(k.spec.Cwd, "cwdmod.py"), []byte("Y = 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := run(t, k, withPolicy("import sys, cwdmod, usersitemod\n"+
		"i = sys.path.index("+fmt.Sprintf("%q", site)+")\n"+
		"(sys.path[0], cwdmod.Y + usersitemod.X, PTH_RAN, all(i < j for j, p in enumerate(sys.path) if p.endswith('-packages') and p != sys.path[i]))",
		noSubprocess(t)))
	if main(r) != "('', 3, True, True)" {
		t.Fatalf("%v", r)
	}
}

// pythonMinor is the host Python's minor version.
func pythonMinor(t *testing.T) string {
	out, err := exec.Command("/usr/bin/python3", "-c", "import sys; print(sys.version_info[1])").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}
