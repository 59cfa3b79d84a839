//go:build kubernetes_e2e

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestPodHostile: what a tenant's code, root included (sudo), tries
// against its own Pod (docs/security.md, "12. Kubernetes Pods").
func TestPodHostile(t *testing.T) {
	srv, cs, ns := startAlone(t)
	t.Run("PidsAcrossUids", func(t *testing.T) { podPidsAcrossUids(t, srv) })
	t.Run("PidsCheck", func(t *testing.T) { podPidsCheck(t, cs, ns) })
	t.Run("AgentReadOnly", func(t *testing.T) { podAgentReadOnly(t, srv) })
	t.Run("EgressProxyNoPreview", func(t *testing.T) { podEgressProxyNoPreview(t, srv) })
}

// execOut runs code (language lang) in sandbox id and returns its
// standard output; anything but a successful execution fails the test.
func execOut(t *testing.T, srv *server, id, lang, code string) string {
	t.Helper()
	c, b := srv.do(t, "POST", "/v1/sandboxes/"+id+"/execute", map[string]any{"language": lang, "code": code})
	var res struct{ Status, Stdout, Stderr string }
	if err := json.Unmarshal(b, &res); err != nil || c != 200 || res.Status != "success" {
		t.Fatalf("execute in %s: %d %s", id, c, b)
	}
	return res.Stdout
}

// newSandbox creates a python sandbox from body's fields and kills it when
// the test ends.
func newSandbox(t *testing.T, srv *server, body map[string]any) string {
	t.Helper()
	body["template"] = "python"
	code, b := srv.do(t, "POST", "/v1/sandboxes", body)
	if code != 201 {
		t.Fatalf("create: %d %s", code, b)
	}
	id := jsonField(t, b, "id")
	t.Cleanup(func() { srv.do(t, "DELETE", "/v1/sandboxes/"+id, nil) })
	return id
}

// pidsSpread is run as root (sudo) in a sandbox: it starts a leader per
// uid of 2001..2000+uids, each of which takes that uid and forks sleepers
// until a fork fails (or per tasks of that uid run), and prints the tasks
// each uid got and why it stopped; then it kills them all.
const pidsSpread = `
import os, signal, sys
uids, per = int(sys.argv[1]), int(sys.argv[2])
r, w = os.pipe()
leaders, stopped = [], "all"
for uid in range(2001, 2001 + uids):
    try:
        pid = os.fork()
    except OSError as e:
        stopped = e.strerror.replace(" ", "_")
        break
    if pid == 0:
        os.close(r)
        os.setgroups([]); os.setgid(uid); os.setuid(uid)
        kids, why = [], "all"
        for _ in range(per - 1):
            try:
                pid = os.fork()
            except OSError as e:
                why = e.strerror
                break
            if pid == 0:
                signal.pause()
                os._exit(0)
            kids.append(pid)
        os.write(w, ("%d %d %s %s\n" % (uid, 1 + len(kids), why.replace(" ", "_"), ",".join(map(str, kids)))).encode())
        signal.pause()
        os._exit(0)
    leaders.append(pid)
os.close(w)
total, lines = 0, []
with os.fdopen(r) as f:
    for _ in leaders:
        uid, n, why, kids = f.readline().split(" ")
        total += int(n)
        lines.append("uid %s: %s tasks (%s)" % (uid, n, why))
        for k in filter(None, kids.strip().split(",")):
            os.kill(int(k), signal.SIGKILL)
for pid in leaders:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
print("total", total, "over", len(leaders), "uids; the uids stopped at", stopped)
print("\n".join(lines))
`

// podPidsAcrossUids: the sandbox's pids limit bounds all of its tasks,
// whatever their uid. Root in the Pod (sudo) has CAP_SETUID over the
// Pod's 65,536 uids; a per-uid bound (RLIMIT_NPROC) lets each uid hold
// the limit again, so eight uids hold eight times as much. The Pod's
// container cgroup holds the limit for them all.
func podPidsAcrossUids(t *testing.T, srv *server) {
	const limit = 64
	id := newSandbox(t, srv, map[string]any{"resources": map[string]any{"pids": limit}})
	out := execOut(t, srv, id, "bash", "cat > /tmp/spread.py <<'EOF'\n"+pidsSpread+"EOF\nsudo python3 /tmp/spread.py 8 100 2>&1; echo rc=$?\n"+
		"cat /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/pids.max 2>/dev/null | head -1 | sed 's/^/pids.max /'")
	t.Logf("root in the Pod spreading tasks over 8 uids, resources.pids %d:\n%s", limit, out)
	var total int
	if _, err := fmt.Sscanf(out, "total %d", &total); err != nil {
		t.Fatalf("no total in %q", out)
	}
	if total > limit {
		t.Errorf("the sandbox's tasks over 8 uids: %d, over its pids limit %d", total, limit)
	}
	// The attack ran (a fork failed at the bound), and the bound is the
	// sandbox's own: its container's cgroup.
	if !strings.Contains(out, "Resource_temporarily_unavailable") {
		t.Errorf("no fork of the spread failed with EAGAIN: %s", out)
	}
	if !strings.Contains(out, "pids.max "+strconv.Itoa(limit)+"\n") {
		t.Errorf("the container's pids.max is not the sandbox's limit %d: %s", limit, out)
	}
}

// podPidsCheck: the agent refuses to serve in a container whose pids.max
// is not the sandbox's limit, as on a node without the NRI plugin: a Pod
// of the sandbox's image without the annotation fails with the agent's
// reason; the same Pod annotated (the control) serves.
func podPidsCheck(t *testing.T, cs kubernetes.Interface, ns string) {
	ctx := context.Background()
	image := env(t, "SHEEPFOLD_E2E_IMAGE")
	mk := func(name string, ann map[string]string) {
		t.Helper()
		_, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
			Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever, HostUsers: new(false), AutomountServiceAccountToken: new(false),
				TerminationGracePeriodSeconds: new(int64(0)),
				Containers: []corev1.Container{{Name: "sandbox", Image: image, ImagePullPolicy: corev1.PullNever,
					Command:                  []string{"/.sheepfold/agent", "serve", "--listen", "/tmp/agent.sock", "--pids-max", "64"},
					TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cs.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})
		})
	}
	mk("pids-unset", nil)
	mk("pids-set", map[string]string{"sheepfold.dev/pids-max": "64"})
	state := func(name string) (*corev1.ContainerStatus, error) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return nil, err
		}
		return &p.Status.ContainerStatuses[0], nil
	}
	var unset, set *corev1.ContainerStatus
	for deadline := time.Now().Add(2 * time.Minute); unset == nil || unset.State.Terminated == nil || set == nil || set.State.Running == nil; time.Sleep(250 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pods not settled: without the annotation %+v, with it %+v", unset, set)
		}
		var err error
		if unset, err = state("pids-unset"); err != nil {
			t.Fatal(err)
		}
		if set, err = state("pids-set"); err != nil {
			t.Fatal(err)
		}
		if set != nil && set.State.Terminated != nil {
			t.Fatalf("the agent in a container with its pids limit exited: %+v", set.State.Terminated)
		}
	}
	msg := unset.State.Terminated.Message
	t.Logf("the agent without its pids limit: exit %d: %s", unset.State.Terminated.ExitCode, msg)
	if unset.State.Terminated.ExitCode != 1 || !strings.Contains(msg, "is max, not 64: the node runs no sheepfold NRI plugin") {
		t.Errorf("the agent in a container without its pids limit: %+v", unset.State.Terminated)
	}
}

// podAgentReadOnly: the agent's binary, which the agent executes again
// (its helpers), is on a read-only mount: root in the Pod can neither
// replace it nor move its directory aside and make another. As a control, the same root replaces a binary of the image's root
// filesystem (/usr/bin/yes).
func podAgentReadOnly(t *testing.T, srv *server) {
	id := newSandbox(t, srv, map[string]any{})
	out := execOut(t, srv, id, "bash", `
before=$(sha256sum /.sheepfold/agent | cut -c1-16)
printf '#!/bin/sh\necho replaced > /tmp/replaced-agent-ran\nshift 3\nexec "$@"\n' > /tmp/evil
chmod 755 /tmp/evil
sudo sh -c 'cp /tmp/evil /.sheepfold/agent.new && mv -f /.sheepfold/agent.new /.sheepfold/agent' 2>&1 | sed 's/^/agent: /'
sudo sh -c 'cp /tmp/evil /usr/local/bin/yes.new && mv -f /usr/local/bin/yes.new /usr/bin/yes && echo control: replaced /usr/bin/yes' 2>&1
sudo sh -c 'mv /.sheepfold /.sheepfold-moved && mkdir /.sheepfold && cp /tmp/evil /.sheepfold/agent' 2>&1 | sed 's/^/agent dir: /'
after=$(sha256sum /.sheepfold/agent | cut -c1-16)
[ "$before" = "$after" ] && echo agent unchanged || echo agent replaced
grep ' /.sheepfold ' /proc/self/mountinfo | awk '{print "mount", $4, $5, $6}'
`)
	t.Logf("root replacing the agent's binary:\n%s", out)
	// A process the agent starts now (a command) would run the
	// replacement where it could be replaced.
	srv.do(t, "POST", "/v1/sandboxes/"+id+"/commands", map[string]any{"cmd": "true"})
	ran := execOut(t, srv, id, "bash", "cat /tmp/replaced-agent-ran 2>/dev/null || echo not-ran")
	t.Logf("the replacement: %s", ran)
	if !strings.Contains(out, "control: replaced /usr/bin/yes") {
		t.Errorf("control: root could not replace /usr/bin/yes (the attack is not root's): %s", out)
	}
	if !strings.Contains(out, "agent unchanged") || strings.Contains(ran, "replaced") {
		t.Errorf("root in the Pod replaced the agent's binary: %s %s", out, ran)
	}
	if !strings.Contains(out, " /.sheepfold ro,") {
		t.Errorf("/.sheepfold is not a read-only mount: %s", out)
	}
}

// podEgressProxyNoPreview: a Pod's egress proxy (its agent's listener on
// the loopback, port 3128) serves the sandbox's own code only. Through
// previews, even a public one (no credential), it is refused: in the
// path form, and in E2B's header form with CONNECT, which would tunnel to
// what the sandbox's allowlist allows.
func podEgressProxyNoPreview(t *testing.T, srv *server) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "stock.csv"), []byte("sku,qty\nA-1,7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := upstream(t, dir)
	id := newSandbox(t, srv, map[string]any{"security_policy": map[string]any{"network": map[string]any{"mode": "allowlist", "allow": []string{addr}}}})
	// The sandbox's own code reaches it through the proxy.
	if got := execOut(t, srv, id, "python", fmt.Sprintf(`import urllib.request; print(urllib.request.urlopen("http://%s/stock.csv", timeout=20).read().decode().splitlines()[1])`, addr)); got != "A-1,7\n" {
		t.Fatalf("the sandbox's own fetch through its proxy: %q", got)
	}
	// The tenant makes the port public (as E2B's sandboxes are, all of
	// their ports).
	if code, b := srv.do(t, "PUT", "/v1/sandboxes/"+id+"/ports/3128", map[string]any{"public": true}); code != 200 {
		t.Fatalf("making port 3128 public: %d %s", code, b)
	}
	// The path form, no credential.
	res, err := http.Get(srv.url + "/v1/sandboxes/" + id + "/proxy/3128/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	t.Logf("GET the path form of port 3128, no credential: %d %s %q", res.StatusCode, res.Header.Get("X-Sheepfold-Error"), body)
	if res.Header.Get("X-Sheepfold-Error") != "" || res.StatusCode != http.StatusForbidden {
		t.Errorf("a preview of the egress proxy's port: %d %s %q (want 403, nothing of the proxy)", res.StatusCode, res.Header.Get("X-Sheepfold-Error"), body)
	}
	// E2B's header form, CONNECT to the allowed address, no credential.
	u, _ := url.Parse(srv.url)
	c, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	req := "GET /stock.csv HTTP/1.0\r\nHost: " + addr + "\r\n\r\n"
	fmt.Fprintf(c, "CONNECT %s:80 HTTP/1.1\r\nHost: %s:80\r\nE2b-Sandbox-Id: %s\r\nE2b-Sandbox-Port: 3128\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", addr, addr, id, len(req), req)
	got, _ := io.ReadAll(bufio.NewReader(c))
	t.Logf("CONNECT through E2B's header form of port 3128, no credential:\n%s", got)
	// The upstream's answer, whatever it made of the stranger's bytes.
	if strings.Contains(string(got), "A-1,7") || strings.Contains(string(got), "Error response") {
		t.Errorf("a stranger reached the sandbox's allowed address through a preview of its egress proxy: %s", got)
	}
	if !strings.HasPrefix(string(got), "HTTP/1.1 403 ") {
		t.Errorf("CONNECT through a preview of the egress proxy's port: %q (want 403)", got)
	}
}
