// Package fake is a runtime.Runtime for tests: it runs the real agent as a
// plain child process on the host, with its file operations confined to a
// temporary root, and no isolation at all. Use it to test the engine and
// the transports without root; never to run untrusted code.
//
// Imports: internal/runtime, internal/osthread (an agent's Pdeathsig) and
// the standard library.
package fake

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sheepfold/sheepfold/internal/osthread"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

var (
	_ runtime.Runtime = (*Runtime)(nil)
	_ runtime.Resizer = (*Runtime)(nil)
)

// Runtime starts agents as host processes.
type Runtime struct {
	AgentBin string // the agent binary
	Dir      string // each sandbox gets Dir/<id>, with root/ and agent.sock
	// Used is what Usage reports for every sandbox (the fake has no cgroup).
	Used runtime.Usage
	// Unmeasured makes Usage fail with runtime.ErrUnsupported, as a
	// runtime whose host cannot read its sandboxes' cgroups (kubernetes):
	// the engine then asks each sandbox's agent (agentproto.OpUsage).
	Unmeasured bool
	// CgroupRoot, when set, is where the agents read their usage
	// (--cgroup-root): a fake cgroup tree of the test's.
	CgroupRoot string

	// Choices are the values of Spec.Runtime it accepts besides "" (its
	// Runtimes); nil offers "fake" alone. They all run the same way.
	Choices []string
	// DiskMemory is DiskInMemory's answer (runtime.DiskMemory): true
	// plays a runtime that keeps disks in memory, as the oci runtime
	// does without loop devices.
	DiskMemory atomic.Bool
	// VolumesUnmeasured makes VolumeUsage say ErrUnsupported for a
	// volume it holds, as a runtime whose volumes are measured elsewhere
	// (Kubernetes' claims) does.
	VolumesUnmeasured atomic.Bool
	// DeviceList is what Devices lists (runtime.Devices): the fake gives
	// a sandbox none of them, it only records them in its Spec.
	DeviceList []runtime.Device

	// mu guards procs, held, specs, resized and the hung reading's fields.
	mu      sync.Mutex
	procs   map[string]*exec.Cmd
	resized map[string]runtime.Limits // the last Resize of each sandbox
	held    map[string]runtime.Held
	specs   map[string]runtime.Spec // sandbox id → the Spec it was created with
	// hung is the sandbox whose usage readings hang (HangUsage); began
	// is told when one starts, unhung closes when they end.
	hung   string
	began  chan struct{}
	unhung chan struct{}
}

// HangUsage makes every usage reading of sandbox id hang until its caller
// gives up, as one of an agent whose Pod is gone. began receives when a
// reading starts; release ends the readings still hanging, and the hang.
func (r *Runtime) HangUsage(id string) (began <-chan struct{}, release func()) {
	b, unhung := make(chan struct{}, 1), make(chan struct{})
	r.mu.Lock()
	r.hung, r.began, r.unhung = id, b, unhung
	r.mu.Unlock()
	var once sync.Once
	return b, func() {
		once.Do(func() {
			r.mu.Lock()
			r.hung = ""
			r.mu.Unlock()
			close(unhung)
		})
	}
}

var (
	_ runtime.Attacher  = (*Runtime)(nil)
	_ runtime.Inventory = (*Runtime)(nil)
)

// Name implements runtime.Runtime.
var _ runtime.DiskMemory = (*Runtime)(nil)

func (r *Runtime) Name() string { return "fake" }

var _ runtime.Devices = (*Runtime)(nil)

// Devices implements runtime.Devices.
func (r *Runtime) Devices() ([]runtime.Device, error) { return slices.Clone(r.DeviceList), nil }

// DiskInMemory implements runtime.DiskMemory.
func (r *Runtime) DiskInMemory() bool { return r.DiskMemory.Load() }

// Runtimes implements runtime.Chooser.
func (r *Runtime) Runtimes() []string {
	if r.Choices == nil {
		return []string{"fake"}
	}
	return r.Choices
}

// Chosen returns the Spec.Runtime that sandbox id was created with.
func (r *Runtime) Chosen(id string) string { return r.Spec(id).Runtime }

// Spec returns the Spec sandbox id was created with (its Limits are what
// a real runtime's cgroup would be given); the zero Spec for an unknown id.
func (r *Runtime) Spec(id string) runtime.Spec {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.specs[id]
}

// Create implements runtime.Runtime.
func (r *Runtime) Create(ctx context.Context, s runtime.Spec) (*runtime.Instance, error) {
	if s.Network != nil {
		// The fake's agent runs in the host's own network.
		return nil, fmt.Errorf("%w: the fake runtime has no sandbox networks", runtime.ErrUnsupported)
	}
	if s.Runtime != "" && !slices.Contains(r.Runtimes(), s.Runtime) {
		return nil, fmt.Errorf("%w: runtime %q is not offered", runtime.ErrUnsupported, s.Runtime)
	}
	dir := filepath.Join(r.Dir, s.ID)
	home := filepath.Join(dir, "root", "home", "user")
	if err := os.MkdirAll(home, 0o755); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "root", "tmp"), 0o1777); err != nil {
		return nil, err
	}
	for _, v := range s.Volumes {
		if _, err := os.Stat(filepath.Join(r.Dir, "volumes", v.ID)); err != nil {
			return nil, fmt.Errorf("%w: %s", runtime.ErrVolumeNotFound, v.ID)
		}
		if err := os.MkdirAll(filepath.Join(dir, "root", v.Path), 0o755); err != nil {
			return nil, err
		}
	}
	sock := filepath.Join(dir, "agent.sock")
	args := []string{"serve", "--listen", sock, "--root", filepath.Join(dir, "root"), "--home", "/home/user"}
	if r.CgroupRoot != "" {
		args = append(args, "--cgroup-root", r.CgroupRoot)
	}
	if s.Lifetime > 0 {
		// As a Pod's agent: a deadline from the start (runtime.Spec.Lifetime).
		args = append(args, "--lifetime", s.Lifetime.String())
	}
	cmd := exec.Command(r.AgentBin, args...)
	cmd.Dir = home
	cmd.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + home, "LANG=C.UTF-8"}, s.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	logf, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	// On the thread that never ends: the agent's Pdeathsig comes when the
	// process that started it ends, not when a thread of it does.
	if err := osthread.Kept(cmd.Start); err != nil {
		return nil, err
	}
	r.mu.Lock()
	if r.procs == nil {
		r.procs = map[string]*exec.Cmd{}
	}
	r.procs[s.ID] = cmd
	if r.held == nil {
		r.held = map[string]runtime.Held{}
	}
	h := runtime.Held{ID: s.ID, Created: time.Now(), Pool: s.Pool}
	if s.Attendant {
		h.Until = h.Created.Add(s.Lifetime)
	}
	r.held[s.ID] = h
	if r.specs == nil {
		r.specs = map[string]runtime.Spec{}
	}
	r.specs[s.ID] = s
	r.mu.Unlock()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			r.Destroy(ctx, s.ID)
			b, _ := os.ReadFile(logf.Name())
			return nil, fmt.Errorf("fake agent did not listen: %s", b)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return &runtime.Instance{ID: s.ID, Socket: sock, PID: cmd.Process.Pid}, nil
}

// Destroy implements runtime.Runtime: it kills the agent's process group.
func (r *Runtime) Destroy(_ context.Context, id string) error {
	r.mu.Lock()
	cmd, ok := r.procs[id]
	delete(r.procs, id)
	delete(r.held, id)
	r.mu.Unlock()
	if ok {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	}
	if err := os.RemoveAll(filepath.Join(r.Dir, id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Usage implements runtime.Runtime; the fake measures nothing (it reports
// Used), and a reading of the sandbox HangUsage names hangs.
func (r *Runtime) Usage(ctx context.Context, id string) (runtime.Usage, error) {
	r.mu.Lock()
	if id != "" && id == r.hung {
		began, unhung := r.began, r.unhung
		r.mu.Unlock()
		select {
		case began <- struct{}{}:
		default:
		}
		select {
		case <-ctx.Done():
			return runtime.Usage{}, ctx.Err()
		case <-unhung:
			return runtime.Usage{}, context.Canceled
		}
	}
	r.mu.Unlock()
	if r.Unmeasured {
		return runtime.Usage{}, fmt.Errorf("%w: the fake runtime measures nothing", runtime.ErrUnsupported)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.procs[id]; !ok {
		return runtime.Usage{}, runtime.ErrNotFound
	}
	return r.Used, nil
}

// Resize implements runtime.Resizer: the fake enforces nothing; it
// remembers the sizes asked for (Resized).
func (r *Runtime) Resize(_ context.Context, id string, l runtime.Limits) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.procs[id]; !ok {
		return runtime.ErrNotFound
	}
	if r.resized == nil {
		r.resized = map[string]runtime.Limits{}
	}
	cur := r.resized[id]
	if l.MemoryBytes > 0 {
		cur.MemoryBytes = l.MemoryBytes
	}
	if l.DiskBytes > 0 {
		cur.DiskBytes = l.DiskBytes
	}
	r.resized[id] = cur
	return nil
}

// Resized is what Resize last set for sandbox id (zero fields: never set).
func (r *Runtime) Resized(id string) runtime.Limits {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.resized[id]
}

// SetUsed sets Used while sandboxes run (Usage reads it under the lock).
func (r *Runtime) SetUsed(u runtime.Usage) {
	r.mu.Lock()
	r.Used = u
	r.mu.Unlock()
}

// List implements runtime.Runtime.
func (r *Runtime) List(context.Context) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]string, 0, len(r.procs))
	for id := range r.procs {
		ids = append(ids, id)
	}
	return ids, nil
}

// Attach implements runtime.Attacher: engines sharing one fake runtime
// play replicas sharing a cluster.
func (r *Runtime) Attach(_ context.Context, id string) (*runtime.Instance, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cmd, ok := r.procs[id]
	if !ok {
		return nil, runtime.ErrNotFound
	}
	return &runtime.Instance{ID: id, Socket: filepath.Join(r.Dir, id, "agent.sock"), PID: cmd.Process.Pid}, nil
}

// Inventory implements runtime.Inventory.
func (r *Runtime) Inventory(context.Context) ([]runtime.Held, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]runtime.Held, 0, len(r.held))
	for _, h := range r.held {
		out = append(out, h)
	}
	return out, nil
}

// End marks instance id ended, as a Pod whose agent exited is (its
// objects stay until destroyed): Inventory then reports it Ended.
func (r *Runtime) End(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if h, ok := r.held[id]; ok {
		h.Ended = true
		r.held[id] = h
	}
}

var _ runtime.Volumes = (*Runtime)(nil)

// MakeVolume implements runtime.Volumes: a directory under Dir/volumes,
// with no bound on its size. The fake mounts nothing: a sandbox's Spec
// records its volumes (Spec) and its root gets an empty directory at
// each path.
func (r *Runtime) MakeVolume(_ context.Context, id string, size int64) error {
	return os.MkdirAll(filepath.Join(r.Dir, "volumes", id), 0o755)
}

// RemoveVolume implements runtime.Volumes.
func (r *Runtime) RemoveVolume(_ context.Context, id string) error {
	return os.RemoveAll(filepath.Join(r.Dir, "volumes", id))
}

// VolumeUsage implements runtime.Volumes: nothing used of no bound.
func (r *Runtime) VolumeUsage(_ context.Context, id string) (int64, int64, error) {
	if _, err := os.Stat(filepath.Join(r.Dir, "volumes", id)); err != nil {
		return 0, 0, runtime.ErrVolumeNotFound
	}
	if r.VolumesUnmeasured.Load() {
		return 0, 0, runtime.ErrUnsupported
	}
	return 0, 0, nil
}

var _ runtime.VolumeOpener = (*Runtime)(nil)

// OpenVolume implements runtime.VolumeOpener: the volume's directory,
// owned by this process's user.
func (r *Runtime) OpenVolume(_ context.Context, id string) (*os.File, int, int, error) {
	f, err := os.Open(filepath.Join(r.Dir, "volumes", id))
	if err != nil {
		return nil, 0, 0, runtime.ErrVolumeNotFound
	}
	return f, os.Getuid(), os.Getgid(), nil
}
