package bench

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRestorePhases breaks a server log's restores down by kind and
// phase, and ignores what is not a restore's.
func TestRestorePhases(t *testing.T) {
	log := `time=2026-12-07T06:45:24Z level=INFO msg="restore phases" id=a what=clone runc=346.99ms after=3.06ms runc_before=22ms criu_start=1.46ms criu_tasks=121.48ms criu_memory=136.22ms criu_finish=32.15ms
time=2026-12-07T06:45:24Z level=INFO msg="sandbox cloned" id=a from=s files=20ms restore=360ms
time=2026-12-07T06:45:25Z level=INFO msg="restore phases" id=b what=resume runc=200ms after=3ms
time=2026-12-07T06:45:25Z level=INFO msg="restore phases" id=c what=resume runc=300ms after=900µs
time=2026-12-07T06:45:26Z level=INFO msg="sandbox resumed" sandbox=b took=250ms
`
	path := filepath.Join(t.TempDir(), "serve.log")
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	res := &benchResults{Breakdown: map[string]stat{}}
	restorePhases(path, res)
	want := map[string]stat{
		"restore phases, clone: 1 files":       {N: 1, P50: 20},
		"restore phases, clone: 2 restore":     {N: 1, P50: 360},
		"restore phases, clone: 3 runc":        {N: 1, P50: 346.99},
		"restore phases, clone: 6 criu_tasks":  {N: 1, P50: 121.48},
		"restore phases, resume: 3 runc":       {N: 2, P50: 200},
		"restore phases, resume: 9 after":      {N: 2, P50: 0.9},
		"restore phases, clone: 7 criu_memory": {N: 1, P50: 136.22},
		"restore phases, clone: 8 criu_finish": {N: 1, P50: 32.15},
		"restore phases, clone: 5 criu_start":  {N: 1, P50: 1.46},
		"restore phases, clone: 4 runc_before": {N: 1, P50: 22},
		"restore phases, clone: 9 after":       {N: 1, P50: 3.06},
	}
	if len(res.Breakdown) != len(want) {
		t.Errorf("%d series, want %d: %v", len(res.Breakdown), len(want), res.Breakdown)
	}
	for name, w := range want {
		got, ok := res.Breakdown[name]
		if !ok || got.N != w.N || got.P50 != w.P50 {
			t.Errorf("%s: %+v (%v), want n %d p50 %v", name, got, ok, w.N, w.P50)
		}
	}
}
