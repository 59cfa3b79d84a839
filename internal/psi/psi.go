// Package psi reads a cgroup v2's pressure stall information (PSI): the
// avg10 figures of its cpu.pressure, memory.pressure and io.pressure
// files, for internal/cgroup's reader (the agent's of its own cgroup, the
// OCI runtime's of a sandbox's cgroup on the host).
//
// Imports: the standard library only (the agent is a static binary of the
// standard library and x/sys).
package psi

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Pressure is the avg10 figure (percent of the last 10 s stalled) of each
// PSI file's "some" and "full" lines (cpu.pressure's "full" is not
// kept).
type Pressure struct {
	CPUSome    float64
	MemorySome float64
	MemoryFull float64
	IOSome     float64
	IOFull     float64
}

// ReadCgroup reads the PSI files of the cgroup v2 directory dir; nil when
// it has none (a kernel built without CONFIG_PSI, or booted with psi=0).
// A file that cannot be read, or a line that does not parse, reads as
// zero.
func ReadCgroup(dir string) *Pressure {
	var p Pressure
	found := false
	for _, f := range []struct {
		file       string
		some, full *float64
	}{
		{"cpu.pressure", &p.CPUSome, nil},
		{"memory.pressure", &p.MemorySome, &p.MemoryFull},
		{"io.pressure", &p.IOSome, &p.IOFull},
	} {
		b, err := os.ReadFile(filepath.Join(dir, f.file))
		if err != nil {
			continue
		}
		found = true
		some, full := Parse(string(b))
		*f.some = some
		if f.full != nil {
			*f.full = full
		}
	}
	if !found {
		return nil
	}
	return &p
}

// Parse reads the avg10 figures of a PSI file's "some" and "full" lines
// ("some avg10=1.50 avg60=0.30 avg300=0.06 total=123456"): the first
// avg10= field of each line that has one that parses; a line missing
// leaves its figure zero.
func Parse(text string) (some, full float64) {
	for line := range strings.Lines(text) {
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		for _, field := range fields[1:] {
			v, ok := strings.CutPrefix(field, "avg10=")
			if !ok {
				continue
			}
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				break
			}
			switch fields[0] {
			case "some":
				some = f
			case "full":
				full = f
			}
			break
		}
	}
	return some, full
}
