package agent

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/fdpass"
	"github.com/sheepfold/sheepfold/internal/pidfd"
)

// sudo without setuid.
//
// E2B's sandboxes let "user" run `sudo CMD` without a password. Sheepfold
// keeps no_new_privs on for every process, so no setuid binary can raise
// privileges; instead the agent binary, bind-mounted read-only at
// SudoPath, acts as sudo when called by that name: it asks the agent
// (over an abstract unix socket, which exists only in the sandbox's own
// network namespace) to run the command as root, handing over its stdin,
// stdout and stderr (SCM_RIGHTS), and waits for the exit status, passing
// on SIGINT, SIGTERM, SIGHUP and SIGQUIT. The agent checks the caller's
// uid from the kernel (SO_PEERCRED): "user" and root may, any other user
// may not; and a process under more seccomp filters than the agent (code
// under allow_subprocess: false) may not either, whatever its uid
// (confined_linux.go). The root process it starts is what `user: "root"` gives a
// command through the API: uid 0 of the sandbox's user namespace with the
// capability bounding set of RootCapabilities, no_new_privs and seccomp on,
// unable to touch pid 1 or the agent. So sudo gives code in the sandbox
// nothing the API does not already give its caller, and the isolation
// layers (user namespace, seccomp, cgroups, mounts, the network gateway)
// hold for root as they do for "user". Its environment is reset as sudo's
// env_reset does: the sandbox's base environment, root's HOME, USER and
// LOGNAME, the caller's terminal settings (TERM, LANG, LC_*) and SUDO_*;
// the caller's own variables (a command's scoped envs) stay behind unless
// -E asks for them.

// SudoPath is where the sandbox finds sudo (the agent binary).
const SudoPath = "/usr/local/bin/sudo"

// sudoSocket is the agent's sudo socket, abstract: not in any filesystem.
const sudoSocket = "@sheepfold-sudo"

// errSudoConfined is sudo's answer to a caller under the no-subprocess
// filter (or a seccomp filter of its own making).
var errSudoConfined = errors.New("this process may not start processes (allow_subprocess: false, or a seccomp filter of its own)")

// maxSudoRequest bounds a request (its environment, mostly).
const maxSudoRequest = 256 << 10

// sudoRequest is what sudo sends, with its three standard fds, as one
// line of JSON.
type sudoRequest struct {
	Argv []string          `json:"argv"`
	Cwd  string            `json:"cwd"`
	Env  map[string]string `json:"env"`
	Keep bool              `json:"keep_env,omitempty"` // -E
}

// serveSudo answers sudo's requests until the server stops.
func (s *server) serveSudo() {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sudoSocket, Net: "unix"})
	if err != nil {
		s.log.Warn("sudo socket", "err", err)
		return
	}
	stop := make(chan struct{})
	s.wg.Go(func() {
		select {
		case <-s.ctx.Done():
		case <-stop:
		}
		ln.Close()
	})
	defer close(stop)
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		s.wg.Go(func() {
			defer c.Close()
			s.sudo(c)
		})
	}
}

// sudo runs one request as root and answers "exit N", "signal N" or
// "error MESSAGE".
func (s *server) sudo(c *net.UnixConn) {
	answer := func(format string, args ...any) { fmt.Fprintf(c, format+"\n", args...) }
	// The request is read before any answer, so that sudo, still sending
	// it, never finds the connection closed.
	// It ends with a newline; a large one arrives in several reads (the
	// kernel ends the first read with the part that carries the fds).
	buf, oob := make([]byte, maxSudoRequest), make([]byte, unix.CmsgSpace(3*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return
	}
	fds := fdpass.Received(oob[:oobn])
	for n < len(buf) && (n == 0 || buf[n-1] != '\n') {
		m, err := c.Read(buf[n:])
		if err != nil {
			break
		}
		n += m
	}
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		files[i] = os.NewFile(uintptr(fd), "sudo-fd"+strconv.Itoa(i))
		defer files[i].Close()
	}
	uid, err := peerUID(c)
	if err != nil || (uid != defaultUID && uid != 0) {
		answer("error user %d is not in the sudoers file", uid)
		return
	}
	// A process under allow_subprocess: false may start none, by this
	// route either (confined_linux.go).
	if confined, err := callerConfined(c, s.cfg.SubprocessDenied); err != nil || confined {
		if err == nil {
			err = errSudoConfined
		}
		answer("error %v", err)
		return
	}
	var req sudoRequest
	if err := json.Unmarshal(buf[:n], &req); err != nil || len(req.Argv) == 0 || len(files) != 3 {
		answer("error a malformed request")
		return
	}
	root, _ := s.user(agentproto.UserRoot, s.passwd)
	env := s.cfg.Env
	if env == nil {
		env = os.Environ()
	}
	add := root.env()
	caller := "user"
	if uid == 0 {
		caller = "root"
	}
	add["SUDO_USER"], add["SUDO_UID"], add["SUDO_GID"] = caller, strconv.Itoa(int(uid)), strconv.Itoa(int(uid))
	add["SUDO_COMMAND"] = strings.Join(req.Argv, " ")
	for k, v := range req.Env {
		if req.Keep || k == "TERM" || k == "COLORTERM" || k == "LANG" || strings.HasPrefix(k, "LC_") {
			add[k] = v
		}
	}
	if env, err = mergeEnv(env, add); err != nil {
		answer("error %v", err)
		return
	}
	cwd := hostPath(s.cfg.Root, path.Clean("/"+req.Cwd))
	exe, err := lookPath(req.Argv[0], env, cwd)
	if err != nil {
		answer("error %s: command not found", req.Argv[0])
		return
	}
	cred := s.credential(root)
	exe, argv := s.nprocCommand(exe, req.Argv)
	var proc *os.Process
	err = StartBounded(cred, func() (err error) {
		proc, err = os.StartProcess(exe, argv, &os.ProcAttr{Dir: cwd, Env: env, Files: files,
			Sys: &syscall.SysProcAttr{Setpgid: true, Credential: cred}})
		return err
	})
	if err != nil {
		answer("error %s: %v", req.Argv[0], err)
		return
	}
	// Signals from sudo reach the command's group; sudo gone (killed with
	// its command) takes the command with it.
	go func() {
		r := bufio.NewScanner(c)
		for r.Scan() {
			if sig, ok := strings.CutPrefix(r.Text(), "signal "); ok {
				if n, err := strconv.Atoi(sig); err == nil && n > 0 && n < 65 {
					unix.Kill(-proc.Pid, unix.Signal(n))
				}
			}
		}
		unix.Kill(-proc.Pid, unix.SIGKILL)
	}()
	_ = pidfd.AwaitExit(proc.Pid) // without a thread; failing, Wait waits
	ps, err := proc.Wait()
	if err != nil {
		answer("error wait: %v", err)
		return
	}
	ws := ps.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		answer("signal %d", int(ws.Signal()))
		return
	}
	answer("exit %d", ws.ExitStatus())
}

func peerUID(c *net.UnixConn) (uint32, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, cerr
	}
	return cred.Uid, nil
}

// Sudo is the sudo command (the agent binary called as "sudo"): it runs
// args as root through the agent and returns the exit status. Options:
// -n (never asks anyway), -E (keep the environment), -u root, -i and -s
// (a login or a plain shell), -- (end of options).
func Sudo(args []string) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "sudo: "+format+"\n", a...)
		return 1
	}
	req := sudoRequest{}
	shell, login := false, false
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		a := args[0]
		args = args[1:]
		switch a {
		case "--":
			goto done
		case "-n", "--non-interactive", "-H":
		case "-E", "--preserve-env":
			req.Keep = true
		case "-i", "--login":
			login = true
		case "-s", "--shell":
			shell = true
		case "-u", "--user":
			if len(args) == 0 || (args[0] != "root" && args[0] != "0" && args[0] != "#0") {
				return fail("only root can be the target user here")
			}
			args = args[1:]
		default:
			return fail("option %s is not supported", a)
		}
	}
done:
	switch {
	case login:
		req.Argv = append([]string{"/bin/bash", "-l"}, shellArgs(args)...)
	case shell:
		req.Argv = append([]string{"/bin/bash"}, shellArgs(args)...)
	case len(args) == 0:
		return fail("a command is needed (usage: sudo [-n] [-E] [-u root] [-i|-s] COMMAND [ARG...])")
	default:
		req.Argv = args
	}
	req.Cwd, _ = os.Getwd()
	req.Env = map[string]string{}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			req.Env[k] = v
		}
	}
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sudoSocket, Net: "unix"})
	if err != nil {
		return fail("cannot reach the sandbox's agent: %v", err)
	}
	defer c.Close()
	b, err := json.Marshal(req)
	if err != nil {
		return fail("%v", err)
	}
	b = append(b, '\n')
	if len(b) > maxSudoRequest {
		return fail("the environment is too large (%d bytes; at most %d)", len(b), maxSudoRequest)
	}
	answer := bufio.NewReader(c)
	n, _, err := c.WriteMsgUnix(b, unix.UnixRights(0, 1, 2), nil)
	if err == nil && n < len(b) {
		_, err = c.Write(b[n:]) // a large request goes in several writes
	}
	if err != nil {
		// The agent may have answered (a refusal) and closed before the
		// whole request was sent: its answer is still ours to read.
		if line, rerr := answer.ReadString('\n'); rerr == nil && strings.HasPrefix(line, "error ") {
			return fail("%s", strings.TrimSpace(strings.TrimPrefix(line, "error ")))
		}
		return fail("cannot reach the sandbox's agent: %v", err)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, unix.SIGINT, unix.SIGTERM, unix.SIGHUP, unix.SIGQUIT)
	go func() {
		for sig := range sigs {
			fmt.Fprintf(c, "signal %d\n", sig.(unix.Signal))
		}
	}()
	line, err := answer.ReadString('\n')
	if err != nil {
		return fail("the agent ended the request: %v", err)
	}
	word, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
	switch word {
	case "exit":
		n, _ := strconv.Atoi(rest)
		return n
	case "signal":
		n, _ := strconv.Atoi(rest)
		return 128 + n
	}
	return fail("%s", rest)
}

// shellArgs is sudo -i/-s's command: a shell's -c with the words joined.
func shellArgs(args []string) []string {
	if len(args) == 0 {
		return nil
	}
	return []string{"-c", strings.Join(args, " ")}
}
