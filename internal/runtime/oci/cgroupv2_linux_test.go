package oci

import (
	"testing"

	"github.com/sheepfold/sheepfold/internal/runtime"
)

// TestMemoryHighOnlyOnV2: memory.high below memory.max on cgroup v2 (a
// sandbox slows before it is killed); nothing runc would refuse on v1.
func TestMemoryHighOnlyOnV2(t *testing.T) {
	l := runtime.Limits{MemoryBytes: 512 << 20}
	if r := resources(l, false); r.Unified != nil {
		t.Errorf("v1 resources carry unified settings %v: runc refuses them on v1", r.Unified)
	}
	r := resources(l, true)
	if got, want := r.Unified["memory.high"], "469762048"; got != want { // 448 MiB
		t.Errorf("memory.high %q, want %s", got, want)
	}
	if *r.Memory.Swap != *r.Memory.Limit {
		t.Errorf("memory+swap %d, limit %d: swap would be allowed", *r.Memory.Swap, *r.Memory.Limit)
	}
	if r := resources(runtime.Limits{}, true); r.Unified != nil {
		t.Errorf("no memory limit, yet memory.high %v", r.Unified)
	}
	for limit, want := range map[int64]int64{
		64 << 20: 48 << 20, // the 16 MiB minimum margin
		20 << 20: 10 << 20, // never under half
		8 << 30:  7 << 30,  // an eighth
	} {
		if got := memoryHigh(limit); got != want {
			t.Errorf("memoryHigh(%d MiB) = %d MiB, want %d MiB", limit>>20, got>>20, want>>20)
		}
	}
}

func TestParsePressure(t *testing.T) {
	some, full := parsePressure("some avg10=12.50 avg60=3.10 avg300=0.66 total=123456\nfull avg10=4.25 avg60=1.00 avg300=0.20 total=5678\n")
	if some != 12.5 || full != 4.25 {
		t.Errorf("parsed some %v full %v, want 12.5 4.25", some, full)
	}
	some, full = parsePressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
	if some != 0 || full != 0 {
		t.Errorf("cpu.pressure without full: %v %v", some, full)
	}
	if p := readPressure(t.TempDir()); p != nil {
		t.Errorf("no PSI files, yet %+v", p)
	}
}
