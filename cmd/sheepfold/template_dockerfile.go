package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sheepfold/sheepfold/internal/config"
	sfengine "github.com/sheepfold/sheepfold/internal/engine"
	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/template"
)

// buildDockerfile is `template build -f`.
func buildDockerfile(ctx context.Context, cfg *config.Config, name, file, contextDir string, buildArgs []string,
	noCache, quiet bool, logFile string) error {
	if cfg.RuntimePath == "" {
		cfg.RuntimePath = filepath.Join(cfg.DataDir, "bin", "runc")
	}
	var src []byte
	var err error
	if file == "-" {
		src, err = io.ReadAll(os.Stdin)
	} else {
		src, err = os.ReadFile(file)
	}
	if err != nil {
		return err
	}
	if contextDir == "" && file != "-" {
		contextDir = filepath.Dir(file)
	}
	if contextDir != "" {
		if contextDir, err = filepath.Abs(contextDir); err != nil {
			return err
		}
	}
	args := map[string]string{}
	for _, a := range buildArgs {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			v, ok = os.LookupEnv(k)
		}
		if ok {
			args[k] = v
		}
	}
	opt := template.DockerfileOptions{
		DataDir: cfg.DataDir, Name: name, Context: contextDir, BuildArgs: args,
		UIDShift: oci.DefaultIDMap.HostID, Runner: sfengine.StepRunner(*cfg), NoCache: noCache,
		Registries: registriesOf(cfg),
	}
	var logs []io.Writer
	if !quiet {
		logs = append(logs, os.Stderr)
	}
	if logFile != "" {
		f, err := os.Create(logFile)
		if err != nil {
			return err
		}
		defer f.Close()
		logs = append(logs, f)
	}
	if len(logs) > 0 {
		opt.Log = io.MultiWriter(logs...)
	}
	start := time.Now()
	info, err := template.BuildDockerfile(ctx, src, opt)
	if err != nil {
		return err
	}
	fmt.Printf("template %s ready at %s (%d MiB, %s, %s)\n", info.Name, info.Path, info.SizeBytes>>20,
		time.Since(start).Round(100*time.Millisecond), info.Hash)
	return nil
}

// registriesOf is the registries a FROM may pull from.
func registriesOf(cfg *config.Config) template.Registries {
	return template.Registries{Allow: cfg.Registries, Insecure: cfg.InsecureRegistries, AuthFile: cfg.RegistryAuthFile}
}

// registryFlags are the flags of the registries a FROM may pull from.
func registryFlags(fs *pflag.FlagSet, cfg *config.Config) {
	fs.StringSliceVar(&cfg.Registries, "registry", nil, "image registries (HOST[:PORT]) a template's FROM HOST/REPO:TAG may pull from over HTTPS (default: none; any other is refused with ERR_REGISTRY_NOT_ALLOWED)")
	fs.StringSliceVar(&cfg.InsecureRegistries, "insecure-registry", nil, "image registries (HOST[:PORT]) a template's FROM may pull from over plain HTTP")
	fs.StringVar(&cfg.RegistryAuthFile, "registry-auth", "", "a Docker config file (config.json) whose \"auths\" hold the registries' credentials (credential helpers are not run; default: anonymous pulls)")
}

// templateImportCmd is `template import`: a template from an OCI image
// (an archive, a layout directory or an image in a registry), built as
// the Dockerfile "FROM oci-archive:FILE" (or "FROM oci:DIR", or "FROM
// HOST/REPO:TAG") would be.
func templateImportCmd(cfg *config.Config) *cobra.Command {
	var quiet bool
	cmd := &cobra.Command{
		Use:   "import FILE|DIR|HOST/REPO:TAG NAME",
		Short: "Make a template from an OCI image: an archive (docker save, skopeo oci-archive:, template export), a layout directory, or an image in a registry --registry/--insecure-registry allows",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := cfg.ResolveDataDir(); err != nil {
				return err
			}
			src, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}
			var ref string
			if fi, err := os.Stat(src); err == nil && fi.IsDir() {
				ref = "oci:" + src
			} else if err == nil {
				ref = "oci-archive:" + src
			} else if template.IsRegistryRef(args[0]) {
				ref = args[0]
			} else {
				return err
			}
			df, err := os.CreateTemp("", "sheepfold-import-*.Dockerfile")
			if err != nil {
				return err
			}
			defer os.Remove(df.Name())
			if _, err := fmt.Fprintf(df, "FROM %s\n", ref); err != nil {
				df.Close()
				return err
			}
			df.Close()
			return buildDockerfile(cmd.Context(), cfg, args[1], df.Name(), "", nil, false, quiet, "")
		},
	}
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "no build log on standard error")
	registryFlags(cmd.Flags(), cfg)
	return cmd
}
