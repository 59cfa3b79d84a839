package oci

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// StepRunner runs the RUN steps of template builds (template.StepRunner,
// through the wiring): each in a runc container of its own whose root is
// the half-built template, with
//   - a user namespace mapping 0..65535 to the template's shifted ids
//     (Step.HostID..+65535), made by runc;
//   - pid, mount, ipc, uts, cgroup and network namespaces: the network
//     has only lo, so a step reaches no host and no registry, unless
//     Step.Network gives it one (a namespace made here, owned by the
//     host's user namespace so the step cannot change its routes or
//     addresses, with lo up and whatever its Attach puts there: the
//     engine's egress gateway, limited to the registries the operator
//     allows; such a step's /sys is an empty tmpfs, as only the
//     namespace's owner may mount sysfs);
//   - root's capabilities RootCapabilities only (none for another
//     USER), no_new_privs, SeccompProfile, NamespaceLimits (no further
//     namespaces), Docker's masked and read-only paths;
//   - a cgroup of its own under /sheepfold-build with StepMemoryBytes
//     and StepPids.
//
// Run returns once the step's first process has ended; its pid namespace
// ends everything else it started, and runc delete --force removes the
// container and its cgroup whatever happened, so no process outlives it.
type StepRunner struct {
	RuntimePath string // runc
	// Dir holds the bundles (Dir/bundles/<id>) and runc's state
	// (Dir/runc) while steps run.
	Dir string
}

// Step is one command of a build.
type Step struct {
	RootFS   string
	Args     []string
	Env      []string
	Cwd      string
	UID, GID uint32 // in the container
	HostID   uint32 // container id 0 is this host id
	// Network, if set, gives the step a network namespace of its own
	// that Network.Attach connects; nil: only lo.
	Network *StepNetwork
}

// StepNetwork is the network of a build step.
type StepNetwork struct {
	ResolvConf string // the step's /etc/resolv.conf
	// CAFile, if set, is a host file of CA certificates the step's TLS
	// clients trust (as well as the template's): bound read-only at
	// StepCAPath, named by StepCAEnv unless the step sets those itself.
	CAFile string
	// Attach connects the namespace at nsPath (made by Run, lo up,
	// before the step's container) to the outside, and is undone by its
	// caller once Run returns.
	Attach func(ctx context.Context, nsPath string) error
}

// StepCAPath is where a step's StepNetwork.CAFile is, inside it: under
// /dev, a tmpfs of the step's own, so that its mount point is never
// made in the template's tree.
const StepCAPath = "/dev/sheepfold-build-ca.crt"

// StepCAEnv names StepCAPath to the TLS clients of a step: OpenSSL
// (Python, curl, apt's https), Node (npm), Python's requests and pip.
var StepCAEnv = []string{"SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE"}

// Limits of a build step's cgroup.
const (
	StepMemoryBytes = 4 << 30
	StepPids        = 4096
)

// Run runs s and returns its error: a non-zero exit, or the context's.
func (r StepRunner) Run(ctx context.Context, s Step, out io.Writer) (err error) {
	if r.RuntimePath == "" || r.Dir == "" {
		return errors.New("step runner: RuntimePath and Dir are required")
	}
	if len(s.Args) == 0 {
		return errors.New("step runner: no command")
	}
	id := r.stepPrefix() + strings.ToLower(rand.Text()[:16])
	runcRoot := filepath.Join(r.Dir, "runc")
	bundle := filepath.Join(r.Dir, "bundles", id)
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, r.cleanStep(context.WithoutCancel(ctx), id, bundle)) }()
	spec, err := stepSpec(s, id)
	if err != nil {
		return err
	}
	if s.Network != nil {
		ns, err := newNetNS()
		if err != nil {
			return fmt.Errorf("step network: %w", err)
		}
		defer ns.Close()
		path := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), ns.Fd())
		if err := s.Network.Attach(ctx, path); err != nil {
			return fmt.Errorf("step network: %w", err)
		}
		resolv := filepath.Join(bundle, "resolv.conf")
		if err := os.WriteFile(resolv, []byte(s.Network.ResolvConf), 0o644); err != nil {
			return err
		}
		for i, n := range spec.Linux.Namespaces {
			if n.Type == specs.NetworkNamespace {
				spec.Linux.Namespaces[i].Path = path
			}
		}
		// sysfs may only be mounted by the owner of the network
		// namespace, which this one's is not: an empty /sys instead.
		for i, m := range spec.Mounts {
			if m.Type == "sysfs" {
				spec.Mounts[i] = specs.Mount{Destination: "/sys", Type: "tmpfs", Source: "tmpfs",
					Options: []string{"nosuid", "noexec", "nodev", "ro", "size=4k"}}
			}
		}
		spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/etc/resolv.conf", Type: "bind",
			Source: resolv, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
		if f := s.Network.CAFile; f != "" {
			spec.Mounts = append(spec.Mounts, specs.Mount{Destination: StepCAPath, Type: "bind",
				Source: f, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
			set := map[string]bool{}
			for _, kv := range spec.Process.Env {
				k, _, _ := strings.Cut(kv, "=")
				set[k] = true
			}
			for _, k := range StepCAEnv {
				if !set[k] {
					spec.Process.Env = append(spec.Process.Env, k+"="+StepCAPath)
				}
			}
		}
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
		return err
	}
	cmd := exec.Command(r.RuntimePath, "--root", runcRoot, "run", "--bundle", bundle, id)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("runc run: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		kill := exec.Command(r.RuntimePath, "--root", runcRoot, "kill", id, "KILL")
		_ = kill.Run()
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return ctx.Err()
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return fmt.Errorf("exit status %d", ee.ExitCode())
	}
	return err
}

// stepSpec is the OCI spec of one build step (see StepRunner).
func stepSpec(s Step, id string) (*specs.Spec, error) {
	caps := &specs.LinuxCapabilities{Bounding: []string{}, Effective: []string{}, Permitted: []string{},
		Inheritable: []string{}, Ambient: []string{}}
	if s.UID == 0 {
		c := slices.Clone(RootCapabilities)
		caps.Bounding, caps.Effective, caps.Permitted = c, slices.Clone(c), slices.Clone(c)
	}
	mem, pids := int64(StepMemoryBytes), int64(StepPids)
	sc, err := SeccompProfile()
	if err != nil {
		return nil, err
	}
	cwd := s.Cwd
	if cwd == "" {
		cwd = "/"
	}
	ids := []specs.LinuxIDMapping{{ContainerID: 0, HostID: s.HostID, Size: DefaultIDMap.Size}}
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User:            specs.User{UID: s.UID, GID: s.GID},
			Args:            s.Args,
			Env:             s.Env,
			Cwd:             cwd,
			Capabilities:    caps,
			NoNewPrivileges: true,
		},
		Root:     &specs.Root{Path: s.RootFS},
		Hostname: "build",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		},
		Linux: &specs.Linux{
			UIDMappings: ids,
			GIDMappings: slices.Clone(ids),
			CgroupsPath: "/" + stepCgroupParent + "/" + id,
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
				Memory:  &specs.LinuxMemory{Limit: &mem, Swap: &mem},
				Pids:    &specs.LinuxPids{Limit: &pids},
			},
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace}, {Type: specs.UserNamespace},
				{Type: specs.CgroupNamespace},
			},
			Sysctl:        maps.Clone(NamespaceLimits),
			MaskedPaths:   maskedPaths,
			ReadonlyPaths: readonlyPaths,
			Seccomp:       sc,
		},
	}, nil
}

// cleanStep removes step id whatever happened: its container (and so
// every process of it), its cgroups, then its bundle. A runc killed while
// it made the container (a cancelled build) leaves cgroups but no state
// for `runc delete` to find: they are killed and removed by their path.
func (r StepRunner) cleanStep(ctx context.Context, id, bundle string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var err error
	var o bytes.Buffer
	d := exec.CommandContext(ctx, r.RuntimePath, "--root", filepath.Join(r.Dir, "runc"), "delete", "--force", id)
	d.Stdout, d.Stderr = &o, &o
	if derr := d.Run(); derr != nil && !strings.Contains(o.String(), "does not exist") {
		err = fmt.Errorf("runc delete %s: %w: %s", id, derr, strings.TrimSpace(o.String()))
	}
	if c, cerr := detectCgroups(stepCgroupParent); cerr != nil {
		err = errors.Join(err, cerr)
	} else if kerr := c.kill(id); kerr != nil {
		err = errors.Join(err, kerr)
	} else {
		err = errors.Join(err, c.remove(id))
	}
	err = errors.Join(err, os.RemoveAll(bundle))
	removeStepCgroupParents()
	return err
}

// stepCgroupParent holds the build steps' cgroups.
const stepCgroupParent = "sheepfold-build"

// stepPrefix starts the ids (and so the cgroups' names) of this runner's
// steps: "build-", then a digest of Dir, so that the steps of runners on
// other directories (another data dir's builds, running at once) are
// told apart.
func (r StepRunner) stepPrefix() string {
	sum := sha256.Sum256([]byte(r.Dir))
	return "build-" + hex.EncodeToString(sum[:4]) + "-"
}

// CgroupGlob matches the cgroups of this runner's steps in every
// hierarchy: none is left once its steps have ended.
func (r StepRunner) CgroupGlob() string {
	return filepath.Join("/sys/fs/cgroup", "*", stepCgroupParent, r.stepPrefix()+"*")
}

// removeStepCgroupParents removes the steps' parent cgroup in each
// hierarchy once no step's cgroup is in it (a step running elsewhere
// keeps it: rmdir fails with EBUSY and it stays for that step's end).
func removeStepCgroupParents() {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", stepCgroupParent))
	for _, d := range append(dirs, filepath.Join("/sys/fs/cgroup", stepCgroupParent)) {
		_ = os.Remove(d)
	}
}

// newNetNS makes a network namespace, owned by the host's user namespace,
// with lo up, and returns it open. It is made on a thread of its own
// that ends in it (the goroutine returns locked), so no other goroutine
// runs in it.
func newNetNS() (*os.File, error) {
	type result struct {
		f   *os.File
		err error
	}
	ch := make(chan result, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread goes with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- result{nil, fmt.Errorf("unshare: %w", err)}
			return
		}
		f, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			ch <- result{nil, err}
			return
		}
		if err := loopbackUp(); err != nil { // checkpoint_linux.go
			f.Close()
			ch <- result{nil, fmt.Errorf("lo up: %w", err)}
			return
		}
		ch <- result{f, nil}
	}()
	r := <-ch
	return r.f, r.err
}
