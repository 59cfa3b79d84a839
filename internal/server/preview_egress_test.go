package server_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/runtime/fake"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
)

// proxiedRuntime is the fake runtime as one whose sandboxes reach the
// network through their agent's egress listener (a Pod's), on
// runtime.ProxyPort of their loopback: a runtime.EgressProxy. Its
// ServeEgress fetches nothing: this test's sandboxes make no connections
// out.
type proxiedRuntime struct{ *fake.Runtime }

func (proxiedRuntime) ServeEgress(context.Context, *runtime.Instance, func(net.Conn), *slog.Logger) {}

var _ runtime.EgressProxy = proxiedRuntime{}

// TestPreviewRefusesEgressPort: where the runtime proxies egress, the
// egress proxy's port of a sandbox is never a preview, public or not,
// in every form (path, host, E2B's headers with CONNECT, which would
// tunnel): the server refuses it without asking the agent, so nothing
// there sees a connection. Control: the same listener on the same port
// is a preview under a runtime that does not proxy egress, and under
// the proxying one another port still is.
func TestPreviewRefusesEgressPort(t *testing.T) {
	// The fake runtime's "inside" is the host's loopback: the listener
	// in the egress proxy's place.
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(runtime.ProxyPort)))
	if errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("port %d of the loopback is taken: this test needs it (%v)", runtime.ProxyPort, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	var reached atomic.Int32
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		w.Write([]byte("the egress proxy answered"))
	})}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	port := strconv.Itoa(runtime.ProxyPort)

	// Control: a runtime that does not proxy egress previews the port.
	plain := newEnv(t, server.Config{PreviewDomain: "preview.localhost"})
	id := plain.create(plain.keyA, nil)
	tok := plain.ports(plain.keyA, id, "").Token
	if r := plain.get("GET", "", "/v1/sandboxes/"+id+"/proxy/"+port+"/", "Sheepfold-Preview-Token", tok); r.status != http.StatusOK || reached.Load() != 1 {
		t.Fatalf("control: port %s under a runtime without an egress proxy: %d %s (reached %d)", port, r.status, r.body, reached.Load())
	}

	e := newEnv(t, server.Config{PreviewDomain: "preview.localhost"}, func(c *sandbox.Config) {
		c.Runtime = proxiedRuntime{c.Runtime.(*fake.Runtime)}
	})
	id = e.create(e.keyA, nil)
	tok = e.ports(e.keyA, id, "").Token
	want(t, e.do("PUT", "/v1/sandboxes/"+id+"/ports/"+port, e.keyA, map[string]any{"public": true}), http.StatusOK, "")
	before := reached.Load()
	for name, req := range map[string][]string{
		"path, token":        {"GET", "", "/v1/sandboxes/" + id + "/proxy/" + port + "/", "Sheepfold-Preview-Token", tok},
		"path, public":       {"GET", "", "/v1/sandboxes/" + id + "/proxy/" + port + "/x"},
		"host, public":       {"GET", port + "-" + id + ".preview.localhost", "/"},
		"e2b header, public": {"GET", "", "/", "E2b-Sandbox-Id", id, "E2b-Sandbox-Port", port},
		"e2b CONNECT":        {"CONNECT", "", "/", "E2b-Sandbox-Id", id, "E2b-Sandbox-Port", port},
	} {
		r := e.get(req[0], req[1], req[2], req[3:]...)
		if r.status != http.StatusForbidden || !strings.Contains(string(r.body), "egress proxy") {
			t.Errorf("%s: %d %s", name, r.status, r.body)
		}
	}
	if n := reached.Load() - before; n != 0 {
		t.Errorf("the listener on the egress proxy's port saw %d requests through previews", n)
	}
	// Another port of the same sandbox is a preview as ever.
	app := startApp(t)
	if r := e.get("GET", "", "/v1/sandboxes/"+id+"/proxy/"+strconv.Itoa(app.port)+"/", "Sheepfold-Preview-Token", tok); r.status != http.StatusOK {
		t.Fatalf("another port under the proxying runtime: %d %s", r.status, r.body)
	}
}
