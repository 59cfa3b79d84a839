package sandbox_test

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/runtime/fake"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// proxyRuntime is the fake runtime as an EgressProxy (a Pod's): it takes
// proxied networks, and records what the engine asks ServeEgress.
type proxyRuntime struct {
	*fake.Runtime
	mu     sync.Mutex
	specs  map[string]*runtime.Network
	served map[string]served
}

type served struct {
	ctx   context.Context
	serve func(net.Conn)
}

func (r *proxyRuntime) Create(ctx context.Context, s runtime.Spec) (*runtime.Instance, error) {
	r.mu.Lock()
	r.specs[s.ID] = s.Network
	r.mu.Unlock()
	s.Network = nil // the fake's agent runs in the host's network
	return r.Runtime.Create(ctx, s)
}

func (r *proxyRuntime) ServeEgress(ctx context.Context, inst *runtime.Instance, serve func(net.Conn), _ *slog.Logger) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.served[inst.ID] = served{ctx, serve}
}

// TestProxiedEgressWiring: over an EgressProxy runtime, a sandbox whose
// policy allows a network gets a proxied network, and the engine hands
// the runtime its gateway: a proxy request served there is decided by
// the sandbox's policy (a host off its allowlist refused with 403), and
// the hand-over ends when the sandbox stops. A sandbox without a network
// is not served at all.
func TestProxiedEgressWiring(t *testing.T) {
	t.Parallel()
	rt := &proxyRuntime{Runtime: &fake.Runtime{AgentBin: testutil.AgentBin(t), Dir: testutil.ShortTempDir(t)},
		specs: map[string]*runtime.Network{}, served: map[string]served{}}
	m := startEngine(t, sandbox.Config{Runtime: rt, Templates: sandbox.TemplatesFunc(func(string) (string, error) { return "/", nil })}, rt.Runtime)
	ctx := context.Background()

	plain, err := m.Create(ctx, sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pol := &policy.Policy{Network: &policy.Network{Mode: policy.NetworkAllowlist, Allow: []string{"allowed.example"}}}
	s, err := m.Create(ctx, sandbox.CreateOptions{Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	rt.mu.Lock()
	got, ok := rt.served[s.ID]
	_, plainServed := rt.served[plain.ID]
	netSpec, plainNet := rt.specs[s.ID], rt.specs[plain.ID]
	rt.mu.Unlock()
	if plainServed || plainNet != nil {
		t.Errorf("a sandbox without a network: served %v, network %+v", plainServed, plainNet)
	}
	if !ok {
		t.Fatal("the engine did not hand the runtime the sandbox's egress")
	}
	if netSpec == nil || !netSpec.Proxy || netSpec.Attach != nil {
		t.Fatalf("the sandbox's network %+v, want a proxied one", netSpec)
	}

	// The sandbox's code asks for a host off its allowlist, over a
	// stream that half-closes as the agent's does.
	code, agentEnd := streamPair(t)
	go got.serve(agentEnd)
	if _, err := code.Write([]byte("CONNECT denied.example:443 HTTP/1.1\r\nHost: denied.example:443\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	code.SetReadDeadline(time.Now().Add(10 * time.Second))
	status, err := bufio.NewReader(code).ReadString('\n')
	if err != nil || !strings.Contains(status, " 403 ") {
		t.Fatalf("the gateway answered %q, %v; want 403", status, err)
	}

	if got.ctx.Err() != nil {
		t.Fatal("the hand-over ended while the sandbox runs")
	}
	if err := m.Kill(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-got.ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the hand-over did not end when the sandbox stopped")
	}
}

// streamPair returns the two ends of a connected unix stream socket.
func streamPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var ends [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "stream")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		ends[i] = c
	}
	return ends[0], ends[1]
}
