package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

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
}

// RESTConfig loads the cluster's client configuration.
func (o KubernetesOptions) RESTConfig() (*rest.Config, error) {
	if o.Kubeconfig == "" {
		c, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes: not in a cluster and no --kubeconfig: %w", err)
		}
		return c, nil
	}
	c, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: --kubeconfig %s: %w", o.Kubeconfig, err)
	}
	return c, nil
}

// OpenKubernetes starts the sandbox manager over the Kubernetes backend:
// every sandbox a Pod (internal/runtime/kubernetes).
func OpenKubernetes(ctx context.Context, ko KubernetesOptions, idle time.Duration, log *slog.Logger,
	opts ...func(*sandbox.Config)) (*Engine, *kubernetes.Runtime, error) {
	if len(ko.Config.Images) == 0 {
		return nil, nil, errors.New("kubernetes: no template has an image (--kubernetes-image python=IMAGE, from sheepfold template export)")
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
