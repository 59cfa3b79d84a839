package egress

import (
	"log/slog"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// logLines is what log holds, a line each.
func logLines(log *testutil.Buffer) []string {
	return strings.Split(strings.TrimSpace(log.String()), "\n")
}

// TestGatewayLogCapped: a sandbox refused 5,000 times in a burst (a loop
// of connects to addresses its policy refuses) writes at most a minute's
// cap of lines to the server's log, and the count of the rest, whose sum
// is every refusal: the host's disk is not the sandbox's to fill.
func TestGatewayLogCapped(t *testing.T) {
	var out testutil.Buffer
	pol, err := policy.CompileEgress(&policy.Network{Mode: "public"})
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(Options{Events: events.Discard, Logger: slog.New(slog.NewTextHandler(&out, nil)), Test: &TestNet{}}, "sb1", pol, 0)
	if err != nil {
		t.Fatal(err)
	}
	const refusals = 5000
	for i := range refusals {
		dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), 80)
		d, _ := g.checkConn(g.pol.Load(), dst)
		if d.ok {
			t.Fatalf("%s allowed", dst)
		}
		g.report(d, "tcp", dst.String())
	}
	g.Close()
	lines := logLines(&out)
	if len(lines) > LogLinesPerMinute+2 {
		t.Fatalf("%d refusals wrote %d log lines; the cap is %d a minute", refusals, len(lines), LogLinesPerMinute)
	}
	denied, suppressed := 0, 0
	count := regexp.MustCompile(`suppressed=(\d+)`)
	for _, l := range lines {
		if strings.Contains(l, `msg="egress denied"`) {
			denied++
		}
		if m := count.FindStringSubmatch(l); m != nil {
			n, _ := strconv.Atoi(m[1])
			suppressed += n
		}
	}
	if denied+suppressed != refusals || !strings.Contains(lines[len(lines)-1], "egress log lines suppressed") {
		t.Fatalf("%d lines written + %d counted, want %d; last line %q", denied, suppressed, refusals, lines[len(lines)-1])
	}
	if !strings.Contains(lines[0], "sandbox=sb1") || !strings.Contains(lines[len(lines)-1], "sandbox=sb1") {
		t.Fatalf("lines lost the sandbox: %q, %q", lines[0], lines[len(lines)-1])
	}
}

// TestLogCap: the cap refills with time, the next line written carries
// the count of those refused, and warnings always pass.
func TestLogCap(t *testing.T) {
	var out testutil.Buffer
	now := time.Unix(1000, 0)
	h := newLogCap(slog.NewTextHandler(&out, nil), 60, func() time.Time { return now })
	log := slog.New(h).With("sandbox", "sb")
	for i := range 70 {
		log.Info("line", "i", i)
	}
	log.Warn("a warning")
	now = now.Add(time.Second) // one line's worth
	log.Info("after a second")
	log.Info("refused again")
	lines := logLines(&out)
	want := []string{`msg=line sandbox=sb i=0`, `msg=line sandbox=sb i=59`, `msg="a warning"`, `msg="after a second" sandbox=sb suppressed=10`}
	if len(lines) != 62 {
		t.Fatalf("%d lines:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for i, l := range []string{lines[0], lines[59], lines[60], lines[61]} {
		if !strings.Contains(l, want[i]) {
			t.Errorf("line %d: %q, want %q", i, l, want[i])
		}
	}
	h.flush()
	if l := logLines(&out); !strings.Contains(l[len(l)-1], "suppressed=1") {
		t.Errorf("flush: %q", l[len(l)-1])
	}
	h.flush() // nothing more to say
	if n := len(logLines(&out)); n != 63 {
		t.Errorf("a second flush wrote: %d lines", n)
	}
}
