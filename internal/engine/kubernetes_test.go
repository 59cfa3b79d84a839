package engine

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/sheepfold/sheepfold/internal/testutil"
)

// apiServer answers every request with an empty PodList, after delay.
func apiServer(t *testing.T, delay time.Duration) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(delay)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[]}`))
	}))
	t.Cleanup(srv.Close)
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: " + srv.URL +
		"\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user:\n    token: t\ncurrent-context: c\n"
	if err := os.WriteFile(kc, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return kc
}

func listPods(t *testing.T, o KubernetesOptions, n int) {
	t.Helper()
	rc, err := o.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	cs, err := k8s.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		if _, err := cs.CoreV1().Pods("ns").List(context.Background(), metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRESTConfigBounds(t *testing.T) {
	kc := apiServer(t, 0)
	rc, err := KubernetesOptions{Kubeconfig: kc}.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	if rc.QPS != DefaultQPS || rc.Burst != DefaultBurst || rc.RateLimiter.QPS() != DefaultQPS {
		t.Errorf("default bounds: qps %g burst %d limiter %g, want %d, %d", rc.QPS, rc.Burst, rc.RateLimiter.QPS(), DefaultQPS, DefaultBurst)
	}
	for _, o := range []KubernetesOptions{{QPS: -1}, {Burst: -1}} {
		o.Kubeconfig = kc
		if _, err := o.RESTConfig(); err == nil || !strings.Contains(err.Error(), "must be positive") {
			t.Errorf("qps %g burst %d: %v, want refused", o.QPS, o.Burst, err)
		}
	}

	// Three requests at 4 a second with no burst: the last two wait
	// about 250 ms each for a token; waits are logged over slowWait.
	defer func(w time.Duration) { slowWait = w }(slowWait)
	slowWait = 100 * time.Millisecond
	var logs testutil.Buffer
	start := time.Now()
	listPods(t, KubernetesOptions{Kubeconfig: kc, QPS: 4, Burst: 1, Log: slog.New(slog.NewTextHandler(&logs, nil))}, 3)
	if d := time.Since(start); d < 400*time.Millisecond {
		t.Errorf("3 requests at 4 a second took %v: the bound was not applied", d)
	}
	if n := strings.Count(logs.String(), "throttled"); n != 2 {
		t.Errorf("%d throttled requests logged, want 2:\n%s", n, logs.String())
	}
}

func TestRESTConfigLogsSlowRequests(t *testing.T) {
	defer func(d time.Duration) { slowRequest = d }(slowRequest)
	// A second: a loopback request to the fake API server took 102 ms on
	// a loaded host, past a 50 ms bound, and was logged as slow.
	slowRequest = time.Second
	var logs testutil.Buffer
	listPods(t, KubernetesOptions{Kubeconfig: apiServer(t, 0), Log: slog.New(slog.NewTextHandler(&logs, nil))}, 2)
	if strings.Contains(logs.String(), "slow") {
		t.Fatalf("fast requests logged:\n%s", logs.String())
	}
	listPods(t, KubernetesOptions{Kubeconfig: apiServer(t, 1500*time.Millisecond), Log: slog.New(slog.NewTextHandler(&logs, nil))}, 1)
	if l := logs.String(); !strings.Contains(l, "slow kubernetes API request") || !strings.Contains(l, "path=/api/v1/namespaces/ns/pods") || !strings.Contains(l, "status=200") {
		t.Fatalf("a slow request is not logged with its path and status:\n%s", l)
	}
}
