//go:build kubernetes_e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// upstream is an HTTP server outside the cluster and the host, at a
// public-looking address (TEST-NET-3, which the gateway does not refuse):
// a network namespace of its own behind a veth pair, whose host end is
// 203.0.113.1/30. It serves dir. Cleanup deletes the namespace (and with
// it the pair and the route).
func upstream(t *testing.T, dir string) string {
	t.Helper()
	const ns, host, peer = "sf-e2e-up", "sfe2e-h", "sfe2e-n"
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "delete", ns).Run() })
	run("link", "add", host, "type", "veth", "peer", "name", peer)
	t.Cleanup(func() { exec.Command("ip", "link", "delete", host).Run() })
	run("link", "set", peer, "netns", ns)
	run("addr", "add", "203.0.113.1/30", "dev", host)
	run("link", "set", host, "up")
	run("-n", ns, "addr", "add", "203.0.113.2/30", "dev", peer)
	run("-n", ns, "link", "set", peer, "up")
	run("-n", ns, "link", "set", "lo", "up")
	srv := exec.Command("ip", "netns", "exec", ns, "/usr/bin/python3", "-m", "http.server", "80", "--bind", "203.0.113.2", "--directory", dir)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", "203.0.113.2:80", time.Second)
		if err == nil {
			c.Close()
			return "203.0.113.2"
		}
		if time.Now().After(deadline) {
			t.Fatalf("the upstream server does not answer: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// egressThroughGateway: a Pod sandbox whose policy allows one address
// reaches it through its agent's egress proxy and the server's gateway
// (HTTP_PROXY is set for it), and is refused another (the host's own)
// with ERR_NETWORK_RESTRICTED; its NetworkPolicy stays deny-all. Its
// network_requests hold across the replicas: once both carry its
// connections, it gets what is left of the budget, not that much from
// each.
func egressThroughGateway(t *testing.T, srv *server, cs kubernetes.Interface, ns string) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "stock.csv"), []byte("sku,qty\nA-1,7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := upstream(t, dir)
	code, b := srv.do(t, "POST", "/v1/sandboxes", map[string]any{"template": "python",
		"security_policy": map[string]any{"network": map[string]any{"mode": "allowlist", "allow": []string{addr}},
			"resource_limits": map[string]any{"network_requests": 4}}})
	if code != 201 {
		t.Fatalf("create with a network: %d %s", code, b)
	}
	id := jsonField(t, b, "id")
	defer srv.do(t, "DELETE", "/v1/sandboxes/"+id, nil)
	code, b = srv.do(t, "POST", "/v1/sandboxes/"+id+"/execute", map[string]any{"language": "python", "code": fmt.Sprintf(`
import urllib.request, urllib.error
print(urllib.request.urlopen("http://%s/stock.csv", timeout=20).read().decode().splitlines()[1])
try:
    urllib.request.urlopen("http://203.0.113.1/", timeout=20)
except urllib.error.HTTPError as e:
    print("refused", e.code, e.headers.get("X-Sheepfold-Error"))
`, addr)})
	if code != 200 || !strings.Contains(string(b), `A-1,7\nrefused 403 ERR_NETWORK_RESTRICTED`) {
		t.Fatalf("egress through the gateway: %d %s", code, b)
	}
	// Both replicas hold it now (srv alternates), so both fetch its
	// connections: of five more fetches, the three left of the budget
	// succeed and two are refused, whichever replica carries them.
	for range 2 {
		if code, b := srv.do(t, "POST", "/v1/sandboxes/"+id+"/execute", map[string]any{"language": "python", "code": "1"}); code != 200 {
			t.Fatalf("execute: %d %s", code, b)
		}
	}
	code, b = srv.do(t, "POST", "/v1/sandboxes/"+id+"/execute", map[string]any{"language": "python", "code": fmt.Sprintf(`
import urllib.request, urllib.error
got = []
for _ in range(5):
    try:
        urllib.request.urlopen("http://%s/stock.csv", timeout=20).read()
        got.append("ok")
    except urllib.error.HTTPError as e:
        got.append(str(e.code))
print(" ".join(got))
`, addr)})
	if code != 200 || !strings.Contains(string(b), `"stdout":"ok ok ok 429 429\n"`) {
		t.Fatalf("network_requests 4 across replicas, after one fetch: %d %s", code, b)
	}
	// Around the proxy, straight to the address the policy allows, the
	// Pod gets nowhere: its own firewall (the netlock init container)
	// holds though this cluster's CNI enforces no NetworkPolicy.
	if got := connectOut(t, srv, id, addr, 80); got != "refused 113" {
		t.Fatalf("a connection to %s around the gateway: %s (want refused 113, EHOSTUNREACH)", addr, got)
	}
	np, err := cs.NetworkingV1().NetworkPolicies(ns).Get(context.Background(), "sf-"+id, metav1.GetOptions{})
	if err != nil || len(np.Spec.Egress) != 0 {
		t.Fatalf("the sandbox's NetworkPolicy: %+v, %v (want every egress denied)", np, err)
	}
	t.Logf("a Pod with network allowlist %s fetched from it through the gateway, network_requests counted across replicas; another address refused", addr)
}

// connectOut is what came of sandbox id's code connecting to host:port
// itself, with no proxy: "connected", "refused 113" (EHOSTUNREACH: the
// Pod's firewall), "refused 111" (nothing listens), "timeout" (5 s) or
// what else bash said. The code is bash, not Python: the Python policy's
// audit hook would refuse the connect before it reached the network, and
// this measures the network. host "gateway" is the Pod's default gateway:
// its node's address, where the node's kubelet listens (port 10250).
func connectOut(t *testing.T, srv *server, id, host string, port int) string {
	t.Helper()
	code, b := srv.do(t, "POST", "/v1/sandboxes/"+id+"/execute", map[string]any{"language": "bash", "code": fmt.Sprintf(`
h=%s
if [ "$h" = gateway ]; then
	while read -r _ dst gw _; do [ "$dst" = 00000000 ] && g=$gw; done </proc/net/route
	h=$((16#${g:6:2})).$((16#${g:4:2})).$((16#${g:2:2})).$((16#${g:0:2}))
fi
err=$(timeout 5 bash -c "echo >/dev/tcp/$h/%d" 2>&1)
rc=$?
case "$rc:$err" in
0:*) echo connected ;;
124:*) echo timeout ;;
*"No route to host"*) echo refused 113 ;;
*"Connection refused"*) echo refused 111 ;;
*) echo "failed $rc: $err" ;;
esac
`, host, port)})
	var res struct{ Status, Stdout string }
	if err := json.Unmarshal(b, &res); err != nil || code != 200 || res.Status != "success" {
		t.Fatalf("connect out of %s: %d %s", id, code, b)
	}
	return strings.TrimSpace(res.Stdout)
}

// jsonField is the string field name of the JSON object b.
func jsonField(t *testing.T, b []byte, name string) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	v, _ := m[name].(string)
	if v == "" {
		t.Fatalf("no %q in %s", name, b)
	}
	return v
}

// waitPool waits until n warm pool Pods run in ns, and returns their
// nodes, sorted.
func waitPool(t *testing.T, cs kubernetes.Interface, ns string, n int) []string {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		pods, err := cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "sheepfold.dev/pool=true", FieldSelector: "status.phase=Running"})
		if err == nil && len(pods.Items) >= n {
			var nodes []string
			for _, p := range pods.Items {
				nodes = append(nodes, p.Spec.NodeName)
			}
			slices.Sort(nodes)
			return nodes
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d warm pool Pods did not run within 2 minutes (err %v)", n, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
