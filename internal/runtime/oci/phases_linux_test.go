package oci

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestReadCriuPhases reads the milestones of a CRIU restore log; a log
// that lacks one gives no phases.
func TestReadCriuPhases(t *testing.T) {
	log := `(00.000000) Unable to get $HOME directory, local configuration file will not be used.
(00.000317) Loaded kdat cache from /run/criu.kdat
(00.003766) Reading image tree
(00.010000)      1: mnt-v2: 	Mounting tmpfs @161 (0)
(00.100000) pie: 12: Preadv 0x41f000:4096... (204 iovs)
(00.196845) pie: 12: ` + "`" + `- returned 1458176
(00.200000) pie: 21: Preadv 0x41f000:4096... (197 iovs)
(00.310090) pie: 21: ` + "`" + `- returned 61825024
(00.410392) Restore finished successfully. Tasks resumed.
(00.410400) Writing stats
`
	dir := t.TempDir()
	path := filepath.Join(dir, "restore.log")
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	got := readCriuPhases(path)
	want := criuPhases{start: ms(3.766), tasks: ms(100 - 3.766), memory: ms(310.090 - 100), finish: ms(410.392 - 310.090), ok: true}
	near := func(a, b time.Duration) bool { return (a - b).Abs() < time.Microsecond }
	if !got.ok || !near(got.start, want.start) || !near(got.tasks, want.tasks) || !near(got.memory, want.memory) || !near(got.finish, want.finish) {
		t.Errorf("phases %+v, want %+v", got, want)
	}
	if err := os.WriteFile(path, []byte(log[:len(log)-80]), 0o600); err != nil {
		t.Fatal(err)
	}
	if p := readCriuPhases(path); p.ok {
		t.Errorf("a log without its end gave phases %+v", p)
	}
	if p := readCriuPhases(filepath.Join(dir, "none.log")); p.ok {
		t.Errorf("no log gave phases %+v", p)
	}
}
