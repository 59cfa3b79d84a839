package agent

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/osthread"
)

// How the agent acts as a sandbox user.
//
// In a sandbox the agent is uid 0 of the sandbox's user namespace with a
// few capabilities (internal/runtime/oci). Processes it starts get the
// requested user's uid, gid and groups through SysProcAttr.Credential:
// the kernel clears a process's permitted and effective capabilities when
// it leaves uid 0, and no_new_privs keeps setuid binaries and file
// capabilities from giving any back. File operations run on a goroutine
// locked to its OS thread whose filesystem uid and gid (setfsuid,
// setfsgid) and groups are the user's: Linux credentials are per thread,
// and with fsuid not 0 the kernel also clears the thread's filesystem
// capabilities (CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER...), so every
// permission check is the user's own and every file it creates is the
// user's. The thread is handed back to the Go scheduler only once its
// credentials are verified restored; otherwise it ends with the goroutine.
// (x/sys/unix makes these calls on the calling thread only, unlike
// package syscall's Setuid family; and the Go runtime never clones a new
// thread from a locked one.)

// agentGroups are the agent's own supplementary groups.
var agentGroups = sync.OnceValues(unix.Getgroups)

// fileOps are the operations asFileUser runs as the requested user. A
// file.watch holds its thread for as long as it lasts (all its inotify
// calls are made by the handler's goroutine).
var fileOps = map[string]bool{
	agentproto.OpFileRead: true, agentproto.OpFileWrite: true, agentproto.OpFileList: true,
	agentproto.OpFileStat: true, agentproto.OpFileMkdir: true, agentproto.OpFileRemove: true,
	agentproto.OpFileMove: true, agentproto.OpFileWatch: true,
}

// passwd reads the sandbox's /etc/passwd (as the agent).
func (s *server) passwd() []byte { return s.files.readSmall("/etc/passwd") }

// asFileUser runs fn, the handler of a file operation, as req.User: with
// relative paths under that user's home and, when the agent switches
// users, with the user's filesystem credentials.
func (s *server) asFileUser(req *agentproto.Request, fn func() agentproto.Event) agentproto.Event {
	if !fileOps[req.Op] {
		return fn()
	}
	name := req.User
	if req.Owner != "" {
		if req.Op != agentproto.OpFileWrite && req.Op != agentproto.OpFileMkdir {
			return fail(agentproto.CodeBadRequest, "owner is for file.write and file.mkdir only")
		}
		name = req.Owner
	}
	id, bad := s.user(name, s.passwd)
	if bad != nil {
		return *bad
	}
	if id.home != s.cfg.Home {
		req.Path = inHome(req.Path, id.home)
		req.NewPath = inHome(req.NewPath, id.home)
		if req.Op == agentproto.OpFileList && req.Path == "" {
			req.Path = id.home
		}
	}
	if req.Owner != "" {
		return fn() // with the agent's permissions; the handler chowns
	}
	return s.asIdentity(id, fn)
}

// chowner returns what gives a new entry (named name in the directory
// pfd) to the owner of req (Request.Owner), or nil when there is none or
// the agent acts as every user itself.
func (s *server) chowner(req *agentproto.Request) func(pfd int, name string) error {
	if req.Owner == "" || !s.switchUsers {
		return nil
	}
	id, bad := s.user(req.Owner, s.passwd)
	if bad != nil {
		return func(int, string) error { return errors.New(bad.Message) }
	}
	return func(pfd int, name string) error {
		return unix.Fchownat(pfd, name, int(id.uid), int(id.gid), unix.AT_SYMLINK_NOFOLLOW)
	}
}

// asIdentity runs fn with id's filesystem credentials when the agent
// switches users (see asFileUser), else as the agent.
func (s *server) asIdentity(id identity, fn func() agentproto.Event) agentproto.Event {
	if !s.switchUsers || id.uid == 0 && id.gid == 0 {
		return fn() // the agent is this user already
	}
	groups, err := agentGroups()
	if err != nil {
		return failErr("getgroups", err)
	}
	runtime.LockOSThread()
	restore := setFSCreds
	if err := setFSCreds(id.uid, id.gid, id.groups); err != nil {
		// gVisor's Sentry keeps fsuid and fsgid equal to the effective
		// ids: the thread takes the user's effective ids instead.
		if eerr := setThreadIDs(id.uid, id.gid, id.groups); eerr != nil {
			s.log.Error("act as user", "user", id.name, "err", err, "thread_ids", eerr)
			if setThreadIDs(0, 0, toUint32s(groups)) == nil {
				runtime.UnlockOSThread()
			}
			return fail(agentproto.CodeInternal, "cannot act as user %s", id.name)
		}
		restore = setThreadIDs
	}
	ev := fn()
	if err := restore(0, 0, toUint32s(groups)); err != nil {
		// Leave the thread locked: it ends with this goroutine.
		s.log.Error("restore the agent's file credentials", "err", err)
		return ev
	}
	runtime.UnlockOSThread()
	return ev
}

// setFSCreds sets the calling thread's supplementary groups, fsgid and
// fsuid, and checks them: setfsuid and setfsgid report no failure.
func setFSCreds(uid, gid uint32, groups []uint32) error {
	gs := make([]int, len(groups))
	for i, g := range groups {
		gs[i] = int(g)
	}
	if err := unix.Setgroups(gs); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	unix.SetfsgidRetGid(int(gid))
	unix.SetfsuidRetUid(int(uid))
	// An invalid id (-1) changes nothing and returns the current one.
	if cur, _ := unix.SetfsgidRetGid(-1); cur != int(gid) {
		return fmt.Errorf("setfsgid %d: still %d", gid, cur)
	}
	if cur, _ := unix.SetfsuidRetUid(-1); cur != int(uid) {
		return fmt.Errorf("setfsuid %d: still %d", uid, cur)
	}
	return nil
}

// setThreadIDs sets the calling thread's supplementary groups and
// effective ids (and so its filesystem ids), keeping its real and saved
// ids (root's), so that setThreadIDs(0, 0, ...) gives it back its ids and
// its effective capabilities. Raw system calls: Go's own change every
// thread of the process.
func setThreadIDs(uid, gid uint32, groups []uint32) error {
	const keep = ^uintptr(0) // -1: unchanged
	// Root's effective id first: groups and gid need it.
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, 0, keep); e != 0 {
		return fmt.Errorf("setresuid back to 0: %w", e)
	}
	gs := make([]int, len(groups))
	for i, g := range groups {
		gs[i] = int(g)
	}
	if err := unix.Setgroups(gs); err != nil { // this thread's alone
		return fmt.Errorf("setgroups: %w", err)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, keep, uintptr(gid), keep); e != 0 {
		return fmt.Errorf("setresgid %d: %w", gid, e)
	}
	if uid != 0 {
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, uintptr(uid), keep); e != 0 {
			return fmt.Errorf("setresuid %d: %w", uid, e)
		}
	}
	// (gVisor has no setfsuid to ask: the effective ids are the
	// filesystem's.)
	if _, euid, _ := unix.Getresuid(); euid != int(uid) {
		return fmt.Errorf("setresuid %d: still %d", uid, euid)
	}
	if _, egid, _ := unix.Getresgid(); egid != int(gid) {
		return fmt.Errorf("setresgid %d: still %d", gid, egid)
	}
	return nil
}

func toUint32s(xs []int) []uint32 {
	out := make([]uint32, len(xs))
	for i, x := range xs {
		out[i] = uint32(x)
	}
	return out
}

// credential is what a process of id starts with: nil (the agent's own)
// unless the agent switches users.
func (s *server) credential(id identity) *syscall.Credential {
	if !s.switchUsers {
		return nil
	}
	return &syscall.Credential{Uid: id.uid, Gid: id.gid, Groups: id.groups}
}

// StartBounded calls start, which starts a process that runs with cred,
// on an OS thread whose capability bounding set holds only what that
// process may have: nothing for any user but root, and for root the
// agent's own less CAP_SETPCAP (which the agent holds only to do this).
// Leaving uid 0 empties a process's permitted and effective sets but not
// its bounding set, which it inherits from the thread that forks it; so
// user processes end up with no capability in any set. The bounding set
// only shrinks, so the thread ends afterwards (osthread.Discarded). With
// cred nil (the agent does not switch
// users) start is called as it is.
func StartBounded(cred *syscall.Credential, start func() error) error {
	return StartIn(cred, "", start)
}

// StartIn is StartBounded for a process that must start in dir (a host
// path) and leaves its SysProcAttr and Dir unset: it calls start on a
// thread whose own working directory is dir, and the process inherits
// it. The thread enters dir as the agent, before the process takes
// cred, so a process may start in a directory its user may not enter,
// as code contexts in E2B's sandboxes do (their kernels run as root
// there: a context made with cwd /root runs in /root). That gives the
// user nothing: every lookup from a working directory still needs search
// permission on it, so such a process can read no name in it, and
// getcwd(2) only names it. The thread gets its working directory of its
// own with unshare(CLONE_FS), which makes no namespace (fork does the
// same for a child; the sandbox's seccomp profile lets exactly this flag
// through), and ends afterwards like StartBounded's. dir "" is
// StartBounded.
//
// In a sandbox with a pids limit the thread first moves into the tenant's
// cgroup (UseTenantCgroup), so that the process is charged to the
// tenant's limit, never to the agent's reserve.
func StartIn(cred *syscall.Credential, dir string, start func() error) error {
	if cred == nil && dir == "" && tenantCgroup.Load() < 0 {
		return start()
	}
	return osthread.Discarded(func() error {
		if err := enterTenant(); err != nil {
			return err
		}
		if dir != "" {
			if err := unix.Unshare(unix.CLONE_FS); err != nil {
				return fmt.Errorf("a working directory of its own: %w", err)
			}
			if err := unix.Chdir(dir); err != nil {
				return &os.PathError{Op: "chdir", Path: dir, Err: err}
			}
		}
		if cred == nil {
			return start()
		}
		for c := 0; c <= unix.CAP_LAST_CAP; c++ {
			if cred.Uid == 0 && c != unix.CAP_SETPCAP {
				continue
			}
			// prctl acts on the calling thread only. EINVAL: a
			// capability this kernel does not have.
			if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
				return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
			}
		}
		return start()
	})
}

// KernelCredential is the credential of code contexts' interpreters for an
// agent whose Config.Root is root: the default user "user" (uid and gid
// 1000, no capabilities) when the agent switches users (it is uid 0 with
// Root "/", as in a sandbox), nil (the agent's own) otherwise.
func KernelCredential(root string) *syscall.Credential {
	if !canSwitchUsers(root) {
		return nil
	}
	return &syscall.Credential{Uid: defaultUID, Gid: defaultGID, Groups: []uint32{defaultGID}}
}

// KernelCredentialFor is KernelCredential for an agent whose default
// user (Config.User, a template's last USER) is user: "" and "user" are
// KernelCredential's, "root" uid 0, any other name (or uid) that user's
// uid and primary gid in root's /etc/passwd. A kernel's credential is
// fixed when it starts, so the default user is the agent's from its
// start (serve --user); nil when the agent does not switch users.
func KernelCredentialFor(root, user string) (*syscall.Credential, error) {
	if !canSwitchUsers(root) {
		return nil, nil
	}
	switch user {
	case "", agentproto.UserDefault:
		return KernelCredential(root), nil
	case agentproto.UserRoot:
		return &syscall.Credential{Uid: 0, Gid: 0, Groups: []uint32{0}}, nil
	}
	passwd, err := os.ReadFile(hostPath(root, "/etc/passwd"))
	if err != nil {
		return nil, fmt.Errorf("user %q: %w", user, err)
	}
	id, ok := lookupUser(passwd, user)
	if !validUserName(user) || !ok {
		return nil, fmt.Errorf("unknown user %q: not in the sandbox's /etc/passwd", user)
	}
	return &syscall.Credential{Uid: id.uid, Gid: id.gid, Groups: []uint32{id.gid}}, nil
}

// contextDir checks that dir, a sandbox path, can be a code context's
// working directory: that it exists and is a directory, as the agent sees
// it. Whether the context's user may enter it does not matter: its
// kernel starts there all the same (StartIn).
func (s *server) contextDir(dir string) *agentproto.Event {
	var st unix.Stat_t
	if err := unix.Stat(hostPath(s.cfg.Root, dir), &st); err != nil {
		ev := failErr(dir, err)
		return &ev
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		ev := failErr(dir, unix.ENOTDIR)
		return &ev
	}
	return nil
}
