package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/doctor"
	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

func doctorCmd(cfg *config.Config) *cobra.Command {
	var (
		asJSON       bool
		tpl          string
		maxSandboxes int
		guestAccel   bool
		guestProbe   string
	)
	poolSize := sandbox.DefaultPoolSize()
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check that this host can run sandboxes, and say what to fix",
		Long: `Check the host: kernel, user namespaces, cgroups, overlayfs, seccomp, the runtime
(refusing a runc without the November 2025 security fixes), the agent, the template,
free disk and memory for the warm pool, and the per-user kernel counters every
sandbox is charged to; and what the host offers a full guest (/dev/kvm from
hardware virtualization, from PVM, or none). One line per check; the exit status is
1 when a check fails (sandboxes cannot run), 0 when all are ok or only warn.

--guest-accel prints only the accelerator the cgroup v2 guest test boots with
("kvm" or "tcg"), a tab and why; --guest-probe says what a KVM boot of the guest
showed ("output" or "silent").`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if guestAccel {
				p, err := doctor.ParseProbe(guestProbe)
				if err != nil {
					return err
				}
				accel, reason := doctor.GuestAccel(doctor.ReadVirt("/"), p)
				fmt.Printf("%s\t%s\n", accel, reason)
				return nil
			}
			// A missing binary is a finding, not an error of the command.
			_ = cfg.Resolve()
			rs := doctor.Run(cmd.Context(), doctorOptions(*cfg, tpl, maxSandboxes, poolSize))
			if asJSON {
				b, err := doctor.JSON(rs)
				if err != nil {
					return err
				}
				fmt.Println(string(b))
			} else {
				fmt.Print(doctor.Format(rs))
			}
			if doctor.Failed(rs) {
				return exitError{1}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the checks as JSON")
	cmd.Flags().StringVar(&tpl, "template", "python", "the template sandboxes start from")
	cmd.Flags().IntVar(&maxSandboxes, "max-sandboxes", 0, "sandboxes the server will run at once (0: the engine's default)")
	cmd.Flags().IntVar(&poolSize, "pool", poolSize, "warm pool size the server will keep")
	cmd.Flags().BoolVar(&guestAccel, "guest-accel", false, "print the accelerator of the cgroup v2 guest test (kvm or tcg) and why, and nothing else")
	cmd.Flags().StringVar(&guestProbe, "guest-probe", "", "with --guest-accel: what a KVM boot of the guest showed (output or silent)")
	return cmd
}

func doctorOptions(cfg config.Config, tpl string, maxSandboxes, poolSize int) doctor.Options {
	if maxSandboxes <= 0 {
		maxSandboxes = sandbox.DefaultMaxSandboxes
	}
	l := sandbox.DefaultLimits
	return doctor.Options{
		DataDir: cfg.DataDir, RuntimePath: cfg.RuntimePath, RunscPath: cfg.RunscPath, AgentPath: cfg.AgentPath, Template: tpl,
		MaxSandboxes: maxSandboxes, PoolSize: poolSize,
		SandboxMemory: l.MemoryBytes, SandboxDisk: l.DiskBytes, SandboxPids: l.Pids,
		HostCounters: oci.HostLimitMinimums(), Disks: oci.CheckDisks,
		Devices: func() ([]string, error) {
			dirs := cfg.CDISpecDirs
			if dirs == nil {
				dirs = config.DefaultCDISpecDirs
			}
			devs, err := oci.CDIDevices(dirs)
			var names []string
			for _, d := range devs {
				names = append(names, d.Name)
			}
			return names, err
		},
	}
}

// checkHost runs the doctor's passive checks once the engine has started
// (it raises the host's per-user limits) and logs each one that is not ok.
func checkHost(ctx context.Context, cfg config.Config, maxSandboxes, poolSize int, log *slog.Logger) {
	o := doctorOptions(cfg, "python", maxSandboxes, poolSize)
	o.SkipProbes = true
	for _, r := range doctor.Run(ctx, o) {
		switch r.Status {
		case doctor.Fail:
			log.Error("host check failed", "check", r.Check, "detail", r.Detail, "fix", r.Fix)
		case doctor.Warn:
			log.Warn("host check", "check", r.Check, "detail", r.Detail, "fix", r.Fix)
		}
	}
}
