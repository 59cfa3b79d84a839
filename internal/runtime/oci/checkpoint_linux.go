package oci

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/runtime"
)

// Checkpoint and restore (runtime.Checkpointer), with runc's checkpoint
// and restore driven by CRIU (Config.CriuPath, a release the set-up
// builds and pins: scripts/criu.sh).
//
// A checkpoint writes every process of the sandbox (memory, threads,
// open files, sockets among its own processes, TCP connections on its
// own loopback, seccomp filters, credentials) into the directory given,
// then runc ends the container: its processes are gone and its cgroups
// removed, so the memory they held is freed. The images are the
// sandbox's memory, readable by the sandbox's host ids: the directory is
// made 0710 with their group, as the bundle is. What stays is the sandbox's
// bundle: its disk and overlay stay mounted (the writable layer is
// the sandbox's files, kept as they are), its id range stays taken, its
// config.json stays. A restore starts the same processes again from the
// directory, in new cgroups with the same limits and a new user
// namespace of the same host ids, and gives back the sandbox's Instance.
//
// Three of the agent's descriptors lead out of the sandbox, to objects of
// the host's, which CRIU cannot dump or recreate by itself: the agent's
// log (its stdin, stdout and stderr: Create makes them one file), its
// listening socket (fd 3, bound in the bundle, of the host's network
// namespace) and, with a pids limit, the sandbox's pids cgroup
// (PidsCgroupFD). A checkpoint names them as CRIU externals: the log and
// the cgroup as "file[mount id:inode]", the listener as "unix[inode]"
// (which our CRIU's patch lets stand for a socket of another network
// namespace: scripts/criu.sh). A restore gives CRIU the pids cgroup, a
// new listening socket at the same path and the log to put in their
// place ("inherit-fd"), on runc restore's own stdin, stdout and stderr,
// the only descriptors runc hands to CRIU. The options go through the
// CRIU configuration file the spec names (the annotation
// org.criu.config, criuConfigAnnotation), written by each checkpoint and
// restore; the spec records the listener's inode (agentSocketAnnotation).
//
// The restored sandbox's namespaces are new: CRIU makes the user
// namespace with the dumped maps (the sandbox's own host ids), owned by
// the range's first uid as Create's is (criuOwnerEnv), so that its
// per-user kernel counters are charged to it again, and the network
// namespace with its loopback down. The restore brings lo up and writes
// NamespaceLimits into the user namespace again before it returns; for
// that moment the restored processes run without them (seccomp still
// refuses new namespaces).
//
// What a checkpoint needs of the sandbox: no connection to the agent may
// be open (the engine closes its own first; an open one is a stream
// socket with its other end on the host, which fails the dump), and no
// process of the sandbox may hold another host object. Nothing else in a
// sandbox leads out: the agent's bind mounts (its binary, resolv.conf)
// are external mounts runc maps, and code inside can open nothing of the
// host's. A failed checkpoint leaves the sandbox running as it was; a
// failed restore leaves it checkpointed (the directory is kept).
//
// A sandbox with a network (Spec.Network: a TUN device whose other end is
// the host's egress gateway, a descriptor CRIU can neither dump nor
// recreate) is checkpointed only once that device is gone: the engine
// detaches its gateway first (egress.Gateway.Detach), leaving the
// network namespace its loopback alone, and dumpable refuses one that
// holds any other interface (errNetworkAttached). The resolv.conf bound
// into it stays as the other external mounts. CRIU restores the
// namespace as dumped, loopback alone, and the engine attaches a gateway
// to the restored init's namespace after Restore returns: the restored
// processes run for that moment with no route out (a connect fails,
// ENETUNREACH), never with any other. The sockets that led through the
// network are closed just before the dump (netcut_linux.go): a restore
// could not connect them again, and it makes them unconnected sockets
// (cutOutwardTCP); the sandbox's own loopback connections are restored
// as they were, lo brought up for them first (loopback_linux.go).

// criuConfigAnnotation names, in a sandbox's spec, the file runc has CRIU
// read its options from; agentSocketAnnotation records the key of the
// agent's listening socket.
const (
	criuConfigAnnotation  = "org.criu.config"
	agentSocketAnnotation = "sheepfold.agent-socket"
)

// criuOwnerEnv names, in CRIU's environment, the host uid and gid that
// make (and so own) a restored sandbox's user namespace: a patch of ours
// (scripts/criu.sh).
const criuOwnerEnv = "SHEEPFOLD_CRIU_USERNS_OWNER"

// Files of a bundle and of a checkpoint's directory.
const (
	criuConfig     = "criu.conf"                 // in the bundle: the options of the next checkpoint or restore
	checkpointMeta = "sheepfold-checkpoint.json" // in the checkpoint's directory: what its restore puts back
)

// checkpointInfo is what a restore needs to know of a checkpoint besides
// CRIU's images: the keys of the host objects the agent held.
type checkpointInfo struct {
	Version      int    `json:"version"`          // checkpointVersion
	Sandbox      string `json:"sandbox"`          // the sandbox's id
	Checkpointed string `json:"checkpointed"`     // when, RFC 3339
	AgentSocket  string `json:"agent_socket"`     // socket:[inode] of the agent's listener
	Log          string `json:"log"`              // file[mount id:inode] of the agent's log
	Pids         string `json:"pids,omitempty"`   // file[mount id:inode] of the pids cgroup, when the agent holds it
	Masked       string `json:"masked,omitempty"` // where runc's masked tmpfs was, dumped as an external (masked_linux.go)
}

// checkpointVersion changes when a checkpoint's layout does.
const checkpointVersion = 1

var (
	_ runtime.Checkpointer     = (*OCI)(nil)
	_ runtime.CheckpointKeeper = (*OCI)(nil)
)

// ErrCheckpointed reports a sandbox that is checkpointed (no process
// runs) where a running one is needed, and ErrRunning one that runs
// where a checkpointed one is.
var (
	ErrCheckpointed = errors.New("the sandbox is checkpointed")
	ErrRunning      = errors.New("the sandbox is running")
)

// Checkpoint implements runtime.Checkpointer.
func (o *OCI) Checkpoint(ctx context.Context, id, dir string) error {
	if !validID(id) {
		return runtime.ErrNotFound
	}
	if err := o.claim(id); err != nil {
		return err
	}
	defer o.release(id)
	b, spec, gid, err := o.dumpable(id, "checkpoint")
	if err != nil {
		return err
	}
	// CRIU's restore reads the images as the sandbox's root (its host
	// uid, the bundle's group): the directory is theirs to pass through
	// (0710, as the bundle), no other host user's, and its parents must
	// let others pass.
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.Chown(dir, 0, int(gid)); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o710); err != nil {
		return err
	}
	if err := traversable(dir); err != nil {
		return fmt.Errorf("checkpoint %s: %w", id, err)
	}
	info, err := o.dumpExternals(id, b, spec)
	if err != nil {
		return err
	}
	began := time.Now()
	freezes, err := o.quiesce(ctx, id)
	if err != nil {
		if terr := o.thawDump(context.WithoutCancel(ctx), id); terr != nil {
			o.cfg.Logger.Warn("thaw a sandbox whose checkpoint failed", "id", id, "err", terr)
		}
		return err
	}
	if err := o.cutDetached(id, b, spec); err != nil {
		if terr := o.thawDump(context.WithoutCancel(ctx), id); terr != nil {
			o.cfg.Logger.Warn("thaw a sandbox whose checkpoint failed", "id", id, "err", terr)
		}
		return err
	}
	cmd := o.runcCriu(ctx, "checkpoint", "--image-path", dir, "--work-path", dir, "--tcp-established", "--file-locks", id)
	if out, err := cmd.CombinedOutput(); err != nil {
		if terr := o.thawDump(context.WithoutCancel(ctx), id); terr != nil {
			o.cfg.Logger.Warn("thaw a sandbox whose checkpoint failed", "id", id, "err", terr)
		}
		return fmt.Errorf("%s checkpoint: %w: %s%s", o.Name(), err, tail(out), criuErrors(filepath.Join(dir, "dump.log")))
	}
	// runc removed the container and its cgroups; what it may leave (a
	// cgroup it does not know of) goes too.
	if err := o.cg.remove(id); err != nil {
		o.cfg.Logger.Warn("remove a checkpointed sandbox's cgroups", "id", id, "err", err)
	}
	info.Checkpointed = time.Now().UTC().Format(time.RFC3339Nano)
	j, err := json.Marshal(info)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, checkpointMeta), j, 0o600); err != nil {
		return err
	}
	o.cfg.Logger.Debug("sandbox checkpointed", "id", id, "dir", dir, "took", time.Since(began).Round(10*time.Microsecond), "freezes", freezes)
	return nil
}

// dumpExternals names, in the bundle's CRIU options, the host objects
// the agent of sandbox id holds (CRIU externals) and returns their keys,
// which a restore replaces.
func (o *OCI) dumpExternals(id, b string, spec *specs.Spec) (checkpointInfo, error) {
	var err error
	info := checkpointInfo{AgentSocket: spec.Annotations[agentSocketAnnotation], Sandbox: id, Version: checkpointVersion}
	ino, prefixed := strings.CutPrefix(info.AgentSocket, "socket:[")
	ino, suffixed := strings.CutSuffix(ino, "]")
	if _, err := strconv.ParseUint(ino, 10, 64); !prefixed || !suffixed || err != nil {
		return checkpointInfo{}, fmt.Errorf("checkpoint %s: its spec does not name the agent's socket (made before checkpoints existed)", id)
	}
	if info.Log, err = fileKey(filepath.Join(b, "agent.log")); err != nil {
		return checkpointInfo{}, err
	}
	externals := []string{"unix[" + ino + "]", info.Log}
	if passesPidsCgroup(spec) {
		if info.Pids, err = fileKey(o.cg.pidsDir(id)); err != nil {
			return checkpointInfo{}, err
		}
		externals = append(externals, info.Pids)
	}
	pid, err := readPid(filepath.Join(b, "init.pid"))
	if err != nil {
		return checkpointInfo{}, err
	}
	if info.Masked, err = maskedMount(pid, o.maskedPath()); err != nil {
		return checkpointInfo{}, fmt.Errorf("checkpoint %s: %w", id, err)
	}
	if info.Masked != "" {
		externals = append(externals, "mnt["+info.Masked+"]:"+maskedKey)
	}
	var conf strings.Builder
	for _, e := range externals {
		fmt.Fprintf(&conf, "external %s\n", e)
	}
	if o.nftLock {
		conf.WriteString("network-lock nftables\n") // netlock_linux.go
	}
	if err := os.WriteFile(filepath.Join(b, criuConfig), []byte(conf.String()), 0o600); err != nil {
		return checkpointInfo{}, err
	}
	return info, nil
}

// dumpable checks that the sandbox id, which the caller has claimed, can
// be dumped for what ("checkpoint", "snapshot"): it runs, CRIU is ready
// and its network namespace holds no interface but its loopback. It returns its bundle, its spec and the
// bundle's group (the sandbox's host root).
func (o *OCI) dumpable(id, what string) (b string, spec *specs.Spec, gid uint32, err error) {
	b = o.bundle(id)
	if spec, err = readSpec(b); err != nil {
		return "", nil, 0, err
	}
	if o.gvisor(id) {
		return "", nil, 0, fmt.Errorf("%w: %s of a gVisor sandbox (CRIU cannot dump the Sentry)", ErrGVisor, what)
	}
	if !o.running(id) {
		return "", nil, 0, fmt.Errorf("%s %s: %w", what, id, ErrCheckpointed)
	}
	if err := o.criuReady(); err != nil {
		return "", nil, 0, err
	}
	if hasNetwork(spec) {
		if err := o.networkDetached(b); err != nil {
			return "", nil, 0, fmt.Errorf("%s %s: %w", what, id, err)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(b, &st); err != nil {
		return "", nil, 0, err
	}
	return b, spec, st.Gid, nil
}

// Restore implements runtime.Checkpointer.
func (o *OCI) Restore(ctx context.Context, id, dir string) (inst *runtime.Instance, err error) {
	if !validID(id) {
		return nil, runtime.ErrNotFound
	}
	if err := o.claim(id); err != nil {
		return nil, err
	}
	defer o.release(id)
	defer o.kickSpares() // a spare may have been taken
	b := o.bundle(id)
	if o.gvisor(id) {
		return nil, fmt.Errorf("%w: restore of a gVisor sandbox", ErrGVisor)
	}
	spec, err := readSpec(b)
	if err != nil {
		return nil, err
	}
	if o.running(id) {
		return nil, fmt.Errorf("restore %s: %w", id, ErrRunning)
	}
	if err := o.criuReady(); err != nil {
		return nil, err
	}
	if err := checkpointOf(id, dir); err != nil {
		return nil, fmt.Errorf("restore %s: %w", id, err)
	}
	// What a runc killed in the middle of an earlier restore left in its
	// state dir (the sandbox is not running, so runc keeps nothing there):
	// its bind of the root (criu-root), which would also fail this
	// restore's runc at its mkdir.
	if err := unmountUnder(filepath.Join(o.runcDir, id)); err != nil {
		return nil, err
	}
	if err := os.RemoveAll(filepath.Join(o.runcDir, id)); err != nil {
		return nil, err
	}
	var info checkpointInfo
	j, err := os.ReadFile(filepath.Join(dir, checkpointMeta))
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(j, &info); err != nil {
		return nil, err
	}
	// Undo a failed restore: kill what runc and CRIU may have started,
	// let runc forget it, remove the cgroups; the bundle, its disk and
	// the checkpoint stay, so that the sandbox can still be restored.
	defer func() {
		if err != nil {
			ctx := context.WithoutCancel(ctx)
			if kerr := o.cg.kill(id); kerr != nil {
				o.cfg.Logger.Error("undo failed restore: kill", "id", id, "err", kerr)
			}
			if o.running(id) {
				if out, derr := o.runc(ctx, "delete", "--force", id).CombinedOutput(); derr != nil {
					o.cfg.Logger.Error("undo failed restore: delete", "id", id, "err", derr, "out", tail(out))
				}
			}
			if rerr := o.cg.remove(id); rerr != nil {
				o.cfg.Logger.Error("undo failed restore: cgroups", "id", id, "err", rerr)
			}
		}
	}()

	// The sandbox's host ids are its bundle's group (Create). Its user
	// namespace ended with its processes; CRIU makes a new one with the
	// same ids (the dumped maps), so the spec maps them instead of
	// naming a namespace to join.
	var st unix.Stat_t
	if err := unix.Stat(b, &st); err != nil {
		return nil, err
	}
	sock, lnFile, err := listenAgent(b)
	if err != nil {
		return nil, err
	}
	defer lnFile.Close()
	newSocket, err := socketKey(lnFile)
	if err != nil {
		return nil, err
	}
	for i, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.UserNamespace {
			spec.Linux.Namespaces[i].Path = ""
		}
	}
	ids := []specs.LinuxIDMapping{{ContainerID: 0, HostID: st.Gid, Size: o.cfg.IDMap.Size}}
	spec.Linux.UIDMappings, spec.Linux.GIDMappings = ids, ids
	spec.Annotations[agentSocketAnnotation] = newSocket
	if err := writeSpec(b, spec); err != nil {
		return nil, err
	}

	began := time.Now()
	pid, err := o.criuRestore(ctx, id, "resume", b, spec, dir, dir, info, lnFile, st.Gid)
	if err != nil {
		return nil, err
	}
	o.cfg.Logger.Debug("sandbox restored", "id", id, "dir", dir, "took", time.Since(began).Round(10*time.Microsecond))
	return &runtime.Instance{ID: id, Socket: sock, PID: pid}, nil
}

// criuRestore starts sandbox id's processes again from the CRIU images
// in imgDir (work: CRIU's work dir, its logs), in the bundle b whose spec
// is written: it hands CRIU the host objects that replace the externals
// info names (the listener lnFile, the agent's log, the pids cgroup),
// then does what CRIU leaves undone. gid is the sandbox's range's first
// host id; what names the restore in its log of phases (phases_linux.go).
// It returns the host pid of the restored init.
func (o *OCI) criuRestore(ctx context.Context, id, what, b string, spec *specs.Spec, imgDir, work string, info checkpointInfo, lnFile *os.File, gid uint32) (int, error) {
	logf, err := openAgentLog(b, gid)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	// CRIU takes the replacements from runc's stdin, stdout and stderr
	// (its fds 0, 1, 2): the pids cgroup (or nothing), the listener, the
	// log. runc writes its own errors to stderr, the log, as at create.
	in, err := os.Open(os.DevNull)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	conf := fmt.Sprintf("inherit-fd fd[1]:%s\ninherit-fd fd[2]:%s\n", info.AgentSocket, info.Log)
	if info.Masked != "" {
		dir, err := o.maskedDir()
		if err != nil {
			return 0, err
		}
		conf += fmt.Sprintf("external mnt[%s]:%s\n", maskedKey, dir)
	}
	// The sandbox's own loopback connections come back as they were
	// (loopback_linux.go); those that led out were cut before the dump
	// (netcut_linux.go) and come back unconnected.
	if hasNetwork(spec) {
		if _, err := cutOutwardTCP(imgDir); err != nil {
			return 0, fmt.Errorf("restore %s: %w", id, err)
		}
	}
	var serveNS func(<-chan struct{}) error
	if tcp, err := holdsTCP(imgDir); err != nil {
		return 0, err
	} else if tcp {
		var c string
		if c, serveNS, err = loopbackHandshake(b); err != nil {
			return 0, fmt.Errorf("restore %s: %w", id, err)
		}
		conf += c
	}
	if info.Pids != "" {
		if !passesPidsCgroup(spec) {
			return 0, fmt.Errorf("restore %s: the checkpoint holds a pids cgroup the spec does not pass", id)
		}
		pidsDir, err := o.cg.openPids(id)
		if err != nil {
			return 0, err
		}
		defer pidsDir.Close()
		in.Close()
		in = pidsDir
		conf += fmt.Sprintf("inherit-fd fd[0]:%s\n", info.Pids)
	}
	if err := os.WriteFile(filepath.Join(b, criuConfig), []byte(conf), 0o600); err != nil {
		return 0, err
	}
	if !hasNetwork(spec) {
		if err := skipNetworkLock(imgDir); err != nil { // netlock_linux.go
			return 0, fmt.Errorf("restore %s: %w", id, err)
		}
	}
	pidFile := filepath.Join(b, "init.pid")
	_ = os.Remove(pidFile)
	// CRIU mounts its cgroup yard (.criu.cgyard.*: a tmpfs and the
	// cgroup hierarchies) in the work dir, in the host's mount namespace,
	// and now and then leaves it mounted: nothing may stay mounted
	// there, and removing the work dir through such mounts would reach
	// into the host's cgroups.
	defer func() {
		if err := unmountUnder(work); err != nil {
			o.cfg.Logger.Error("unmount what CRIU left in its work dir", "id", id, "dir", work, "err", err)
		}
	}()
	cmd := o.runcCriu(ctx, "restore", "--bundle", b, "--image-path", imgDir, "--work-path", work, "--tcp-established", "--file-locks",
		"--detach", "--pid-file", pidFile, id)
	// runc passes its environment on to CRIU: our CRIU makes the new user
	// namespace as the range's first uid, which then owns it, as the
	// engine's own holder owns the one Create makes (userns_linux.go).
	cmd.Env = append(cmd.Env, fmt.Sprintf("%s=%d", criuOwnerEnv, gid))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = in, lnFile, logf
	began := time.Now()
	nsErr := make(chan error, 1)
	done := make(chan struct{})
	if serveNS != nil {
		go func() { nsErr <- serveNS(done) }()
	} else {
		nsErr <- nil
	}
	err = cmd.Run()
	close(done)
	if nerr := <-nsErr; nerr != nil && err == nil {
		err = nerr
	} else if nerr != nil {
		o.cfg.Logger.Warn("restore: bring the loopback up", "id", id, "err", nerr)
	}
	if err != nil {
		log, _ := os.ReadFile(logf.Name())
		return 0, fmt.Errorf("%s restore: %w: %s%s", o.Name(), err, tail(log), criuErrors(filepath.Join(work, "restore.log")))
	}
	ran := time.Now()
	pid, err := readPid(pidFile)
	if err != nil {
		return 0, err
	}
	// What CRIU leaves undone: the restored network namespace's loopback
	// is down, and the new user namespace has the kernel's default
	// per-user limits, not the sandbox's (NamespaceLimits, which runc
	// wrote at create).
	if err := inNetns(fmt.Sprintf("/proc/%d/ns/net", pid), loopbackUp); err != nil {
		return 0, err
	}
	if err := o.setNamespaceLimits(ctx, pid); err != nil {
		return 0, err
	}
	if info.Pids != "" {
		limit, err := tenantLimit(spec)
		if err != nil {
			return 0, err
		}
		if err := o.cg.restoreTenant(id, limit, int(gid)); err != nil {
			return 0, err
		}
	}
	o.logRestorePhases(id, what, work, began, ran.Sub(began), time.Since(ran))
	return pid, nil
}

// Checkpointed implements runtime.CheckpointKeeper: the bundle is
// there, runc holds no state for it (its processes were checkpointed),
// and dir holds this sandbox's checkpoint, whose record Checkpoint writes
// last, once CRIU's images are complete.
func (o *OCI) Checkpointed(ctx context.Context, id, dir string) error {
	if !validID(id) {
		return runtime.ErrNotFound
	}
	if _, err := readSpec(o.bundle(id)); err != nil {
		return err
	}
	if o.running(id) {
		return fmt.Errorf("sandbox %s: %w", id, ErrRunning)
	}
	return checkpointOf(id, dir)
}

// checkpointed says whether sandbox id was checkpointed and not
// restored since: runc holds no state for it, and its bundle has the
// CRIU options a checkpoint writes (a bundle a crash left in the middle
// of a create has neither).
func (o *OCI) checkpointed(id string) bool {
	if o.running(id) {
		return false
	}
	_, err := os.Stat(filepath.Join(o.bundle(id), criuConfig))
	return err == nil
}

// checkpointOf checks that dir holds a complete checkpoint of sandbox id.
func checkpointOf(id, dir string) error {
	var info checkpointInfo
	j, err := os.ReadFile(filepath.Join(dir, checkpointMeta))
	if err != nil {
		return fmt.Errorf("sandbox %s has no complete checkpoint: %w", id, err)
	}
	if err := json.Unmarshal(j, &info); err != nil || info.Version != checkpointVersion || info.Sandbox != id {
		return fmt.Errorf("%s is not a checkpoint of sandbox %s (%v)", dir, id, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "inventory.img")); err != nil {
		return fmt.Errorf("the checkpoint of sandbox %s lacks CRIU's images: %w", id, err)
	}
	return nil
}

// inNetns runs fn on an OS thread of its own that has entered the
// network namespace at path; the thread ends with it (it is never given
// back to other goroutines).
func inNetns(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread exits with the goroutine
		ns, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		err = unix.Setns(ns, unix.CLONE_NEWNET)
		unix.Close(ns)
		if err != nil {
			errc <- fmt.Errorf("enter %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// loopbackUp brings lo up in the calling thread's network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback flags: %w", err)
	}
	if ifr.Uint16()&unix.IFF_UP != 0 {
		return nil
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}
	return nil
}

// setNamespaceLimits writes NamespaceLimits into the user namespace of
// pid, as runc does at create: a process that joins the namespace has
// every capability in it, CAP_SYS_RESOURCE included, which
// /proc/sys/user asks of a writer (Go cannot join a user namespace, so
// util-linux's nsenter and a shell do).
func (o *OCI) setNamespaceLimits(ctx context.Context, pid int) error {
	var script strings.Builder
	for _, k := range slices.Sorted(maps.Keys(NamespaceLimits)) {
		name, ok := strings.CutPrefix(k, "user.")
		if !ok || strings.ContainsAny(name, "/.") {
			return fmt.Errorf("namespace limit %q is not a user.* sysctl", k)
		}
		fmt.Fprintf(&script, "echo %s > /proc/sys/user/%s || exit 1\n", NamespaceLimits[k], name)
	}
	cmd := exec.CommandContext(ctx, o.ns.nsenter, fmt.Sprintf("--user=/proc/%d/ns/user", pid), "--", "/bin/sh", "-c", script.String())
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("set the restored sandbox's namespace limits: %w: %s", err, tail(out))
	}
	return nil
}

// running says whether runc holds state for the sandbox: it was created
// or restored and not checkpointed (nor destroyed) since.
func (o *OCI) running(id string) bool {
	if o.gvisor(id) {
		return o.runscState(id)
	}
	_, err := os.Stat(filepath.Join(o.runcDir, id, "state.json"))
	return err == nil
}

// criuReady checks that Config.CriuPath is an executable file, and
// the first time gives CRIU its kernel cache (kdat_linux.go).
func (o *OCI) criuReady() error {
	fi, err := os.Stat(o.cfg.CriuPath)
	if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("%w: checkpoints need CRIU at %s (make setup builds it)", runtime.ErrUnsupported, o.cfg.CriuPath)
	}
	o.kdatOnce.Do(func() {
		o.ensureKdat(context.Background())
		o.nftLock = o.criuHasNftLock(context.Background())
	})
	return nil
}

// runcCriu is a runc command that finds Config.CriuPath: runc runs
// "criu" from its PATH.
func (o *OCI) runcCriu(ctx context.Context, args ...string) *exec.Cmd {
	cmd := o.runc(ctx, args...)
	cmd.Env = []string{"PATH=" + filepath.Dir(o.cfg.CriuPath) + ":/usr/sbin:/usr/bin:/sbin:/bin"}
	return cmd
}

// listenAgent makes the agent's listening socket at b/agent.sock, root's
// alone, and returns its path and a descriptor of it for the agent.
func listenAgent(b string) (string, *os.File, error) {
	sock := filepath.Join(b, "agent.sock")
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return "", nil, fmt.Errorf("agent socket: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(sock, 0o600); err != nil {
		ln.Close()
		return "", nil, err
	}
	f, err := ln.File()
	ln.Close()
	if err != nil {
		return "", nil, err
	}
	return sock, f, nil
}

// openAgentLog opens the agent's log (its stdin, stdout and stderr),
// root's, which the sandbox's host ids (group gid) may write: a restore
// reopens it as the sandbox's root (checkpoint_linux.go). The sandbox
// writes to it anyway, and no process of the sandbox can reach it by a
// path.
func openAgentLog(b string, gid uint32) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(b, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	if err := f.Chown(0, int(gid)); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Chmod(0o620); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// socketKey is CRIU's name of a socket: "socket:[inode]".
func socketKey(f *os.File) (string, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return "", err
	}
	return fmt.Sprintf("socket:[%d]", st.Ino), nil
}

// fileKey is CRIU's name of an external file: "file[mount id:inode]", in
// hex, as the host's mount namespace (the agent's descriptors were opened
// there) sees path.
func fileKey(path string) (string, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", err
	}
	f, err := os.Open(fmt.Sprintf("/proc/self/fdinfo/%d", fd))
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "mnt_id:"); ok {
			mnt, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
			if err != nil {
				return "", fmt.Errorf("fdinfo of %s: %w", path, err)
			}
			return fmt.Sprintf("file[%x:%x]", mnt, st.Ino), nil
		}
	}
	return "", fmt.Errorf("fdinfo of %s has no mnt_id", path)
}

// readSpec reads a bundle's config.json; a missing bundle is ErrNotFound.
func readSpec(b string) (*specs.Spec, error) {
	j, err := os.ReadFile(filepath.Join(b, "config.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, runtime.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	var s specs.Spec
	if err := json.Unmarshal(j, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(b, "config.json"), err)
	}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	if s.Linux == nil || s.Process == nil {
		return nil, fmt.Errorf("%s: not a sandbox's spec", filepath.Join(b, "config.json"))
	}
	return &s, nil
}

// writeSpec writes a bundle's config.json.
func writeSpec(b string, s *specs.Spec) error {
	j, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(b, "config.json"), j, 0o600)
}

// writeBundle writes spec into bundle b and opens the agent's log there,
// whose group is the sandbox's gid: the last steps of a Create, for runc
// and runsc alike, before the runtime runs.
func writeBundle(b string, spec *specs.Spec, gid uint32) (*os.File, error) {
	if err := writeSpec(b, spec); err != nil {
		return nil, err
	}
	return openAgentLog(b, gid)
}

// cutDetached closes, in sandbox id (frozen, its network detached), the
// sockets that led through its network (netcut_linux.go).
func (o *OCI) cutDetached(id, b string, spec *specs.Spec) error {
	if !hasNetwork(spec) {
		return nil
	}
	pid, err := readPid(filepath.Join(b, "init.pid"))
	if err != nil {
		return err
	}
	n, err := cutNetwork(pid)
	if err != nil {
		return fmt.Errorf("dump %s: %w", id, err)
	}
	if n > 0 {
		o.cfg.Logger.Debug("closed the sockets that led through a detached network", "id", id, "count", n)
	}
	return nil
}

// errNetworkAttached reports a sandbox whose network namespace still
// holds an interface besides its loopback (its egress TUN) at a dump.
var errNetworkAttached = errors.New("the sandbox's network is attached: detach its gateway before a dump")

// networkDetached checks that the network namespace of the sandbox in
// bundle b (its init's) holds no interface but lo.
func (o *OCI) networkDetached(b string) error {
	pid, err := readPid(filepath.Join(b, "init.pid"))
	if err != nil {
		return err
	}
	var names []string
	err = inNetns(fmt.Sprintf("/proc/%d/ns/net", pid), func() error {
		ifs, err := net.Interfaces()
		for _, i := range ifs {
			if i.Name != "lo" {
				names = append(names, i.Name)
			}
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("list the sandbox's interfaces: %w", err)
	}
	if len(names) > 0 {
		return fmt.Errorf("%w (%s)", errNetworkAttached, strings.Join(names, ", "))
	}
	return nil
}

// hasNetwork says whether the sandbox was given a network interface: its
// spec binds the resolv.conf that goes with one (Create).
func hasNetwork(s *specs.Spec) bool {
	for _, m := range s.Mounts {
		if m.Destination == "/etc/resolv.conf" {
			return true
		}
	}
	return false
}

// passesPidsCgroup says whether the agent was given the sandbox's pids
// cgroup (initArgs).
func passesPidsCgroup(s *specs.Spec) bool {
	for _, a := range s.Process.Args {
		if strings.HasPrefix(a, "--pids-cgroup-fd=") {
			return true
		}
	}
	return false
}

// tenantLimit is the tenant's pids limit: the sandbox's less AgentPids
// (resources).
func tenantLimit(s *specs.Spec) (int64, error) {
	if s.Linux.Resources == nil || s.Linux.Resources.Pids == nil || s.Linux.Resources.Pids.Limit == nil {
		return 0, errors.New("the spec has no pids limit")
	}
	return *s.Linux.Resources.Pids.Limit - AgentPids, nil
}

// criuErrors returns the error lines of a CRIU log, for messages.
func criuErrors(log string) string {
	b, err := os.ReadFile(log)
	if err != nil {
		return ""
	}
	var lines []string
	for l := range bytes.Lines(b) {
		if bytes.Contains(l, []byte("Error (")) {
			lines = append(lines, string(bytes.TrimSpace(l)))
		}
	}
	if len(lines) > 8 {
		lines = lines[len(lines)-8:]
	}
	if len(lines) == 0 {
		return ""
	}
	return " (criu: " + strings.Join(lines, "; ") + ")"
}

// claimPoll is how often claimWait tries the claim again.
const claimPoll = 5 * time.Millisecond

// claimWait claims sandbox id as claim does, waiting, until ctx ends,
// for an operation that holds it (a checkpoint or snapshot whose CRIU
// dump takes a few hundred ms, up to its 10 s freeze timeout) to end:
// Destroy must not fail because a dump was running, which would leave
// the sandbox's processes, mounts and cgroups behind.
func (o *OCI) claimWait(ctx context.Context, id string) error {
	t := time.NewTicker(claimPoll)
	defer t.Stop()
	for {
		err := o.claim(id)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (waited %v)", err, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// A task of the sandbox caught by the freezer in the middle of a vfork
// (a shell's or Python's subprocess, posix_spawn, Go's os/exec: the
// parent waits, uninterruptibly, for its child to exec or exit) cannot be
// dumped: CRIU seizes and stops the child before its exec, so the parent
// stays in that wait (state D, in kernel_clone) and CRIU waits out its
// 10 s timeout ("Unseizable non-zombie ... state D") and fails. A
// checkpoint therefore freezes the sandbox itself first (runc pause), at
// a moment when no task is in such a wait: frozen while one is, it is
// thawed, given quiescePause to finish its exec, and frozen again. CRIU
// takes a frozen cgroup as it is (it seizes the tasks frozen, then thaws
// them), and a dump that fails leaves it frozen again: the checkpoint
// thaws it (runc resume).

// quiesceTries bounds the freezes a checkpoint tries before it dumps a
// sandbox that vforks all the time as it is (its dump may then time out,
// and the engine tries it once more); quiescePause is the wait between.
const (
	quiesceTries = 20
	quiescePause = 5 * time.Millisecond
)

// quiesce freezes sandbox id with none of its tasks in a vfork, or, past
// quiesceTries, frozen as it is; it says how many freezes it took.
func (o *OCI) quiesce(ctx context.Context, id string) (int, error) {
	for try := 1; ; try++ {
		if out, err := o.runc(ctx, "pause", id).CombinedOutput(); err != nil {
			return try, fmt.Errorf("%s pause: %w: %s", o.Name(), err, tail(out))
		}
		if !o.vforking(id) || try == quiesceTries {
			return try, nil
		}
		if err := o.thawDump(ctx, id); err != nil {
			return try, err
		}
		select {
		case <-ctx.Done():
			return try, ctx.Err()
		case <-time.After(quiescePause):
		}
	}
}

// thawDump thaws sandbox id after quiesce (runc resume).
func (o *OCI) thawDump(ctx context.Context, id string) error {
	if out, err := o.runc(ctx, "resume", id).CombinedOutput(); err != nil {
		return fmt.Errorf("%s resume: %w: %s", o.Name(), err, tail(out))
	}
	return nil
}

// vforking says whether a task in sandbox id's freezer cgroup (or one
// below it) waits for a vfork child's exec: the kernel shows it sleeping
// in kernel_clone (wait_for_vfork_done, where that is not inlined), as a
// frozen sleeper keeps the place it sleeps at.
func (o *OCI) vforking(id string) bool {
	list := "tasks"
	if o.cg.v2 {
		list = "cgroup.threads"
	}
	found := false
	_ = filepath.WalkDir(o.cg.controller(id, "freezer"), func(path string, d os.DirEntry, err error) error {
		if err != nil || found || d.IsDir() || d.Name() != list {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		for _, tid := range strings.Fields(string(b)) {
			w, err := os.ReadFile("/proc/" + tid + "/wchan")
			if err == nil && (string(w) == "kernel_clone" || string(w) == "wait_for_vfork_done") {
				o.cfg.Logger.Debug("a task is in a vfork as the sandbox is frozen for its checkpoint", "id", id, "tid", tid)
				found = true
				return nil
			}
		}
		return nil
	})
	return found
}
