// Package doctor checks that a host can run Sheepfold's sandboxes and says
// what to fix, one line per check. `sheepfold doctor` prints the checks and
// exits non-zero when one blocks sandboxes; `sheepfold serve` runs them at
// start, without the live probes (Options.SkipProbes), and logs what is
// not ok.
//
// Most checks read files under Options.Root (procfs, sysfs, the data dir),
// so tests run them against a fake tree; the probes that must act to know
// (creating a user namespace, mounting an overlay, running the runtime)
// run only against the real root ("/").
//
// Imports: internal/template (where templates live), the standard library
// and golang.org/x/sys.
package doctor

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/internal/template"
)

// Status is a check's verdict.
type Status string

// The verdicts. Fail means sandboxes cannot run (or must not, as with a
// runtime that lacks security fixes); Warn means they run, less well.
const (
	OK   Status = "ok"
	Warn Status = "warn"
	Fail Status = "fail"
)

// Result is one check's outcome.
type Result struct {
	Check  string `json:"check"`
	Status Status `json:"status"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
}

// Options say what host and what configuration to check.
type Options struct {
	// Root is where /proc and /sys are read; "/" (the default) also runs
	// the live probes unless SkipProbes.
	Root        string
	SkipProbes  bool // no user namespace or overlay mount is made to test
	DataDir     string
	RuntimePath string
	// CriuPath is the CRIU that checkpoints sandboxes (pause); "": criu
	// beside RuntimePath, where `make setup` builds it.
	CriuPath string
	// RunscPath is gVisor's runsc, for sandboxes that choose runtime
	// gvisor; "": none is installed.
	RunscPath string
	AgentPath string
	Template  string // the template sandboxes start from ["python"]
	// MaxSandboxes, PoolSize and the per-sandbox limits size the disk,
	// memory and kernel-counter checks.
	MaxSandboxes  int
	PoolSize      int
	SandboxMemory int64 // default memory limit of a sandbox, bytes
	SandboxDisk   int64 // default writable-layer size of a sandbox, bytes
	SandboxPids   int64 // default pids limit of a sandbox
	// HostCounters maps each host per-user limit a sandbox is charged
	// against (a sysctl file such as /proc/sys/fs/inotify/max_user_instances)
	// to the least value that lets one sandbox use its whole namespace's
	// share. Every sandbox is a host user of its own, so the minimums do
	// not grow with the number of sandboxes. Empty: the engine gives
	// sandboxes no namespace limits of their own.
	HostCounters map[string]int64
	// Disks checks that sandboxes can have disks of their own (ext4
	// images on loop devices: oci.CheckDisks); its error says why not,
	// and their disks are then kept in memory. nil: not checked, and
	// disks are counted as memory.
	Disks func() error
	// Devices lists the devices the host's CDI specs describe, by their
	// CDI names (oci.CDIDevices); nil: not checked.
	Devices func() ([]string, error)
}

// MinKernel is the oldest kernel that has every facility the engine uses
// (openat2 RESOLVE_IN_ROOT is 5.6); RecommendedKernel adds cgroup.kill
// (5.14) and idmapped overlay layers (5.19).
var (
	MinKernel         = [2]int{5, 6}
	RecommendedKernel = [2]int{5, 19}
)

// Run performs every check, in a fixed order.
func Run(ctx context.Context, o Options) []Result {
	if o.Root == "" {
		o.Root = "/"
	}
	if o.Template == "" {
		o.Template = "python"
	}
	d := doctor{o: o}
	if o.Disks != nil {
		d.disksErr = o.Disks()
		d.ownDisks = d.disksErr == nil
	}
	rs := []Result{
		d.kernel(), d.userns(), d.cgroups(), d.overlay(), d.seccomp(),
		d.runtime(ctx), d.gvisor(), d.checkpoints(ctx), d.agent(), d.template(), d.disk(),
	}
	if o.Disks != nil {
		rs = append(rs, d.disks())
	}
	if o.Devices != nil {
		rs = append(rs, d.devices())
	}
	return append(rs, d.memory(), d.counters(), d.virt())
}

// Failed reports whether any result blocks sandboxes.
func Failed(rs []Result) bool {
	for _, r := range rs {
		if r.Status == Fail {
			return true
		}
	}
	return false
}

// Format writes one line per result: status, check, detail, and the fix
// where there is one.
func Format(rs []Result) string {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "%-4s %-11s %s", strings.ToUpper(string(r.Status)), r.Check, r.Detail)
		if r.Fix != "" {
			fmt.Fprintf(&b, " (fix: %s)", r.Fix)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// JSON encodes the results for scripts.
func JSON(rs []Result) ([]byte, error) {
	return json.MarshalIndent(map[string]any{"ok": !Failed(rs), "checks": rs}, "", "  ")
}

type doctor struct {
	o        Options
	disksErr error // why sandboxes cannot have disks of their own (Options.Disks)
	ownDisks bool  // they can: disks are on the data dir, not in memory
}

func (d doctor) live() bool { return d.o.Root == "/" && !d.o.SkipProbes }

func (d doctor) path(p string) string { return filepath.Join(d.o.Root, p) }

func (d doctor) read(p string) (string, error) {
	b, err := os.ReadFile(d.path(p))
	return strings.TrimSpace(string(b)), err
}

func (d doctor) readInt(p string) (int64, error) {
	s, err := d.read(p)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(s, 10, 64)
}

func result(check string, s Status, fix, format string, args ...any) Result {
	return Result{Check: check, Status: s, Detail: fmt.Sprintf(format, args...), Fix: fix}
}

func (d doctor) kernel() Result {
	rel, err := d.read("proc/sys/kernel/osrelease")
	if err != nil {
		return result("kernel", Fail, "", "cannot read the kernel release: %v", err)
	}
	v, ok := parseVersion(rel)
	switch {
	case !ok:
		return result("kernel", Warn, "", "cannot parse kernel release %q", rel)
	case less(v, MinKernel):
		return result("kernel", Fail, "upgrade the kernel", "Linux %s is older than %d.%d (openat2 is needed)", rel, MinKernel[0], MinKernel[1])
	case less(v, RecommendedKernel):
		return result("kernel", Warn, "upgrade the kernel", "Linux %s lacks cgroup.kill or idmapped overlay layers (%d.%d+)", rel, RecommendedKernel[0], RecommendedKernel[1])
	}
	return result("kernel", OK, "", "Linux %s", rel)
}

// parseVersion reads "6.18.44-fc" as [6 18].
func parseVersion(s string) ([2]int, bool) {
	parts := strings.SplitN(s, ".", 3)
	if len(parts) < 2 {
		return [2]int{}, false
	}
	maj, err1 := strconv.Atoi(parts[0])
	minor := parts[1]
	if i := strings.IndexFunc(minor, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		minor = minor[:i]
	}
	mn, err2 := strconv.Atoi(minor)
	return [2]int{maj, mn}, err1 == nil && err2 == nil
}

func less(a, b [2]int) bool { return a[0] < b[0] || a[0] == b[0] && a[1] < b[1] }

func (d doctor) userns() Result {
	n, err := d.readInt("proc/sys/user/max_user_namespaces")
	if err != nil {
		return result("userns", Fail, "use a kernel built with CONFIG_USER_NS", "user namespaces are not available: %v", err)
	}
	if n == 0 {
		return result("userns", Fail, "sysctl -w user.max_user_namespaces=15000", "user.max_user_namespaces is 0")
	}
	note := ""
	// Ubuntu's AppArmor rule restricts only unprivileged creators; the
	// server creates namespaces as root, so it is a note, not a failure.
	if v, err := d.readInt("proc/sys/kernel/apparmor_restrict_unprivileged_userns"); err == nil && v == 1 {
		note = "; AppArmor restricts unprivileged user namespaces (root is not affected)"
	}
	if d.live() {
		if err := probeUserns(); err != nil {
			return result("userns", Fail, "allow user namespaces for root (sysctls, AppArmor, a container's seccomp)", "cannot create a user namespace: %v", err)
		}
	}
	return result("userns", OK, "", "user namespaces available (max %d)%s", n, note)
}

func (d doctor) cgroups() Result {
	const fix = "mount cgroup v2 with the cpu, memory and pids controllers (or v1 hierarchies for them)"
	if ctrl, err := d.read("sys/fs/cgroup/cgroup.controllers"); err == nil {
		have := map[string]bool{}
		for _, c := range strings.Fields(ctrl) {
			have[c] = true
		}
		var missing []string
		for _, c := range []string{"cpu", "memory", "pids"} {
			if !have[c] {
				missing = append(missing, c)
			}
		}
		if len(missing) > 0 {
			return result("cgroups", Fail, fix, "cgroup v2 lacks the %s controller(s)", strings.Join(missing, ", "))
		}
		if !have["io"] {
			return result("cgroups", Warn, "enable the io controller", "cgroup v2 (cpu, memory, pids; no io: no disk bandwidth limits)")
		}
		return result("cgroups", OK, "", "cgroup v2 unified (cpu, memory, pids, io)")
	}
	var missing []string
	for _, c := range []string{"memory", "pids", "cpu"} {
		if _, err := os.Stat(d.path("sys/fs/cgroup/" + c)); err != nil {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return result("cgroups", Fail, fix, "no cgroup v2 and no v1 hierarchy for %s", strings.Join(missing, ", "))
	}
	mode := "cgroup v1"
	if _, err := os.Stat(d.path("sys/fs/cgroup/unified/cgroup.controllers")); err == nil {
		mode = "cgroup v1 with a v2 hybrid mount (whole-tree kill through the unified hierarchy)"
	}
	return result("cgroups", OK, "", "%s (memory, pids, cpu)", mode)
}

func (d doctor) overlay() Result {
	fss, err := d.read("proc/filesystems")
	// Stock kernels (Debian's) build overlayfs as a module that the first
	// overlay mount loads: until then it is not in /proc/filesystems.
	module := false
	if err != nil || !hasField(fss, "overlay") {
		rel, _ := d.read("proc/sys/kernel/osrelease")
		ko, _ := filepath.Glob(d.path("lib/modules/" + rel + "/kernel/fs/overlayfs/overlay.ko*"))
		if rel == "" || len(ko) == 0 {
			return result("overlay", Fail, "load or build in overlayfs", "overlayfs is not available")
		}
		module = true
	}
	if d.live() && d.o.DataDir != "" {
		if err := probeOverlay(d.o.DataDir); err != nil {
			return result("overlay", Fail, "put the data dir on a filesystem overlayfs accepts as a lower layer (ext4, xfs, btrfs)",
				"cannot mount an overlay over %s: %v", d.o.DataDir, err)
		}
		return result("overlay", OK, "", "overlayfs mounts over %s", d.o.DataDir)
	}
	if module {
		return result("overlay", OK, "", "overlayfs available (a module, loaded by the first overlay mount)")
	}
	return result("overlay", OK, "", "overlayfs available")
}

func hasField(text, want string) bool {
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[len(f)-1] == want {
			return true
		}
	}
	return false
}

func (d doctor) seccomp() Result {
	status, err := d.read("proc/self/status")
	if err != nil || !strings.Contains(status, "\nSeccomp:") {
		return result("seccomp", Fail, "use a kernel built with CONFIG_SECCOMP_FILTER", "seccomp is not available")
	}
	actions, err := d.read("proc/sys/kernel/seccomp/actions_avail")
	if err != nil || !strings.Contains(" "+actions+" ", " errno ") {
		return result("seccomp", Fail, "use a kernel built with CONFIG_SECCOMP_FILTER", "seccomp filters cannot return errors (actions: %q)", actions)
	}
	if !strings.Contains(" "+actions+" ", " user_notif ") {
		return result("seccomp", Warn, "upgrade the kernel", "seccomp filters work, without user notification: "+
			"contexts cannot apply allow_subprocess: false")
	}
	if rel, err := d.read("proc/sys/kernel/osrelease"); err == nil {
		if v, ok := parseVersion(rel); ok && !less(v, MinKernel) && less(v, [2]int{5, 7}) { // older: the kernel check fails
			return result("seccomp", Warn, "upgrade the kernel", "Linux %s lacks SECCOMP_FILTER_FLAG_TSYNC_ESRCH (5.7): "+
				"contexts cannot apply allow_subprocess: false", rel)
		}
	}
	return result("seccomp", OK, "", "seccomp filters (%s)", actions)
}

// fixedRunc lists, per minor release line, the first runc with the
// November 2025 fixes (CVE-2025-31133, CVE-2025-52565, CVE-2025-52881);
// lines after the last entry have them from their first release.
var fixedRunc = []struct{ line, first [3]int }{
	{[3]int{1, 2, 0}, [3]int{1, 2, 8}},
	{[3]int{1, 3, 0}, [3]int{1, 3, 3}},
}

func cmp3(a, b [3]int) int {
	for i := range a {
		if a[i] != b[i] {
			if a[i] < b[i] {
				return -1
			}
			return 1
		}
	}
	return 0
}

// parseRunc reads the version line of `runc --version`: the release and
// whether it is a pre-release ("1.4.0-rc.2").
func parseRunc(out string) (v [3]int, raw string, pre, ok bool) {
	for _, line := range strings.Split(out, "\n") {
		rest, found := strings.CutPrefix(line, "runc version ")
		if !found {
			continue
		}
		raw = strings.TrimSpace(rest)
		core, suffix, _ := strings.Cut(raw, "-")
		f := strings.Split(core, ".")
		if len(f) != 3 {
			return v, raw, false, false
		}
		for i := range f {
			n, err := strconv.Atoi(f[i])
			if err != nil {
				return v, raw, false, false
			}
			v[i] = n
		}
		return v, raw, suffix != "", true
	}
	return v, "", false, false
}

// runcFixed reports whether runc v (a pre-release if pre) has the
// November 2025 fixes. They came with 1.2.8, 1.3.3 and 1.4.0-rc.3; a
// pre-release counts only after the 1.4.0 line, where every one has them.
func runcFixed(v [3]int, pre bool) bool {
	if pre {
		return cmp3(v, [3]int{1, 4, 0}) > 0
	}
	if cmp3(v, [3]int{1, 2, 0}) < 0 {
		return false
	}
	for _, f := range fixedRunc {
		if v[0] == f.line[0] && v[1] == f.line[1] {
			return cmp3(v, f.first) >= 0
		}
	}
	return true
}

// CriuPatchSet is the GitID the set-up's CRIU prints: 4.2.1 with the
// patches of scripts/criu.patch (scripts/criu.sh pins the same).
const CriuPatchSet = "sheepfold-2"

// checkpoints checks the CRIU that runc's checkpoint and restore run: the
// pinned build, or sandboxes cannot be paused (everything else works).
func (d doctor) checkpoints(ctx context.Context) Result {
	const fix = "run `make setup` (builds the pinned CRIU 4.2.1 into DATA_DIR/bin)"
	p := d.o.CriuPath
	if p == "" {
		p = filepath.Join(filepath.Dir(d.o.RuntimePath), "criu")
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, p, "--version").Output()
	if err != nil {
		return result("checkpoints", Warn, fix, "no CRIU at %s (%v): sandboxes cannot be checkpointed (pause, snapshots)", p, err)
	}
	var version, gitID string
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "Version: "); ok {
			version = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(line, "GitID: "); ok {
			gitID = strings.TrimSpace(v)
		}
	}
	if gitID != CriuPatchSet {
		return result("checkpoints", Warn, fix, "CRIU %q at %s is not the set-up's build (%s, GitID %s): "+
			"sandboxes cannot be checkpointed (pause, snapshots)", strings.TrimSpace(version), p, "4.2.1", CriuPatchSet)
	}
	return result("checkpoints", OK, "", "CRIU %s (%s): sandboxes can be checkpointed (%s)", version, gitID, p)
}

func (d doctor) runtime(ctx context.Context) Result {
	const fix = "run `make setup` (builds the pinned runc into DATA_DIR/bin)"
	p := d.o.RuntimePath
	if p == "" {
		return result("runtime", Fail, fix, "no runtime configured")
	}
	fi, err := os.Stat(p)
	if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return result("runtime", Fail, fix, "%s is not an executable file", p)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, p, "--version").Output()
	if err != nil {
		return result("runtime", Fail, fix, "%s --version: %v", p, err)
	}
	v, raw, pre, ok := parseRunc(string(out))
	if !ok {
		return result("runtime", Fail, fix, "%s is not runc (version %q)", p, raw)
	}
	if !runcFixed(v, pre) {
		return result("runtime", Fail, fix, "runc %s lacks the November 2025 security fixes (CVE-2025-31133, -52565, -52881)", raw)
	}
	feat, err := exec.CommandContext(ctx, p, "features").Output()
	if err != nil {
		return result("runtime", Fail, fix, "%s features: %v", p, err)
	}
	var f struct {
		Linux struct {
			Seccomp struct {
				Enabled *bool `json:"enabled"`
			} `json:"seccomp"`
		} `json:"linux"`
	}
	if err := json.Unmarshal(feat, &f); err != nil || f.Linux.Seccomp.Enabled == nil || !*f.Linux.Seccomp.Enabled {
		return result("runtime", Fail, fix, "runc %s was built without seccomp", raw)
	}
	return result("runtime", OK, "", "runc %s with seccomp (%s)", raw, p)
}

// GVisorVersion is the gVisor module version `make setup` builds runsc
// from (scripts/setup.sh takes it from go.mod, which pins the same for
// the egress gateway's netstack); setup writes it beside the binary, in
// runsc.version.
const GVisorVersion = "v0.0.0-20260905035102-160fafc42237"

// gvisor checks the runsc that runs the sandboxes choosing runtime
// gvisor: optional (runc runs every other), but when present it must be
// the set-up's static build (a cgo build fails at its first run: it
// re-executes itself in an empty chroot without a dynamic loader).
func (d doctor) gvisor() Result {
	const fix = "run `make setup` (builds the pinned runsc, static, into DATA_DIR/bin)"
	p := d.o.RunscPath
	if p == "" {
		return result("gvisor", Warn, fix, "gVisor's runsc is not installed: sandboxes run under runc only (runtime \"gvisor\" is refused with ERR_NOT_SUPPORTED)")
	}
	fi, err := os.Stat(p)
	if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return result("gvisor", Warn, fix, "%s is not an executable file: runtime gvisor is unavailable", p)
	}
	if f, err := elf.Open(p); err == nil {
		dynamic := false
		for _, prog := range f.Progs {
			dynamic = dynamic || prog.Type == elf.PT_INTERP
		}
		f.Close()
		if dynamic {
			return result("gvisor", Warn, fix, "%s is linked dynamically (a cgo build): it fails at its first run; build it with CGO_ENABLED=0", p)
		}
	}
	stamp, _ := os.ReadFile(p + ".version")
	if v := strings.TrimSpace(string(stamp)); v != GVisorVersion {
		return result("gvisor", Warn, fix, "runsc at %s is not the set-up's build (%s.version says %q, want %s)", p, p, v, GVisorVersion)
	}
	return result("gvisor", OK, "", "gVisor runsc %s, static (%s): sandboxes may choose runtime gvisor", GVisorVersion, p)
}

func (d doctor) agent() Result {
	p := d.o.AgentPath
	fi, err := os.Stat(p)
	if p == "" || err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return result("agent", Fail, "run `make build` (bin/sheepfold-agent beside bin/sheepfold)", "agent binary %q is not an executable file", p)
	}
	return result("agent", OK, "", "%s", p)
}

func (d doctor) template() Result {
	fix := fmt.Sprintf("sheepfold template build --force %s", d.o.Template)
	info, err := template.Get(d.o.DataDir, d.o.Template)
	if err != nil {
		if errors.Is(err, template.ErrNotBuilt) {
			fix = fmt.Sprintf("sheepfold template build %s", d.o.Template)
		}
		return result("template", Fail, fix, "template %s: %v", d.o.Template, err)
	}
	for _, p := range []string{"usr/bin/python3", "usr/bin/node", "bin/bash", "etc/passwd"} {
		if _, err := os.Stat(filepath.Join(info.Path, p)); err != nil {
			return result("template", Fail, fix, "template %s is incomplete: no /%s", d.o.Template, p)
		}
	}
	return result("template", OK, "", "template %s at %s", d.o.Template, info.Path)
}

const gib = 1 << 30

func (d doctor) disk() Result {
	free, err := freeBytes(d.o.DataDir)
	if err != nil {
		return result("disk", Warn, "", "cannot measure free space at %s: %v", d.o.DataDir, err)
	}
	// The data dir holds templates, the database and logs: keep a floor
	// for them; and, where sandboxes have disks of their own, each
	// sandbox's disk, allocated whole at its create: the warm pool's
	// members hold theirs all the time.
	need := int64(3 * gib / 2)
	what := "templates, database and logs"
	if d.ownDisks {
		need += int64(d.o.PoolSize) * d.o.SandboxDisk
		what += fmt.Sprintf(" and the disks of a pool of %d", d.o.PoolSize)
	}
	if free < need {
		return result("disk", Warn, "free space on the data dir's filesystem", "%.1f GiB free at %s, under the %.1f GiB of %s",
			float64(free)/gib, d.o.DataDir, float64(need)/gib, what)
	}
	detail := fmt.Sprintf("%.1f GiB free at %s", float64(free)/gib, d.o.DataDir)
	if d.ownDisks && d.o.SandboxDisk > 0 {
		fit := (free - need) / d.o.SandboxDisk
		detail += fmt.Sprintf("; room for %d more sandboxes' disks of the default %d MiB", fit, d.o.SandboxDisk>>20)
	}
	return result("disk", OK, "", "%s", detail)
}

// disks reports where sandboxes' disks are: ext4 images of their own
// on loop devices, or (without them) in memory.
func (d doctor) disks() Result {
	if d.disksErr != nil {
		return result("disks", Warn, "install e2fsprogs, load the loop module (modprobe loop) and give the server the loop devices",
			"sandboxes' disks will be kept in memory, their memory limit holding memory plus disk: %v", d.disksErr)
	}
	return result("disks", OK, "", "each sandbox's disk is an ext4 image of its own on a loop device, under the data dir")
}

// devices lists the CDI devices sandboxes may ask for: none is no fault.
func (d doctor) devices() Result {
	names, err := d.o.Devices()
	switch {
	case err != nil:
		return result("devices", Warn, "fix or remove the CDI spec named (nvidia-ctk cdi generate writes NVIDIA's)",
			"%d CDI devices sandboxes may ask for (%s), but not those of %v", len(names), strings.Join(names, ", "), err)
	case len(names) == 0:
		return result("devices", OK, "", "no CDI devices: sandboxes asking for a GPU or a device are refused")
	}
	return result("devices", OK, "", "%d CDI devices sandboxes may ask for: %s", len(names), strings.Join(names, ", "))
}

func (d doctor) memory() Result {
	mi, err := os.ReadFile(d.path("proc/meminfo"))
	if err != nil {
		return result("memory", Warn, "", "cannot read /proc/meminfo: %v", err)
	}
	avail := meminfo(mi, "MemAvailable")
	// A warm pool member holds about 70 MiB of preloaded interpreter; a
	// writable layer kept in memory counts against it as it fills.
	need := int64(d.o.PoolSize)*(128<<20) + 512<<20
	if avail < need {
		return result("memory", Warn, "lower --pool or add memory", "%d MiB available, the pool of %d needs about %d MiB", avail>>20, d.o.PoolSize, need>>20)
	}
	detail := fmt.Sprintf("%d MiB available", avail>>20)
	if total := meminfo(mi, "MemTotal"); d.o.MaxSandboxes > 0 && d.o.SandboxMemory > 0 && total > 0 {
		per := d.o.SandboxMemory
		if !d.ownDisks {
			per += d.o.SandboxDisk // the disk is memory too
		}
		commit := int64(d.o.MaxSandboxes) * per
		detail += fmt.Sprintf("; %d sandboxes at their default limits may use %d MiB of %d MiB", d.o.MaxSandboxes, commit>>20, total>>20)
	}
	return result("memory", OK, "", "%s", detail)
}

func meminfo(b []byte, key string) int64 {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == key+":" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n << 10
		}
	}
	return 0
}

// counters checks the kernel's per-user counters each sandbox is charged
// to, and the pid space all sandboxes share.
func (d doctor) counters() Result {
	n := int64(max(d.o.MaxSandboxes, 1))
	var problems, fixes []string
	if pidMax, err := d.readInt("proc/sys/kernel/pid_max"); err == nil && d.o.SandboxPids > 0 && n*d.o.SandboxPids >= pidMax/2 {
		problems = append(problems, fmt.Sprintf("%d sandboxes × %d pids reach half of kernel.pid_max (%d)", n, d.o.SandboxPids, pidMax))
		fixes = append(fixes, fmt.Sprintf("sysctl -w kernel.pid_max=%d", 4*n*d.o.SandboxPids))
	}
	if len(d.o.HostCounters) == 0 {
		problems = append(problems, "sandboxes have no per-namespace limits: one may exhaust the inotify instances of the user that owns every sandbox")
	}
	paths := make([]string, 0, len(d.o.HostCounters))
	for p := range d.o.HostCounters {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		want := d.o.HostCounters[p]
		have, err := d.readInt(strings.TrimPrefix(p, "/"))
		if err != nil {
			continue // the kernel lacks the counter, and so do the sandboxes
		}
		if have < want {
			name := strings.ReplaceAll(strings.TrimPrefix(p, "/proc/sys/"), "/", ".")
			problems = append(problems, fmt.Sprintf("%s is %d, under the %d a sandbox may use (`sheepfold serve` raises it at start)", name, have, want))
			fixes = append(fixes, fmt.Sprintf("sysctl -w %s=%d", name, want))
		}
	}
	if len(problems) > 0 {
		return result("counters", Warn, strings.Join(fixes, "; "), "%s", strings.Join(problems, "; "))
	}
	return result("counters", OK, "", "pid space for %d sandboxes; each sandbox's kernel counters are its own host user's", n)
}
