//go:build kubernetes_e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sheepfold/sheepfold/internal/secrets"
	"github.com/sheepfold/sheepfold/internal/testutil/pgtest"
)

// serverManifest is the server's Deployment, Service and budget.
const serverManifest = "../../../deploy/kubernetes/server.yaml"

// TestServerInCluster runs deploy/kubernetes as an operator applies it:
// the Deployment's two replicas run in Pods of the cluster, as the
// manifest's non-root user on a read-only root, with the in-cluster
// credentials of rbac.yaml's ServiceAccount; both become Ready (their
// /readyz asks the cluster), and a sandbox created through one is served
// by the other and leaves nothing behind.
//
// The test cluster has no kube-proxy (no Service IPs) and its API server
// and PostgreSQL listen on the host's loopback and a unix socket, which
// Pods cannot reach: the test relays both on node a's address and points
// the replicas there (KUBERNETES_SERVICE_HOST and the database URL), as a
// real cluster's Service IP and database host would be.
func TestServerInCluster(t *testing.T) {
	image := env(t, "SHEEPFOLD_E2E_IMAGE")
	serverImage := env(t, "SHEEPFOLD_E2E_SERVER_IMAGE")
	bin := env(t, "SHEEPFOLD_E2E_BIN")
	rc, err := clientcmd.BuildConfigFromFlags("", env(t, "SHEEPFOLD_E2E_KUBECONFIG"))
	if err != nil {
		t.Fatal(err)
	}
	cs, ns, _ := setup(t)
	ctx := context.Background()

	dsn := pgtest.New(t)
	key := newKey(t, bin, t.TempDir(), dsn, "--name", "in-cluster")
	const nodeA = "10.88.1.1" // cluster.sh's node a: its bridge, in the API server's certificate
	api, err := url.Parse(rc.Host)
	if err != nil {
		t.Fatal(err)
	}
	apiRelay, cutAPI := relay(t, nodeA, "tcp", api.Host)
	pg, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pgRelay, _ := relay(t, nodeA, "unix", filepath.Join(pg.Query().Get("host"), ".s.PGSQL.5432"))
	podDSN := fmt.Sprintf("postgres://%s@%s%s?sslmode=disable", pg.Query().Get("user"), pgRelay, pg.Path)
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "sheepfold-database"},
		StringData: map[string]string{"url": podDSN},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	keys, err := secrets.NewKeyLine("k1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "sheepfold-secrets"},
		StringData: map[string]string{"keys": keys},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	var selector string
	replicas := int32(0)
	for _, obj := range decodeManifest(t, serverManifest) {
		var err error
		switch o := obj.(type) {
		case *appsv1.Deployment:
			o.Namespace = ns
			selector = metav1.FormatLabelSelector(o.Spec.Selector)
			replicas = *o.Spec.Replicas
			deployHere(t, &o.Spec.Template.Spec, ns, image, serverImage, apiRelay)
			_, err = cs.AppsV1().Deployments(ns).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.Service:
			o.Namespace = ns
			_, err = cs.CoreV1().Services(ns).Create(ctx, o, metav1.CreateOptions{})
		case *policyv1.PodDisruptionBudget:
			o.Namespace = ns
			_, err = cs.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("%s: unexpected %T", serverManifest, obj)
		}
		if err != nil {
			t.Fatalf("%s: %v", serverManifest, err)
		}
	}
	if replicas < 2 {
		t.Fatalf("%s: %d replicas; the test needs two", serverManifest, replicas)
	}
	start := time.Now()
	pods := waitReady(t, cs, ns, selector, int(replicas))
	t.Logf("the Deployment's %d replicas Ready in %v on %v", replicas, time.Since(start).Round(time.Millisecond), nodesOf(pods))
	a := &server{url: "http://" + net.JoinHostPort(pods[0].Status.PodIP, "8080"), key: key}
	b := &server{url: "http://" + net.JoinHostPort(pods[1].Status.PodIP, "8080"), key: key}

	start = time.Now()
	code, body := a.do(t, "POST", "/v1/sandboxes", map[string]any{"template": "python"})
	if code != 201 {
		logServers(t, cs, ns, pods)
		t.Fatalf("create through replica %s: %d %s", pods[0].Name, code, body)
	}
	id := jsonField(t, body, "id")
	code, body = b.do(t, "POST", "/v1/sandboxes/"+id+"/execute", map[string]any{"code": "import os; print('in the cluster as', os.getuid())", "language": "python"})
	if code != 200 || !strings.Contains(string(body), `"stdout":"in the cluster as 1000\n"`) {
		logServers(t, cs, ns, pods)
		t.Fatalf("execute through replica %s: %d %s", pods[1].Name, code, body)
	}
	t.Logf("created through one replica, first result through the other in %v", time.Since(start).Round(time.Millisecond))
	if code, body := b.do(t, "DELETE", "/v1/sandboxes/"+id, nil); code != 204 {
		t.Fatalf("kill: %d %s", code, body)
	}
	waitGone(t, cs, ns, "sheepfold.dev/sandbox="+id)

	// The cluster out of reach: both replicas' /readyz say so, and the
	// kubelets' probes take them out of the Service.
	cutAPI()
	start = time.Now()
	for _, p := range pods {
		waitStatus(t, "http://"+net.JoinHostPort(p.Status.PodIP, "8080")+"/readyz", http.StatusServiceUnavailable)
	}
	t.Logf("the API server out of the replicas' reach: /readyz 503 on both in %v", time.Since(start).Round(time.Millisecond))
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
		l, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err == nil && len(l.Items) > 0 && !slices.ContainsFunc(l.Items, podReady) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("server Pods still Ready a minute after their /readyz failed")
		}
	}
	t.Logf("both server Pods not Ready %v after the API server went", time.Since(start).Round(time.Millisecond))
}

// podReady reports whether p is Ready.
func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitStatus waits up to 30 s until a GET of url answers status.
func waitStatus(t *testing.T, url string, status int) {
	t.Helper()
	last := "no answer"
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		res, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
		if err != nil {
			last = err.Error()
			continue
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode == status {
			return
		}
		last = fmt.Sprintf("%d %s", res.StatusCode, b)
	}
	t.Fatalf("GET %s: %s after 30 s, want %d", url, last, status)
}

// deployHere adapts the manifest's Pod to the test cluster: namespace ns,
// the images imported into its nodes, no warm Pods (TestSandboxesAsPods
// covers them), and the API server at the relay apiRelay.
func deployHere(t *testing.T, spec *corev1.PodSpec, ns, image, serverImage, apiRelay string) {
	t.Helper()
	c := &spec.Containers[0]
	c.Image, c.ImagePullPolicy = serverImage, corev1.PullNever
	set := map[string]string{"--kubernetes-namespace=": ns, "--kubernetes-image=": "python=" + image}
	for i, a := range c.Args {
		for flag, v := range set {
			if strings.HasPrefix(a, flag) {
				c.Args[i] = flag + v
				delete(set, flag)
			}
		}
	}
	if len(set) > 0 {
		t.Fatalf("%s: the server's args %q lack %v", serverManifest, c.Args, set)
	}
	c.Args = append(c.Args, "--pool=0")
	host, port, _ := net.SplitHostPort(apiRelay)
	c.Env = append(c.Env, corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: host}, corev1.EnvVar{Name: "KUBERNETES_SERVICE_PORT", Value: port})
}

// waitReady waits until n Pods match selector and are Ready, and returns
// them.
func waitReady(t *testing.T, cs kubernetes.Interface, ns, selector string, n int) []corev1.Pod {
	t.Helper()
	var ready []corev1.Pod
	var last *corev1.PodList
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		l, err := cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			continue
		}
		last, ready = l, ready[:0]
		for _, p := range l.Items {
			if podReady(p) && p.DeletionTimestamp == nil {
				ready = append(ready, p)
			}
		}
		if len(ready) >= n {
			return ready[:n]
		}
	}
	if last != nil {
		logServers(t, cs, ns, last.Items)
	}
	t.Fatalf("%d of %d server Pods Ready after 3 minutes", len(ready), n)
	return nil
}

// logServers logs each server Pod's status and log.
func logServers(t *testing.T, cs kubernetes.Interface, ns string, pods []corev1.Pod) {
	t.Helper()
	for _, p := range pods {
		t.Logf("server Pod %s on %s: %s %+v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.ContainerStatuses)
		if b, err := cs.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{TailLines: new(int64(60))}).DoRaw(context.Background()); err == nil {
			t.Logf("its log:\n%s", b)
		}
	}
}

func nodesOf(pods []corev1.Pod) []string {
	var nodes []string
	for _, p := range pods {
		nodes = append(nodes, p.Spec.NodeName)
	}
	return nodes
}

// relay listens on host (any port) and copies each connection to and
// from a new connection to addr on network; it stops, closing every
// connection, when the test ends or stop is called. It returns the
// address it listens on and stop.
func relay(t *testing.T, host, network, addr string) (string, func()) {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	closed := false
	var wg sync.WaitGroup
	stop := sync.OnceFunc(func() {
		l.Close()
		mu.Lock()
		closed = true
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	t.Cleanup(stop)
	wg.Go(func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial(network, addr)
			if err != nil {
				in.Close()
				continue
			}
			mu.Lock()
			if closed {
				mu.Unlock()
				in.Close()
				out.Close()
				return
			}
			conns = append(conns, in, out)
			mu.Unlock()
			wg.Go(func() { io.Copy(out, in); out.Close(); in.Close() })
			wg.Go(func() { io.Copy(in, out); in.Close(); out.Close() })
		}
	})
	return l.Addr().String(), stop
}
