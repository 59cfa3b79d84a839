package oci

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// CRIU's cache of what it learns of the kernel (kerndat).
//
// Every CRIU run, dump or restore, first probes the kernel: which
// features, system calls and socket kinds it has, the vDSO's layout (a
// helper process is started to read the 32-bit one), the CPU's. On a
// 2-core host that is 40 to 110 ms of each run. Run as root, CRIU keeps
// what it found in /run/criu.kdat and reads it back the next time, but
// only writes it where /run is a tmpfs (so that it is gone at the next
// boot, with the kernel it describes). On a host whose /run is on disk
// (this project's CI host, some VMs and containers) no run ever finds a
// cache.
//
// ensureKdat gives such a host the cache CRIU would keep on a tmpfs: it
// has CRIU probe once in a mount namespace of its own whose /run is a
// tmpfs (criu check), and puts the file it wrote at /run/criu.kdat, where
// every later CRIU run reads it. The file is CRIU's own, written by the
// release the engine runs; CRIU checks its size and magic words when it
// reads it. A cache older than the host's boot or than the CRIU binary
// is made again, so that it never describes another kernel or another
// CRIU. On a host whose /run is a tmpfs the engine leaves CRIU to it.

// kdatPath is where CRIU, run as root, reads its cache (KDAT_RUNDIR).
const kdatPath = "/run/criu.kdat"

// ensureKdat makes sure CRIU finds a current cache at kdatPath (see
// above); it is called once per runtime, before the first CRIU run.
// Failing, it logs why: CRIU then probes the kernel on each run as
// before.
func (o *OCI) ensureKdat(ctx context.Context) {
	began := time.Now()
	made, err := ensureKdatAt(ctx, kdatPath, o.cfg.CriuPath, o.ns.unshare)
	if err != nil {
		o.cfg.Logger.Warn("CRIU's kernel cache could not be made: each checkpoint and restore probes the kernel again", "path", kdatPath, "err", err)
		return
	}
	if made {
		o.cfg.Logger.Info("made CRIU's kernel cache (this host's /run is not a tmpfs)", "path", kdatPath, "took", time.Since(began).Round(time.Millisecond))
	}
}

// ensureKdatAt makes path a current CRIU cache, unless its directory is
// a tmpfs (CRIU keeps it there itself) or it is current already; it
// says whether it wrote one.
func ensureKdatAt(ctx context.Context, path, criu, unshare string) (bool, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(path), &fs); err != nil {
		return false, err
	}
	if fs.Type == unix.TMPFS_MAGIC {
		return false, nil
	}
	if fresh, err := kdatCurrent(path, criu); err != nil || fresh {
		return false, err
	}
	data, err := probeKdat(ctx, criu, unshare)
	if err != nil {
		return false, err
	}
	tmp := fmt.Sprintf("%s.sheepfold-%d", path, os.Getpid())
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return false, err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return false, err
	}
	return true, nil
}

// kdatCurrent says whether path holds a cache written since the host
// booted and since the CRIU binary was.
func kdatCurrent(path, criu string) (bool, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if fi.Size() == 0 {
		return false, nil
	}
	boot, err := bootTime()
	if err != nil {
		return false, err
	}
	ci, err := os.Stat(criu)
	if err != nil {
		return false, err
	}
	return fi.ModTime().After(boot) && fi.ModTime().After(ci.ModTime()), nil
}

// bootTime is when the host booted (/proc/stat's btime).
func bootTime() (time.Time, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return time.Time{}, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "btime "); ok {
			s, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return time.Time{}, err
			}
			return time.Unix(s, 0), nil
		}
	}
	return time.Time{}, errors.New("/proc/stat has no btime")
}

// probeKdat has CRIU probe the kernel in a mount namespace of its own
// whose /run is a new tmpfs, where CRIU keeps its cache, and returns the
// cache. The namespace, and the tmpfs with it, end with the command.
func probeKdat(ctx context.Context, criu, unshare string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	script := `mount -t tmpfs -o size=1m,mode=0755 sheepfold-kdat /run || exit 1
"$0" check >/dev/null 2>&1
exec cat ` + kdatPath
	cmd := exec.CommandContext(ctx, unshare, "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, criu)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("criu check with /run on a tmpfs: %w: %s", err, tail(stderr.Bytes()))
	}
	if stdout.Len() == 0 {
		return nil, errors.New("criu check wrote an empty cache")
	}
	return stdout.Bytes(), nil
}
