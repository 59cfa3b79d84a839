package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	digest "github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/homeseed"
	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/template"
	"github.com/sheepfold/sheepfold/internal/template/ociimage"
)

// imageNamePrefix names the images of exported templates:
// sheepfold.local/template/NAME:TAG. The .local host is no registry: the
// image is imported into containerd, never pulled.
const imageNamePrefix = "sheepfold.local/template/"

// exportOptions configure exportTemplate.
type exportOptions struct {
	DataDir string
	Agent   string // host path of the agent binary
	Output  string // the archive; "-" is stdout
	Tag     string
	Gzip    bool
	Force   bool // replace an existing Output
}

func templateExportCmd(cfg *config.Config) *cobra.Command {
	var o exportOptions
	cmd := &cobra.Command{
		Use:   "export NAME",
		Short: "Write a built template as an OCI image archive (for `ctr -n k8s.io images import`)",
		Long: `Write the built template NAME as an OCI image layout archive that containerd
imports (ctr -n k8s.io images import FILE), so that sandboxes can run as Pods
from it. The image holds the template's root filesystem with its owners
unshifted to the sandbox's ids and, in a second layer, the agent at
` + oci.AgentPath + ` (also ` + oci.SudoPath + `) and the template's home as a tar archive at
` + oci.HomeSeedPath + ` (a Pod's agent unpacks it into the memory-backed
volume mounted over ` + oci.SandboxHome + `); its entrypoint is the agent. It is
named ` + imageNamePrefix + `NAME:TAG, TAG by default the first 12 hex digits
of the manifest's digest (the same template and agent give the same image).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := cfg.ResolveAgent(); err != nil {
				return err
			}
			o.DataDir, o.Agent = cfg.DataDir, cfg.AgentPath
			if o.Output == "" {
				o.Output = args[0] + ".oci.tar"
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			start := time.Now()
			res, err := exportTemplate(ctx, args[0], o)
			if err != nil {
				return err
			}
			out := io.Writer(os.Stdout)
			if o.Output == "-" {
				out = os.Stderr // stdout holds the archive
			}
			fmt.Fprintf(out, "image   %s\ndigest  %s\nsize    %d MiB (%s, %s)\n", res.Ref, res.Manifest.Digest,
				res.Size>>20, o.Output, time.Since(start).Round(100*time.Millisecond))
			if len(res.Skipped) > 0 {
				fmt.Fprintf(out, "left out %d sockets: %s\n", len(res.Skipped), strings.Join(res.Skipped, ", "))
			}
			if o.Output != "-" {
				fmt.Fprintf(out, "import  ctr -n k8s.io images import %s\n", o.Output)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&o.Output, "output", "o", "", "the archive to write; - for stdout (default NAME.oci.tar)")
	cmd.Flags().StringVar(&o.Tag, "tag", "", "the image's tag (default: the first 12 hex digits of its manifest digest)")
	cmd.Flags().BoolVar(&o.Gzip, "gzip", false, "gzip the layers (about 3x smaller, about twice as slow to write)")
	cmd.Flags().BoolVar(&o.Force, "force", false, "overwrite an existing output file")
	cmd.Flags().StringVar(&cfg.AgentPath, "agent", cfg.AgentPath, "the agent binary to put in the image (default: as the server finds it; env SHEEPFOLD_AGENT)")
	return cmd
}

// exportTemplate writes the image of template name to o.Output: to a
// temporary file beside it, renamed into place once complete (never left
// behind on an error or an interrupt).
func exportTemplate(ctx context.Context, name string, o exportOptions) (ociimage.Result, error) {
	info, err := template.Get(o.DataDir, name)
	if errors.Is(err, template.ErrNotBuilt) {
		if _, lerr := template.Lookup(name); lerr != nil {
			return ociimage.Result{}, lerr // neither built nor buildable
		}
	}
	if err != nil {
		return ociimage.Result{}, err
	}
	if o.Tag != "" {
		if err := ociimage.ValidTag(o.Tag); err != nil {
			return ociimage.Result{}, err
		}
	}
	agentDigest, err := fileDigest(o.Agent)
	if err != nil {
		return ociimage.Result{}, fmt.Errorf("agent binary: %w", err)
	}
	seed, err := homeSeed(filepath.Join(info.Path, oci.SandboxHome), o.DataDir)
	if err != nil {
		return ociimage.Result{}, err
	}
	defer os.Remove(seed)
	opt := ociimage.Options{
		Name:   imageNamePrefix + name,
		Tag:    o.Tag,
		RootFS: info.Path,
		HostID: info.UIDShift,
		IDs:    oci.DefaultIDMap.Size,
		Files: []ociimage.File{
			{Path: oci.AgentPath, Source: o.Agent, Mode: 0o755, Links: []string{oci.SudoPath}},
			{Path: oci.HomeSeedPath, Source: seed, Mode: 0o644},
		},
		Created: info.Created,
		CreatedBy: fmt.Sprintf("sheepfold template build %s (Debian %s: %s)", info.Name, info.Suite,
			strings.Join(info.Packages, " ")),
		Gzip: o.Gzip,
		Config: v1.ImageConfig{
			// The agent starts as root of the sandbox and drops to the
			// user itself; the Pod spec gives its arguments (init ...).
			User:       "0:0",
			Entrypoint: []string{oci.AgentPath},
			Env:        slices.Clone(oci.BaseEnv),
			WorkingDir: oci.SandboxHome,
			Labels: map[string]string{
				"io.sheepfold.template":           info.Name,
				"io.sheepfold.template.suite":     info.Suite,
				"io.sheepfold.template.packages":  strings.Join(info.Packages, ","),
				"io.sheepfold.template.created":   info.Created.UTC().Format(time.RFC3339),
				"io.sheepfold.template.uid-shift": strconv.FormatUint(uint64(info.UIDShift), 10),
				"io.sheepfold.agent.digest":       agentDigest.String(),
				"io.sheepfold.version":            version,
			},
		},
	}

	if o.Output == "-" {
		if term.IsTerminal(int(os.Stdout.Fd())) {
			return ociimage.Result{}, errors.New("not writing an image archive to a terminal: redirect stdout or use -o FILE")
		}
		// The staged layers (unlinked at once) go beside the templates,
		// on a disk that holds them, not in a /tmp that may be a tmpfs.
		opt.TempDir = o.DataDir
		res, err := ociimage.Write(ctx, os.Stdout, opt)
		return res, exportError(name, err)
	}
	out, err := filepath.Abs(o.Output)
	if err != nil {
		return ociimage.Result{}, err
	}
	if fi, err := os.Stat(out); err == nil {
		if fi.IsDir() {
			return ociimage.Result{}, fmt.Errorf("%s is a directory", o.Output)
		}
		if !o.Force {
			return ociimage.Result{}, fmt.Errorf("%s exists; use --force to overwrite it", o.Output)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return ociimage.Result{}, err
	}
	dir := filepath.Dir(out)
	f, err := os.CreateTemp(dir, filepath.Base(out)+".tmp-*")
	if err != nil {
		return ociimage.Result{}, err
	}
	tmp := f.Name()
	done := false
	defer func() {
		if !done {
			f.Close()
			os.Remove(tmp)
		}
	}()
	res, err := ociimage.Write(ctx, f, opt)
	if err != nil {
		return ociimage.Result{}, exportError(name, err)
	}
	if err := f.Chmod(0o644); err != nil {
		return ociimage.Result{}, err
	}
	if err := f.Sync(); err != nil {
		return ociimage.Result{}, err
	}
	if err := f.Close(); err != nil {
		return ociimage.Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return ociimage.Result{}, err
	}
	if o.Force {
		err = os.Rename(tmp, out)
	} else {
		// A link fails where a file appeared meanwhile: never clobbered.
		if err = os.Link(tmp, out); err == nil {
			os.Remove(tmp)
		} else if errors.Is(err, fs.ErrExist) {
			err = fmt.Errorf("%s exists; use --force to overwrite it", o.Output)
		}
	}
	if err != nil {
		return ociimage.Result{}, err
	}
	done = true
	return res, nil
}

// homeSeed writes the template's home (its host path) as a home seed
// archive to a temporary file in dir and returns the file's path; the
// caller removes it.
func homeSeed(home, dir string) (string, error) {
	f, err := os.CreateTemp(dir, "home-seed-*.tar")
	if err != nil {
		return "", err
	}
	_, err = homeseed.Write(f, home)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("the template's home: %w", err)
	}
	return f.Name(), nil
}

// fileDigest returns the sha256 digest of the regular file at p.
func fileDigest(p string) (digest.Digest, error) {
	f, err := os.Open(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("%s not found: run `make build` (or set SHEEPFOLD_AGENT or --agent)", p)
		}
		return "", err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", p)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return digest.NewDigest(digest.SHA256, h), nil
}

// exportError adds to err (if any) what the user can do about it.
func exportError(name string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ociimage.ErrOwner):
		return fmt.Errorf("export template %s: %w\n(something changed the template after its build, as host root; "+
			"rebuild it: sheepfold template build --force %s)", name, err, name)
	}
	return fmt.Errorf("export template %s: %w", name, err)
}
