package main

import (
	"errors"
	"fmt"
	"os"
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

	var force, update, quiet bool
	var logFile string
	build := &cobra.Command{
		Use:   "build NAME",
		Short: "Build a template's root filesystem from Debian packages (once; --force rebuilds)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			def, err := template.Lookup(args[0])
			if err != nil {
				return err
			}
			if err := cfg.ResolveDataDir(); err != nil {
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
	build.Flags().StringVar(&logFile, "log", "", "write debootstrap and apt output to this file")

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
			fmt.Fprintln(w, "NAME\tSTATUS\tSIZE\tCREATED\tDESCRIPTION")
			for _, d := range template.Builtin() {
				i, ok := have[d.Name]
				delete(have, d.Name)
				if !ok {
					fmt.Fprintf(w, "%s\tnot built\t-\t-\t%s\n", d.Name, d.Description)
					continue
				}
				fmt.Fprintf(w, "%s\tbuilt\t%d MiB\t%s\t%s\n", d.Name, i.SizeBytes>>20, i.Created.Format(time.DateTime), d.Description)
			}
			for _, i := range have {
				fmt.Fprintf(w, "%s\tbuilt\t%d MiB\t%s\t\n", i.Name, i.SizeBytes>>20, i.Created.Format(time.DateTime))
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
	cmd.AddCommand(build, list, rm, setRuntime, templateExportCmd(cfg))
	return cmd
}
