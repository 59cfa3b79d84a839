// Package nri is the node's half of a Kubernetes sandbox's pids limit: a
// plugin of the container runtime's Node Resource Interface (NRI, in
// containerd 2 and CRI-O; `sheepfold nri-plugin`, a DaemonSet in
// deploy/kubernetes/nri.yaml) that gives every container of a Pod
// annotated kubernetes.AnnotationPids=N a pids cgroup limit of N.
//
// Kubernetes has no pids limit per Pod or container: only the kubelet's
// podPidsLimit, one number for every Pod of a node. An RLIMIT_NPROC
// bounds one uid's tasks, and root in a sandbox may take any of the
// Pod's 65,536 uids. A container's pids.max counts every task of the
// container whatever its uid, as the local engine's sandbox cgroup does,
// and the container sees it read-only. The runtime asks each plugin
// before it creates a container; this one answers with the limit (a
// ContainerAdjustment), which the runtime writes into the container's
// OCI spec and runc into its cgroup. A Pod without the annotation is
// left alone; one whose annotation is not a positive number is refused
// (its container is not created). The sandbox's agent checks the limit
// before it serves (agent.CheckPidsMax), so a node without the plugin
// fails the Pod instead of running it unbounded.
//
// # Why
//
// A Pod has no pids limit of its own in Kubernetes (the kubelet's
// podPidsLimit is one number for every Pod of a node), and a per-uid
// RLIMIT_NPROC does not bound a sandbox: its root may take any of the Pod's
// 65,536 uids. The runtime puts the sandbox's limit on the Pod as the
// annotation `sheepfold.dev/pids-max`, and internal/runtime/kubernetes/nri,
// a plugin of the container runtime's NRI (`sheepfold nri-plugin`, the
// DaemonSet of deploy/kubernetes/nri.yaml, connected to each node's
// containerd or CRI-O), answers each CreateContainer of such a Pod with
// that pids limit, which the runtime writes into the container's OCI spec
// and runc into its cgroup: the container's pids.max, over all its tasks
// whatever their uid, as the local engine's sandbox cgroup. The agent,
// given `--pids-max`, reads its own cgroup's pids.max before it listens
// and exits when it is not the limit (agent/pidsmax.go), so a node without
// the plugin fails the Pod, and the create says why. The agent's
// `--nproc` (agent/nproc.go) is no longer used. gVisor Pods
// (Config.NodePidsRuntimes) get no check: runsc applies no container's
// pids limit on the host, and their tasks' host threads and stubs count in
// the Pod's cgroup, which only the kubelet's podPidsLimit bounds.
//
// Imports: internal/runtime/kubernetes (the annotation), internal/backoff
// (the reconnect's wait), the NRI stub (github.com/containerd/nri, the
// runtime's own protocol library) and the standard library.
package nri

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"

	"github.com/sheepfold/sheepfold/internal/backoff"
	"github.com/sheepfold/sheepfold/internal/runtime/kubernetes"
)

// Name and Index are how the plugin registers with the runtime (plugins
// are asked in the order of their indexes).
const (
	Name  = "sheepfold-pids"
	Index = "50"
)

// DefaultSocket is where containerd and CRI-O listen for NRI plugins.
const DefaultSocket = api.DefaultSocketPath

// Plugin sets the pids limit of annotated Pods' containers.
type Plugin struct {
	log *slog.Logger
}

var (
	_ stub.ConfigureInterface       = (*Plugin)(nil)
	_ stub.CreateContainerInterface = (*Plugin)(nil)
)

// Configure implements stub.ConfigureInterface: the runtime took the
// plugin (logged, which is how one knows), for the events it implements.
func (p *Plugin) Configure(_ context.Context, _, runtime, version string) (api.EventMask, error) {
	p.log.Info("registered with the runtime", "runtime", runtime, "version", version)
	return 0, nil
}

// CreateContainer implements stub.CreateContainerInterface: the Pod's
// pids limit as the container's, or an error (the container is not
// created) for an annotation that is not a limit.
func (p *Plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	n, err := kubernetes.PodPids(pod.GetAnnotations())
	if err != nil {
		return nil, nil, fmt.Errorf("sheepfold nri: pod %s/%s: %w", pod.GetNamespace(), pod.GetName(), err)
	}
	if n == 0 {
		return nil, nil, nil
	}
	adj := &api.ContainerAdjustment{}
	adj.SetLinuxPidLimits(n)
	p.log.Info("pids limit", "pod", pod.GetNamespace()+"/"+pod.GetName(), "container", ctr.GetName(), "pids_max", n)
	return adj, nil, nil
}

// retry is how long, at most, Run waits before it connects again: a
// restarted runtime is rejoined within it, as containers it creates
// meanwhile get no pids limit (and their agents refuse to serve). The
// wait is jittered (internal/backoff), not doubled.
const retry = time.Second

// Run serves the runtime listening at socket until ctx ends, connecting
// again (within each second) when the runtime is not there yet or restarts.
// Started by the runtime itself (a pre-installed plugin, its connection
// in the environment), it uses that connection instead.
func Run(ctx context.Context, socket string, log *slog.Logger) error {
	p := &Plugin{log: log}
	wait := backoff.Backoff{Base: retry, Max: retry}
	for {
		s, err := stub.New(p, stub.WithPluginName(Name), stub.WithPluginIdx(Index), stub.WithSocketPath(socket))
		if err != nil {
			return fmt.Errorf("sheepfold nri: %w", err)
		}
		err = s.Run(ctx)
		if ctx.Err() != nil {
			return nil
		}
		log.Warn("the runtime's NRI connection ended; connecting again", "socket", socket, "err", err)
		if !wait.Wait(ctx) {
			return nil
		}
	}
}
