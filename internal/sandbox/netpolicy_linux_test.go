package sandbox_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// Cells that reach 203.0.113.30:80 (a test server through the gateway)
// without the Python driver's audit hook: raw system calls through
// ctypes, Node's net, Bash's /dev/tcp. Each prints the response's status
// line, or how the connection failed.
var hookless = map[string]string{
	"python": `import ctypes, struct, errno
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.socket(2, 1, 0)
addr = struct.pack('=H', 2) + struct.pack('!H', 80) + bytes([203, 0, 113, 30]) + bytes(8)
if libc.connect(fd, addr, 16) != 0:
    out = errno.errorcode[ctypes.get_errno()]
else:
    req = b'GET /x HTTP/1.0\r\nHost: x\r\n\r\n'
    libc.send(fd, req, len(req), 0)
    buf = ctypes.create_string_buffer(256)
    n = libc.recv(fd, buf, 256, 0)
    out = buf.raw[:max(n, 0)].split(b'\r\n')[0].decode()
libc.close(fd)
print(out)`,
	"javascript": `const line = await new Promise((ok) => {
  const s = require('net').connect(80, '203.0.113.30', () => s.write('GET /x HTTP/1.0\r\nHost: x\r\n\r\n'));
  let d = '';
  s.on('data', (c) => { d += c; });
  s.on('end', () => ok(d.split('\r\n')[0]));
  s.on('error', (e) => ok(e.code));
  s.setTimeout(10000, () => { s.destroy(); ok('timeout'); });
});
console.log(line);`,
	"bash": `if exec 3<>/dev/tcp/203.0.113.30/80; then printf 'GET /x HTTP/1.0\r\nHost: x\r\n\r\n' >&3; head -1 <&3 | tr -d '\r'; exec 3<&-; else echo refused; fi`,
}

// TestPolicyNetworkWithoutTheHook: network.mode none and allowlist hold
// for code that never passes the Python driver's audit hook (ctypes, Node,
// Bash): the sandbox's namespace has no route (none), the gateway refuses
// what the allowlist does not name. The same cells reach the server from
// a sandbox with mode public.
func TestPolicyNetworkWithoutTheHook(t *testing.T) {
	w := newEgressWorld(t)
	m, log := w.engine(t)
	public := w.sandbox(t, m, sandbox.CreateOptions{Policy: &policy.Policy{Network: &policy.Network{Mode: policy.NetworkPublic}}})
	none := w.sandbox(t, m, sandbox.CreateOptions{Policy: &policy.Policy{Network: &policy.Network{Mode: policy.NetworkNone}}})
	allow := w.sandbox(t, m, sandbox.CreateOptions{Policy: allowlist("api.test")})
	refused := map[string]map[string]string{
		"none":  {"python": "ENETUNREACH", "javascript": "ENETUNREACH", "bash": "refused"},
		"allow": {"python": "ECONNREFUSED", "javascript": "ECONNREFUSED", "bash": "refused"},
	}
	for _, lang := range []string{"python", "javascript", "bash"} {
		t.Run(lang, func(t *testing.T) {
			out := func(s *sandbox.Sandbox) string {
				ex, _ := inContext(t, s, lang, hookless[lang])
				if ex.Error != nil {
					t.Fatalf("%s: %+v", lang, ex.Error)
				}
				return strings.TrimSpace(ex.Stdout)
			}
			if got := out(public); got != "HTTP/1.0 200 OK" {
				t.Fatalf("mode public reaches the server: %q", got)
			}
			if got := out(none); got != refused["none"][lang] {
				t.Fatalf("mode none: %q, want %q", got, refused["none"][lang])
			}
			if got := out(allow); got != refused["allow"][lang] {
				t.Fatalf("mode allowlist: %q, want %q", got, refused["allow"][lang])
			}
		})
	}
	evs := log.find(allow.ID, events.SecurityViolation, "target", "203.0.113.30:80")
	if len(evs) == 0 || fmt.Sprint(evs[0].Details["kind"]) != events.KindNetworkDenied {
		t.Fatalf("the gateway reports the refusals: %+v", evs)
	}
}
