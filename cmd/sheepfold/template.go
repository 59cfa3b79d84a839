package main

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/template"
)

func templateCmd(cfg *config.Config) *cobra.Command {
	cmd := &cobra.Command{Use: "template", Short: "Build, list, export and remove sandbox templates"}

	var force, update, quiet, noCache bool
	var logFile, dockerfile, contextDir string
	var buildArgs []string
	build := &cobra.Command{
		Use:   "build NAME",
		Short: "Build a template: a builtin one from Debian packages (once; --force rebuilds), or any from a Dockerfile (-f)",
		Long: `Build a template.

Without -f, NAME is a builtin template (python), built from Debian packages
with debootstrap, once (--force rebuilds).

With -f Dockerfile, NAME is built from the Dockerfile: FROM a built template,
an OCI image (oci-archive:FILE, oci:DIR) or an image in a registry the
operator allows (HOST[:PORT]/REPO:TAG or @DIGEST: --registry,
--insecure-registry, --registry-auth), then RUN (in a sandbox of the half-built template, without network), COPY and
ADD (from --context only), ENV, ARG, WORKDIR, USER and LABEL. The labels
sheepfold.start ("command") and sheepfold.ready ("port:N" or "cmd:COMMAND")
are kept as the template's start command and ready check. Steps are cached by
their inputs: a rebuild redoes only the steps from the first changed one.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := cfg.ResolveDataDir(); err != nil {
				return err
			}
			if dockerfile != "" {
				return buildDockerfile(cmd.Context(), cfg, args[0], dockerfile, contextDir, buildArgs, noCache, quiet, logFile)
			}
			def, err := template.Lookup(args[0])
			if err != nil {
				return err
			}
			opt := template.BuildOptions{DataDir: cfg.DataDir, UIDShift: oci.DefaultIDMap.HostID, Force: force}
			if logFile != "" {
				f, err := os.Create(logFile)
				if err != nil {
					return err
				}
				defer f.Close()
				opt.Log = f
			}
			var bar *progressbar.ProgressBar
			// Not a terminal (CI logs): one line per step, no redrawn bar.
			fi, _ := os.Stderr.Stat()
			tty := fi != nil && fi.Mode()&os.ModeCharDevice != 0
			lastStep := ""
			if !quiet && !tty {
				opt.Progress = func(step string, done, total int) {
					if step != lastStep {
						lastStep = step
						fmt.Fprintf(os.Stderr, "template %s: %s\n", def.Name, step)
					}
				}
			}
			if !quiet && tty {
				opt.Progress = func(step string, done, total int) {
					if bar == nil {
						bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(os.Stderr),
							progressbar.OptionSetWidth(30), progressbar.OptionShowElapsedTimeOnFinish(),
							progressbar.OptionSetPredictTime(false), progressbar.OptionClearOnFinish())
					}
					bar.Describe(fmt.Sprintf("%-28s", step))
					_ = bar.Set(done)
				}
			}
			start := time.Now()
			info, err := template.Build(cmd.Context(), def, opt)
			if errors.Is(err, template.ErrStale) && update {
				fmt.Fprintf(os.Stderr, "sheepfold: %v: rebuilding\n", err)
				opt.Force = true
				info, err = template.Build(cmd.Context(), def, opt)
			}
			if bar != nil {
				_ = bar.Finish()
			}
			if err != nil {
				return err
			}
			fmt.Printf("template %s ready at %s (%d MiB, %s)\n", info.Name, info.Path, info.SizeBytes>>20,
				time.Since(start).Round(100*time.Millisecond))
			return nil
		},
	}
	build.Flags().BoolVar(&force, "force", false, "rebuild even if the template exists")
	build.Flags().BoolVar(&update, "update", false, "rebuild the template if it is stale (built from another package list, suite or id shift); keep it if it is current")
	build.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress bar")
	build.Flags().StringVar(&logFile, "log", "", "write debootstrap and apt output (or the Dockerfile build's log) to this file")
	build.Flags().StringVarP(&dockerfile, "file", "f", "", "build NAME from this Dockerfile (\"-\": standard input)")
	build.Flags().StringVar(&contextDir, "context", "", "the build context COPY and ADD read from (default: the Dockerfile's directory)")
	build.Flags().StringArrayVar(&buildArgs, "build-arg", nil, "KEY=VALUE for an ARG (repeatable)")
	build.Flags().BoolVar(&noCache, "no-cache", false, "build every step anew (Dockerfile builds)")
	registryFlags(build.Flags(), cfg)
	build.Flags().StringSliceVar(&cfg.BuildAllowHosts, "build-allow-host", config.DefaultBuildAllowHosts,
		"the hosts RUN steps may reach, through an egress gateway that refuses every other (allowlist rules: host, *.domain, host:port; repeatable or comma-separated; \"\" for none: no network)")
	build.Flags().StringVar(&cfg.BuildCAFile, "build-ca-file", config.DefaultBuildCA(),
		"CA certificates the TLS clients of RUN steps trust besides the template's own (SSL_CERT_FILE, NODE_EXTRA_CA_CERTS, ... name it inside the step; \"\": none)")

	list := &cobra.Command{
		Use:   "list",
		Short: "List templates: built ones and those that can be built",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := cfg.ResolveDataDir(); err != nil {
				return err
			}
			built, err := template.List(cfg.DataDir)
			if err != nil {
				return err
			}
			have := map[string]template.Info{}
			for _, i := range built {
				have[i.Name] = i
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tSTATUS\tSIZE\tCREATED\tBUILD\tHASH\tRUNTIME\tDESCRIPTION")
			for _, d := range template.Builtin() {
				i, ok := have[d.Name]
				delete(have, d.Name)
				if !ok {
					fmt.Fprintf(w, "%s\tnot built\t-\t-\t-\t-\t-\t%s\n", d.Name, d.Description)
					continue
				}
				fmt.Fprintf(w, "%s\tbuilt\t%s\t%s\n", d.Name, listColumns(i), d.Description)
			}
			for _, n := range slices.Sorted(maps.Keys(have)) {
				i := have[n]
				desc := ""
				if i.From != "" {
					desc = "from a Dockerfile, FROM " + i.From
				}
				fmt.Fprintf(w, "%s\tbuilt\t%s\t%s\n", i.Name, listColumns(i), desc)
			}
			return w.Flush()
		},
	}
	rm := &cobra.Command{
		Use:   "rm NAME",
		Short: "Remove a built template",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := cfg.ResolveDataDir(); err != nil {
				return err
			}
			return template.Remove(cfg.DataDir, args[0])
		},
	}
	setRuntime := &cobra.Command{
		Use:   "set-runtime NAME RUNTIME",
		Short: `Set the runtime (runc or gvisor; "" for the server's default) of the template's sandboxes that name none`,
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := cfg.ResolveDataDir(); err != nil {
				return err
			}
			return template.SetRuntime(cfg.DataDir, args[0], args[1])
		},
	}
	var gpus int
	setDevices := &cobra.Command{
		Use:   "set-devices NAME [DEVICE...]",
		Short: "Set the devices (CDI names, and --gpu GPUs) each sandbox of the template is given unless its create names its own; none to clear",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := cfg.ResolveDataDir(); err != nil {
				return err
			}
			return template.SetDevices(cfg.DataDir, args[0], gpus, args[1:])
		},
	}
	setDevices.Flags().IntVar(&gpus, "gpu", 0, "GPUs (devices of the server's GPU class) each sandbox is given")
	cmd.AddCommand(build, list, rm, setRuntime, setDevices, templateExportCmd(cfg), templateImportCmd(cfg))
	return cmd
}

// listColumns are a built template's SIZE, CREATED, BUILD (time), HASH and
// RUNTIME columns of template list.
func listColumns(i template.Info) string {
	build, hash := "-", "-"
	if i.BuildSeconds > 0 {
		build = (time.Duration(i.BuildSeconds*1e3) * time.Millisecond).Round(100 * time.Millisecond).String()
	}
	if i.Hash != "" {
		hash = strings.TrimPrefix(i.Hash, "sha256:")[:12]
	}
	// Every template runs on the engine's runtime (runc); Kubernetes
	// runs an exported one (template export).
	return fmt.Sprintf("%d MiB\t%s\t%s\t%s\trunc", i.SizeBytes>>20, i.Created.Format(time.DateTime), build, hash)
}
