//go:build linux

// Package kubernetes runs sandboxes as Pods of a Kubernetes cluster: the
// runtime.Runtime of `serve --backend kubernetes`.
//
// Each sandbox is three objects in one namespace, all labelled with the
// sandbox's id and the deployment's instance name:
//
//   - a NetworkPolicy, made first, that denies the sandbox's Pod every
//     egress and admits ingress only to the agent's port (from the server's
//     Pods when their labels are configured); the Pod's init container
//     netlock says the same in the Pod's own network namespace (nftables),
//     which holds where the CNI plugin enforces no NetworkPolicy;
//   - a Secret with the agent's credential (package agenttls): its own
//     certificate and key, and the authority's certificate;
//   - the Pod: the template's image (sheepfold template export), our agent
//     as pid 1 listening on TCP with TLS, the sandbox's limits as requests
//     and limits, the RuntimeClass configured (runc, gVisor...) or the
//     one the sandbox chose among those offered (Config.RuntimeClasses), and a
//     security context as strict as the local engine's: no privilege
//     escalation (no_new_privs), every capability dropped but the agent's
//     own seven (which it empties from the bounding set of user code),
//     the local engine's seccomp profile (a Localhost profile on each
//     node; RuntimeDefault where asked), and a user namespace (hostUsers:
//     false) unless turned off for clusters without them. The agent's
//     own directory (its binary, which it executes again) is the image's,
//     mounted read-only (an image volume), so that root in the sandbox
//     cannot replace it. The sandbox's pids limit is an annotation
//     (AnnotationPids) that the node's NRI plugin (package nri) makes the
//     pids.max of the Pod's containers: one bound on all of the
//     sandbox's tasks whatever their uid, which the agent checks before
//     anything runs (a node without the plugin fails the Pod).
//
// The agent starts with the sandbox's lifetime (runtime.Spec.Lifetime,
// `--lifetime`: a warm pool member's lease, a sandbox's timeout), which
// its init keeps until a ping replaces it: a Pod whose server died after
// posting it, before the first ping, still ends (its Pod then fails and a
// collector deletes its objects), where it would otherwise run with no
// deadline, a warm pool member spared by every collector for ever. A Pod
// whose agent never started (still Pending past StartTimeout, when every
// create has given up on it) is reported ended by Inventory for the same
// reason.
//
// The server dials the agent at the Pod's IP; the handshake proves both
// ends (the agent's certificate names its sandbox, so a reused Pod IP
// never reaches another sandbox).
//
// Deleting a sandbox deletes the three objects; List finds every object
// of the instance, so that a garbage collector can remove those whose
// record is gone.
//
// Persistent volumes (runtime.Volumes) are PersistentVolumeClaims of
// Config.StorageClass, one per volume and labelled with its id
// (LabelVolume), which no sandbox's deletion or collection touches; a
// sandbox's Pod mounts its volumes' claims at their paths, read-only
// where asked, and its agent gives the root of each read-write one to the
// user before it serves (volumes.go).
//
// # Pods, egress and trust
//
// internal/runtime/kubernetes is a runtime.Runtime whose sandboxes are Pods
// (README, "Run on Kubernetes"). Create makes a NetworkPolicy (first: no
// moment without it), a Secret with the agent's credential and the Pod, then
// watches the Pod until it runs with an IP, failing at once on a reason no
// wait mends (ErrImageNeverPull, CreateContainerError...) and deleting all
// three on any failure. The agent runs `init --listen-tcp :49983 --tls-dir
// /.sheepfold-tls --pids-max <Limits.Pids>` from the image's own
// /.sheepfold, which the Pod mounts read-only over the container's writable
// root (an image volume of the same image, sub-path .sheepfold: the binary
// the agent executes again for its helpers and the home seed; the Secret
// sits beside it, as nothing can be mounted inside); the host's agent client dials through
// runtime.Instance.Dial instead of a unix socket, and nothing else in the
// engine changed. Egress: the runtime is a runtime.EgressProxy, so a
// sandbox whose policy allows a network gets runtime.Network{Proxy: true}
// instead of a TUN: the agent listens on runtime.ProxyAddr
// (127.0.0.1:3128, `--egress-listen`), the Pod's environment names it as
// HTTP(S)_PROXY (that port is the sandbox's own: Sandbox.DialPort refuses
// it with ErrEgressPort on such a runtime, so no preview reaches it), and
// the runtime keeps four `egress.accept` requests waiting
// (runtime/kubernetes/egress.go: its own goroutines, which its Close waits
// for; the engine only hands it the sandbox's gateway through
// runtime.EgressProxy.ServeEgress, sandbox/egress.go); each returns once
// the code connects, and the raw stream goes to egress.Gateway.ServeProxy (egress/proxy_linux.go), which
// reads the CONNECT or absolute-form request, resolves the name as the
// sandbox's DNS question would be answered, decides the address with
// checkConn and carries the connection as a flow of the TUN path's kind
// (every request judged, SNI and Host checks, network_requests, the flow
// cap, idle timeout, byte counts and rate, closed by a tightened policy). Which layer guarantees what for a Pod:
// against code that ignores the proxy, the Pod's own firewall (the init
// container netlock runs agent.LockNetwork: an nftables table `inet
// sheepfold` whose input and output chains drop all but the loopback,
// connections made to the agent's port and IPv6 neighbour discovery; TCP
// out is rejected so that connect fails at once) is the boundary on any
// cluster, and the NetworkPolicy (deny all egress) a second one where a CNI
// enforces it (the only one for gVisor Pods, whose netstack has no
// nftables: Config.OpenNetworkRuntimes); the init container holds
// CAP_NET_ADMIN and exits before the sandbox's container, which never has
// it, starts; the gateway in the server
// decides everything that goes out; the agent only relays bytes and is
// not trusted to decide. A waiting accept is not activity (the idle stop
// ignores it). Replicas that adopt the sandbox run their own gateway and
// pumps from the recorded policy, which is why a shared sandbox's network
// rules cannot change after create. The budgets that must hold across
// those replicas live in the agent, which all of them reach
// (agent/budget.go, `budget.take`; sandbox/agentbudget.go): every gateway
// takes each request from the agent's `network_requests` total
// (egress.Gateway.ShareBudget), every replica each execution from its
// `rate_limiting` bucket; a take that fails refuses, and an agent older
// than the op leaves each replica counting alone. The agent keeps only the
// count (the gateway still decides), out of the code's reach: the code,
// root in the sandbox included, has no capability, so it cannot trace the
// agent or write its memory (the agent's capabilities are not a subset of
// its own), and an agent that dies ends the sandbox, budget and all. internal/agenttls is the trust: one authority per
// deployment (a Secret, made by the first server, read by the others),
// per-sandbox agent certificates (server-auth only, named
// `<id>.agent.sheepfold`), a server certificate (client-auth only); TLS 1.3
// with session resumption. The seccomp profile is the local engine's
// (`sheepfold seccomp-profile`, a Localhost profile on the nodes), because
// RuntimeDefault refuses the unshare(CLONE_FS) the agent gives each kernel.
// engine.OpenKubernetes loads the kubeconfig or the in-cluster account; the
// engine's manager, pool, policies and records are those of the local
// backend.
//
// # Usage, disk and bounds
//
// A Pod's usage (metrics, metering, the idle stop, OOM and pids reports)
// comes from its agent: the runtime's Usage says ErrUnsupported (the
// cgroup is on the node), and the engine's one reader (sandbox/usage.go)
// then sends the agent a `usage` op, which reads its container's own
// cgroup: v2 through the cgroup namespace at /sys/fs/cgroup, v1 at the
// per-controller mounts runc binds to the container's directories
// (agent/usage.go). The local engine never asks the agent. What is trusted:
// the figures are the kernel's counters, read by our agent (uid 0 of the
// Pod's user namespace, non-dumpable); user code runs as uid 1000 with no
// capabilities, and even the sandbox's root has no CAP_SYS_ADMIN or
// CAP_SYS_PTRACE, so nothing in the sandbox can remount or mount over the
// read-only /sys/fs/cgroup (whose counters are the kernel's anyway) or
// reach into the agent to change its answer. A Pod's disk is a
// memory-backed emptyDir of the disk size (charged to the Pod's memory,
// whose limit and request are memory plus disk, so full is ENOSPC, not an
// OOM kill: runtime.DiskMemory), mounted over the home
// and /tmp as two sub-directories of one volume; the agent reports its
// statfs. As the volume hides the image's home, `template export` puts the
// template's home in the image as a tar archive (/.sheepfold/home.tar,
// internal/homeseed), which the agent unpacks into the empty volume, owned
// by the user, before it serves (agent/scratch_linux.go: the dotfiles and
// matplotlib's font cache, seconds to rebuild). Writes elsewhere (root's
// apt, /var) go to the container's writable layer on the node, bounded by
// the Pod's ephemeral-storage limit (the kubelet evicts) and not counted in
// the disk figures. Not measured for Pods: an execution's CPU time on the whole cgroup (the agent
// counts its interpreter and waited-for children, RLIMIT_CPU the backstop;
// sandbox/cpu.go), and an OOM kill of the agent itself (the sandbox then
// stopped "unexpectedly"). Each reading is one agent call (a TLS
// connection, resumed): metering's sample every second per sandbox, and
// one more per execution for the OOM count. The meter holds no lock across
// a reading, reads at most 16 sandboxes at once and gives each reading 2 s:
// an agent that does not answer (its Pod deleted by another replica, its
// node lost) delays its own sandbox's sample, never a create, a kill or
// another sandbox's sample (before, one such agent held every create and
// kill of its replica for up to 30 s). The idle loop likewise checks 16
// sandboxes at once, each check bounded to 2 s. A dial through port-forward is
// bounded by its caller's context too (a stream of a Pod that is gone is
// otherwise left to the connection's 30 s timeout). Each replica's client
// of the API server sends at most `--kubernetes-api-qps` requests a second
// (50) in bursts of `--kubernetes-api-burst` (100), not client-go's 5 and
// 10, which a busy replica exceeds (a create makes three objects and
// watches its Pod, a kill deletes three); waits over 250 ms for that
// bound, API requests slower than 2 s and agent connections slower than
// 1 s are logged as warnings.
//
// Imports: internal/runtime (its interfaces, and the egress proxy's
// address and environment), internal/runtime/oci (the agent's path,
// capabilities and rlimits), internal/agenttls, internal/agentproto and
// internal/backoff (fetching a Pod's egress connections, egress.go),
// client-go and the standard library.
package kubernetes

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/sheepfold/sheepfold/internal/agenttls"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/runtime/oci"
)

// Labels on every object of a sandbox.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	managedBy      = "sheepfold"
	LabelSandbox   = "sheepfold.dev/sandbox"
	LabelInstance  = "sheepfold.dev/instance"
	// LabelPool marks the Pod of a warm pool member ("true"); it stays
	// when the member is handed out (its record then tells them apart).
	LabelPool = "sheepfold.dev/pool"
	// LabelAttendant marks the Pod of a volume's attendant ("true",
	// runtime.Spec.Attendant), and AnnotationLifetime is its lifetime (a
	// Go duration): the collectors of every replica leave it be until
	// its creation plus that (runtime.Held.Until).
	LabelAttendant     = "sheepfold.dev/attendant"
	AnnotationLifetime = "sheepfold.dev/lifetime"
)

// Defaults of Config.
const (
	DefaultAgentPort      = 49983
	DefaultInstance       = "sheepfold"
	DefaultStartTimeout   = 2 * time.Minute
	DefaultKubeletTimeout = 15 * time.Second
	DefaultMaxLifetime    = 30 * 24 * time.Hour
	DefaultCPURequest     = 0.1
	DefaultGPUResource    = "nvidia.com/gpu"
	// DefaultSeccompProfile is where operators put the agent's profile
	// on each node (/var/lib/kubelet/seccomp/ by default).
	DefaultSeccompProfile = "sheepfold/agent.json"
)

// tlsDir is where the Pod mounts its Secret: beside the agent's
// directory, which is a read-only image volume with no mount point in it.
const tlsDir = "/.sheepfold-tls"

// agentDir is the directory of the agent's binary and the home seed in
// an exported image (oci.AgentPath, oci.HomeSeedPath), which the Pod
// mounts read-only over itself from the image (an image volume): root in
// the sandbox cannot replace the binary the agent executes again (its
// helpers), nor rename the directory (a mount point).
const agentDir = "/.sheepfold"

// AnnotationPids, on a sandbox's Pod, is its pids limit: the node's NRI
// plugin (package nri, `sheepfold nri-plugin`) makes it the pids.max of
// each of the Pod's containers, and the agent refuses to start in a
// container whose pids.max is not that (--pids-max).
const AnnotationPids = "sheepfold.dev/pids-max"

// PodPids returns the pids limit a Pod's annotations ask for (0 and no
// error when they ask none), or why the annotation is not a limit.
func PodPids(annotations map[string]string) (int64, error) {
	v, ok := annotations[AnnotationPids]
	if !ok {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("annotation %s=%q is not a positive number of tasks", AnnotationPids, v)
	}
	return n, nil
}

// container is the name of the sandbox's container in its Pod, and
// netlockContainer that of the init container that closes its network.
const (
	container        = "sandbox"
	netlockContainer = "netlock"
)

// Config says where and how sandboxes run. Zero fields take the defaults
// in brackets.
type Config struct {
	// Namespace holds the sandboxes' objects (required).
	Namespace string
	// Instance names this Sheepfold deployment; every replica of it
	// shares it, and only its objects are listed and collected
	// [DefaultInstance].
	Instance string
	// Images maps each template to its image (sheepfold template export).
	Images map[string]string
	// RuntimeClass is the Pods' RuntimeClass; "" the cluster's default.
	RuntimeClass string
	// RuntimeClasses are the runtimes a sandbox may choose
	// (runtime.Spec.Runtime), each name mapped to its RuntimeClass, e.g.
	// gvisor → gvisor, runc → runc. A sandbox that chooses none gets
	// RuntimeClass.
	RuntimeClasses map[string]string
	// HostUsers runs Pods in the host's user namespace; the default
	// (false) asks for a user namespace per Pod, which the cluster must
	// support (Kubernetes 1.33+, containerd 2, a kernel with idmapped
	// mounts on the node's filesystems).
	HostUsers bool
	// HostUsersRuntimes are runtimes (names a create may choose, or
	// RuntimeClasses) whose Pods run in the host's user namespace
	// whatever HostUsers says: gVisor's runsc cannot join a Pod's user
	// namespace (its gofer fails to enter it: "error setting namespace of
	// type user"), and its own kernel is the boundary there.
	HostUsersRuntimes []string
	// OpenNetwork leaves a Pod's network to its NetworkPolicy alone. By
	// default an init container (the agent's netlock, with CAP_NET_ADMIN
	// and nothing else) first closes the Pod's network namespace to all
	// but the agent's port (agent.LockNetwork), whether or not the
	// cluster's CNI enforces NetworkPolicies. For clusters that enforce
	// them and whose Pod Security admission refuses NET_ADMIN.
	OpenNetwork bool
	// OpenNetworkRuntimes are runtimes (as HostUsersRuntimes) whose
	// Pods get no netlock whatever OpenNetwork says, their NetworkPolicy
	// alone closing them: gVisor's netstack has no nftables outside its
	// tests (runsc's TESTONLY-nftables) and its iptables needs raw
	// sockets, so netlock cannot run there; its packets leave through the
	// Pod's namespace below any rule there, by a packet socket.
	OpenNetworkRuntimes []string
	// NodePidsRuntimes are runtimes (as HostUsersRuntimes) whose tasks
	// are not in their container's cgroup, so that the container's pids
	// limit does not bound them: gVisor's runsc applies no pids limit of
	// a container on the host (its tasks live in its own kernel, their
	// host threads and stubs in the Pod's cgroup). The node's
	// podPidsLimit alone bounds those Pods; their agent checks no limit.
	NodePidsRuntimes []string
	// StorageClass is the StorageClass of the volumes' claims
	// (volumes.go); "" the cluster's default.
	StorageClass string
	// VolumeAccessMode is the access mode of the volumes' claims
	// [DefaultVolumeAccessMode].
	VolumeAccessMode corev1.PersistentVolumeAccessMode
	// PullPolicy is the containers' image pull policy [IfNotPresent].
	PullPolicy corev1.PullPolicy
	// AgentPort is where each agent listens in its Pod [DefaultAgentPort].
	AgentPort int
	// CPURequest is the CPU a sandbox requests, in cores, at most its
	// limit: what the scheduler reserves for it [DefaultCPURequest].
	// Memory is requested as much as its limit.
	CPURequest float64
	// GPUResource is the extended resource a sandbox's GPUs are asked
	// for by (runtime.GPUScheduler) [DefaultGPUResource].
	GPUResource string
	// ServerPods, when set, are the labels of the server's Pods (in
	// Namespace): the only Pods let in to agents. Empty admits any
	// source on the agent's port, where TLS still refuses all but the
	// server (a server outside the cluster).
	ServerPods map[string]string
	// MaxLifetime is how long an agent's certificate is valid: the
	// longest a sandbox may live [DefaultMaxLifetime].
	MaxLifetime time.Duration
	// SeccompProfile is the Pods' Localhost seccomp profile, relative to
	// each node's kubelet seccomp directory: the JSON of `sheepfold
	// seccomp-profile` (the local engine's, which lets the agent give a
	// kernel a working directory of its own; RuntimeDefault refuses that,
	// and no code context starts). "RuntimeDefault" asks for the
	// runtime's default instead [DefaultSeccompProfile].
	SeccompProfile string
	// PortForward, when set, is how the server reaches agents: through
	// the API server's port-forward of each Pod, for a server outside the
	// cluster's network. Nil: at each Pod's IP (the server must reach the
	// pod network).
	PortForward *rest.Config
	// StartTimeout bounds a Pod's way to running [DefaultStartTimeout].
	StartTimeout time.Duration
	// KubeletTimeout is how long a Pod bound to a node may wait for the
	// node's kubelet to take it; past it the Pod is made again on
	// another node (a kubelet that died, its node not yet NotReady)
	// [DefaultKubeletTimeout].
	KubeletTimeout time.Duration
	// CA issues the agents' credentials, and Client is the server's side
	// (both required; every replica must have the same authority).
	CA     *agenttls.CA
	Client *agenttls.Client
}

// Runtime runs sandboxes as Pods.
type Runtime struct {
	cs  kubernetes.Interface
	cfg Config
	fwd *forwarder // nil unless Config.PortForward
	// egress are the goroutines of ServeEgress (egress.go), which Close
	// waits for.
	egress sync.WaitGroup
}

var (
	_ runtime.Runtime    = (*Runtime)(nil)
	_ runtime.Placer     = (*Runtime)(nil)
	_ runtime.DiskMemory = (*Runtime)(nil)
)

// New returns a runtime over the cluster of cs.
func New(cs kubernetes.Interface, cfg Config) (*Runtime, error) {
	if cfg.Namespace == "" {
		return nil, errors.New("kubernetes: a namespace is required")
	}
	if cfg.CA == nil || cfg.Client == nil {
		return nil, errors.New("kubernetes: the agents' authority and the server's credential are required")
	}
	if cfg.Instance == "" {
		cfg.Instance = DefaultInstance
	}
	if cfg.PullPolicy == "" {
		cfg.PullPolicy = corev1.PullIfNotPresent
	}
	if cfg.VolumeAccessMode == "" {
		cfg.VolumeAccessMode = DefaultVolumeAccessMode
	}
	if cfg.StorageClass != "" && !className.MatchString(cfg.StorageClass) {
		return nil, fmt.Errorf("kubernetes: StorageClass %q is not a valid object name", cfg.StorageClass)
	}
	switch cfg.VolumeAccessMode {
	case corev1.ReadWriteOnce, corev1.ReadWriteOncePod, corev1.ReadWriteMany:
	default:
		return nil, fmt.Errorf("kubernetes: volume access mode %q: ReadWriteOnce, ReadWriteOncePod or ReadWriteMany", cfg.VolumeAccessMode)
	}
	if cfg.AgentPort == 0 {
		cfg.AgentPort = DefaultAgentPort
	}
	if cfg.CPURequest == 0 {
		cfg.CPURequest = DefaultCPURequest
	}
	if cfg.GPUResource == "" {
		cfg.GPUResource = DefaultGPUResource
	}
	if cfg.MaxLifetime == 0 {
		cfg.MaxLifetime = DefaultMaxLifetime
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	if cfg.KubeletTimeout == 0 {
		cfg.KubeletTimeout = DefaultKubeletTimeout
	}
	if cfg.SeccompProfile == "" {
		cfg.SeccompProfile = DefaultSeccompProfile
	}
	if msgs := validLabel(cfg.Instance); msgs != "" {
		return nil, fmt.Errorf("kubernetes: instance %q: %s", cfg.Instance, msgs)
	}
	for name, class := range cfg.RuntimeClasses {
		if msgs := validLabel(name); msgs != "" {
			return nil, fmt.Errorf("kubernetes: runtime name %q: %s", name, msgs)
		}
		if !className.MatchString(class) {
			return nil, fmt.Errorf("kubernetes: runtime %q: RuntimeClass %q is not a valid object name", name, class)
		}
	}
	r := &Runtime{cs: cs, cfg: cfg}
	if cfg.PortForward != nil {
		r.fwd = newForwarder(cfg.PortForward, cfg.Namespace)
	}
	return r, nil
}

// className is a RuntimeClass's name: a DNS subdomain.
var className = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

var labelValue = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$`)

func validLabel(v string) string {
	if !labelValue.MatchString(v) {
		return "must be lowercase letters, digits and '-', at most 42, starting and ending alphanumeric"
	}
	return ""
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return "kubernetes" }

// DiskInMemory implements runtime.DiskMemory: a Pod's disk is a
// memory-backed emptyDir, and its memory limit holds memory plus disk.
func (r *Runtime) DiskInMemory() bool { return true }

// Runtimes implements runtime.Chooser: the names of Config.RuntimeClasses.
func (r *Runtime) Runtimes() []string {
	return slices.Sorted(maps.Keys(r.cfg.RuntimeClasses))
}

// runtimeClass is the RuntimeClass of a sandbox that chose runtime name
// ("" for the configured one).
func (r *Runtime) runtimeClass(name string) (string, error) {
	if name == "" {
		return r.cfg.RuntimeClass, nil
	}
	class, ok := r.cfg.RuntimeClasses[name]
	if !ok {
		return "", fmt.Errorf("%w: runtime %q is not offered (offered: %s)", runtime.ErrUnsupported, name, strings.Join(r.Runtimes(), ", "))
	}
	return class, nil
}

// objectName is the name of a sandbox's Pod, Secret and NetworkPolicy.
func objectName(id string) string { return "sf-" + id }

func (r *Runtime) labels(id string) map[string]string {
	return map[string]string{LabelManagedBy: managedBy, LabelInstance: r.cfg.Instance, LabelSandbox: id}
}

// selector selects every object of this instance.
func (r *Runtime) selector() string {
	return labels.SelectorFromSet(labels.Set{LabelManagedBy: managedBy, LabelInstance: r.cfg.Instance}).String()
}

// Create implements runtime.Runtime: the NetworkPolicy, the Secret and the
// Pod, then it waits until the Pod runs and has an IP. On error every
// object made is deleted.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (inst *runtime.Instance, err error) {
	image, ok := r.cfg.Images[spec.Template]
	if !ok {
		return nil, fmt.Errorf("kubernetes: template %q has no image configured (sheepfold template export, then [kubernetes.images])", spec.Template)
	}
	if spec.Network != nil && !spec.Network.Proxy {
		return nil, fmt.Errorf("%w: a Pod's network goes through its agent's egress proxy (runtime.Network.Proxy)", runtime.ErrUnsupported)
	}
	if len(spec.Devices) > 0 {
		return nil, fmt.Errorf("%w: a Pod's GPUs are the cluster's to choose (by number, not by name)", runtime.ErrUnsupported)
	}
	if msgs := validLabel(spec.ID); msgs != "" {
		return nil, fmt.Errorf("kubernetes: sandbox id %q: %s", spec.ID, msgs)
	}
	if _, err := r.runtimeClass(spec.Runtime); err != nil {
		return nil, err
	}
	cred, err := r.cfg.CA.IssueAgent(spec.ID, time.Now(), r.cfg.MaxLifetime)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			_ = r.Destroy(ctx, spec.ID)
		}
	}()
	ns := r.cfg.Namespace
	if _, err := r.cs.NetworkingV1().NetworkPolicies(ns).Create(ctx, r.networkPolicy(spec.ID), metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("kubernetes: create the sandbox's network policy: %w", err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: objectName(spec.ID), Labels: r.labels(spec.ID)},
		Type:       corev1.SecretTypeOpaque,
		Data: map[string][]byte{
			agenttls.CertFile: cred.CertPEM, agenttls.KeyFile: cred.KeyPEM, agenttls.CAFile: r.cfg.CA.CertPEM,
		},
	}
	if _, err := r.cs.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("kubernetes: create the sandbox's secret: %w", err)
	}
	pod, err := r.pod(spec, image)
	if err != nil {
		return nil, err
	}
	// A Pod bound to a node whose kubelet is gone (and not yet marked
	// NotReady) would wait out the start timeout: it is made again away
	// from such nodes, a few times, unless the caller chose the node.
	var absent []string
	for attempt := 1; ; attempt++ {
		created, err := r.cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("kubernetes: create the sandbox's pod: %w", err)
		}
		up, err := r.waitRunning(ctx, created)
		var na *nodeAbsentError
		if errors.As(err, &na) && attempt < maxPlacements && spec.Node == "" {
			absent = append(absent, na.node)
			if err := r.deletePod(ctx, pod.Name); err != nil {
				return nil, err
			}
			avoidNodes(pod, absent)
			continue
		}
		if err != nil {
			return nil, err
		}
		return &runtime.Instance{ID: spec.ID, Dial: r.dialer(spec.ID, up.Status.PodIP), Node: up.Spec.NodeName}, nil
	}
}

// maxPlacements bounds how many nodes a create tries when kubelets do
// not take its Pod.
const maxPlacements = 3

// nodeAbsentError reports a Pod bound to a node whose kubelet did not
// take it within Config.KubeletTimeout.
type nodeAbsentError struct{ node string }

func (e *nodeAbsentError) Error() string {
	return fmt.Sprintf("kubernetes: node %s did not start the sandbox's pod: its kubelet does not answer", e.node)
}

// avoidNodes keeps pod off these nodes.
func avoidNodes(pod *corev1.Pod, nodes []string) {
	pod.Spec.Affinity = nodeAffinity(corev1.NodeSelectorOpNotIn, nodes...)
}

// nodeAffinity requires a Pod's node to be (op In) or not to be (NotIn)
// one of nodes.
func nodeAffinity(op corev1.NodeSelectorOperator, nodes ...string) *corev1.Affinity {
	return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: op, Values: nodes}},
		}}},
	}}
}

// Nodes implements runtime.Placer: the nodes that are Ready, schedulable
// and free of taints that keep new Pods off (NoSchedule, NoExecute; a
// sandbox's Pod tolerates none). It needs the right to list nodes (a
// ClusterRole: deploy/kubernetes/rbac.yaml).
func (r *Runtime) Nodes(ctx context.Context) ([]string, error) {
	list, err := r.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubernetes: list the nodes: %w", err)
	}
	var out []string
	for _, n := range list.Items {
		if schedulable(&n) {
			out = append(out, n.Name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// schedulable reports whether a sandbox's Pod can start on n now.
func schedulable(n *corev1.Node) bool {
	if n.Spec.Unschedulable {
		return false
	}
	for _, t := range n.Spec.Taints {
		if t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute {
			return false
		}
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// deletePod deletes a Pod at once and waits until it is gone, so that
// one of the same name can be made.
func (r *Runtime) deletePod(ctx context.Context, name string) error {
	pods := r.cs.CoreV1().Pods(r.cfg.Namespace)
	if err := ignoreNotFound(pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})); err != nil {
		return fmt.Errorf("kubernetes: delete the sandbox's pod: %w", err)
	}
	for {
		_, err := pods.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("kubernetes: read the sandbox's pod: %w", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// dialer connects to a sandbox's agent at ip with TLS that accepts only
// that sandbox's agent.
// Through the port-forward (Config.PortForward), the same TLS runs over
// the forwarded stream.
func (r *Runtime) dialer(id, ip string) func(ctx context.Context) (net.Conn, error) {
	if r.fwd != nil {
		cfg := r.cfg.Client.Config(id)
		return func(ctx context.Context) (net.Conn, error) {
			raw, err := r.fwd.dial(ctx, objectName(id), r.cfg.AgentPort)
			if err != nil {
				return nil, err
			}
			conn := tls.Client(raw, cfg)
			if err := conn.HandshakeContext(ctx); err != nil {
				raw.Close()
				return nil, err
			}
			return conn, nil
		}
	}
	addr := net.JoinHostPort(ip, strconv.Itoa(r.cfg.AgentPort))
	d := &tls.Dialer{Config: r.cfg.Client.Config(id)}
	return func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
}

func (r *Runtime) networkPolicy(id string) *networkingv1.NetworkPolicy {
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(int32(r.cfg.AgentPort))
	in := networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}}}
	if len(r.cfg.ServerPods) > 0 {
		in.From = []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: r.cfg.ServerPods}}}
	}
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: objectName(id), Labels: r.labels(id)},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelSandbox: id, LabelInstance: r.cfg.Instance}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{in},
			Egress:      []networkingv1.NetworkPolicyEgressRule{}, // none: every egress denied
		},
	}
}

// capabilities are oci.AgentCapabilities as Kubernetes names them.
func capabilities() []corev1.Capability {
	out := make([]corev1.Capability, len(oci.AgentCapabilities))
	for i, c := range oci.AgentCapabilities {
		out[i] = corev1.Capability(strings.TrimPrefix(c, "CAP_"))
	}
	return out
}

var _ runtime.GPUScheduler = (*Runtime)(nil)

// GPUResource implements runtime.GPUScheduler.
func (r *Runtime) GPUResource() string { return r.cfg.GPUResource }

func (r *Runtime) pod(spec runtime.Spec, image string) (*corev1.Pod, error) {
	class, err := r.runtimeClass(spec.Runtime)
	if err != nil {
		return nil, err
	}
	env := make([]corev1.EnvVar, 0, len(spec.Env))
	for _, kv := range spec.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("kubernetes: environment entry %q is not KEY=VALUE", kv)
		}
		env = append(env, corev1.EnvVar{Name: k, Value: v})
	}
	lim := spec.Limits
	limits := corev1.ResourceList{}
	requests := corev1.ResourceList{}
	if lim.MemoryBytes > 0 {
		// The disk is a memory-backed emptyDir (below), charged to the
		// Pod's memory: the limit holds memory plus disk, so that a full
		// disk is ENOSPC, never an OOM kill (DiskInMemory).
		mem := lim.MemoryBytes
		if !spec.ReadOnly {
			mem += lim.DiskBytes
		}
		limits[corev1.ResourceMemory] = *resource.NewQuantity(mem, resource.BinarySI)
		requests[corev1.ResourceMemory] = *resource.NewQuantity(mem, resource.BinarySI)
	}
	if lim.DiskBytes > 0 {
		limits[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(lim.DiskBytes, resource.BinarySI)
	}
	cpuReq := r.cfg.CPURequest
	if lim.CPUs > 0 {
		limits[corev1.ResourceCPU] = *resource.NewMilliQuantity(int64(lim.CPUs*1000), resource.DecimalSI)
		cpuReq = min(cpuReq, lim.CPUs)
	}
	requests[corev1.ResourceCPU] = *resource.NewMilliQuantity(int64(cpuReq*1000), resource.DecimalSI)
	// The sandbox's container alone asks for GPUs: the netlock init
	// container needs none, and the device plugin gives the Pod's
	// containers what they ask.
	mainLimits := limits
	if spec.GPUs > 0 {
		mainLimits = limits.DeepCopy()
		mainLimits[corev1.ResourceName(r.cfg.GPUResource)] = *resource.NewQuantity(int64(spec.GPUs), resource.DecimalSI)
	}

	// The agent's directory from the image itself, read-only (an image
	// volume: Kubernetes 1.35+, containerd 2.1+ or CRI-O), over the same
	// directory of the container's writable root.
	mounts := []corev1.VolumeMount{
		{Name: "agent-tls", MountPath: tlsDir, ReadOnly: true},
		{Name: "agent", MountPath: agentDir, SubPath: strings.TrimPrefix(agentDir, "/"), ReadOnly: true},
	}
	volumes := []corev1.Volume{
		{Name: "agent-tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: objectName(spec.ID), DefaultMode: ptr(int32(0o400)),
		}}},
		{Name: "agent", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{
			Reference: image, PullPolicy: r.cfg.PullPolicy,
		}}},
	}
	// A sandbox's disk: a memory-backed emptyDir of the disk size (a
	// tmpfs, charged to the Pod's memory, whose limit holds it besides
	// the memory), mounted over the home and /tmp, which the agent
	// prepares (internal/agent, scratch_linux.go) and measures. Writes
	// elsewhere go to the container's writable layer, bounded by the
	// ephemeral-storage limit. A read-only sandbox writes only to its
	// writable paths, which share its disk limit as the local engine's do
	// (each is bounded by it).
	var scratch bool
	if !spec.ReadOnly {
		scratch = true
		ed := &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}
		if lim.DiskBytes > 0 {
			ed.SizeLimit = resource.NewQuantity(lim.DiskBytes, resource.BinarySI)
		}
		volumes = append(volumes, corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: ed}})
		mounts = append(mounts,
			corev1.VolumeMount{Name: "scratch", MountPath: oci.SandboxHome, SubPath: "home"},
			corev1.VolumeMount{Name: "scratch", MountPath: "/tmp", SubPath: "tmp"})
	}
	for i, p := range spec.WritablePaths {
		name := "writable-" + strconv.Itoa(i)
		ed := &corev1.EmptyDirVolumeSource{}
		if lim.DiskBytes > 0 {
			ed.SizeLimit = resource.NewQuantity(lim.DiskBytes, resource.BinarySI)
		}
		volumes = append(volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: ed}})
		mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: p})
	}
	// The persistent volumes: a claim each (volumes.go).
	pvs, pvMounts, ownArgs := podVolumes(spec)
	volumes = append(volumes, pvs...)
	mounts = append(mounts, pvMounts...)
	args := append([]string{oci.AgentPath, "init"}, oci.RlimitFlags...)
	args = append(args, ownArgs...)
	args = append(args, "--listen-tcp", ":"+strconv.Itoa(r.cfg.AgentPort), "--tls-dir", tlsDir)
	// The template's USER and WORKDIR: the defaults of the sandbox's
	// processes and code contexts.
	args = append(args, runtime.AgentDefaults(spec)...)
	// The usage history every replica reads the same (E2B's metrics).
	args = append(args, "--usage-history")
	if spec.Lifetime > 0 {
		// A deadline from the start: a Pod whose server died before its
		// first ping ends anyway (runtime.Spec.Lifetime).
		args = append(args, "--lifetime", spec.Lifetime.String())
	}
	if scratch {
		args = append(args, "--scratch", oci.HomeSeedPath)
	}
	if spec.Network != nil {
		// Its only way out: the agent's egress listener, which the
		// server's gateway serves (internal/egress, proxy_linux.go); the
		// NetworkPolicy denies everything else.
		args = append(args, "--egress-listen", runtime.ProxyAddr)
		for _, kv := range runtime.ProxyEnv() {
			k, v, _ := strings.Cut(kv, "=")
			env = append(env, corev1.EnvVar{Name: k, Value: v})
		}
	}
	// The sandbox's pids limit is its container's pids.max, which the
	// node's NRI plugin sets from the annotation, and the agent checks
	// before anything else runs: a node without the plugin fails the
	// Pod. It bounds every task of the container, whatever its uid (root
	// in the sandbox may take any of the Pod's 65,536).
	var annotations map[string]string
	if lim.Pids > 0 {
		annotations = map[string]string{AnnotationPids: strconv.FormatInt(lim.Pids, 10)}
		if !listed(r.cfg.NodePidsRuntimes, spec.Runtime, class) {
			args = append(args, "--pids-max", strconv.FormatInt(lim.Pids, 10))
		}
	}
	hostname := spec.Hostname
	if hostname == "" {
		hostname = "sandbox"
	}
	seccomp := &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: ptr(r.cfg.SeccompProfile)}
	if r.cfg.SeccompProfile == "RuntimeDefault" {
		seccomp = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	}
	podLabels := r.labels(spec.ID)
	if spec.Pool {
		podLabels[LabelPool] = "true"
	}
	if spec.Attendant {
		podLabels[LabelAttendant] = "true"
		if annotations == nil {
			annotations = map[string]string{}
		}
		annotations[AnnotationLifetime] = spec.Lifetime.String()
	}
	// Spread over nodes: a node's loss takes as few as can be. Warm
	// pool members are spread among themselves instead, so that every
	// node keeps some ready (the API server refuses two constraints of
	// one topology key and policy, so a Pod has one or the other).
	sel := map[string]string{LabelManagedBy: managedBy, LabelInstance: r.cfg.Instance}
	if spec.Pool {
		sel[LabelPool] = "true"
	}
	spread := []corev1.TopologySpreadConstraint{{
		MaxSkew: 1, TopologyKey: "kubernetes.io/hostname", WhenUnsatisfiable: corev1.ScheduleAnyway,
		LabelSelector: &metav1.LabelSelector{MatchLabels: sel},
	}}
	// A Pod placed by the caller (a warm pool member of that node) is
	// bound to it by affinity: the scheduler still checks its resources.
	var affinity *corev1.Affinity
	if spec.Node != "" {
		spread = nil
		affinity = nodeAffinity(corev1.NodeSelectorOpIn, spec.Node)
	}
	// The Pod's own firewall: an init container closes the network
	// namespace before the sandbox's container starts in it. Its one
	// capability never reaches the sandbox's code, which runs in the
	// other container, so nothing there can undo the rules.
	var initContainers []corev1.Container
	if !r.cfg.OpenNetwork && !listed(r.cfg.OpenNetworkRuntimes, spec.Runtime, class) {
		initContainers = []corev1.Container{{
			Name:            netlockContainer,
			Image:           image,
			ImagePullPolicy: r.cfg.PullPolicy,
			Command:         []string{oci.AgentPath, "netlock", "--agent-port", strconv.Itoa(r.cfg.AgentPort)},
			// As much as the sandbox's: a Pod's request is the larger of
			// its init and its main containers', so this changes neither
			// its request nor its QoS class.
			Resources: corev1.ResourceRequirements{Limits: limits, Requests: requests},
			SecurityContext: &corev1.SecurityContext{
				AllowPrivilegeEscalation: ptr(false),
				Privileged:               ptr(false),
				ReadOnlyRootFilesystem:   ptr(true),
				RunAsUser:                ptr(int64(0)),
				RunAsGroup:               ptr(int64(0)),
				Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_ADMIN"}},
				SeccompProfile:           seccomp,
			},
			TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		}}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: objectName(spec.ID), Labels: podLabels, Annotations: annotations},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr(false),
			EnableServiceLinks:            ptr(false),
			TerminationGracePeriodSeconds: ptr(int64(0)),
			Hostname:                      hostname,
			HostUsers:                     ptr(r.cfg.HostUsers || listed(r.cfg.HostUsersRuntimes, spec.Runtime, class)),
			SecurityContext:               &corev1.PodSecurityContext{SeccompProfile: seccomp},
			TopologySpreadConstraints:     spread,
			Affinity:                      affinity,
			Volumes:                       volumes,
			InitContainers:                initContainers,
			Containers: []corev1.Container{{
				Name:            container,
				Image:           image,
				ImagePullPolicy: r.cfg.PullPolicy,
				Command:         args,
				Env:             env,
				WorkingDir:      oci.SandboxHome,
				Ports:           []corev1.ContainerPort{{Name: "agent", ContainerPort: int32(r.cfg.AgentPort), Protocol: corev1.ProtocolTCP}},
				Resources:       corev1.ResourceRequirements{Limits: mainLimits, Requests: requests},
				VolumeMounts:    mounts,
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr(false),
					Privileged:               ptr(false),
					ReadOnlyRootFilesystem:   ptr(spec.ReadOnly),
					RunAsUser:                ptr(int64(0)),
					RunAsGroup:               ptr(int64(0)),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: capabilities()},
					SeccompProfile:           seccomp,
				},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
		},
	}
	if class != "" {
		pod.Spec.RuntimeClassName = ptr(class)
	}
	return pod, nil
}

func ptr[T any](v T) *T { return &v }

// listed reports whether a sandbox's runtime is in runtimes, which name
// runtimes a create may choose (Config.RuntimeClasses' keys) or
// RuntimeClasses: name is the one chosen ("" none), class its
// RuntimeClass (Config.RuntimeClass when none was chosen).
func listed(runtimes []string, name, class string) bool {
	return name != "" && slices.Contains(runtimes, name) || class != "" && slices.Contains(runtimes, class)
}

// errPodFailed reports a Pod that cannot run: its phase, or its
// container's reason and message.
var errPodFailed = errors.New("kubernetes: the sandbox's pod cannot run")

// fatalWaiting are container waiting reasons no retry mends.
var fatalWaiting = map[string]bool{
	"ErrImageNeverPull": true, "InvalidImageName": true, "ImagePullBackOff": true, "ErrImagePull": true,
	"CreateContainerConfigError": true, "CreateContainerError": true, "RunContainerError": true,
}

// waitRunning watches the Pod until it runs with an IP, and returns it as
// it is then; it fails at once when it cannot.
func (r *Runtime) waitRunning(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.StartTimeout)
	defer cancel()
	if _, done, err := podReady(pod); done {
		return running(pod, err)
	}
	w, err := r.cs.CoreV1().Pods(pod.Namespace).Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", pod.Name).String(),
		ResourceVersion: pod.ResourceVersion,
	})
	if err != nil {
		return nil, fmt.Errorf("kubernetes: watch the sandbox's pod: %w", err)
	}
	defer w.Stop()
	last := pod
	// Once the Pod is bound, its node's kubelet has KubeletTimeout to
	// take it (it sets the Pod's start time).
	var untaken <-chan time.Time
	for {
		if untaken == nil && last.Spec.NodeName != "" && last.Status.StartTime == nil {
			untaken = time.After(r.cfg.KubeletTimeout)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("kubernetes: the sandbox's pod did not run in %s (phase %s%s): %w",
				r.cfg.StartTimeout, last.Status.Phase, waitingReason(last), ctx.Err())
		case <-untaken:
			p, err := r.cs.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				return nil, fmt.Errorf("kubernetes: read the sandbox's pod: %w", err)
			}
			if p.Status.StartTime == nil {
				return nil, &nodeAbsentError{node: p.Spec.NodeName}
			}
			last = p
		case ev, ok := <-w.ResultChan():
			if !ok {
				// The watch ended (the API server's timeout): resume
				// from the Pod as it is now.
				p, err := r.cs.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
				if err != nil {
					return nil, fmt.Errorf("kubernetes: read the sandbox's pod: %w", err)
				}
				return r.waitRunning(ctx, p)
			}
			switch ev.Type {
			case watch.Deleted:
				return nil, fmt.Errorf("%w: deleted while starting", errPodFailed)
			case watch.Error:
				return nil, fmt.Errorf("kubernetes: watch the sandbox's pod: %v", apierrors.FromObject(ev.Object))
			}
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || p.Name != pod.Name {
				continue // (a watch that ignores the field selector)
			}
			last = p
			if _, done, err := podReady(p); done {
				return running(p, err)
			}
		}
	}
}

// running is what waitRunning returns of p once podReady is done.
func running(p *corev1.Pod, err error) (*corev1.Pod, error) {
	if err != nil {
		return nil, err
	}
	return p, nil
}

// podReady says whether p runs with an IP (ip), or can never (err).
func podReady(p *corev1.Pod) (ip string, done bool, err error) {
	switch p.Status.Phase {
	case corev1.PodRunning:
		if p.Status.PodIP != "" {
			return p.Status.PodIP, true, nil
		}
	case corev1.PodFailed, corev1.PodSucceeded:
		return "", true, fmt.Errorf("%w: phase %s%s%s", errPodFailed, p.Status.Phase, prefixed(p.Status.Reason), waitingReason(p))
	}
	for _, cs := range p.Status.InitContainerStatuses {
		if w := cs.State.Waiting; w != nil && fatalWaiting[w.Reason] {
			return "", true, fmt.Errorf("%w: %s: %s: %s", errPodFailed, cs.Name, w.Reason, w.Message)
		}
		if t := cs.State.Terminated; t != nil && t.ExitCode != 0 {
			return "", true, fmt.Errorf("%w: %s exited with %d (%s): %s", errPodFailed, cs.Name, t.ExitCode, t.Reason, t.Message)
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && fatalWaiting[w.Reason] {
			return "", true, fmt.Errorf("%w: %s: %s", errPodFailed, w.Reason, w.Message)
		}
		if t := cs.State.Terminated; t != nil {
			return "", true, fmt.Errorf("%w: the agent exited with %d (%s): %s", errPodFailed, t.ExitCode, t.Reason, t.Message)
		}
	}
	return "", false, nil
}

func prefixed(s string) string {
	if s == "" {
		return ""
	}
	return ", " + s
}

func waitingReason(p *corev1.Pod) string {
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && w.Reason != "" {
			return ", " + w.Reason
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			return ", " + c.Message
		}
	}
	return ""
}

// Destroy implements runtime.Runtime: the Pod (at once, no grace), its
// Secret and its NetworkPolicy. Objects already gone are not errors.
func (r *Runtime) Destroy(ctx context.Context, id string) error {
	ns, name := r.cfg.Namespace, objectName(id)
	if r.fwd != nil {
		r.fwd.forget(name)
	}
	now := metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}
	errs := []error{
		ignoreNotFound(r.cs.CoreV1().Pods(ns).Delete(ctx, name, now)),
		ignoreNotFound(r.cs.CoreV1().Secrets(ns).Delete(ctx, name, metav1.DeleteOptions{})),
		ignoreNotFound(r.cs.NetworkingV1().NetworkPolicies(ns).Delete(ctx, name, metav1.DeleteOptions{})),
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("kubernetes: delete sandbox %s: %w", id, err)
	}
	return nil
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// List implements runtime.Runtime: the ids of every Pod, Secret and
// NetworkPolicy of this instance.
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	ns, opt := r.cfg.Namespace, metav1.ListOptions{LabelSelector: r.selector()}
	seen := map[string]bool{}
	var ids []string
	add := func(l map[string]string) {
		if id := l[LabelSandbox]; id != "" && !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	pods, err := r.cs.CoreV1().Pods(ns).List(ctx, opt)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: list pods: %w", err)
	}
	for _, p := range pods.Items {
		add(p.Labels)
	}
	secrets, err := r.cs.CoreV1().Secrets(ns).List(ctx, opt)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: list secrets: %w", err)
	}
	for _, s := range secrets.Items {
		add(s.Labels)
	}
	nps, err := r.cs.NetworkingV1().NetworkPolicies(ns).List(ctx, opt)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: list network policies: %w", err)
	}
	for _, n := range nps.Items {
		add(n.Labels)
	}
	return ids, nil
}

var (
	_ runtime.Attacher  = (*Runtime)(nil)
	_ runtime.Inventory = (*Runtime)(nil)
)

// Attach implements runtime.Attacher: every replica of a deployment
// reaches every sandbox's agent, at its Pod's IP.
func (r *Runtime) Attach(ctx context.Context, id string) (*runtime.Instance, error) {
	if msgs := validLabel(id); msgs != "" {
		return nil, fmt.Errorf("%w: sandbox id %q: %s", runtime.ErrNotFound, id, msgs)
	}
	p, err := r.cs.CoreV1().Pods(r.cfg.Namespace).Get(ctx, objectName(id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%w: sandbox %s has no pod", runtime.ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes: read the sandbox's pod: %w", err)
	}
	if p.Labels[LabelInstance] != r.cfg.Instance || p.Labels[LabelSandbox] != id {
		return nil, fmt.Errorf("%w: pod %s is not sandbox %s of instance %s", runtime.ErrNotFound, p.Name, id, r.cfg.Instance)
	}
	ip, done, err := podReady(p)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: %v", runtime.ErrNotFound, err)
	case !done || p.DeletionTimestamp != nil:
		return nil, fmt.Errorf("%w: sandbox %s's pod is not running (phase %s)", runtime.ErrNotFound, id, p.Status.Phase)
	}
	return &runtime.Instance{ID: id, Dial: r.dialer(id, ip), Node: p.Spec.NodeName}, nil
}

// Inventory implements runtime.Inventory: every sandbox Pod of this
// instance (ended when it failed, is being deleted, or is still Pending
// past StartTimeout), and the Secrets and NetworkPolicies no Pod is left
// for (a create that failed half-way), as ended.
func (r *Runtime) Inventory(ctx context.Context) ([]runtime.Held, error) {
	ns, opt := r.cfg.Namespace, metav1.ListOptions{LabelSelector: r.selector()}
	pods, err := r.cs.CoreV1().Pods(ns).List(ctx, opt)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: list pods: %w", err)
	}
	var out []runtime.Held
	seen := map[string]bool{}
	for _, p := range pods.Items {
		id := p.Labels[LabelSandbox]
		if id == "" || seen[id] {
			continue
		}
		seen[id] = true
		_, done, err := podReady(&p)
		// A Pod that never ran within StartTimeout has no create
		// waiting for it (each gives up then and deletes its Pod): its
		// server died. It is ended, as its agent, which never started,
		// cannot end it (a warm pool member's would, at its lease).
		stuck := !done && p.Status.Phase == corev1.PodPending && !p.CreationTimestamp.IsZero() &&
			time.Since(p.CreationTimestamp.Time) > r.cfg.StartTimeout
		h := runtime.Held{ID: id, Created: p.CreationTimestamp.Time, Pool: p.Labels[LabelPool] == "true",
			Ended: done && err != nil || p.DeletionTimestamp != nil || stuck}
		if p.Labels[LabelAttendant] == "true" {
			// Unreadable: no lease beyond the collectors' grace.
			if d, err := time.ParseDuration(p.Annotations[AnnotationLifetime]); err == nil && d > 0 {
				h.Until = h.Created.Add(d)
			}
		}
		out = append(out, h)
	}
	orphan := func(id string, created time.Time) {
		if id != "" && !seen[id] {
			seen[id] = true
			out = append(out, runtime.Held{ID: id, Created: created, Ended: true})
		}
	}
	secrets, err := r.cs.CoreV1().Secrets(ns).List(ctx, opt)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: list secrets: %w", err)
	}
	for _, s := range secrets.Items {
		orphan(s.Labels[LabelSandbox], s.CreationTimestamp.Time)
	}
	nps, err := r.cs.NetworkingV1().NetworkPolicies(ns).List(ctx, opt)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: list network policies: %w", err)
	}
	for _, n := range nps.Items {
		orphan(n.Labels[LabelSandbox], n.CreationTimestamp.Time)
	}
	return out, nil
}

// Usage implements runtime.Runtime. A Pod's cgroup is on its node, out of
// the server's reach: ErrUnsupported, on which the engine asks the
// sandbox's agent, which reads its container's cgroup
// (agentproto.OpUsage).
func (r *Runtime) Usage(ctx context.Context, id string) (runtime.Usage, error) {
	return runtime.Usage{}, fmt.Errorf("%w: a Pod's cgroup is on its node; its agent reads it", runtime.ErrUnsupported)
}

// Close implements the engine's runtime: it waits for the egress
// goroutines, which end with their sandboxes' gateways (the engine closes
// them first); the runtime holds nothing else beyond its client.
func (r *Runtime) Close() error {
	r.egress.Wait()
	return nil
}

// Ready reports whether the cluster answers for the namespace: the API
// server is reachable and the server may list Pods there.
func (r *Runtime) Ready(ctx context.Context) error {
	_, err := r.cs.CoreV1().Pods(r.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: r.selector(), Limit: 1})
	if err != nil {
		return fmt.Errorf("kubernetes: the cluster does not answer: %w", err)
	}
	return nil
}

// PreviewKey is the key every replica signs preview URLs and tokens
// with: derived from the agents' authority, which they share.
func (r *Runtime) PreviewKey() []byte { return r.cfg.CA.DeriveKey("preview") }

// HasTemplate reports whether a template has an image.
func (r *Runtime) HasTemplate(name string) bool {
	_, ok := r.cfg.Images[name]
	return ok
}

// LabelRole marks objects of the deployment that are not a sandbox's.
const LabelRole = "sheepfold.dev/role"

// authoritySecret names the Secret holding the agents' authority.
func authoritySecret(instance string) string { return instance + "-agent-authority" }

// LoadCA returns the agents' authority of instance, kept in a Secret of
// namespace, and makes it on first use. Replicas starting together agree:
// the first create wins and the others read it.
func LoadCA(ctx context.Context, cs kubernetes.Interface, namespace, instance string) (*agenttls.CA, error) {
	secrets := cs.CoreV1().Secrets(namespace)
	name := authoritySecret(instance)
	for range 2 {
		s, err := secrets.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			ca, err := agenttls.ParseCA(s.Data["ca.crt"], s.Data["ca.key"])
			if err != nil {
				return nil, fmt.Errorf("kubernetes: secret %s/%s: %w", namespace, name, err)
			}
			return ca, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("kubernetes: read the agents' authority: %w", err)
		}
		ca, err := agenttls.NewCA(time.Now())
		if err != nil {
			return nil, err
		}
		_, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
				LabelManagedBy: managedBy, LabelInstance: instance, LabelRole: "agent-authority"}},
			Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{"ca.crt": ca.CertPEM, "ca.key": ca.KeyPEM},
		}, metav1.CreateOptions{})
		if err == nil {
			return ca, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("kubernetes: save the agents' authority: %w", err)
		}
		// Another replica made it first: read theirs.
	}
	return nil, fmt.Errorf("kubernetes: secret %s/%s keeps changing", namespace, name)
}
