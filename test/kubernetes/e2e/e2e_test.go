//go:build kubernetes_e2e

// Package e2e runs two replicas of `sheepfold serve --backend kubernetes`
// against the real cluster of test/kubernetes (test.sh starts it and runs
// this with -tags kubernetes_e2e), with their records in one real
// PostgreSQL, behind a balancer: sandboxes become Pods spread over both
// nodes, run the Black-Friday analysis, survive a replica's death
// mid-execution, pass the official E2B SDKs' suite, and leave nothing in
// the cluster once killed.
//
// It never skips: run without its cluster, it fails.
//
// # The cluster
//
//   - test/kubernetes (`make test-kubernetes`, third in .ci/run): a real
//     two-node Kubernetes cluster on this one host, and the Kubernetes backend
//     tested against it (sheepfold.sh: the template exported and imported,
//     the seccomp profile on both nodes, e2e/ with `-tags kubernetes_e2e`:
//     serve over pgtest's PostgreSQL, four sandboxes as Pods spread over both
//     nodes, the Black-Friday analysis with its chart, code as uid 1000 with
//     no capabilities in a user-namespaced Pod, kill and shutdown leave no Pod,
//     Secret or NetworkPolicy, hostile_test.go's attacks of a tenant's root on
//     its Pod; then deploy/kubernetes dry-run on the server; the NRI plugin
//     runs on the host at each node's containerd, whose NRI is on, and the
//     kubelets have podPidsLimit 8192). cluster.sh builds Kubernetes, etcd and containerd
//     at pinned releases from the Go module proxy (wrapper modules in
//     build/, cached under `<data>/kubernetes/<versions>/bin` with a stamp),
//     then `up` starts etcd, the control plane on loopback and two kubelets,
//     each with its own containerd, cgroup root and CNI bridge (Debian's
//     plugins; pods on 10.88.1.0/24 and 10.88.2.0/24, routed by the host);
//     the pause and test images are static Go programs (pause/, echo/) written
//     as OCI archives by ociimage/ and imported with ctr, as `cluster.sh
//     import-image` does for any archive; pki/ writes the certificates in one
//     process. `down` undoes all of it (processes,
//     mounts, links, iptables/nft, sysctls, cgroups, default paths the daemons
//     made). test.sh runs up, smoke.sh (a pod per node, host-to-pod and
//     pod-to-pod HTTP, deletion leaves nothing), down, and fails unless the
//     host state after down equals the state before up;
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sheepfold/sheepfold/internal/testutil"
	"github.com/sheepfold/sheepfold/internal/testutil/nodejs"
	"github.com/sheepfold/sheepfold/internal/testutil/pgtest"
)

func TestMain(m *testing.M) { testutil.Main(m, pgtest.StopShared) }

func env(t *testing.T, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: run test/kubernetes/test.sh (make test-kubernetes)", name)
	}
	return v
}

// server is a running sheepfold serve.
type server struct {
	url, key string
	cmd      *exec.Cmd
	exited   chan error
}

func (s *server) do(t *testing.T, method, path string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	return s.send(t, method, path, rd, "application/json")
}

// send sends body (nil: none) of contentType and returns the status and
// the answer's body.
func (s *server) send(t *testing.T, method, path string, body io.Reader, contentType string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, s.url+path, body)
	req.Header.Set("Authorization", "Bearer "+s.key)
	req.Header.Set("Content-Type", contentType)
	res, err := (&http.Client{Timeout: 3 * time.Minute}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// executionRunning reports whether the sandbox's execution of code is
// running, as its record says.
func executionRunning(t *testing.T, s *server, id, code string) bool {
	t.Helper()
	status, b := s.do(t, "GET", "/v1/sandboxes/"+id+"/executions", nil)
	if status != http.StatusOK {
		t.Fatalf("list executions: %d %s", status, b)
	}
	var page struct {
		Executions []struct{ Code, Status string } `json:"executions"`
	}
	if err := json.Unmarshal(b, &page); err != nil {
		t.Fatalf("list executions: %v: %s", err, b)
	}
	return slices.ContainsFunc(page.Executions, func(e struct{ Code, Status string }) bool {
		return e.Code == code && e.Status == "running"
	})
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

const blackFriday = `
import io, base64
import pandas as pd
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
csv = "order_id,sku,qty,price\n" + "\n".join(f"{i},{'SKU'+str(i%7)},{1+i%3},{9.99+i%5}" for i in range(2000)) + "\n17,SKU3,2,11.99\n"
df = pd.read_csv(io.StringIO(csv))
dups = df[df.duplicated("order_id", keep=False)]
stock = df.groupby("sku")["qty"].sum().sort_values()
stock.plot(kind="bar", title="units sold")
plt.show()
print("duplicates", sorted(set(dups.order_id)), "revenue", round((df.qty * df.price).sum(), 2))
stock
`

// startServer starts `sheepfold serve` with args on addr and waits until
// it is ready.
func startServer(t *testing.T, bin, name, addr, key string, args ...string) *server {
	t.Helper()
	srv := &server{url: "http://" + addr, key: key, exited: make(chan error, 1)}
	// SHEEPFOLD_E2E_LOG_DIR keeps the replicas' logs after the test.
	dir := os.Getenv("SHEEPFOLD_E2E_LOG_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	logPath := filepath.Join(dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	srv.cmd = exec.Command(bin, append([]string{"serve", "--listen", addr}, args...)...)
	srv.cmd.Stdout, srv.cmd.Stderr = logf, logf
	if err := srv.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { srv.exited <- srv.cmd.Wait(); logf.Close() }()
	t.Cleanup(func() {
		srv.cmd.Process.Kill()
		b, _ := os.ReadFile(logPath)
		if t.Failed() {
			t.Logf("%s's log:\n%s", name, b)
			return
		}
		// Passed: its warnings alone (slow agents, a throttled or slow
		// API server) tell how close a run came to failing.
		var warn []string
		for l := range strings.Lines(string(b)) {
			if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
				warn = append(warn, l)
			}
		}
		if len(warn) > 0 {
			t.Logf("%s's %d warnings and errors (the last 40):\n%s", name, len(warn), strings.Join(warn[max(0, len(warn)-40):], ""))
		}
	})
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		res, err := http.Get(srv.url + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return srv
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is not ready: %v", name, err)
		}
	}
}

// balancer spreads requests over replicas in turn, as a Service does,
// and passes a replica over for a while once it refuses connections
// (an endpoint that failed its readiness). It never retries: a request
// cut by a replica's death fails, and the client retries.
type balancer struct {
	backends []*url.URL
	next     atomic.Uint64
	mu       sync.Mutex
	down     map[string]time.Time
}

func newBalancer(t *testing.T, replicas ...*server) *server {
	b := &balancer{down: map[string]time.Time{}}
	for _, r := range replicas {
		u, _ := url.Parse(r.url)
		b.backends = append(b.backends, u)
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(b.pick())
			pr.Out.Host = pr.In.Host
		},
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			b.mu.Lock()
			b.down[r.URL.Host] = time.Now().Add(3 * time.Second)
			b.mu.Unlock()
			http.Error(w, "replica unavailable: "+err.Error(), http.StatusBadGateway)
		},
	}
	// The request's body is read whole before it is sent on: a replica
	// that answers as soon as it has the body must not race the proxy's
	// goroutine that still holds the client's body. Streamed through,
	// that goroutine's last read (for the body's end) could come after
	// the answer began, which Go's HTTP/1 server forbids (it closes the
	// body then): the write failed, the replica's connection was closed
	// and the client got a cut answer, "other side closed"
	// (TestSandboxesAsPods under load). Made full duplex instead, the
	// read could outlast the handler and race the server's read of the
	// next request ("invalid concurrent Body.Read call").
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			b, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, "reading the request: "+err.Error(), http.StatusBadRequest)
				return
			}
			r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
			r.TransferEncoding = nil
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	return &server{url: hs.URL, key: replicas[0].key}
}

func (b *balancer) pick() *url.URL {
	b.mu.Lock()
	defer b.mu.Unlock()
	for range b.backends {
		u := b.backends[b.next.Add(1)%uint64(len(b.backends))]
		if time.Now().After(b.down[u.Host]) {
			return u
		}
	}
	return b.backends[0]
}

func TestSandboxesAsPods(t *testing.T) {
	image := env(t, "SHEEPFOLD_E2E_IMAGE")
	bin := env(t, "SHEEPFOLD_E2E_BIN")
	e2bDir := env(t, "SHEEPFOLD_E2E_E2B_DIR")
	ctx := context.Background()
	cs, ns, kubeconfig := setup(t)

	dsn := pgtest.New(t)
	data := t.TempDir()
	key := newKey(t, bin, data, dsn, "--name", "e2e")
	e2bKey := newKey(t, bin, data, dsn, "--e2b", "--name", "e2b-suite", "--owner", "e2b-suite")

	// Two replicas over one PostgreSQL and one namespace, behind a
	// balancer: every request may land on either.
	args := []string{"--data-dir", data, "--database", dsn,
		"--backend", "kubernetes", "--kubeconfig", kubeconfig, "--kubernetes-namespace", ns,
		"--kubernetes-image", "python=" + image}
	addrA, addrB := freePort(t), freePort(t)
	// A keeps a warm Pod on each node, B none: creates are hits and
	// misses.
	argsA := append(slices.Clone(args), "--pool", "1")
	replicaA := startServer(t, bin, "replica-a", addrA, key, argsA...)
	// B reaches agents through the API server's port-forward, A at
	// their Pod IPs: requests take both ways.
	replicaB := startServer(t, bin, "replica-b", addrB, key, append(slices.Clone(args), "--pool", "0", "--kubernetes-connect", "port-forward")...)
	srv := newBalancer(t, replicaA, replicaB)
	// A's warm Pods run, one on each node (a create that finds one is a
	// hit).
	if nodes := waitPool(t, cs, ns, 2); !slices.Equal(nodes, []string{"sf-node-a", "sf-node-b"}) {
		t.Fatalf("warm pool Pods on nodes %v, want one on each", nodes)
	}

	// Four sandboxes at once: Pods over both nodes, each runs the
	// analysis; create → first result is timed.
	const n = 4
	ids := make([]string, n)
	took := make([]time.Duration, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			start := time.Now()
			code, b := srv.do(t, "POST", "/v1/sandboxes", map[string]any{"template": "python"})
			if code != 201 {
				t.Errorf("create: %d %s", code, b)
				return
			}
			var sb struct{ ID string }
			json.Unmarshal(b, &sb)
			ids[i] = sb.ID
			code, b = srv.do(t, "POST", "/v1/sandboxes/"+sb.ID+"/execute", map[string]any{"code": "print(1+1)", "language": "python"})
			took[i] = time.Since(start)
			if code != 200 || !strings.Contains(string(b), `"stdout":"2\n"`) {
				t.Errorf("1+1: %d %s", code, b)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("create → first result of %d sandboxes at once: %v", n, took)
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]int{}
	mine := 0
	for _, p := range pods.Items {
		if p.Spec.HostUsers == nil || *p.Spec.HostUsers {
			t.Errorf("pod %s is not in a user namespace of its own", p.Name)
		}
		if slices.Contains(ids, p.Labels["sheepfold.dev/sandbox"]) {
			nodes[p.Spec.NodeName]++
			mine++
		}
	}
	if mine != n || len(nodes) < 2 {
		t.Fatalf("%d pods of the sandboxes on nodes %v: want %d spread over both", mine, nodes, n)
	}

	code, b := srv.do(t, "POST", "/v1/sandboxes/"+ids[0]+"/execute", map[string]any{"code": blackFriday, "language": "python"})
	var res struct {
		Status  string
		Stdout  string
		Results []map[string]any
	}
	json.Unmarshal(b, &res)
	var png bool
	for _, r := range res.Results {
		if s, ok := r["png"].(string); ok && strings.HasPrefix(s, "iVBOR") {
			png = true
		}
	}
	if code != 200 || res.Status != "success" || !strings.Contains(res.Stdout, "duplicates [17]") || !png {
		t.Fatalf("Black Friday: %d %s", code, b)
	}
	// State survives between executions in one sandbox.
	if code, b := srv.do(t, "POST", "/v1/sandboxes/"+ids[0]+"/execute", map[string]any{"code": "print(len(df))", "language": "python"}); code != 200 || !strings.Contains(string(b), `"stdout":"2001\n"`) {
		t.Fatalf("state across executions: %d %s", code, b)
	}
	// The code runs as "user" without capabilities.
	if code, b := srv.do(t, "POST", "/v1/sandboxes/"+ids[1]+"/execute", map[string]any{"language": "python",
		"code": "import os; print(os.getuid(), [l for l in open('/proc/self/status') if l.startswith('CapEff')][0].split()[1])"}); code != 200 || !strings.Contains(string(b), `"stdout":"1000 0000000000000000\n"`) {
		t.Fatalf("user code's identity: %d %s", code, b)
	}

	replicaA = replicaKill(t, srv, replicaA, ids[0], func() *server { return startServer(t, bin, "replica-a2", addrA, key, argsA...) })

	// The official E2B SDKs' suite through the balancer: every request
	// of it may land on either replica.
	nodejs.E2BSuite(t, e2bDir, srv.url, e2bKey, nil)

	// A network allowlist: through the agent's egress proxy and a
	// replica's gateway, nothing else.
	egressThroughGateway(t, srv, cs, ns)

	// Node loss through replica A, which reaches agents at their Pod IPs
	// (through port-forward, B's way, a Pod whose kubelet is down is out
	// of reach; B then destroys it without its agent).
	nodeLoss(t, replicaA, cs, ns, env(t, "SHEEPFOLD_E2E_CLUSTER"))

	// Killing a sandbox deletes its Pod, Secret and NetworkPolicy.
	if code, b := srv.do(t, "DELETE", "/v1/sandboxes/"+ids[0], nil); code != 204 && code != 200 {
		t.Fatalf("kill: %d %s", code, b)
	}
	waitGone(t, cs, ns, "sheepfold.dev/sandbox="+ids[0])

	// Replicas that stop leave sandboxes to the others: the last ones
	// are killed through the API, and then nothing of them stays.
	for _, id := range ids[1:] {
		if code, b := srv.do(t, "DELETE", "/v1/sandboxes/"+id, nil); code != 204 && code != 200 {
			t.Fatalf("kill %s: %d %s", id, code, b)
		}
	}
	for _, r := range []*server{replicaA, replicaB} {
		r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-r.exited:
			if err != nil {
				t.Fatalf("serve exited: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("serve did not stop")
		}
	}
	waitGone(t, cs, ns, "sheepfold.dev/sandbox")
}

// replicaKill: replica A dies (SIGKILL) in the middle of an execution
// sent to it; the client's retry through the balancer succeeds on the
// other replica, with the sandbox's state. A started again serves the
// sandbox too: replicas leave sandboxes alone when they start and stop.
// It returns the new replica A.
func replicaKill(t *testing.T, lb, a *server, id string, restart func() *server) *server {
	if code, b := lb.do(t, "POST", "/v1/sandboxes/"+id+"/execute", map[string]any{"code": "kept = 'state kept'", "language": "python"}); code != 200 {
		t.Fatalf("set state: %d %s", code, b)
	}
	slow := map[string]any{"code": "import time; time.sleep(4); print(kept)", "language": "python"}
	cut := make(chan error, 1)
	go func() {
		body, _ := json.Marshal(slow)
		req, _ := http.NewRequest("POST", a.url+"/v1/sandboxes/"+id+"/execute", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+a.key)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			err = fmt.Errorf("answered %d %s", res.StatusCode, b)
		}
		cut <- err
	}()
	// A kills it once the execution runs there (its record says so in
	// the shared store), not before it arrived.
	for deadline := time.Now().Add(60 * time.Second); !executionRunning(t, lb, id, slow["code"].(string)); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the slow execution never ran on replica A")
		}
	}
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-a.exited
	if err := <-cut; err == nil || strings.Contains(err.Error(), "answered") {
		t.Fatalf("the request to the replica that died: %v (want it cut)", err)
	}
	// The client retries through the balancer until a replica answers.
	start := time.Now()
	for attempt := 1; ; attempt++ {
		code, b := lb.do(t, "POST", "/v1/sandboxes/"+id+"/execute", slow)
		if code == 200 && strings.Contains(string(b), `"stdout":"state kept\n"`) {
			t.Logf("replica killed mid-execution: the retry succeeded on the other after %d attempts in %v", attempt, time.Since(start).Round(time.Millisecond))
			break
		}
		if code != http.StatusBadGateway || attempt > 5 {
			t.Fatalf("retry after a replica's death: %d %s", code, b)
		}
	}
	a = restart()
	if code, b := a.do(t, "POST", "/v1/sandboxes/"+id+"/execute", map[string]any{"code": "print(kept)", "language": "python"}); code != 200 || !strings.Contains(string(b), `"stdout":"state kept\n"`) {
		t.Fatalf("the restarted replica: %d %s", code, b)
	}
	return a
}

// nodeLoss: node b's kubelet dies. Its Pods' containers run on, so its
// sandboxes keep answering; killing one deletes its objects at once (no
// kubelet confirms a Pod's end: the deletion has no grace period); once
// the kubelet is back it ends the orphaned container.
func nodeLoss(t *testing.T, srv *server, cs kubernetes.Interface, ns, cluster string) {
	ctx := context.Background()
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var id, ip string
	// One of the test's sandboxes (not a warm pool member, nobody's yet).
	code, listed := srv.do(t, "GET", "/v1/sandboxes", nil)
	if code != 200 {
		t.Fatalf("list: %d %s", code, listed)
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName == "sf-node-b" && p.Status.Phase == corev1.PodRunning &&
			strings.Contains(string(listed), `"`+p.Labels["sheepfold.dev/sandbox"]+`"`) {
			id, ip = p.Labels["sheepfold.dev/sandbox"], p.Status.PodIP
			break
		}
	}
	if id == "" || ip == "" {
		t.Fatalf("no sandbox on sf-node-b among %d pods", len(pods.Items))
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(cluster, args...).CombinedOutput(); err != nil {
			t.Fatalf("cluster.sh %v: %v\n%s", args, err, out)
		}
	}
	stopped := time.Now().Truncate(time.Second) // as creation times are kept
	run("stop-kubelet", "b")
	restarted := false
	defer func() {
		if !restarted {
			run("start-kubelet", "b")
		}
	}()
	if code, b := srv.do(t, "POST", "/v1/sandboxes/"+id+"/execute", map[string]any{"code": "print('still here')", "language": "python"}); code != 200 || !strings.Contains(string(b), `"stdout":"still here\n"`) {
		t.Fatalf("a sandbox on the node whose kubelet died: %d %s", code, b)
	}
	// Creates meanwhile: the scheduler still sees node b Ready, so it
	// binds Pods there; the runtime makes them again on node a once b's
	// kubelet has not taken them for 15 s. A warm pool Pod that already
	// ran on b may be handed out (it runs on, as the sandbox above does),
	// so the second create asks for environment variables, which no warm
	// member has: its Pod must be made now, on node a.
	start := time.Now()
	var wg sync.WaitGroup
	var fresh atomic.Int32
	for i := range 2 {
		wg.Go(func() {
			req := map[string]any{"template": "python"}
			if i == 1 {
				req["env"] = map[string]string{"SF_E2E": "node-loss"}
			}
			code, b := srv.do(t, "POST", "/v1/sandboxes", req)
			if code != 201 {
				t.Errorf("create while a kubelet is down: %d %s", code, b)
				return
			}
			var sb struct{ ID string }
			json.Unmarshal(b, &sb)
			if code, b := srv.do(t, "POST", "/v1/sandboxes/"+sb.ID+"/execute", map[string]any{"code": "print(1)", "language": "python"}); code != 200 {
				t.Errorf("first execution while a kubelet is down: %d %s", code, b)
			}
			p, err := cs.CoreV1().Pods(ns).Get(ctx, "sf-"+sb.ID, metav1.GetOptions{})
			switch {
			case err != nil:
				t.Errorf("the pod of a sandbox created while b's kubelet is down: %v", err)
			case p.CreationTimestamp.Time.Before(stopped) && i == 1:
				t.Errorf("a sandbox with its own environment, created while b's kubelet is down, has a Pod made before (on %s)", p.Spec.NodeName)
			case p.CreationTimestamp.Time.Before(stopped):
				t.Logf("a sandbox created while b's kubelet is down came from the warm pool (on %s)", p.Spec.NodeName)
			case p.Spec.NodeName != "sf-node-a":
				t.Errorf("a sandbox created while b's kubelet is down runs on %q", p.Spec.NodeName)
			default:
				fresh.Add(1)
			}
			if code, b := srv.do(t, "DELETE", "/v1/sandboxes/"+sb.ID, nil); code != 204 {
				t.Errorf("kill: %d %s", code, b)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("two sandboxes created while b's kubelet was down (%d Pods made then, on node a) in %v", fresh.Load(), time.Since(start).Round(time.Millisecond))

	start = time.Now()
	if code, b := srv.do(t, "DELETE", "/v1/sandboxes/"+id, nil); code != 204 && code != 200 {
		t.Fatalf("kill on the node whose kubelet died: %d %s", code, b)
	}
	waitGone(t, cs, ns, "sheepfold.dev/sandbox="+id)
	t.Logf("a sandbox on a node without its kubelet: killed, its objects gone in %v", time.Since(start).Round(time.Millisecond))
	if c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, "49983"), 2*time.Second); err != nil {
		t.Fatalf("the orphaned agent should still run until the kubelet is back: %v", err)
	} else {
		c.Close()
	}
	run("start-kubelet", "b")
	restarted = true
	start = time.Now()
	for {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, "49983"), time.Second)
		if err != nil {
			break
		}
		c.Close()
		if time.Since(start) > 2*time.Minute {
			t.Fatal("the kubelet, back, did not end the orphaned sandbox's container")
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("the kubelet, back, ended the orphaned container in %v", time.Since(start).Round(time.Millisecond))
}

// waitGone waits until no Pod, Secret or NetworkPolicy matches sel.
func waitGone(t *testing.T, cs kubernetes.Interface, ns, sel string) {
	t.Helper()
	ctx := context.Background()
	opt := metav1.ListOptions{LabelSelector: sel}
	var left, pods []string
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		left, pods = left[:0], pods[:0]
		if l, err := cs.CoreV1().Pods(ns).List(ctx, opt); err == nil {
			for _, p := range l.Items {
				left = append(left, "pod/"+p.Name)
				// What the Pod was, for the failure: its node, phase,
				// labels (pool or not), age and deletion.
				pods = append(pods, fmt.Sprintf("%s: node %s, phase %s, labels %v, created %s, deleting %v",
					p.Name, p.Spec.NodeName, p.Status.Phase, p.Labels, p.CreationTimestamp.Format(time.RFC3339), p.DeletionTimestamp != nil))
			}
		}
		if l, err := cs.CoreV1().Secrets(ns).List(ctx, opt); err == nil {
			for _, s := range l.Items {
				left = append(left, "secret/"+s.Name)
			}
		}
		if l, err := cs.NetworkingV1().NetworkPolicies(ns).List(ctx, opt); err == nil {
			for _, p := range l.Items {
				left = append(left, "networkpolicy/"+p.Name)
			}
		}
		if len(left) == 0 {
			return
		}
	}
	slices.Sort(left)
	t.Fatalf("left in the cluster: %v; pods: %v", left, pods)
}

// startAlone starts one `sheepfold serve --backend kubernetes` over a
// PostgreSQL of its own, with its sandboxes in a namespace of their own
// and args added to its command.
func startAlone(t *testing.T, args ...string) (*server, kubernetes.Interface, string) {
	cs, ns, kubeconfig := setup(t)
	return startAloneIn(t, ns, kubeconfig, args...), cs, ns
}

// startAloneIn is startAlone in a namespace setup made.
func startAloneIn(t *testing.T, ns, kubeconfig string, args ...string) *server {
	image := env(t, "SHEEPFOLD_E2E_IMAGE")
	bin := env(t, "SHEEPFOLD_E2E_BIN")
	dsn := pgtest.New(t)
	data := t.TempDir()
	srv := startServer(t, bin, "serve", freePort(t), newKey(t, bin, data, dsn, "--name", "e2e"), append([]string{"--data-dir", data, "--database", dsn, "--pool", "0",
		"--backend", "kubernetes", "--kubeconfig", kubeconfig, "--kubernetes-namespace", ns,
		"--kubernetes-image", "python=" + image}, args...)...)
	return srv
}

// newKey creates an API key with `sheepfold keys create args` and
// returns it.
func newKey(t *testing.T, bin, data, dsn string, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin, append([]string{"keys", "create", "--data-dir", data, "--database", dsn}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("keys create: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`key:\s+(\S+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("keys create printed %s", out)
	}
	return string(m[1])
}

// TestGVisor: a sandbox that chooses the runtime gvisor runs in a Pod of
// RuntimeClass gvisor, under gVisor's kernel, beside one of the default
// runtime (runc) on the host's; a runtime not offered is refused.
func TestGVisor(t *testing.T) {
	srv, cs, ns := startAlone(t, "--kubernetes-runtime-class", "runc", "--kubernetes-runtime-classes", "gvisor=gvisor,runc=runc")
	ctx := context.Background()
	// What the code sees of its kernel: gVisor names itself in
	// /proc/version ("Linux version 4.19.0-gvisor ...").
	const probe = "print(open('/proc/version').read().strip())"
	kernel := map[string]string{}
	var ids []string
	for _, rt := range []string{"gvisor", ""} {
		req := map[string]any{"template": "python"}
		if rt != "" {
			req["runtime"] = rt
		}
		code, b := srv.do(t, "POST", "/v1/sandboxes", req)
		if code != 201 {
			t.Fatalf("create with runtime %q: %d %s", rt, code, b)
		}
		var sb struct{ ID string }
		json.Unmarshal(b, &sb)
		ids = append(ids, sb.ID)
		code, b = srv.do(t, "POST", "/v1/sandboxes/"+sb.ID+"/execute", map[string]any{"code": probe, "language": "python"})
		var res struct{ Status, Stdout string }
		json.Unmarshal(b, &res)
		if code != 200 || res.Status != "success" {
			t.Fatalf("runtime %q: probe: %d %s", rt, code, b)
		}
		kernel[rt] = res.Stdout
		// The agent switches users under gVisor too (its uid 0 is the
		// sentry's): the code runs as "user" without capabilities.
		if code, b := srv.do(t, "POST", "/v1/sandboxes/"+sb.ID+"/execute", map[string]any{"language": "python",
			"code": "import os; print(os.getuid(), [l for l in open('/proc/self/status') if l.startswith('CapEff')][0].split()[1])"}); code != 200 || !strings.Contains(string(b), `"stdout":"1000 0000000000000000\n"`) {
			t.Errorf("runtime %q: user code's identity: %d %s", rt, code, b)
		}
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "sheepfold.dev/sandbox=" + sb.ID})
		if err != nil || len(pods.Items) != 1 {
			t.Fatalf("the pod of %s: %v, %d pods", sb.ID, err, len(pods.Items))
		}
		// The runc Pod's firewall (its netlock init container) keeps its
		// code from its node's kubelet; a gVisor Pod has none (gVisor's
		// netstack has no nftables): only a NetworkPolicy, which this
		// cluster's CNI does not enforce, closes it.
		reach := connectOut(t, srv, sb.ID, "gateway", 10250)
		inits := len(pods.Items[0].Spec.InitContainers)
		switch {
		case rt == "" && (reach != "refused 113" || inits != 1):
			t.Errorf("runc: a connection to the node's kubelet: %s, %d init containers (want refused 113, netlock)", reach, inits)
		case rt == "gvisor" && inits != 0:
			t.Errorf("gvisor: %d init containers, want none", inits)
		}
		t.Logf("runtime %q: a connection to the node's kubelet: %s", rt, reach)
		class := pods.Items[0].Spec.RuntimeClassName
		want := map[string]string{"gvisor": "gvisor", "": "runc"}[rt]
		if class == nil || *class != want {
			t.Errorf("runtime %q: the pod's RuntimeClass is %v, want %s", rt, class, want)
		}
		t.Logf("runtime %q (RuntimeClass %s, node %s): %s", rt, want, pods.Items[0].Spec.NodeName, res.Stdout)
	}
	if !strings.Contains(kernel["gvisor"], "gvisor") {
		t.Errorf("the gvisor sandbox's kernel does not say gVisor: %s", kernel["gvisor"])
	}
	if strings.Contains(kernel[""], "gvisor") || kernel[""] == kernel["gvisor"] {
		t.Errorf("the default (runc) sandbox's kernel is gVisor's: %s", kernel[""])
	}
	code, b := srv.do(t, "POST", "/v1/sandboxes", map[string]any{"template": "python", "runtime": "kata"})
	if code != 400 || !strings.Contains(string(b), "ERR_BAD_REQUEST") || !strings.Contains(string(b), "gvisor, runc") {
		t.Errorf("create with runtime kata: %d %s; want 400 naming gvisor, runc", code, b)
	}
	// Sandboxes outlive the server (replicas share them): killed first.
	for _, id := range ids {
		if code, b := srv.do(t, "DELETE", "/v1/sandboxes/"+id, nil); code != 204 {
			t.Errorf("kill %s: %d %s", id, code, b)
		}
	}
	srv.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-srv.exited:
		if err != nil {
			t.Fatalf("serve exited: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("serve did not stop")
	}
	waitGone(t, cs, ns, "sheepfold.dev/sandbox")
}
