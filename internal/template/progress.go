package template

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
)

// tailLines is how many lines of output a BuildError keeps.
const tailLines = 50

// maxLine bounds one kept line; longer lines are cut.
const maxLine = 1024

// buildLog is where the commands of a build write their output: it passes
// everything on to the caller's Log and keeps the last tailLines lines for a
// BuildError. Safe for concurrent use.
type buildLog struct {
	// mu guards everything below.
	mu      sync.Mutex
	out     io.Writer // nil: discard
	ring    [tailLines]string
	n       int // lines written so far; ring[n%tailLines] is the next slot
	partial []byte
}

func newBuildLog(out io.Writer) *buildLog { return &buildLog{out: out} }

func (l *buildLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(p)
	if l.out != nil {
		l.out.Write(p) // the caller's log failing must not fail the build
	}
	for len(p) > 0 {
		i := strings.IndexByte(string(p), '\n')
		chunk := p
		if i >= 0 {
			chunk = p[:i]
		}
		if room := maxLine - len(l.partial); room > 0 {
			l.partial = append(l.partial, chunk[:min(len(chunk), room)]...)
		}
		if i < 0 {
			break
		}
		l.push(string(l.partial))
		l.partial = l.partial[:0]
		p = p[i+1:]
	}
	return n, nil
}

// Printf writes a line of the build's own.
func (l *buildLog) Printf(format string, args ...any) {
	fmt.Fprintf(l, "sheepfold: "+format+"\n", args...)
}

func (l *buildLog) push(line string) {
	l.ring[l.n%tailLines] = strings.TrimRight(line, "\r")
	l.n++
}

// Tail returns the last lines written, oldest first, including an
// unfinished last line.
func (l *buildLog) Tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var lines []string
	for i := max(0, l.n-tailLines); i < l.n; i++ {
		lines = append(lines, l.ring[i%tailLines])
	}
	if len(l.partial) > 0 {
		lines = append(lines, string(l.partial))
	}
	return strings.Join(lines, "\n")
}

// progressTotal is the scale of BuildOptions.Progress.
const progressTotal = 1000

// Where each step of a build sits on the progress scale (units done when
// it starts). Debootstrap's own phases are placed by debootstrapPhases.
const (
	progressDebootstrap = 0
	progressConfigure   = 985
	progressPython      = 986
	progressStrip       = 992
	progressShift       = 994
	progressFinish      = 998
)

// debootstrapPhases places debootstrap's progress phases (the names it
// reports with --debian-installer) on the build's scale, from..to, in
// proportion to the time each took in a build of the python template
// (376 s of debootstrap, 206 s of them downloading).
var debootstrapPhases = map[string]struct {
	from, to int
	label    string
}{
	"DOWNREL":      {0, 2, "downloading release file"},
	"DOWNRELSIG":   {2, 4, "downloading release file signature"},
	"DOWNPKGS":     {4, 68, "downloading packages files"},
	"DOWNMAINPKGS": {4, 68, "downloading packages file"},
	"SIZEDEBS":     {68, 71, "finding package sizes"},
	"DOWNDEBS":     {71, 610, "downloading packages"},
	"EXTRACTPKGS":  {610, 652, "extracting packages"},
	"INSTCORE":     {652, 653, "installing core packages"},
	"UNPACKREQ":    {653, 686, "unpacking required packages"},
	"CONFREQ":      {686, 725, "configuring required packages"},
	"UNPACKBASE":   {725, 860, "unpacking base system"},
	"CONFBASE":     {860, 985, "configuring base system"},
}

// progress forwards a build's progress to BuildOptions.Progress, never
// going backwards.
type progress struct {
	fn   func(step string, done, total int)
	done int
}

func (p *progress) report(step string, done int) {
	if p.fn == nil {
		return
	}
	done = min(max(done, p.done), progressTotal)
	p.done = done
	p.fn(step, done, progressTotal)
}

// diReader reads debootstrap's --debian-installer messages (its file
// descriptor 3): "P: now end [PHASE]" progress lines, and messages made of
// a "X: NAME" line, "XA: arg" lines and an "XF: printf format" line, X being
// P, I, W or E. It reports progress and writes the I, W and E messages,
// formatted as debootstrap would print them, to log.
//
// While downloading packages, debootstrap's byte counts restart with every
// package; the count of packages validated, out of the number SIZEDEBS
// ended with, stands in for them.
func diReader(r io.Reader, prog *progress, log io.Writer) {
	var (
		phase          string
		debs, verified int
		args           []string
	)
	report := func(now, end int) {
		ph, ok := debootstrapPhases[phase]
		if !ok || end <= 0 {
			return
		}
		prog.report("debootstrap: "+ph.label, ph.from+(ph.to-ph.from)*min(max(now, 0), end)/end)
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		kind, rest, ok := strings.Cut(sc.Text(), ": ")
		if !ok {
			continue
		}
		switch kind {
		case "P":
			f := strings.Fields(rest)
			if len(f) < 2 {
				continue
			}
			now, err1 := strconv.Atoi(f[0])
			end, err2 := strconv.Atoi(f[1])
			if err1 != nil || err2 != nil {
				continue
			}
			if len(f) > 2 {
				phase = f[2]
			}
			switch phase {
			case "SIZEDEBS":
				debs = end
			case "DOWNDEBS":
				now, end = verified, max(debs, 1)
			}
			report(now, end)
			args = nil
		case "I":
			if rest == "VALIDATING" && phase == "DOWNDEBS" {
				verified++
				report(verified, max(debs, 1))
			}
			args = nil
		case "W", "E":
			args = nil
		case "PA", "IA", "WA", "EA":
			args = append(args, rest)
		case "IF", "WF", "EF":
			fmt.Fprintf(log, "%s: %s\n", kind[:1], diFormat(rest, args))
			args = nil
		case "PF":
			args = nil
		}
	}
}

// diFormat expands the %s verbs (and %%) of debootstrap's printf formats.
func diFormat(format string, args []string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 == len(format) {
			b.WriteByte(c)
			continue
		}
		i++
		switch format[i] {
		case '%':
			b.WriteByte('%')
		case 's', 'd':
			if len(args) > 0 {
				b.WriteString(args[0])
				args = args[1:]
				break
			}
			fallthrough // keep a verb without an argument as it is
		default:
			b.WriteByte('%')
			b.WriteByte(format[i])
		}
	}
	return b.String()
}
