package psi

import (
	"os"
	"path/filepath"
	"testing"
)

func TestParse(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, text string
		some, full float64
	}{
		{"memory", "some avg10=12.50 avg60=3.10 avg300=0.66 total=123456\nfull avg10=4.25 avg60=1.00 avg300=0.20 total=5678\n", 12.5, 4.25},
		{"cpu without full", "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", 0, 0},
		{"no final newline", "some avg10=1.50 avg60=0.30 avg300=0.06 total=1\nfull avg10=0.75 avg60=0 avg300=0 total=1", 1.5, 0.75},
		{"tabs and spaces", "  some\tavg10=2.00  avg60=0\n", 2, 0},
		{"avg10 not second", "some total=5 avg10=3.00\n", 3, 0},
		{"the first avg10", "some avg10=1.00 avg10=9.00\n", 1, 0},
		{"bad number", "some avg10=x avg60=1\nfull avg10=0.50\n", 0, 0.5},
		{"unknown kind", "most avg10=7.00\n", 0, 0},
		{"empty", "", 0, 0},
		{"garbage", "some\n\nfull=1\n", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			some, full := Parse(tc.text)
			if some != tc.some || full != tc.full {
				t.Errorf("Parse(%q) = %v %v, want %v %v", tc.text, some, full, tc.some, tc.full)
			}
		})
	}
}

func TestReadCgroup(t *testing.T) {
	t.Parallel()
	if p := ReadCgroup(t.TempDir()); p != nil {
		t.Errorf("no PSI files, yet %+v", p)
	}
	dir := t.TempDir()
	for name, text := range map[string]string{
		"cpu.pressure":    "some avg10=1.50 avg60=0 avg300=0 total=1\nfull avg10=8.00 avg60=0 avg300=0 total=1\n",
		"memory.pressure": "some avg10=4.25 avg60=0 avg300=0 total=1\nfull avg10=2.00 avg60=0 avg300=0 total=1\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// io.pressure is missing: its figures read as zero; cpu's full is
	// not kept.
	want := Pressure{CPUSome: 1.5, MemorySome: 4.25, MemoryFull: 2}
	if p := ReadCgroup(dir); p == nil || *p != want {
		t.Errorf("ReadCgroup = %+v, want %+v", p, want)
	}
}

// PSI files come from the kernel, but the parser must not fail on
// anything (a future format, a fake tree).
func FuzzParse(f *testing.F) {
	f.Add("some avg10=1.50 avg60=0.30 avg300=0.06 total=123456\nfull avg10=x\n")
	f.Add("")
	f.Fuzz(func(t *testing.T, text string) {
		Parse(text)
	})
}
