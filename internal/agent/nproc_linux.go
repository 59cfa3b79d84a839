package agent

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// NprocExec is the nproc-exec sub-command, args after its name: "N PATH
// ARGV0 [ARG...]". It sets its RLIMIT_NPROC, soft and hard, to N and
// executes PATH with argv ARGV0 ARG... and its own environment. It runs
// as the user already (the agent started it so), and lowering a limit
// needs no privilege. It returns only on failure: 2 for bad arguments,
// 126 when PATH cannot be executed, 127 when it does not exist (a
// shell's statuses).
func NprocExec(args []string) int {
	if len(args) < 3 {
		fmt.Fprintf(os.Stderr, "usage: %s N PATH ARGV0 [ARG...]\n", NprocExecCommand)
		return 2
	}
	n, err := strconv.ParseUint(args[0], 10, 64)
	if err != nil || n == 0 {
		fmt.Fprintf(os.Stderr, "%s: bad limit %q\n", NprocExecCommand, args[0])
		return 2
	}
	if err := unix.Setrlimit(unix.RLIMIT_NPROC, &unix.Rlimit{Cur: n, Max: n}); err != nil {
		fmt.Fprintf(os.Stderr, "%s: set RLIMIT_NPROC: %v\n", NprocExecCommand, err)
		return 126
	}
	err = unix.Exec(args[1], args[2:], os.Environ())
	fmt.Fprintf(os.Stderr, "%s: %v\n", args[2], err)
	if errors.Is(err, unix.ENOENT) {
		return 127
	}
	return 126
}

// nprocCommand is the command that starts exe with argv: through
// nproc-exec when Config.Nproc is set.
func (s *server) nprocCommand(exe string, argv []string) (string, []string) {
	if s.cfg.Nproc <= 0 {
		return exe, argv
	}
	return NprocCommand(s.helper, s.cfg.Nproc, exe, argv)
}
