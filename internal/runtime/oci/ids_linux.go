package oci

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/runtime"
)

// Host id ranges, one per sandbox.
//
// The kernel charges per-user counters (inotify instances and watches,
// fanotify groups, POSIX message queue bytes, pending signals, namespaces)
// at every level of the user-namespace chain: in the sandbox's namespace
// to the uid inside, and in the host's to the namespace's owner, against
// the host's per-user limit (kernel/ucount.c). If every sandbox shared one
// owner (runc creates user namespaces as root), one sandbox could take all
// of root's inotify instances from the host and from every other sandbox.
// So each sandbox gets a range of host ids of its own: its uids and gids
// 0..65535 are HostID..HostID+65535, and its user namespace is owned by
// HostID, so that its whole usage is charged to a host uid nobody else
// has. The template's owners (Config.IDMap, the shift templates are built
// with) are left to no sandbox; each sandbox sees the template through an
// idmapped mount that shows it owned by the sandbox's own ids.
//
// Ranges are handed out through a registry shared by every engine on the
// host (Config.IDsDir): one file per range in use, named by its slot and
// holding the bundle path of the sandbox that has it. A bundle is made
// before its range is taken and removed only after the range is given
// back, so a registry entry whose bundle is gone is stale (its bundle was
// deleted behind our back) and is reclaimed; an entry whose bundle exists
// stays reserved until that sandbox is destroyed, by its engine or by the
// crash sweep, even when the engine that made it has died.

// ErrNoIDs reports that every id range is in use.
var ErrNoIDs = fmt.Errorf("%w: no free host id range", runtime.ErrCapacity)

// idRanges hands out host id ranges (see above).
type idRanges struct {
	dir   string   // the registry
	bases []uint32 // slot -> the host id of the range's uid 0
	size  uint32
}

// newIDRanges lays out slots ranges of size ids after the template's
// range, keeping those that /etc/subuid and /etc/subgid allow: inside
// root's entries when root has any, and clear of every other user's.
func newIDRanges(dir string, tmpl IDMap, slots int) (*idRanges, error) {
	subuid, err := readSubIDs("/etc/subuid")
	if err != nil {
		return nil, err
	}
	subgid, err := readSubIDs("/etc/subgid")
	if err != nil {
		return nil, err
	}
	r := &idRanges{dir: dir, size: tmpl.Size}
	first := uint64(tmpl.HostID) + uint64(tmpl.Size)
	for i := 0; i < slots; i++ {
		base := first + uint64(i)*uint64(tmpl.Size)
		if base+uint64(tmpl.Size) > math.MaxUint32 {
			break
		}
		if subuid.allows(base, uint64(tmpl.Size)) && subgid.allows(base, uint64(tmpl.Size)) {
			r.bases = append(r.bases, uint32(base))
		}
	}
	if len(r.bases) == 0 {
		return nil, fmt.Errorf("no host id range for sandboxes: /etc/subuid and /etc/subgid give root no %d ids above %d that no other user has", tmpl.Size, first)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("id registry: %w", err)
	}
	return r, nil
}

// allocate takes a free range for the sandbox whose bundle is given and
// returns the host id of its uid 0: the first free one of prefer (ranges
// with a user namespace made in advance), else the lowest free one. The
// entry appears with its content (linked from a temporary file), so no
// one ever reads a half-written one.
func (r *idRanges) allocate(bundle string, prefer ...uint32) (uint32, error) {
	tmp, err := os.CreateTemp(r.dir, ".new-")
	if err != nil {
		return 0, fmt.Errorf("id registry: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(bundle)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("id registry: %w", err)
	}
	order := make([]int, 0, len(prefer)+len(r.bases))
	for _, b := range prefer {
		if slot, ok := r.slotOf(b); ok {
			order = append(order, slot)
		}
	}
	for slot := range r.bases {
		order = append(order, slot)
	}
	for attempt := 0; attempt < 2; attempt++ {
		for _, slot := range order {
			err := os.Link(tmp.Name(), r.entry(slot))
			if err == nil {
				return r.bases[slot], nil
			}
			if !errors.Is(err, os.ErrExist) {
				return 0, fmt.Errorf("id registry: %w", err)
			}
		}
		if attempt == 0 {
			if err := r.reclaim(); err != nil {
				return 0, err
			}
		}
	}
	return 0, ErrNoIDs
}

// nextFree returns the base of the lowest free range that skip does not
// exclude, if any.
func (r *idRanges) nextFree(skip func(base uint32) bool) (uint32, bool) {
	for slot, base := range r.bases {
		if !skip(base) && r.slotFree(slot) {
			return base, true
		}
	}
	return 0, false
}

// holder returns the bundle that holds the range at base, if any.
func (r *idRanges) holder(base uint32) (string, bool) {
	slot, ok := r.slotOf(base)
	if !ok {
		return "", false
	}
	b, err := os.ReadFile(r.entry(slot))
	if err != nil || len(b) == 0 {
		return "", false
	}
	return string(b), true
}

// isFree reports whether the range at base is free now.
func (r *idRanges) isFree(base uint32) bool {
	slot, ok := r.slotOf(base)
	return ok && r.slotFree(slot)
}

func (r *idRanges) slotFree(slot int) bool {
	_, err := os.Lstat(r.entry(slot))
	return errors.Is(err, os.ErrNotExist)
}

// slotOf returns the slot of the range at base (bases ascend).
func (r *idRanges) slotOf(base uint32) (int, bool) {
	return slices.BinarySearch(r.bases, base)
}

// release gives back the range held by bundle, if any. It holds the
// registry's lock, as reclaim does: otherwise a reclaimer that read this
// entry before its release could remove the entry that reuses the slot.
func (r *idRanges) release(bundle string) error {
	unlock, err := r.lock()
	if err != nil {
		return err
	}
	defer unlock()
	slot, ok, err := r.find(bundle)
	if err != nil || !ok {
		return err
	}
	if err := os.Remove(r.entry(slot)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("id registry: %w", err)
	}
	return nil
}

// find returns the slot bundle holds.
func (r *idRanges) find(bundle string) (int, bool, error) {
	var found int
	ok := false
	err := r.each(func(slot int, owner string) {
		if owner == bundle {
			found, ok = slot, true
		}
	})
	return found, ok, err
}

// reclaim removes the entries whose bundle no longer exists. It holds the
// registry's lock so that two reclaimers never both decide on one entry
// (the second could remove a fresh entry that reused the slot).
func (r *idRanges) reclaim() error {
	unlock, err := r.lock()
	if err != nil {
		return err
	}
	defer unlock()
	var stale []int
	if err := r.each(func(slot int, bundle string) {
		if _, err := os.Lstat(bundle); errors.Is(err, os.ErrNotExist) {
			stale = append(stale, slot)
		}
	}); err != nil {
		return err
	}
	for _, slot := range stale {
		if err := os.Remove(r.entry(slot)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("id registry: %w", err)
		}
	}
	return nil
}

// lock takes the registry's lock (allocation needs none: linking an
// entry is atomic).
func (r *idRanges) lock() (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(r.dir, ".lock"), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("id registry: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("id registry: %w", err)
	}
	return func() { f.Close() }, nil
}

// each calls fn with every entry's slot and bundle path.
func (r *idRanges) each(fn func(slot int, bundle string)) error {
	entries, err := os.ReadDir(r.dir)
	if err != nil {
		return fmt.Errorf("id registry: %w", err)
	}
	for _, e := range entries {
		slot, err := strconv.Atoi(e.Name())
		if err != nil || slot < 0 || slot >= len(r.bases) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(r.dir, e.Name()))
		if err != nil || len(b) == 0 {
			continue // removed meanwhile
		}
		fn(slot, string(b))
	}
	return nil
}

func (r *idRanges) entry(slot int) string { return filepath.Join(r.dir, strconv.Itoa(slot)) }

// subIDs are the entries of /etc/subuid or /etc/subgid.
type subIDs struct {
	root, others [][2]uint64 // [start, end)
}

// readSubIDs parses name:start:count lines; a missing file has no entries.
func readSubIDs(path string) (subIDs, error) {
	var s subIDs
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return s, err
	}
	defer f.Close()
	return parseSubIDs(f)
}

func parseSubIDs(rd io.Reader) (subIDs, error) {
	var s subIDs
	sc := bufio.NewScanner(rd)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		f := strings.Split(string(line), ":")
		if len(f) != 3 {
			continue
		}
		start, err1 := strconv.ParseUint(f[1], 10, 32)
		count, err2 := strconv.ParseUint(f[2], 10, 32)
		if err1 != nil || err2 != nil || count == 0 {
			continue
		}
		r := [2]uint64{start, start + count}
		if f[0] == "root" || f[0] == "0" {
			s.root = append(s.root, r)
		} else {
			s.others = append(s.others, r)
		}
	}
	return s, sc.Err()
}

// allows reports whether ids [start, start+n) may be a sandbox's: inside
// one of root's entries if root has any, and overlapping no other user's.
func (s subIDs) allows(start, n uint64) bool {
	end := start + n
	for _, o := range s.others {
		if start < o[1] && o[0] < end {
			return false
		}
	}
	if len(s.root) == 0 {
		return true
	}
	for _, r := range s.root {
		if r[0] <= start && end <= r[1] {
			return true
		}
	}
	return false
}

// hostLimits are the host's per-user limits that bound each sandbox as a
// whole (charged to its namespace's owner), with the namespace limit each
// must cover twice (see NamespaceLimits).
var hostLimits = []struct{ path, perSandbox string }{
	{"/proc/sys/fs/inotify/max_user_instances", "user.max_inotify_instances"},
	{"/proc/sys/fs/inotify/max_user_watches", "user.max_inotify_watches"},
	{"/proc/sys/user/max_fanotify_groups", "user.max_fanotify_groups"},
	{"/proc/sys/user/max_fanotify_marks", "user.max_fanotify_marks"},
}

// raiseHostLimits raises the host's per-user limits that are below twice
// a sandbox's per-uid ones, so that the agent and the user's code in one
// sandbox can each use all they are given. They are per host user, and
// every sandbox is its own host user, so they need not grow with the
// number of sandboxes. A limit that cannot be raised is logged.
func raiseHostLimits(log *slog.Logger) {
	for _, l := range hostLimits {
		per, _ := strconv.ParseInt(NamespaceLimits[l.perSandbox], 10, 64)
		b, err := os.ReadFile(l.path)
		if err != nil {
			continue // the kernel lacks it; so do the sandboxes
		}
		cur, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil || cur >= 2*per {
			continue
		}
		if err := os.WriteFile(l.path, []byte(strconv.FormatInt(2*per, 10)), 0); err != nil {
			log.Warn("cannot raise a host limit; a sandbox's user code may exhaust its agent's share", "sysctl", l.path, "have", cur, "want", 2*per, "err", err)
			continue
		}
		log.Info("raised a host limit for sandboxes", "sysctl", l.path, "from", cur, "to", 2*per)
	}
}

// HostLimitMinimums returns, by sysctl file, the least value of each host
// per-user limit a sandbox is charged against that lets it use all of its
// namespace's share (raiseHostLimits raises lower ones at start).
func HostLimitMinimums() map[string]int64 {
	m := make(map[string]int64, len(hostLimits))
	for _, l := range hostLimits {
		per, _ := strconv.ParseInt(NamespaceLimits[l.perSandbox], 10, 64)
		m[l.path] = 2 * per
	}
	return m
}
