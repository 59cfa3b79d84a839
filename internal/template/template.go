package template

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
)

// FormatVersion is Info.Version for templates this package builds. Get
// refuses templates of another version: they must be rebuilt.
const FormatVersion = 1

// maxMappedID is the largest uid or gid the runtime maps into a sandbox
// (container ids 0..65535); Build refuses files owned by anything larger.
const maxMappedID = 65535

// Sentinel errors; test with errors.Is.
var (
	// ErrUnknown: no definition has that name.
	ErrUnknown = errors.New("unknown template")
	// ErrNotBuilt: the template has no built root filesystem in the data dir.
	ErrNotBuilt = errors.New("template not built")
	// ErrStale: a built template does not match what was asked for (another
	// uid shift, suite or package list, or an old format); rebuild it with
	// BuildOptions.Force.
	ErrStale = errors.New("template stale")
	// ErrInUse: a running engine holds the template (Use); it is not
	// removed.
	ErrInUse = errors.New("template in use")
)

// Definition says what a template contains.
type Definition struct {
	Name        string   // [a-z0-9][a-z0-9_-]*, at most 63 characters
	Suite       string   // Debian suite, e.g. "bookworm"
	Packages    []string // installed on top of debootstrap's minbase variant
	Description string
}

// Info describes a built template; it is stored as template.json next to the
// root filesystem.
type Info struct {
	Name      string    `json:"name"`
	Path      string    `json:"path"` // the rootfs directory; set from the data dir on every read
	Suite     string    `json:"suite"`
	Packages  []string  `json:"packages"`
	Created   time.Time `json:"created"`
	SizeBytes int64     `json:"size_bytes"` // disk usage of the rootfs, each inode counted once
	UIDShift  uint32    `json:"uid_shift"`  // every owner in the rootfs is shifted up by this
	Version   int       `json:"version"`    // FormatVersion
	// Runtime is the runtime of the template's sandboxes that name none
	// ("runc" or "gvisor"; SetRuntime); "" leaves it to the server.
	Runtime string `json:"runtime,omitempty"`
	// GPUs and Devices are the devices each sandbox of the template is
	// given unless its create asks otherwise (SetDevices, or a
	// Dockerfile's LABEL sheepfold.gpu and sheepfold.devices).
	GPUs    int      `json:"gpu,omitempty"`
	Devices []string `json:"devices,omitempty"`

	// Of a template built from a Dockerfile (BuildDockerfile):
	Hash         string            `json:"hash,omitempty"` // "sha256:..." of its inputs: the same inputs, the same hash
	From         string            `json:"from,omitempty"` // the template it was built FROM
	Env          []string          `json:"env,omitempty"`  // ENV, "K=V"
	User         string            `json:"user,omitempty"` // USER
	WorkDir      string            `json:"workdir,omitempty"`
	Start        string            `json:"start,omitempty"` // LABEL sheepfold.start
	Ready        string            `json:"ready,omitempty"` // LABEL sheepfold.ready
	Labels       map[string]string `json:"labels,omitempty"`
	BuildSeconds float64           `json:"build_seconds,omitempty"`
	// Tagged is when a tag's copy was made (Tag); zero for a name alone.
	Tagged     time.Time `json:"tagged,omitzero"`
	StepsBuilt int       `json:"steps_built,omitempty"` // steps not taken from the layer cache
}

// Runtimes are the values of Info.Runtime besides "".
var Runtimes = []string{"gvisor", "runc"}

// SetRuntime sets the runtime of template name's sandboxes that name
// none: one of Runtimes, or "" for the server's default.
func SetRuntime(dataDir, name, runtime string) error {
	if runtime != "" && !slices.Contains(Runtimes, runtime) {
		return fmt.Errorf("unknown runtime %q: %s, or \"\" for the server's default", runtime, strings.Join(Runtimes, ", "))
	}
	info, err := Get(dataDir, name)
	if err != nil {
		return err
	}
	info.Runtime = runtime
	return writeInfo(filepath.Join(templatesDir(dataDir), name), info)
}

// BuildOptions configure Build.
type BuildOptions struct {
	DataDir string // e.g. /var/lib/sheepfold; required
	// Mirror is the Debian archive to install from; empty means the first
	// host apt source that serves the suite, else http://deb.debian.org/debian.
	Mirror string
	// UIDShift is added to every file's uid and gid in the rootfs (the
	// runtime maps container ids 0..65535 to UIDShift..UIDShift+65535).
	UIDShift uint32
	Force    bool // rebuild even if the template is built
	// Progress, if set, is told how far the build is: done of total units on
	// one scale for the whole build (total stays the same, done never goes
	// down), and a short human description of the current step. It is called
	// from one goroutine at a time.
	Progress func(step string, done, total int)
	// Log, if set, receives the output of debootstrap and of commands run in
	// the rootfs. Its last lines go into a failed build's BuildError anyway.
	Log io.Writer

	// debootstrap overrides the debootstrap executable (tests).
	debootstrap string
}

// BuildError reports a failed build step with the last lines of output of
// the commands the build ran.
type BuildError struct {
	Template string
	Step     string
	Err      error
	Output   string // the last lines of debootstrap / chroot output, maybe empty
}

func (e *BuildError) Error() string {
	msg := fmt.Sprintf("build template %s: %s: %v", e.Template, e.Step, e.Err)
	if e.Output != "" {
		msg += "\nlast lines of output:\n" + e.Output
	}
	return msg
}

func (e *BuildError) Unwrap() error { return e.Err }

// Builtin returns the templates Sheepfold knows how to build, as their
// specs in builtin/ declare them (builtin.go). The specs are embedded and
// checked by tests, so a bad one is a bug: Builtin panics on it.
func Builtin() []Definition {
	defs, err := builtinDefinitions()
	if err != nil {
		panic(err)
	}
	return defs
}

// Lookup returns the builtin definition called name.
func Lookup(name string) (Definition, error) {
	for _, d := range Builtin() {
		if d.Name == name {
			return d, nil
		}
	}
	return Definition{}, fmt.Errorf("%w %q (known: %s)", ErrUnknown, name, strings.Join(builtinNames(), ", "))
}

func builtinNames() []string {
	var names []string
	for _, d := range Builtin() {
		names = append(names, d.Name)
	}
	return names
}

var (
	nameRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	suiteRE   = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)
	packageRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`) // Debian policy 5.6.1
)

// ValidName checks a template's name: [a-z0-9][a-z0-9_-]*, at most 63
// characters.
func ValidName(name string) error { return validName(name) }

func validName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("invalid template name %q: want [a-z0-9][a-z0-9_-]*, at most 63 characters", name)
	}
	return nil
}

// validate checks everything that ends up in a path or a command line.
func (d Definition) validate() error {
	if err := validName(d.Name); err != nil {
		return err
	}
	if !suiteRE.MatchString(d.Suite) {
		return fmt.Errorf("template %s: invalid suite %q", d.Name, d.Suite)
	}
	for _, p := range d.Packages {
		if !packageRE.MatchString(p) {
			return fmt.Errorf("template %s: invalid package name %q", d.Name, p)
		}
	}
	return nil
}

// templatesDir is <dataDir>/templates.
func templatesDir(dataDir string) string { return filepath.Join(dataDir, "templates") }

const (
	rootfsDir = "rootfs"
	infoFile  = "template.json"
)

// Get returns the built template called name, or a tag of one:
// "NAME:TAG" (tags.go).
func Get(dataDir, name string) (Info, error) {
	return getRef(dataDir, name)
}

// readInfo reads dir/template.json and checks it against dir.
func readInfo(dir, name string) (Info, error) {
	b, err := os.ReadFile(filepath.Join(dir, infoFile))
	if errors.Is(err, fs.ErrNotExist) {
		return Info{}, fmt.Errorf("%w: %s; run `sheepfold template build %s`", ErrNotBuilt, name, name)
	}
	if err != nil {
		return Info{}, fmt.Errorf("read template %s: %w", name, err)
	}
	var info Info
	if err := json.Unmarshal(b, &info); err != nil {
		return Info{}, fmt.Errorf("read template %s: %s: %w", name, infoFile, err)
	}
	if info.Name != name {
		return Info{}, fmt.Errorf("read template %s: %s names %q", name, infoFile, info.Name)
	}
	if info.Version != FormatVersion {
		return Info{}, fmt.Errorf("%w: %s has format version %d, want %d; run `sheepfold template build --force %s`",
			ErrStale, name, info.Version, FormatVersion, name)
	}
	info.Path = filepath.Join(dir, rootfsDir)
	if fi, err := os.Lstat(info.Path); err != nil || !fi.IsDir() {
		return Info{}, fmt.Errorf("%w: %s has no rootfs directory; run `sheepfold template build --force %s`", ErrNotBuilt, name, name)
	}
	return info, nil
}

// List returns the built templates in dataDir, sorted by name. A missing
// data dir means none. Templates that cannot be read are left out and
// reported in the error, joined; the others are still returned.
func List(dataDir string) ([]Info, error) {
	ents, err := os.ReadDir(templatesDir(dataDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	var infos []Info
	var errs []error
	for _, e := range ents {
		// Dot entries are staging dirs, old copies and locks.
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") || validName(e.Name()) != nil {
			continue
		}
		info, err := readInfo(filepath.Join(templatesDir(dataDir), e.Name()), e.Name())
		if errors.Is(err, ErrNotBuilt) {
			continue // a directory that is not a template
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		infos = append(infos, info)
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].Name < infos[j].Name })
	return infos, errors.Join(errs...)
}

// Remove deletes the built template called name. It waits for a build of the
// same name to finish. The template is first renamed aside, so a removal cut
// short never leaves a half-deleted template that looks built.
func Remove(dataDir, name string) error {
	if err := validName(name); err != nil {
		return err
	}
	dir := templatesDir(dataDir)
	final := filepath.Join(dir, name)
	if _, err := os.Lstat(final); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove template %s: %w", name, ErrNotBuilt)
	}
	unlock, err := lockTemplate(context.Background(), dir, name)
	if err != nil {
		return fmt.Errorf("remove template %s: %w", name, err)
	}
	defer unlock()
	if _, err := os.Lstat(final); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove template %s: %w", name, ErrNotBuilt) // removed while we waited
	}
	unuse, err := claimUnused(dir, name)
	if err != nil {
		return fmt.Errorf("remove template %s: %w", name, err)
	}
	defer unuse()
	aside := asideName(dir, name)
	if err := os.Rename(final, aside); err != nil {
		return fmt.Errorf("remove template %s: %w", name, err)
	}
	if err := removeStaging(aside); err != nil {
		return fmt.Errorf("remove template %s: %w", name, err)
	}
	return nil
}

// asideName returns a fresh name in dir to rename template name's old
// directory to before it is removed.
func asideName(dir, name string) string {
	return filepath.Join(dir, "."+name+".old-"+rand.Text()[:10])
}

// mismatch reports why info, an existing template, cannot stand for def built
// with shift, or "" if it can.
func (info Info) mismatch(def Definition, shift uint32) string {
	switch {
	case info.UIDShift != shift:
		return fmt.Sprintf("built with uid shift %d, want %d", info.UIDShift, shift)
	case info.Suite != def.Suite:
		return fmt.Sprintf("built from suite %s, want %s", info.Suite, def.Suite)
	case !samePackages(info.Packages, def.Packages):
		return fmt.Sprintf("built with packages %s, want %s", strings.Join(info.Packages, ","), strings.Join(def.Packages, ","))
	}
	return ""
}

func samePackages(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}

// writeInfo writes info as dir/template.json.
func writeInfo(dir string, info Info) error {
	b, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return err
	}
	// A new file renamed into place: a reader never sees half of it, and
	// a Cache sees a new inode.
	tmp, err := os.CreateTemp(dir, infoFile+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename, nothing
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(dir, infoFile))
}
