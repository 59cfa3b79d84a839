//go:build linux

package kubernetes

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sheepfold/sheepfold/internal/agenttls"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

const ns = "sandboxes"

func newRuntime(t *testing.T, cfg Config) (*Runtime, *fake.Clientset) {
	t.Helper()
	now := time.Now()
	ca, err := agenttls.NewCA(now)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := ca.IssueServer(now)
	if err != nil {
		t.Fatal(err)
	}
	client, err := agenttls.NewClient(sc, ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Namespace, cfg.CA, cfg.Client = ns, ca, client
	if cfg.Images == nil {
		cfg.Images = map[string]string{"python": "sheepfold.local/template/python:abc"}
	}
	cs := fake.NewClientset()
	r, err := New(cs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r, cs
}

// kubelet plays the node for the Pod named name: once it exists, set
// its status.
func kubelet(t *testing.T, cs *fake.Clientset, name string, status corev1.PodStatus) {
	go func() {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			p, err := cs.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
			if err != nil {
				continue
			}
			p.Status = status
			if _, err := cs.CoreV1().Pods(ns).UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
				t.Errorf("update status: %v", err)
			}
			return
		}
		t.Errorf("pod %s was never created", name)
	}()
}

func spec(id string) runtime.Spec {
	return runtime.Spec{ID: id, Template: "python", Env: []string{"A=1", "B=x=y"},
		Limits: runtime.Limits{MemoryBytes: 512 << 20, CPUs: 1.5, DiskBytes: 1 << 30, Pids: 256}}
}

func TestCreateMakesStrictPod(t *testing.T) {
	t.Parallel()
	r, cs := newRuntime(t, Config{RuntimeClass: "gvisor", ServerPods: map[string]string{"app": "sheepfold"}})
	kubelet(t, cs, "sf-abc", corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.88.1.7"})
	inst, err := r.Create(context.Background(), spec("abc"))
	if err != nil {
		t.Fatal(err)
	}
	if inst.ID != "abc" || inst.Dial == nil || inst.Socket != "" {
		t.Fatalf("instance %+v", inst)
	}
	ctx := context.Background()
	pod, err := cs.CoreV1().Pods(ns).Get(ctx, "sf-abc", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ps := pod.Spec
	if ps.HostUsers == nil || *ps.HostUsers || ps.RuntimeClassName == nil || *ps.RuntimeClassName != "gvisor" ||
		*ps.AutomountServiceAccountToken || *ps.EnableServiceLinks || ps.RestartPolicy != corev1.RestartPolicyNever {
		t.Fatalf("pod spec: %+v", ps)
	}
	if len(ps.Containers) != 1 {
		t.Fatalf("containers: %+v", ps.Containers)
	}
	c := ps.Containers[0]
	sc := c.SecurityContext
	if *sc.AllowPrivilegeEscalation || *sc.Privileged || sc.SeccompProfile.Type != corev1.SeccompProfileTypeLocalhost ||
		*sc.SeccompProfile.LocalhostProfile != DefaultSeccompProfile ||
		!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Fatalf("security context: %+v", sc)
	}
	var added []string
	for _, c := range sc.Capabilities.Add {
		added = append(added, string(c))
	}
	sort.Strings(added)
	if strings.Join(added, ",") != "CHOWN,DAC_OVERRIDE,FOWNER,KILL,SETGID,SETPCAP,SETUID" {
		t.Fatalf("capabilities added: %v", added)
	}
	if c.Image != "sheepfold.local/template/python:abc" || c.Command[0] != "/.sheepfold/agent" || c.Command[1] != "init" ||
		!strings.Contains(strings.Join(c.Command, " "), "--listen-tcp :49983 --tls-dir /.sheepfold-tls") {
		t.Fatalf("container: image %s, command %v", c.Image, c.Command)
	}
	if len(c.Env) != 2 || c.Env[1].Name != "B" || c.Env[1].Value != "x=y" {
		t.Fatalf("env: %+v", c.Env)
	}
	// Memory plus the disk, a memory-backed emptyDir (below): a full disk
	// is ENOSPC, not an OOM kill.
	lim, req := c.Resources.Limits, c.Resources.Requests
	if lim.Memory().Value() != 512<<20+1<<30 || lim.Cpu().MilliValue() != 1500 || lim.StorageEphemeral().Value() != 1<<30 ||
		req.Memory().Value() != 512<<20+1<<30 || req.Cpu().MilliValue() != 100 {
		t.Fatalf("resources: limits %v, requests %v", lim, req)
	}

	// The Secret: a credential of this sandbox's agent, from the authority.
	sec, err := cs.CoreV1().Secrets(ns).Get(ctx, "sf-abc", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(sec.Data[agenttls.CertFile])
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(r.cfg.CA.Cert)
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: agenttls.ServerName("abc"), Roots: roots,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Fatalf("the agent's certificate: %v", err)
	}
	if len(sec.Data[agenttls.KeyFile]) == 0 || string(sec.Data[agenttls.CAFile]) != string(r.cfg.CA.CertPEM) {
		t.Fatal("the secret lacks the key or the authority")
	}
	if v := ps.Volumes[0].Secret; v == nil || v.SecretName != "sf-abc" || *v.DefaultMode != 0o400 {
		t.Fatalf("secret volume: %+v", ps.Volumes[0])
	}

	// The disk: a memory-backed emptyDir of the disk size over the home
	// and /tmp, which the agent prepares from the image's home seed.
	if v := ps.Volumes[2]; v.Name != "scratch" || v.EmptyDir == nil || v.EmptyDir.Medium != corev1.StorageMediumMemory ||
		v.EmptyDir.SizeLimit.Value() != 1<<30 {
		t.Fatalf("scratch volume: %+v", v)
	}
	var scratch []string
	for _, m := range c.VolumeMounts {
		if m.Name == "scratch" {
			scratch = append(scratch, m.MountPath+"="+m.SubPath)
		}
	}
	if !slices.Equal(scratch, []string{"/home/user=home", "/tmp=tmp"}) ||
		!strings.Contains(strings.Join(c.Command, " "), "--scratch /.sheepfold/home.tar") {
		t.Fatalf("scratch mounts %v, command %v", scratch, c.Command)
	}

	// The NetworkPolicy: no egress, ingress to the agent's port from the
	// server's Pods.
	np, err := cs.NetworkingV1().NetworkPolicies(ns).Get(ctx, "sf-abc", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if np.Spec.PodSelector.MatchLabels[LabelSandbox] != "abc" || len(np.Spec.Egress) != 0 ||
		!slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) || len(np.Spec.Ingress) != 1 ||
		np.Spec.Ingress[0].Ports[0].Port.IntValue() != 49983 || np.Spec.Ingress[0].From[0].PodSelector.MatchLabels["app"] != "sheepfold" {
		t.Fatalf("network policy: %+v", np.Spec)
	}

	ids, err := r.List(ctx)
	if err != nil || !slices.Equal(ids, []string{"abc"}) {
		t.Fatalf("List: %v, %v", ids, err)
	}
	if err := r.Destroy(ctx, "abc"); err != nil {
		t.Fatal(err)
	}
	if err := r.Destroy(ctx, "abc"); err != nil {
		t.Fatalf("destroying twice: %v", err)
	}
	if ids, err := r.List(ctx); err != nil || len(ids) != 0 {
		t.Fatalf("List after Destroy: %v, %v", ids, err)
	}
}

func TestCreateFailureLeavesNothing(t *testing.T) {
	t.Parallel()
	r, cs := newRuntime(t, Config{})
	kubelet(t, cs, "sf-bad", corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
		Name: container, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
			Reason: "ErrImageNeverPull", Message: `image "x" is not present`}},
	}}})
	_, err := r.Create(context.Background(), spec("bad"))
	if !errors.Is(err, errPodFailed) || !strings.Contains(err.Error(), "ErrImageNeverPull") {
		t.Fatalf("create: %v", err)
	}
	if ids, err := r.List(context.Background()); err != nil || len(ids) != 0 {
		t.Fatalf("left behind: %v, %v", ids, err)
	}
}

// A create whose caller gives up once its Pod was posted (a warm pool's
// filler at Shutdown) deletes the Pod, its Secret and its NetworkPolicy:
// the caller, told it failed, owns nothing.
func TestCreateCancelledLeavesNothing(t *testing.T) {
	t.Parallel()
	r, cs := newRuntime(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer cancel()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if _, err := cs.CoreV1().Pods(ns).Get(context.Background(), objectName("gone"), metav1.GetOptions{}); err == nil {
				return
			}
		}
	}()
	sp := spec("gone")
	sp.Pool = true
	if _, err := r.Create(ctx, sp); !errors.Is(err, context.Canceled) {
		t.Fatalf("create: %v", err)
	}
	if ids, err := r.List(context.Background()); err != nil || len(ids) != 0 {
		t.Fatalf("left behind: %v, %v", ids, err)
	}
}

func TestCreateTimesOut(t *testing.T) {
	t.Parallel()
	r, _ := newRuntime(t, Config{StartTimeout: 200 * time.Millisecond})
	_, err := r.Create(context.Background(), spec("slow"))
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "did not run in 200ms") {
		t.Fatalf("create: %v", err)
	}
	if ids, _ := r.List(context.Background()); len(ids) != 0 {
		t.Fatalf("left behind: %v", ids)
	}
}

func TestCreateRefuses(t *testing.T) {
	t.Parallel()
	r, _ := newRuntime(t, Config{})
	for name, s := range map[string]runtime.Spec{
		"unknown template": {ID: "a1", Template: "ruby"},
		"network":          {ID: "a2", Template: "python", Network: &runtime.Network{}},
		"bad id":           {ID: "A_B", Template: "python"},
		"bad env":          {ID: "a3", Template: "python", Env: []string{"NOEQUALS"}},
	} {
		if _, err := r.Create(context.Background(), s); err == nil {
			t.Errorf("%s: created", name)
		}
	}
	if ids, _ := r.List(context.Background()); len(ids) != 0 {
		t.Fatalf("left behind: %v", ids)
	}
	if _, ok := any(r).(runtime.Volumes); !ok {
		t.Fatal("the Kubernetes runtime keeps no volumes")
	}
}

// TestRuntimeChoice: a sandbox that chooses a runtime gets its
// RuntimeClass (and the host's user namespace where configured, as
// gVisor needs); one that chooses none gets the configured class; a
// name not offered is refused before anything is made.
func TestRuntimeChoice(t *testing.T) {
	t.Parallel()
	r, cs := newRuntime(t, Config{RuntimeClass: "runc", HostUsersRuntimes: []string{"gvisor"},
		RuntimeClasses: map[string]string{"runc": "runc", "gvisor": "gvisor-systrap"}})
	if got := runtime.Offered(r); !slices.Equal(got, []string{"gvisor", "runc"}) {
		t.Fatalf("offered: %v", got)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		id, runtime, class string
		hostUsers          bool
	}{
		{"c1", "", "runc", false},
		{"c2", "gvisor", "gvisor-systrap", true},
		{"c3", "runc", "runc", false},
	} {
		kubelet(t, cs, "sf-"+tc.id, corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.88.1.7"})
		s := spec(tc.id)
		s.Runtime = tc.runtime
		if _, err := r.Create(ctx, s); err != nil {
			t.Fatalf("%q: %v", tc.runtime, err)
		}
		pod, err := cs.CoreV1().Pods(ns).Get(ctx, "sf-"+tc.id, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c := pod.Spec.RuntimeClassName; c == nil || *c != tc.class {
			t.Errorf("%q: RuntimeClass %v, want %s", tc.runtime, c, tc.class)
		}
		if h := pod.Spec.HostUsers; h == nil || *h != tc.hostUsers {
			t.Errorf("%q: hostUsers %v, want %v", tc.runtime, h, tc.hostUsers)
		}
	}
	s := spec("c4")
	s.Runtime = "kata"
	_, err := r.Create(ctx, s)
	if !errors.Is(err, runtime.ErrUnsupported) || !strings.Contains(err.Error(), "offered: gvisor, runc") {
		t.Fatalf("kata: %v", err)
	}
	if _, err := cs.NetworkingV1().NetworkPolicies(ns).Get(ctx, "sf-c4", metav1.GetOptions{}); err == nil {
		t.Fatal("a refused runtime left a NetworkPolicy")
	}
}

func TestNewRefusesBadRuntimeClasses(t *testing.T) {
	t.Parallel()
	ca, err := agenttls.NewCA(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for name, classes := range map[string]map[string]string{
		"empty name":  {"": "gvisor"},
		"bad name":    {"G_Visor": "gvisor"},
		"empty class": {"gvisor": ""},
		"bad class":   {"gvisor": "GVisor!"},
	} {
		if _, err := New(fake.NewClientset(), Config{Namespace: ns, CA: ca, Client: &agenttls.Client{}, RuntimeClasses: classes}); err == nil {
			t.Errorf("%s: accepted %v", name, classes)
		}
	}
}

// TestListOnlyThisInstance: objects of another deployment in the
// namespace are not ours to list or collect.
func TestListOnlyThisInstance(t *testing.T) {
	t.Parallel()
	r, cs := newRuntime(t, Config{Instance: "blue"})
	ctx := context.Background()
	for _, o := range []struct{ id, instance string }{{"s1", "blue"}, {"s2", "green"}} {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sf-" + o.id, Namespace: ns,
			Labels: map[string]string{LabelManagedBy: managedBy, LabelInstance: o.instance, LabelSandbox: o.id}}}
		if _, err := cs.CoreV1().Secrets(ns).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ids, err := r.List(ctx)
	if err != nil || !slices.Equal(ids, []string{"s1"}) {
		t.Fatalf("List: %v, %v", ids, err)
	}
}

func TestLoadCASharedByReplicas(t *testing.T) {
	t.Parallel()
	cs := fake.NewClientset()
	ctx := context.Background()
	a, err := LoadCA(ctx, cs, ns, "blue")
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadCA(ctx, cs, ns, "blue")
	if err != nil {
		t.Fatal(err)
	}
	if !a.Cert.Equal(b.Cert) {
		t.Fatal("a second replica got another authority")
	}
	c, err := LoadCA(ctx, cs, ns, "green")
	if err != nil {
		t.Fatal(err)
	}
	if a.Cert.Equal(c.Cert) {
		t.Fatal("two instances share an authority")
	}
	// The authority's Secret is not a sandbox's.
	r, err := New(cs, Config{Namespace: ns, Instance: "blue", CA: a, Client: &agenttls.Client{}})
	if err != nil {
		t.Fatal(err)
	}
	if ids, err := r.List(ctx); err != nil || len(ids) != 0 {
		t.Fatalf("List: %v, %v", ids, err)
	}
	// A damaged Secret is an error, not a new authority.
	sec, _ := cs.CoreV1().Secrets(ns).Get(ctx, "blue-agent-authority", metav1.GetOptions{})
	sec.Data["ca.key"] = c.KeyPEM
	cs.CoreV1().Secrets(ns).Update(ctx, sec, metav1.UpdateOptions{})
	if _, err := LoadCA(ctx, cs, ns, "blue"); err == nil {
		t.Fatal("a mismatched key was accepted")
	}
}

// TestAttachAndInventory: another replica reaches a running sandbox by
// its Pod; the inventory tells pool members, ended Pods and leftovers of
// a failed create apart.
func TestAttachAndInventory(t *testing.T) {
	t.Parallel()
	r, cs := newRuntime(t, Config{})
	ctx := context.Background()
	running := corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7"}
	kubelet(t, cs, "sf-live", running)
	if _, err := r.Create(ctx, spec("live")); err != nil {
		t.Fatal(err)
	}
	pooled := spec("warm")
	pooled.Pool = true
	kubelet(t, cs, "sf-warm", running)
	if _, err := r.Create(ctx, pooled); err != nil {
		t.Fatal(err)
	}
	kubelet(t, cs, "sf-done", running)
	if _, err := r.Create(ctx, spec("done")); err != nil {
		t.Fatal(err)
	}
	p, err := cs.CoreV1().Pods(ns).Get(ctx, "sf-done", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodRunning {
		t.Fatalf("Create returned with its pod %s", p.Status.Phase)
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodSucceeded}
	if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A create that failed after its Secret: no Pod.
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sf-half", Namespace: ns, Labels: r.labels("half")}}
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	inst, err := r.Attach(ctx, "live")
	if err != nil || inst.Dial == nil || inst.ID != "live" {
		t.Fatalf("Attach live: %+v, %v", inst, err)
	}
	for _, id := range []string{"done", "half", "nope", "Bad_ID"} {
		if _, err := r.Attach(ctx, id); !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("Attach %s: %v, want ErrNotFound", id, err)
		}
	}

	held, err := r.Inventory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]runtime.Held{}
	for _, h := range held {
		h.Created = time.Time{} // the API server sets it; the fake does not
		got[h.ID] = h
	}
	warm, err := cs.CoreV1().Pods(ns).Get(ctx, "sf-warm", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// One constraint per Pod: the API server refuses two of one topology
	// key and policy (the fake does not check).
	if tsc := warm.Spec.TopologySpreadConstraints; len(tsc) != 1 || tsc[0].LabelSelector.MatchLabels[LabelPool] != "true" {
		t.Errorf("a warm pool member is not spread among the pool's: %+v", tsc)
	}
	live, err := cs.CoreV1().Pods(ns).Get(ctx, "sf-live", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tsc := live.Spec.TopologySpreadConstraints; len(tsc) != 1 || tsc[0].LabelSelector.MatchLabels[LabelPool] != "" ||
		tsc[0].LabelSelector.MatchLabels[LabelInstance] == "" {
		t.Errorf("a sandbox is not spread among all of this instance's: %+v", tsc)
	}
	want := map[string]runtime.Held{
		"live": {ID: "live"},
		"warm": {ID: "warm", Pool: true},
		"done": {ID: "done", Ended: true},
		"half": {ID: "half", Ended: true},
	}
	if len(got) != len(want) {
		t.Fatalf("inventory %+v, want %+v", got, want)
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("%s: %+v, want %+v", id, got[id], w)
		}
	}
}

// TestInventoryStuckPending: a warm pool member's Pod still Pending past
// StartTimeout (its server died while it waited to be scheduled; its
// agent never started, so its lease cannot end it) is ended, and a
// collector takes it; one younger than that is a create in flight.
func TestInventoryStuckPending(t *testing.T) {
	t.Parallel()
	r, cs := newRuntime(t, Config{StartTimeout: time.Minute})
	ctx := context.Background()
	for id, age := range map[string]time.Duration{"stuck": 2 * time.Minute, "young": 30 * time.Second} {
		sp := spec(id)
		sp.Pool = true
		pod, err := r.pod(sp, "image")
		if err != nil {
			t.Fatal(err)
		}
		pod.Namespace, pod.CreationTimestamp = ns, metav1.NewTime(time.Now().Add(-age))
		pod.Status.Phase = corev1.PodPending
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	held, err := r.Inventory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, h := range held {
		if !h.Pool {
			t.Errorf("%s is not a pool member: %+v", h.ID, h)
		}
		got[h.ID] = h.Ended
	}
	if len(got) != 2 || !got["stuck"] || got["young"] {
		t.Fatalf("ended: %v, want stuck alone", got)
	}
}

// TestInventoryAttendant: a volume's attendant's Pod is labelled and
// carries its lifetime; the inventory gives it its creation plus that as
// Until, and none to a sandbox or an attendant whose lifetime is
// unreadable.
func TestInventoryAttendant(t *testing.T) {
	t.Parallel()
	r, cs := newRuntime(t, Config{})
	ctx := context.Background()
	created := time.Now().Add(-time.Minute).Truncate(time.Second)
	for id, life := range map[string]string{"vfok": "", "vfbad": "soon", "plain": "-"} {
		sp := spec(id)
		sp.Attendant, sp.Lifetime = life != "-", 140*time.Second
		pod, err := r.pod(sp, "image")
		if err != nil {
			t.Fatal(err)
		}
		if sp.Attendant && (pod.Labels[LabelAttendant] != "true" || pod.Annotations[AnnotationLifetime] != "2m20s") {
			t.Fatalf("the attendant's pod: labels %v, annotations %v", pod.Labels, pod.Annotations)
		}
		if !sp.Attendant && (pod.Labels[LabelAttendant] != "" || pod.Annotations[AnnotationLifetime] != "") {
			t.Fatalf("a sandbox's pod: labels %v, annotations %v", pod.Labels, pod.Annotations)
		}
		if life != "" && life != "-" {
			pod.Annotations[AnnotationLifetime] = life
		}
		pod.Namespace, pod.CreationTimestamp = ns, metav1.NewTime(created)
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.9"}
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	held, err := r.Inventory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]time.Time{}
	for _, h := range held {
		got[h.ID] = h.Until
	}
	if len(got) != 3 || !got["vfok"].Equal(created.Add(140*time.Second)) || !got["vfbad"].IsZero() || !got["plain"].IsZero() {
		t.Fatalf("until: %v, want vfok's at %s alone", got, created.Add(140*time.Second))
	}
}

// TestCreateAvoidsAbsentKubelet: a Pod bound to a node whose kubelet
// never takes it is made again away from that node.
func TestCreateAvoidsAbsentKubelet(t *testing.T) {
	t.Parallel()
	r, cs := newRuntime(t, Config{KubeletTimeout: 100 * time.Millisecond})
	ctx := context.Background()
	pods := cs.CoreV1().Pods(ns)
	go func() {
		// The scheduler binds the Pod to node "dead", whose kubelet
		// never answers; the Pod made again goes to "live".
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			p, err := pods.Get(ctx, "sf-sb", metav1.GetOptions{})
			if err != nil {
				continue
			}
			if p.Spec.NodeName == "" && p.Spec.Affinity == nil {
				p.Spec.NodeName = "dead"
				if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
					t.Errorf("bind: %v", err)
					return
				}
				continue
			}
			if p.Spec.Affinity != nil {
				p.Spec.NodeName = "live"
				if p, err = pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
					t.Errorf("bind again: %v", err)
					return
				}
				p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.9", StartTime: &metav1.Time{Time: time.Now()}}
				if _, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
					t.Errorf("status: %v", err)
				}
				return
			}
		}
		t.Error("the pod was never made again away from the dead node")
	}()
	if _, err := r.Create(ctx, spec("sb")); err != nil {
		t.Fatal(err)
	}
	p, err := pods.Get(ctx, "sf-sb", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	terms := p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if p.Spec.NodeName != "live" || len(terms) != 1 || !slices.Equal(terms[0].MatchFields[0].Values, []string{"dead"}) {
		t.Fatalf("pod on %s with affinity %+v", p.Spec.NodeName, terms)
	}
}

// TestCreateOnNode: a sandbox placed on a node (a warm pool member of it)
// is bound there by affinity, with no spread; its Instance names the node;
// when that node's kubelet does not take it the create fails at once
// (it is not made again elsewhere) and leaves nothing.
func TestCreateOnNode(t *testing.T) {
	t.Parallel()
	r, cs := newRuntime(t, Config{KubeletTimeout: 100 * time.Millisecond})
	ctx := context.Background()
	pods := cs.CoreV1().Pods(ns)
	// bind plays the scheduler and the kubelet of node for Pod name:
	// bound there, and started unless absent.
	bind := func(name, node string, absent bool) {
		go func() {
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				p, err := pods.Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					continue
				}
				p.Spec.NodeName = node
				if p, err = pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
					t.Errorf("bind: %v", err)
					return
				}
				if !absent {
					p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7", StartTime: &metav1.Time{Time: time.Now()}}
					if _, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
						t.Errorf("status: %v", err)
					}
				}
				return
			}
			t.Errorf("pod %s was never created", name)
		}()
	}
	sp := spec("placed")
	sp.Pool, sp.Node = true, "n1"
	bind("sf-placed", "n1", false)
	inst, err := r.Create(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	if inst.Node != "n1" {
		t.Fatalf("instance on node %q", inst.Node)
	}
	p, err := pods.Get(ctx, "sf-placed", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	terms := p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || terms[0].MatchFields[0].Key != "metadata.name" || terms[0].MatchFields[0].Operator != corev1.NodeSelectorOpIn ||
		!slices.Equal(terms[0].MatchFields[0].Values, []string{"n1"}) || len(p.Spec.TopologySpreadConstraints) != 0 {
		t.Fatalf("affinity %+v, spread %+v", terms, p.Spec.TopologySpreadConstraints)
	}

	sp = spec("stuck")
	sp.Pool, sp.Node = true, "n2"
	bind("sf-stuck", "n2", true)
	var na *nodeAbsentError
	if _, err := r.Create(ctx, sp); !errors.As(err, &na) || na.node != "n2" {
		t.Fatalf("create on a node whose kubelet is absent: %v", err)
	}
	if ids, err := r.List(ctx); err != nil || !slices.Equal(ids, []string{"placed"}) {
		t.Fatalf("sandboxes after the failed create: %v, %v", ids, err)
	}
	if s, err := cs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); err != nil || len(s.Items) != 1 {
		t.Fatalf("secrets after the failed create: %v, %v", s, err)
	}
}

// TestNodes: the nodes a sandbox can start on are the Ready ones, not
// cordoned, without a taint that keeps Pods off.
func TestNodes(t *testing.T) {
	t.Parallel()
	r, cs := newRuntime(t, Config{})
	ready := corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}
	nodes := []*corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "b-ready"}, Status: ready},
		{ObjectMeta: metav1.ObjectMeta{Name: "a-prefer"}, Status: ready,
			Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectPreferNoSchedule}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "not-ready"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse}, {Type: corev1.NodeReady, Status: corev1.ConditionUnknown}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "cordoned"}, Status: ready, Spec: corev1.NodeSpec{Unschedulable: true}},
		{ObjectMeta: metav1.ObjectMeta{Name: "no-schedule"}, Status: ready,
			Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectNoSchedule}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "no-execute"}, Status: ready,
			Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "node.kubernetes.io/unreachable", Effect: corev1.TaintEffectNoExecute}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "unknown"}},
	}
	for _, n := range nodes {
		if _, err := cs.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := r.Nodes(context.Background())
	if err != nil || !slices.Equal(got, []string{"a-prefer", "b-ready"}) {
		t.Fatalf("nodes %v, %v", got, err)
	}
}

// The sandbox's pids limit is its Pod's annotation, which the node's NRI
// plugin makes its containers' pids.max, and the agent's --pids-max,
// which refuses a container without it; in a user namespace of its own
// or the node's alike (a container's cgroup counts every uid). A runtime
// whose tasks are not in its container's cgroup (NodePidsRuntimes,
// gVisor) gets the annotation but no check.
func TestPodPids(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		hostUsers bool
		runtime   string
		pids      int64
		check     bool
	}{
		{false, "", 256, true},
		{true, "", 256, true},
		{false, "", 0, false},
		{false, "safe", 256, false},
		{false, "fast", 64, true},
	} {
		r, _ := newRuntime(t, Config{HostUsers: tc.hostUsers, RuntimeClasses: map[string]string{"fast": "runc", "safe": "gvisor"}, NodePidsRuntimes: []string{"gvisor"}})
		sp := spec("abc")
		sp.Limits.Pids, sp.Runtime = tc.pids, tc.runtime
		pod, err := r.pod(sp, "image")
		if err != nil {
			t.Fatal(err)
		}
		n := strconv.FormatInt(tc.pids, 10)
		cmd := strings.Join(pod.Spec.Containers[0].Command, " ")
		if strings.Contains(cmd, "--nproc") || tc.check != strings.HasSuffix(cmd, " --pids-max "+n) || !tc.check && strings.Contains(cmd, "--pids-max") {
			t.Errorf("%+v: command %q", tc, cmd)
		}
		got, err := PodPids(pod.Annotations)
		if err != nil || got != tc.pids {
			t.Errorf("%+v: annotations %v: %d, %v", tc, pod.Annotations, got, err)
		}
	}
}

// A sandbox's agent starts with its lifetime (runtime.Spec.Lifetime):
// a Pod whose server dies before the first ping, which would have given
// it one, ends anyway. Without a lifetime the agent has no deadline
// until a ping sets one.
func TestPodStartsWithLifetime(t *testing.T) {
	t.Parallel()
	r, _ := newRuntime(t, Config{})
	for _, tc := range []struct {
		lifetime time.Duration
		want     string
	}{{62 * time.Second, "--lifetime 1m2s"}, {0, ""}} {
		sp := spec("abc")
		sp.Pool, sp.Lifetime = true, tc.lifetime
		pod, err := r.pod(sp, "image")
		if err != nil {
			t.Fatal(err)
		}
		cmd := strings.Join(pod.Spec.Containers[0].Command, " ")
		if tc.want != "" && !strings.Contains(cmd, " "+tc.want+" ") || tc.want == "" && strings.Contains(cmd, "--lifetime") {
			t.Errorf("lifetime %v: command %q", tc.lifetime, cmd)
		}
	}
}

// A template's USER and WORKDIR (runtime.Spec.User, WorkDir) reach the
// agent's command line as serve's --user and --workdir, which init
// passes on; a spec without them (the python template) starts the agent
// with neither.
func TestPodAgentDefaults(t *testing.T) {
	t.Parallel()
	r, _ := newRuntime(t, Config{})
	for _, tc := range []struct {
		user, workdir string
		want          []string
		not           []string
	}{
		{"nobody", "/srv/x", []string{"--user nobody", "--workdir /srv/x"}, nil},
		{"", "/srv/x", []string{"--workdir /srv/x"}, []string{"--user"}},
		{"", "", nil, []string{"--user", "--workdir"}},
	} {
		sp := spec("abc")
		sp.User, sp.WorkDir = tc.user, tc.workdir
		pod, err := r.pod(sp, "image")
		if err != nil {
			t.Fatal(err)
		}
		cmd := strings.Join(pod.Spec.Containers[0].Command, " ") + " "
		for _, w := range tc.want {
			if !strings.Contains(cmd, " "+w+" ") {
				t.Errorf("%q %q: no %q in %q", tc.user, tc.workdir, w, cmd)
			}
		}
		for _, n := range tc.not {
			if strings.Contains(cmd, n) {
				t.Errorf("%q %q: %q in %q", tc.user, tc.workdir, n, cmd)
			}
		}
	}
}

// PodPids reads the annotation the NRI plugin acts on: absent is no
// limit; anything but a positive number is an error, never a limit of 0
// (which would be none).
func TestPodPidsAnnotation(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]int64{"256": 256, "1": 1, "0": -1, "-3": -1, "": -1, "12x": -1, "9223372036854775808": -1} {
		n, err := PodPids(map[string]string{AnnotationPids: v})
		if want < 0 && err == nil || want >= 0 && (err != nil || n != want) {
			t.Errorf("%q: %d, %v", v, n, err)
		}
	}
	if n, err := PodPids(map[string]string{"other": "1"}); n != 0 || err != nil {
		t.Errorf("no annotation: %d, %v", n, err)
	}
}

// The agent's directory is the image's, read-only, over the writable
// root's: the binary the agent executes again (its helpers) cannot be
// replaced by root in the sandbox.
func TestPodAgentReadOnly(t *testing.T) {
	t.Parallel()
	r, _ := newRuntime(t, Config{PullPolicy: corev1.PullNever})
	pod, err := r.pod(spec("abc"), "registry.example/python:1")
	if err != nil {
		t.Fatal(err)
	}
	var vol *corev1.Volume
	for i, v := range pod.Spec.Volumes {
		if v.Name == "agent" {
			vol = &pod.Spec.Volumes[i]
		}
	}
	if vol == nil || vol.Image == nil || vol.Image.Reference != "registry.example/python:1" || vol.Image.PullPolicy != corev1.PullNever {
		t.Fatalf("the agent's volume: %+v", vol)
	}
	c := pod.Spec.Containers[0]
	var m []corev1.VolumeMount
	for _, vm := range c.VolumeMounts {
		if vm.Name == "agent" {
			m = append(m, vm)
		}
	}
	if len(m) != 1 || m[0].MountPath != "/.sheepfold" || m[0].SubPath != ".sheepfold" || !m[0].ReadOnly {
		t.Fatalf("the agent's mounts: %+v", m)
	}
	if !strings.HasPrefix(c.Command[0], m[0].MountPath+"/") || !strings.Contains(strings.Join(c.Command, " "), "--scratch "+m[0].MountPath+"/") {
		t.Fatalf("the agent and its home seed are not from the read-only mount: %v", c.Command)
	}
	// Nothing is mounted inside it (it has no mount point of its own).
	for _, vm := range c.VolumeMounts {
		if strings.HasPrefix(vm.MountPath, "/.sheepfold/") {
			t.Errorf("%s is mounted inside the agent's read-only directory", vm.MountPath)
		}
	}
}

// A read-only sandbox has no scratch volume: it writes only to its
// writable paths, each an emptyDir bounded by its disk limit.
func TestPodReadOnlyHasNoScratch(t *testing.T) {
	t.Parallel()
	r, _ := newRuntime(t, Config{})
	sp := spec("abc")
	sp.ReadOnly, sp.WritablePaths = true, []string{"/data"}
	pod, err := r.pod(sp, "image")
	if err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0]
	if cmd := strings.Join(c.Command, " "); strings.Contains(cmd, "--scratch") || !*c.SecurityContext.ReadOnlyRootFilesystem {
		t.Fatalf("command %q, read-only root %v", cmd, *c.SecurityContext.ReadOnlyRootFilesystem)
	}
	var paths []string
	for _, m := range c.VolumeMounts {
		paths = append(paths, m.MountPath)
	}
	if !slices.Equal(paths, []string{"/.sheepfold-tls", "/.sheepfold", "/data"}) {
		t.Fatalf("mounts %v", paths)
	}
	if ed := pod.Spec.Volumes[2].EmptyDir; ed == nil || ed.Medium != "" || ed.SizeLimit.Value() != 1<<30 {
		t.Fatalf("writable path volume %+v", pod.Spec.Volumes[2])
	}
}

// The Pod's firewall: an init container, the agent's netlock with
// NET_ADMIN and nothing else, closes the Pod's network before the
// sandbox starts; OpenNetwork leaves it out. A netlock that failed fails
// the create, and says so.
func TestPodNetlock(t *testing.T) {
	t.Parallel()
	r, cs := newRuntime(t, Config{})
	pod, err := r.pod(spec("abc"), "image")
	if err != nil {
		t.Fatal(err)
	}
	if len(pod.Spec.InitContainers) != 1 {
		t.Fatalf("init containers: %+v", pod.Spec.InitContainers)
	}
	ic := pod.Spec.InitContainers[0]
	sc := ic.SecurityContext
	if ic.Name != "netlock" || ic.Image != "image" || strings.Join(ic.Command, " ") != "/.sheepfold/agent netlock --agent-port 49983" ||
		*sc.AllowPrivilegeEscalation || *sc.Privileged || !*sc.ReadOnlyRootFilesystem ||
		!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"NET_ADMIN"}) ||
		sc.SeccompProfile.Type != corev1.SeccompProfileTypeLocalhost {
		t.Fatalf("netlock container: %+v, security %+v", ic, sc)
	}
	main := pod.Spec.Containers[0]
	if !ic.Resources.Limits.Memory().Equal(*main.Resources.Limits.Memory()) || !ic.Resources.Requests.Cpu().Equal(*main.Resources.Requests.Cpu()) {
		t.Fatalf("netlock resources %v, the sandbox's %v", ic.Resources, main.Resources)
	}
	if slices.Contains(main.SecurityContext.Capabilities.Add, "NET_ADMIN") {
		t.Fatal("the sandbox's container has NET_ADMIN")
	}

	open, _ := newRuntime(t, Config{OpenNetwork: true})
	if pod, err := open.pod(spec("abc"), "image"); err != nil || len(pod.Spec.InitContainers) != 0 {
		t.Fatalf("OpenNetwork: init containers %+v, %v", pod.Spec.InitContainers, err)
	}
	// A RuntimeClass whose kernel has no nftables (gVisor's), chosen or
	// the default, gets none either; the others do.
	gv, _ := newRuntime(t, Config{RuntimeClass: "gvisor", RuntimeClasses: map[string]string{"fast": "runc", "safe": "gvisor"}, OpenNetworkRuntimes: []string{"gvisor"}})
	for rt, want := range map[string]int{"": 0, "safe": 0, "fast": 1} {
		sp := spec("abc")
		sp.Runtime = rt
		if pod, err := gv.pod(sp, "image"); err != nil || len(pod.Spec.InitContainers) != want {
			t.Fatalf("runtime %q: %d init containers, want %d (%v)", rt, len(pod.Spec.InitContainers), want, err)
		}
	}

	kubelet(t, cs, "sf-nl", corev1.PodStatus{Phase: corev1.PodPending, InitContainerStatuses: []corev1.ContainerStatus{{
		Name: "netlock", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", Message: "netlock: nftables rules: operation not permitted"}},
	}}})
	_, err = r.Create(context.Background(), spec("nl"))
	if err == nil || !strings.Contains(err.Error(), "netlock exited with 1 (Error): netlock: nftables rules: operation not permitted") {
		t.Fatalf("create with a failed netlock: %v", err)
	}
	if ids, err := r.List(context.Background()); err != nil || len(ids) != 0 {
		t.Fatalf("left behind: %v, %v", ids, err)
	}
}

// TestPodGPUs: a sandbox's GPUs are the sandbox container's limit of the
// GPU extended resource (the device plugin's to allocate), not the
// netlock container's; none asked, none in the Pod. Devices by name are
// refused before anything is made.
func TestPodGPUs(t *testing.T) {
	t.Parallel()
	r, _ := newRuntime(t, Config{GPUResource: "example.com/gpu"})
	sp := spec("abc")
	sp.GPUs = 2
	pod, err := r.pod(sp, "image")
	if err != nil {
		t.Fatal(err)
	}
	gpu := corev1.ResourceName("example.com/gpu")
	if q := pod.Spec.Containers[0].Resources.Limits[gpu]; q.Value() != 2 {
		t.Errorf("the sandbox's container asks for %v GPUs: %v", q.Value(), pod.Spec.Containers[0].Resources.Limits)
	}
	if _, ok := pod.Spec.InitContainers[0].Resources.Limits[gpu]; ok {
		t.Errorf("the netlock container asks for GPUs: %v", pod.Spec.InitContainers[0].Resources.Limits)
	}
	if pod, err := r.pod(spec("abc"), "image"); err != nil || len(pod.Spec.Containers[0].Resources.Limits) != len(pod.Spec.InitContainers[0].Resources.Limits) {
		t.Errorf("without GPUs: %v, %v", pod.Spec.Containers[0].Resources.Limits, err)
	}
	if r.GPUResource() != "example.com/gpu" {
		t.Errorf("GPUResource = %q", r.GPUResource())
	}
	_, err = r.Create(context.Background(), runtime.Spec{ID: "a5", Template: "python", Devices: []string{"nvidia.com/gpu=0"}})
	if !errors.Is(err, runtime.ErrUnsupported) {
		t.Fatalf("devices by name: %v, want ErrUnsupported", err)
	}
	if ids, _ := r.List(context.Background()); len(ids) != 0 {
		t.Fatalf("left behind: %v", ids)
	}
}

// TestReady: the runtime is ready while the API server answers a list of
// its Pods in its namespace (what /readyz asks on this backend), and not
// once it fails.
func TestReady(t *testing.T) {
	r, cs := newRuntime(t, Config{})
	if err := r.Ready(context.Background()); err != nil {
		t.Fatalf("ready: %v", err)
	}
	var asked string
	cs.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		asked = a.GetNamespace()
		return true, nil, errors.New("connection refused")
	})
	err := r.Ready(context.Background())
	if err == nil || !strings.Contains(err.Error(), "the cluster does not answer") || asked != ns {
		t.Fatalf("with the API server gone: %v (asked in %q)", err, asked)
	}
}

// Each volume is a PersistentVolumeClaim of the configured StorageClass
// and access mode, asking for its size; making it again is no error,
// removing it deletes the claim, and its use is not measured.
func TestVolumeClaims(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r, cs := newRuntime(t, Config{StorageClass: "fast-ssd"})
	if err := r.MakeVolume(ctx, "vol-abc", 64<<20); err != nil {
		t.Fatal(err)
	}
	if err := r.MakeVolume(ctx, "vol-abc", 64<<20); err != nil {
		t.Fatalf("made again: %v", err)
	}
	c, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "vol-abc", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Spec.StorageClassName == nil || *c.Spec.StorageClassName != "fast-ssd" ||
		!slices.Equal(c.Spec.AccessModes, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}) ||
		c.Spec.Resources.Requests.Storage().Value() != 64<<20 || c.Labels[LabelVolume] != "vol-abc" || c.Labels[LabelInstance] != DefaultInstance {
		t.Fatalf("claim %+v", c)
	}
	if _, _, err := r.VolumeUsage(ctx, "vol-abc"); !errors.Is(err, runtime.ErrUnsupported) {
		t.Errorf("usage: %v, want ErrUnsupported", err)
	}
	// A claim is no sandbox: the collector never sees it.
	if ids, err := r.List(ctx); err != nil || len(ids) != 0 {
		t.Errorf("List = %v, %v; want no sandboxes", ids, err)
	}
	if err := r.RemoveVolume(ctx, "vol-abc"); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "vol-abc", metav1.GetOptions{}); err == nil {
		t.Fatal("the claim is still there")
	}
	if err := r.RemoveVolume(ctx, "vol-abc"); err != nil {
		t.Errorf("removed twice: %v", err)
	}
	if _, _, err := r.VolumeUsage(ctx, "vol-abc"); !errors.Is(err, runtime.ErrVolumeNotFound) {
		t.Errorf("usage of a removed volume: %v", err)
	}
	if err := r.MakeVolume(ctx, "Vol_Bad", 1<<20); err == nil {
		t.Error("a bad id was made")
	}
	// No StorageClass: the cluster's default (none named).
	r2, cs2 := newRuntime(t, Config{VolumeAccessMode: corev1.ReadWriteMany})
	if err := r2.MakeVolume(ctx, "vol-def", 1<<20); err != nil {
		t.Fatal(err)
	}
	if c, _ := cs2.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "vol-def", metav1.GetOptions{}); c.Spec.StorageClassName != nil || c.Spec.AccessModes[0] != corev1.ReadWriteMany {
		t.Errorf("default claim %+v", c.Spec)
	}
	for _, cfg := range []Config{{StorageClass: "Bad_Class"}, {VolumeAccessMode: "ReadOnlyMany"}} {
		cfg.Namespace, cfg.CA, cfg.Client = ns, r.cfg.CA, r.cfg.Client
		if _, err := New(cs, cfg); err == nil {
			t.Errorf("New accepted %+v", cfg)
		}
	}
}

// A sandbox's volumes are its Pod's claims, mounted at their paths,
// read-only ones read-only in both the volume source and the mount; the
// agent gives the read-write ones to the user.
func TestPodVolumes(t *testing.T) {
	t.Parallel()
	r, _ := newRuntime(t, Config{})
	sp := spec("abc")
	sp.Volumes = []runtime.VolumeMount{{ID: "vol-rw", Path: "/data"}, {ID: "vol-ro", Path: "/home/user/ref", ReadOnly: true}}
	pod, err := r.pod(sp, "image")
	if err != nil {
		t.Fatal(err)
	}
	claims := map[string]corev1.PersistentVolumeClaimVolumeSource{}
	names := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			claims[v.Name] = *v.PersistentVolumeClaim
		}
	}
	c := pod.Spec.Containers[0]
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		if _, ok := claims[m.Name]; ok {
			mounts[m.MountPath] = m
			names[m.MountPath] = claims[m.Name].ClaimName
		}
	}
	if len(claims) != 2 || names["/data"] != "vol-rw" || names["/home/user/ref"] != "vol-ro" {
		t.Fatalf("claims %v, mounts %v", claims, names)
	}
	if mounts["/data"].ReadOnly || claims[mounts["/data"].Name].ReadOnly {
		t.Error("the read-write volume is read-only")
	}
	if !mounts["/home/user/ref"].ReadOnly || !claims[mounts["/home/user/ref"].Name].ReadOnly {
		t.Error("the read-only volume is writable")
	}
	cmd := strings.Join(c.Command, " ")
	if !strings.Contains(cmd, "--own-volume /data") || strings.Contains(cmd, "--own-volume /home/user/ref") {
		t.Errorf("agent command %q: want --own-volume for /data alone", cmd)
	}
}
