package sandbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// loopbackPair opens, in the sandbox's Python kernel, TCP connections
// between a client and a server of its own over 127.0.0.1 and ::1, and
// leaves bytes sent and not yet read in each (in flight at the pause).
const loopbackPair = `
import socket
pairs = []
for fam, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
    srv = socket.socket(fam, socket.SOCK_STREAM)
    srv.bind((host, 0))
    srv.listen()
    cli = socket.create_connection(srv.getsockname()[:2], timeout=5)
    peer, _ = srv.accept()
    peer.settimeout(5)
    cli.sendall(b"hello ")
    assert peer.recv(6) == b"hello "
    cli.sendall(b"unread")
    pairs.append((srv, cli, peer))
"ready"`

// loopbackAfter uses the connections loopbackPair opened: the bytes in
// flight are read, and both ends send and receive again.
const loopbackAfter = `
out = []
for srv, cli, peer in pairs:
    try:
        got = peer.recv(6)
        cli.sendall(b"again")
        got += b"|" + peer.recv(5)
        peer.sendall(b"back")
        got += b"|" + cli.recv(4)
        out.append(got.decode())
    except OSError as e:
        out.append(type(e).__name__)
" ".join(out)`

const loopbackWant = "unread|again|back unread|again|back"

// outward opens, in the kernel, a connection through the sandbox's
// gateway to api.test, and outwardAfter says what became of it.
const (
	outward = `
gw = socket.create_connection(("api.test", 80), timeout=10)
gw.sendall(b"GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")
assert gw.recv(1000).startswith(b"HTTP/1.1 200")`
	outwardAfter = `
try:
    gw.sendall(b"GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")
    r = "answered" if gw.recv(1000) else "ended"
except OSError as e:
    r = type(e).__name__
r`
)

// TestPauseKeepsLoopbackTCP: TCP connections a sandbox's code holds
// between a client and a server of its own, over its loopback, survive a
// pause to disk and its resume (CRIU's TCP repair in the sandbox's own
// network namespace), with the bytes that were in flight: for a sandbox
// without a network and one with an allowlist, which holds a connection
// through its gateway too: that one is cut by the pause (its socket
// comes back unconnected, TestNetworkPauseResume), the loopback's are
// not.
func TestPauseKeepsLoopbackTCP(t *testing.T) {
	testutil.SkipUnderGVisor(t, "no checkpoint under gVisor: pause is refused (TestGVisorSandbox)")
	ctx := context.Background()
	t.Run("no network", func(t *testing.T) {
		m, _, _ := pauseEngine(t)
		loopbackSurvives(ctx, t, m, sandbox.CreateOptions{Timeout: 10 * time.Minute}, false)
	})
	t.Run("network", func(t *testing.T) {
		w := newEgressWorld(t)
		m := netPauseEngine(t, w)
		loopbackSurvives(ctx, t, m, sandbox.CreateOptions{Policy: allowlist("api.test"), Timeout: 10 * time.Minute}, true)
	})
}

func loopbackSurvives(ctx context.Context, t *testing.T, m *sandbox.Manager, opts sandbox.CreateOptions, out bool) {
	t.Helper()
	s := newSandbox(t, m, opts)
	if got := mainText(run(t, s, "python", loopbackPair)); got != "'ready'" {
		t.Fatalf("opening the connections: %q", got)
	}
	if out {
		if ex := run(t, s, "python", outward); ex.Error != nil {
			t.Fatalf("the connection through the gateway: %+v", ex.Error)
		}
	}
	for round := 1; round <= 2; round++ {
		if err := s.Pause(ctx); err != nil {
			t.Fatalf("round %d: pause: %v", round, err)
		}
		if err := s.Resume(ctx); err != nil {
			t.Fatalf("round %d: resume: %v", round, err)
		}
		if got := mainText(run(t, s, "python", loopbackAfter)); got != "'"+loopbackWant+"'" {
			t.Fatalf("round %d: the loopback connections after the resume: %s, want %s", round, got, loopbackWant)
		}
		if out && round == 1 {
			ex := run(t, s, "python", outwardAfter)
			if got := mainText(ex); got != "'BrokenPipeError'" && got != "'ended'" {
				t.Errorf("the connection through the gateway after the resume: %s (%+v), want it cut", got, ex.Error)
			}
		}
		run(t, s, "python", `for srv, cli, peer in pairs: cli.sendall(b"unread")`)
	}
}

// maskedProbe prints, for each directory runc masks that the sandbox
// has, how many entries it shows, whether its mount is read-only and
// what a write into it gets; and, as the control that the probe can
// see a directory's entries and write where it may, the same of
// /proc/bus (read-only, not masked) and /tmp.
const maskedProbe = `
import errno, os
ro = {l.split()[4]: "ro" in l.split()[5].split(",") for l in open("/proc/self/mountinfo")}
def probe(d):
    try:
        open(os.path.join(d, "x"), "w").close()
        w = "written"
        os.unlink(os.path.join(d, "x"))
    except OSError as e:
        w = errno.errorcode[e.errno]
    return "%s:%d:%s:%s" % (d, len(os.listdir(d)), ro.get(d), w)
masked = ["/proc/acpi", "/proc/asound", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap", "/sys/kernel/debug"]
print(" ".join(probe(d) for d in masked + ["/proc/bus", "/tmp"] if os.path.isdir(d)))
`

// TestPauseKeepsMaskedPaths: the directories runc masks (an empty
// read-only tmpfs at create, a bind of the runtime's empty read-only
// directory after a restore: internal/runtime/oci masked_linux.go) stay
// empty and unwritable across pauses, as they were before the first;
// the control, /proc/bus and /tmp, shows entries and takes a write.
func TestPauseKeepsMaskedPaths(t *testing.T) {
	ctx := context.Background()
	m, _, _ := pauseEngine(t)
	s := newSandbox(t, m, sandbox.CreateOptions{Timeout: 10 * time.Minute})
	before := py(t, s, maskedProbe)
	f := strings.Fields(before)
	if len(f) < 3 || !strings.HasPrefix(f[0], "/proc/acpi:0:True:") || !strings.HasPrefix(f[len(f)-1], "/tmp:") || !strings.HasSuffix(f[len(f)-1], ":written") ||
		strings.HasPrefix(f[len(f)-2], "/proc/bus:0:") {
		t.Fatalf("before the pause the probe sees %q: want /proc/acpi masked, and the control (/proc/bus with entries, /tmp written)", before)
	}
	for _, d := range f[:len(f)-2] {
		if !strings.Contains(d, ":0:True:") || strings.HasSuffix(d, ":written") {
			t.Fatalf("before the pause a masked directory: %s", d)
		}
	}
	for round := 1; round <= 2; round++ {
		if err := s.Pause(ctx); err != nil {
			t.Fatalf("round %d: pause: %v", round, err)
		}
		if err := s.Resume(ctx); err != nil {
			t.Fatalf("round %d: resume: %v", round, err)
		}
		if got := py(t, s, maskedProbe); got != before {
			t.Fatalf("round %d: after the resume %q, before %q", round, got, before)
		}
	}
}
