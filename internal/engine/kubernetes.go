package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/sheepfold/sheepfold/internal/agenttls"
	"github.com/sheepfold/sheepfold/internal/runtime/kubernetes"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// KubernetesOptions open the Kubernetes backend.
type KubernetesOptions struct {
	// Kubeconfig is the path of a kubeconfig file; "" uses the Pod's
	// in-cluster service account.
	Kubeconfig string
	// Config is the runtime's (its CA and Client are made here: the
	// authority is the deployment's, in a Secret of the namespace).
	Config kubernetes.Config
	// PortForward reaches agents through the API server's port-forward
	// instead of Pod IPs (a server outside the cluster's network).
	PortForward bool
	// QPS and Burst bound this replica's requests to the API server: a
	// sustained rate, and how many may go at once above it.
	QPS   float32
	Burst int
	// Log, when set, is told of requests that waited on that bound or
	// took long to answer.
	Log *slog.Logger
}

// Default client bounds. client-go's own (5 a second, bursts of 10)
// throttle a replica well below its load: a create makes three
// objects and watches its Pod, a kill deletes three, and the warm pool
// refills; at 12,000 sandboxes an hour that is over 20 requests a
// second.
const (
	DefaultQPS   = 50
	DefaultBurst = 100
)

// Requests that wait longer than slowWait for the client's bound, or
// take longer than slowRequest to answer, are logged.
var (
	slowWait    = 250 * time.Millisecond
	slowRequest = 2 * time.Second
)

// RESTConfig loads the cluster's client configuration, with this
// replica's request bounds.
func (o KubernetesOptions) RESTConfig() (*rest.Config, error) {
	var c *rest.Config
	var err error
	if o.Kubeconfig == "" {
		if c, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("kubernetes: not in a cluster and no --kubeconfig: %w", err)
		}
	} else if c, err = clientcmd.BuildConfigFromFlags("", o.Kubeconfig); err != nil {
		return nil, fmt.Errorf("kubernetes: --kubeconfig %s: %w", o.Kubeconfig, err)
	}
	qps, burst := o.QPS, o.Burst
	if qps == 0 {
		qps = DefaultQPS
	}
	if burst == 0 {
		burst = DefaultBurst
	}
	if qps < 0 || burst < 1 {
		return nil, fmt.Errorf("kubernetes: the API request bounds must be positive: %g a second, bursts of %d", qps, burst)
	}
	c.QPS, c.Burst = qps, burst
	c.RateLimiter = &loggedLimiter{RateLimiter: flowcontrol.NewTokenBucketRateLimiter(qps, burst), log: o.Log}
	if o.Log != nil {
		c.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &loggedTransport{rt: rt, log: o.Log} })
	}
	return c, nil
}

// loggedLimiter logs the requests that waited long for a token.
type loggedLimiter struct {
	flowcontrol.RateLimiter
	log *slog.Logger
}

func (l *loggedLimiter) Wait(ctx context.Context) error {
	start := time.Now()
	err := l.RateLimiter.Wait(ctx)
	if d := time.Since(start); d > slowWait && l.log != nil {
		l.log.Warn("kubernetes API request throttled by this replica's bound (--kubernetes-api-qps, --kubernetes-api-burst)",
			"waited", d, "qps", l.QPS())
	}
	return err
}

// loggedTransport logs the API requests that took long to answer
// (headers; a watch's or a port-forward's stream is not timed).
type loggedTransport struct {
	rt  http.RoundTripper
	log *slog.Logger
}

func (t *loggedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := t.rt.RoundTrip(req)
	if d := time.Since(start); d > slowRequest {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.log.Warn("slow kubernetes API request", "method", req.Method, "path", req.URL.Path, "status", status, "took", d, "err", err)
	}
	return resp, err
}

// OpenKubernetes starts the sandbox manager over the Kubernetes backend:
// every sandbox a Pod (internal/runtime/kubernetes).
func OpenKubernetes(ctx context.Context, ko KubernetesOptions, idle time.Duration, log *slog.Logger,
	opts ...func(*sandbox.Config)) (*Engine, *kubernetes.Runtime, error) {
	if len(ko.Config.Images) == 0 {
		return nil, nil, errors.New("kubernetes: no template has an image (--kubernetes-image python=IMAGE, from sheepfold template export)")
	}
	if ko.Log == nil {
		ko.Log = log
	}
	rc, err := ko.RESTConfig()
	if err != nil {
		return nil, nil, err
	}
	cs, err := k8s.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes: %w", err)
	}
	cfg := ko.Config
	if ko.PortForward {
		cfg.PortForward = rc
	}
	if cfg.Instance == "" {
		cfg.Instance = kubernetes.DefaultInstance
	}
	if cfg.CA, err = kubernetes.LoadCA(ctx, cs, cfg.Namespace, cfg.Instance); err != nil {
		return nil, nil, err
	}
	cred, err := cfg.CA.IssueServer(time.Now())
	if err != nil {
		return nil, nil, err
	}
	if cfg.Client, err = agenttls.NewClient(cred, cfg.CA.CertPEM); err != nil {
		return nil, nil, err
	}
	rt, err := kubernetes.New(cs, cfg)
	if err != nil {
		return nil, nil, err
	}
	if err := rt.Ready(ctx); err != nil {
		return nil, nil, err
	}
	// Pods outlive this server, and every replica serves every one.
	opts = append(opts, func(c *sandbox.Config) { c.Shared = true })
	eng, err := open(ctx, rt, sandbox.TemplatesFunc(func(name string) (string, error) {
		if !rt.HasTemplate(name) {
			return "", fmt.Errorf("no image for template %q in this cluster", name)
		}
		return "", nil // the runtime maps the name to its image
	}), idle, log, opts)
	if err != nil {
		return nil, nil, err
	}
	return eng, rt, nil
}
