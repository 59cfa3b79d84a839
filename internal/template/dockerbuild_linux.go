package template

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
	"golang.org/x/sys/unix"
)

// BuildDockerfile builds the template opt.Name from a Dockerfile (see
// ParseDockerfile for what it may hold) and returns its Info. Each step
// that changes files (RUN, COPY, ADD, WORKDIR) makes a layer, kept in
// <DataDir>/templates/.layers/<key> and keyed by the hash of the layer
// under it, the instruction after expansion, the build's environment,
// user and working directory, and the content of the context files it
// copies: a layer whose key is there is reused, not rebuilt. The template
// is the FROM template's root filesystem (hard links: neither is ever
// written in place) with the layers applied in order, installed as
// BuildOptions' builds are. On failure nothing of the build is left: no
// mount, no staging or half-made layer, no process (a RUN's sandbox is
// the StepRunner's and ends with it). A failed step is a *BuildError
// naming the line, the instruction and its last lines of output.
func BuildDockerfile(ctx context.Context, dockerfile []byte, opt DockerfileOptions) (Info, error) {
	df, err := ParseDockerfile(bytes.NewReader(dockerfile))
	if err != nil {
		return Info{}, err
	}
	if err := validName(opt.Name); err != nil {
		return Info{}, err
	}
	if opt.DataDir == "" {
		return Info{}, errors.New("build template: no data dir")
	}
	if opt.UIDShift > math.MaxUint32-maxMappedID-1 {
		return Info{}, fmt.Errorf("build template %s: uid shift %d too large", opt.Name, opt.UIDShift)
	}
	dataDir, err := filepath.Abs(opt.DataDir)
	if err != nil {
		return Info{}, err
	}
	dir := templatesDir(dataDir)
	for _, d := range []string{dir, filepath.Join(dir, layersDir), filepath.Join(dir, logsDir)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return Info{}, fmt.Errorf("build template %s: %w", opt.Name, err)
		}
	}
	// The build log, kept (the last build of each name) for BuildLog.
	logf, err := os.OpenFile(buildLogPath(dataDir, opt.Name), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|noFollow, 0o640)
	if err != nil {
		return Info{}, fmt.Errorf("build template %s: %w", opt.Name, err)
	}
	defer logf.Close()
	var out io.Writer = logf
	if opt.Log != nil {
		out = io.MultiWriter(logf, opt.Log)
	}
	b := &dfBuilder{
		df: df, opt: opt, dataDir: dataDir, dir: dir,
		log: newBuildLog(out), keep: logf,
		prog: &progress{fn: opt.Progress},
	}
	return b.build(ctx)
}

type dfBuilder struct {
	df      *Dockerfile
	opt     DockerfileOptions
	dataDir string
	dir     string // <dataDir>/templates
	log     *buildLog
	keep    io.Writer // the kept log file alone
	prog    *progress

	// The state of the stage as the steps go.
	env     []string // ENV, in order, "K=V"
	args    map[string]string
	user    string
	workdir string
	// workdirSet: a WORKDIR of this Dockerfile or of its FROM set
	// workdir; else the steps run in "/" and the template records none
	// (its sandboxes keep the agent's default, the user's home).
	workdirSet bool
	labels     map[string]string
	layers     []string // diff dirs, bottom first
	key        string   // hash of everything so far
	ran        int      // steps built (not from the cache)
}

func (b *dfBuilder) fail(ctx context.Context, st *Step, err error) error {
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		err = fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	step := "FROM"
	if st != nil {
		step = fmt.Sprintf("line %d: %s", st.Line, st.Text)
	}
	return &BuildError{Template: b.opt.Name, Step: step, Err: err, Output: b.log.Tail()}
}

func (b *dfBuilder) build(ctx context.Context) (info Info, err error) {
	start := time.Now()
	var cu cleanup
	defer func() {
		if cerr := cu.run(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up after build of template %s: %w", b.opt.Name, cerr))
		}
		if err != nil { // for the kept log; the caller has err
			fmt.Fprintf(b.keep, "sheepfold: build failed: %v\n", err)
		}
	}()

	// FROM: build args of the meta ARGs expand it.
	b.args = map[string]string{}
	for _, a := range b.df.MetaArgs {
		for _, kv := range a.Args {
			b.args[kv.Key] = b.buildArg(kv)
		}
	}
	from, err := b.expand(b.df.From)
	if err != nil {
		return Info{}, b.fail(ctx, nil, err)
	}
	var base Info
	var baseID string
	if isImageRef(from) || IsRegistryRef(from) {
		unlock, err := lockTemplate(ctx, b.dir, b.opt.Name)
		if err != nil {
			return Info{}, b.fail(ctx, nil, err)
		}
		defer unlock()
		if base, err = b.importImage(ctx, from); err != nil {
			return Info{}, b.fail(ctx, nil, err)
		}
		baseID = base.Hash
	} else {
		if from == b.opt.Name {
			return Info{}, b.fail(ctx, nil, fmt.Errorf("template %s cannot be built FROM itself", from))
		}
		if err := validName(from); err != nil {
			return Info{}, b.fail(ctx, nil, fmt.Errorf("FROM %s: want a built template, oci-archive:FILE, oci:DIR or HOST/REPO:TAG (%v)", from, err))
		}
		// Lock both names, in order, so that the base is not removed or
		// rebuilt under the build.
		names := []string{from, b.opt.Name}
		slices.Sort(names)
		for _, n := range names {
			unlock, err := lockTemplate(ctx, b.dir, n)
			if err != nil {
				return Info{}, b.fail(ctx, nil, err)
			}
			defer unlock()
		}
		if base, err = Get(b.dataDir, from); err != nil {
			return Info{}, b.fail(ctx, nil, fmt.Errorf("FROM %s: %w", from, err))
		}
		if base.UIDShift != b.opt.UIDShift {
			return Info{}, b.fail(ctx, nil, fmt.Errorf("FROM %s: built with uid shift %d, want %d", from, base.UIDShift, b.opt.UIDShift))
		}
		baseID = base.Hash
		if baseID == "" { // a debootstrap build: its template.json says what it is
			raw, err := os.ReadFile(filepath.Join(b.dir, from, infoFile))
			if err != nil {
				return Info{}, b.fail(ctx, nil, err)
			}
			baseID = digestOf(raw)
		}
	}
	b.env = slices.Clone(base.Env)
	b.user = base.User
	b.workdir, b.workdirSet = base.WorkDir, base.WorkDir != ""
	if b.workdir == "" {
		b.workdir = "/"
	}
	b.labels = maps.Clone(base.Labels)
	if b.labels == nil {
		b.labels = map[string]string{}
	}
	b.key = digestOf([]byte(fmt.Sprintf("sheepfold-dockerfile-v1\nfrom %s\nshift %d\n", baseID, b.opt.UIDShift)))
	b.log.Printf("FROM %s (%s)", from, baseID)

	total := len(b.df.Steps) + 1
	for i := range b.df.Steps {
		st := &b.df.Steps[i]
		if err := ctx.Err(); err != nil {
			return Info{}, b.fail(ctx, st, err)
		}
		b.prog.report(fmt.Sprintf("step %d/%d", i+1, len(b.df.Steps)), i*progressTotal/total)
		if err := b.step(ctx, st, base.Path); err != nil {
			return Info{}, b.fail(ctx, st, err)
		}
	}

	// The template: the base's tree (hard links), the layers on top.
	b.prog.report("install", len(b.df.Steps)*progressTotal/total)
	staging, err := os.MkdirTemp(b.dir, "."+b.opt.Name+".build-")
	if err != nil {
		return Info{}, b.fail(ctx, nil, err)
	}
	cu.add(func() error { return removeStaging(staging) })
	if err := os.Chmod(staging, 0o755); err != nil {
		return Info{}, b.fail(ctx, nil, err)
	}
	rootfs := filepath.Join(staging, rootfsDir)
	if err := linkTree(ctx, base.Path, rootfs); err != nil {
		return Info{}, b.fail(ctx, nil, fmt.Errorf("copy the base: %w", err))
	}
	for _, l := range b.layers {
		if err := applyLayer(ctx, l, rootfs); err != nil {
			return Info{}, b.fail(ctx, nil, fmt.Errorf("apply layer %s: %w", filepath.Base(filepath.Dir(l)), err))
		}
	}
	size, err := shiftOwnership(ctx, rootfs, 0) // counts, changes nothing
	if err != nil {
		return Info{}, b.fail(ctx, nil, err)
	}
	final := filepath.Join(b.dir, b.opt.Name)
	info = Info{
		Name:         b.opt.Name,
		Path:         filepath.Join(final, rootfsDir),
		Suite:        base.Suite,
		Created:      time.Now().UTC(),
		SizeBytes:    size,
		UIDShift:     b.opt.UIDShift,
		Version:      FormatVersion,
		Hash:         b.key,
		From:         from,
		Env:          b.env,
		User:         b.user,
		WorkDir:      b.recordedWorkDir(),
		Start:        b.labels[LabelStart],
		Ready:        b.labels[LabelReady],
		Labels:       b.labels,
		BuildSeconds: time.Since(start).Seconds(),
		StepsBuilt:   b.ran,
	}
	if len(info.Labels) == 0 {
		info.Labels = nil
	}
	if info.GPUs, info.Devices, err = devicesFromLabels(b.labels); err != nil {
		return Info{}, b.fail(ctx, nil, fmt.Errorf("%w: %v", ErrDockerfile, err))
	}
	if err := writeInfo(staging, info); err != nil {
		return Info{}, b.fail(ctx, nil, err)
	}
	if err := syncfs(staging); err != nil {
		return Info{}, b.fail(ctx, nil, err)
	}
	if err := ctx.Err(); err != nil {
		return Info{}, b.fail(ctx, nil, err)
	}
	inst := &builder{def: Definition{Name: b.opt.Name}, dir: b.dir, log: b.log}
	if err := inst.install(staging, final); err != nil {
		return Info{}, b.fail(ctx, nil, err)
	}
	cu.release()
	b.prog.report("done", progressTotal)
	b.log.Printf("template %s built in %s (%d of %d steps built, the rest cached); hash %s",
		b.opt.Name, time.Since(start).Round(time.Millisecond), b.ran, len(b.df.Steps), b.key)
	return info, nil
}

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func (b *dfBuilder) buildArg(kv instructions.KeyValuePairOptional) string {
	if v, ok := b.opt.BuildArgs[kv.Key]; ok {
		return v
	}
	if kv.Value != nil {
		return *kv.Value
	}
	return ""
}

// environ is what variables expand from, and RUN's environment: build
// args, then ENV (which wins).
func (b *dfBuilder) environ() []string {
	var env []string
	for _, k := range slices.Sorted(maps.Keys(b.args)) {
		env = append(env, k+"="+b.args[k])
	}
	env = append(env, b.env...)
	return env
}

func (b *dfBuilder) expand(word string) (string, error) {
	s, _, err := shell.NewLex('\\').ProcessWord(word, shell.EnvsFromSlice(b.environ()))
	return s, err
}

// step runs one instruction: state changes, or a layer built or found.
func (b *dfBuilder) step(ctx context.Context, st *Step, baseRoot string) error {
	if ex, ok := st.cmd.(instructions.SupportsSingleWordExpansion); ok {
		if err := ex.Expand(b.expand); err != nil {
			return err
		}
	}
	switch c := st.cmd.(type) {
	case *instructions.EnvCommand:
		for _, kv := range c.Env {
			b.env = setEnv(b.env, kv.Key, kv.Value)
		}
	case *instructions.ArgCommand:
		for _, kv := range c.Args {
			b.args[kv.Key] = b.buildArg(kv)
		}
	case *instructions.UserCommand:
		b.user = c.User
	case *instructions.LabelCommand:
		for _, kv := range c.Labels {
			b.labels[kv.Key] = kv.Value
		}
	case *instructions.WorkdirCommand:
		b.workdir, b.workdirSet = resolveIn(b.workdir, c.Path), true
	}
	// The key: the layer below, the instruction as expanded, the state.
	h := sha256.New()
	state, _ := json.Marshal(struct {
		Env     []string
		Args    map[string]string
		User    string
		WorkDir string
		Labels  map[string]string
	}{b.env, b.args, b.user, b.workdir, b.labels})
	fmt.Fprintf(h, "%s\n%s\n%s\n", b.key, stepText(st.cmd), state)
	var apply func(root string) error
	switch c := st.cmd.(type) {
	case *instructions.RunCommand:
		apply = func(root string) error { return b.run(ctx, c, root) }
	case *instructions.CopyCommand:
		srcs, err := b.sources(c.SourcePaths, h)
		if err != nil {
			return err
		}
		apply = func(root string) error { return b.copy(srcs, c.DestPath, c.Chown, c.Chmod, root) }
	case *instructions.AddCommand:
		srcs, err := b.sources(c.SourcePaths, h)
		if err != nil {
			return err
		}
		if err := b.refuseArchives(srcs); err != nil {
			return err
		}
		apply = func(root string) error { return b.copy(srcs, c.DestPath, c.Chown, c.Chmod, root) }
	case *instructions.WorkdirCommand:
		apply = func(root string) error { return b.mkdirWorkdir(root) }
	}
	b.key = "sha256:" + hex.EncodeToString(h.Sum(nil))
	if apply == nil {
		b.log.Printf("line %d: %s", st.Line, st.Text)
		return nil
	}
	final := filepath.Join(b.dir, layersDir, strings.TrimPrefix(b.key, "sha256:"))
	if !b.opt.NoCache {
		if fi, err := os.Lstat(filepath.Join(final, diffDir)); err == nil && fi.IsDir() {
			b.log.Printf("line %d: %s: cached", st.Line, st.Text)
			b.layers = append(b.layers, filepath.Join(final, diffDir))
			return nil
		}
	}
	b.log.Printf("line %d: %s", st.Line, st.Text)
	diff, err := b.layer(ctx, baseRoot, final, apply)
	if err != nil {
		return err
	}
	b.ran++
	b.layers = append(b.layers, diff)
	return nil
}

// stepText is the instruction as expanded, for the key.
func stepText(cmd instructions.Command) string {
	b, err := json.Marshal(cmd)
	if err != nil {
		return fmt.Sprintf("%#v", cmd)
	}
	return cmd.Name() + " " + string(b)
}

func setEnv(env []string, k, v string) []string {
	env = slices.DeleteFunc(env, func(e string) bool { return strings.HasPrefix(e, k+"=") })
	return append(env, k+"="+v)
}

// resolveIn is p relative to dir, cleaned, absolute.
func resolveIn(dir, p string) string {
	if !path.IsAbs(p) {
		p = path.Join(dir, p)
	}
	return path.Clean("/" + p)
}

// layer makes one layer: an overlay of the layers so far over the base,
// apply run on it, its upper directory kept as final/diff. Nothing is left
// on failure.
func (b *dfBuilder) layer(ctx context.Context, baseRoot, final string, apply func(root string) error) (diff string, err error) {
	var cu cleanup
	defer func() {
		if cerr := cu.run(); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	tmp, err := os.MkdirTemp(filepath.Join(b.dir, layersDir), ".tmp-")
	if err != nil {
		return "", err
	}
	cu.add(func() error { return removeStaging(tmp) })
	if err := os.Chmod(tmp, 0o755); err != nil { // the sandbox's root reaches its rootfs
		return "", err
	}
	upper, work, merged := filepath.Join(tmp, diffDir), filepath.Join(tmp, "work"), filepath.Join(tmp, "merged")
	for _, d := range []string{upper, work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return "", err
		}
	}
	lowers := []string{}
	for i := len(b.layers) - 1; i >= 0; i-- {
		lowers = append(lowers, b.layers[i])
	}
	lowers = append(lowers, baseRoot)
	for _, l := range lowers {
		if strings.ContainsAny(l, ":,") {
			return "", fmt.Errorf("layer path %q has a ':' or ','", l)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,redirect_dir=off,metacopy=off,index=off",
		strings.Join(lowers, ":"), upper, work)
	if len(opts) > 4000 {
		return "", fmt.Errorf("too many layers (%d) for one overlay mount", len(lowers))
	}
	if err := unix.Mount("overlay", merged, "overlay", unix.MS_NODEV, opts); err != nil {
		return "", fmt.Errorf("mount overlay: %w", err)
	}
	cu.add(func() error {
		if err := unix.Unmount(merged, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return unix.Unmount(merged, unix.MNT_DETACH)
		}
		return nil
	})
	if err := os.Chown(merged, int(b.opt.UIDShift), int(b.opt.UIDShift)); err != nil {
		return "", err
	}
	if err := apply(merged); err != nil {
		return "", err
	}
	if err := unix.Unmount(merged, 0); err != nil {
		return "", fmt.Errorf("unmount overlay: %w", err)
	}
	if err := cleanDiff(upper); err != nil {
		return "", err
	}
	if _, err := stripSetid(upper); err != nil {
		return "", err
	}
	if err := os.RemoveAll(work); err != nil {
		return "", err
	}
	if err := os.Remove(merged); err != nil {
		return "", err
	}
	if err := os.RemoveAll(final); err != nil { // a layer rebuilt with NoCache
		return "", err
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", err
	}
	cu.release()
	return filepath.Join(final, diffDir), nil
}

// run runs a RUN step with the StepRunner on root.
func (b *dfBuilder) run(ctx context.Context, c *instructions.RunCommand, root string) error {
	if b.opt.Runner == nil {
		return errors.New("RUN needs a step runner (none configured)")
	}
	args := slices.Clone(c.CmdLine)
	if c.PrependShell {
		args = []string{"/bin/sh", "-c", strings.Join(c.CmdLine, " ")}
	}
	uid, gid, err := resolveUser(root, b.user)
	if err != nil {
		return err
	}
	env := b.environ()
	if !slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, "PATH=") }) {
		env = append([]string{defaultPath}, env...)
	}
	if err := b.mkdirWorkdir(root); err != nil {
		return err
	}
	err = b.opt.Runner.RunStep(ctx, RunStep{RootFS: root, Args: args, Env: env, Cwd: b.workdir,
		UID: uid, GID: gid, UIDShift: b.opt.UIDShift}, b.log)
	if err != nil {
		return fmt.Errorf("%s: %w", strings.Join(args, " "), err)
	}
	return nil
}

// mkdirWorkdir makes the working directory in root if it is missing
// (root-owned, as Docker does).
func (b *dfBuilder) mkdirWorkdir(root string) error {
	r, err := os.OpenRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	rel := strings.TrimPrefix(b.workdir, "/")
	if rel == "" {
		return nil
	}
	if fi, err := r.Stat(rel); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("WORKDIR %s is not a directory", b.workdir)
		}
		return nil
	}
	return mkdirAllOwned(r, rel, b.opt.UIDShift, b.opt.UIDShift)
}

// mkdirAllOwned makes rel and its missing parents in r, owned by uid:gid.
func mkdirAllOwned(r *os.Root, rel string, uid, gid uint32) error {
	parts := strings.Split(path.Clean(rel), "/")
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		err := r.Mkdir(p, 0o755)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return err
		}
		if err := r.Lchown(p, int(uid), int(gid)); err != nil {
			return err
		}
	}
	return nil
}

// recordedWorkDir is the template's WORKDIR: its last, or "" when none
// was given (not the "/" its steps ran in).
func (b *dfBuilder) recordedWorkDir() string {
	if !b.workdirSet {
		return ""
	}
	return b.workdir
}

// resolveUser turns USER's "name|uid[:group|gid]" into ids, names read
// from root's /etc/passwd and /etc/group.
func resolveUser(root, user string) (uid, gid uint32, err error) {
	if user == "" {
		return 0, 0, nil
	}
	u, g, hasGroup := strings.Cut(user, ":")
	passwd, _ := readInRoot(root, "etc/passwd")
	uid, pgid, err := lookupID(passwd, u, true)
	if err != nil {
		return 0, 0, fmt.Errorf("USER %s: %w", user, err)
	}
	gid = pgid
	if hasGroup {
		group, _ := readInRoot(root, "etc/group")
		if gid, _, err = lookupID(group, g, false); err != nil {
			return 0, 0, fmt.Errorf("USER %s: %w", user, err)
		}
	}
	if uid > maxMappedID || gid > maxMappedID {
		return 0, 0, fmt.Errorf("USER %s: ids above %d are not mapped", user, maxMappedID)
	}
	return uid, gid, nil
}

func readInRoot(root, rel string) ([]byte, error) {
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return r.ReadFile(rel)
}

// lookupID finds name (or a number) in a passwd or group file; for passwd
// it also returns the user's primary group.
func lookupID(file []byte, name string, passwd bool) (id, gid uint32, err error) {
	n, nerr := strconv.ParseUint(name, 10, 32)
	for _, line := range strings.Split(string(file), "\n") {
		f := strings.Split(line, ":")
		if len(f) < 3 || (f[0] != name && (nerr != nil || f[2] != name)) {
			continue
		}
		i, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil {
			continue
		}
		if passwd && len(f) > 3 {
			g, err := strconv.ParseUint(f[3], 10, 32)
			if err == nil {
				return uint32(i), uint32(g), nil
			}
		}
		return uint32(i), uint32(i), nil
	}
	if nerr == nil {
		return uint32(n), uint32(n), nil
	}
	return 0, 0, fmt.Errorf("no such user or group %q", name)
}

// linkTree copies the tree src to dst (which must not exist) with hard
// links for everything but directories (cp -al), so no file's data is
// copied; neither tree is written in place afterwards. Where the two are
// on different filesystems it copies (cp -a).
func linkTree(ctx context.Context, src, dst string) error {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "cp", "-a", "--link", "--no-target-directory", src, dst)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err == nil {
		return nil
	}
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	out.Reset()
	cmd = exec.CommandContext(ctx, "cp", "-a", "--no-target-directory", src, dst)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("cp -a: %w: %s", err, strings.TrimSpace(out.String()))
	}
	return nil
}
