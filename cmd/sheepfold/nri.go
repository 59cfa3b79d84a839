package main

import (
	"log/slog"
	"os"
	"os/signal"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/runtime/kubernetes/nri"
)

// nriPluginCmd runs on every node of a cluster that runs sandboxes: the
// container runtime's plugin that gives each sandbox's container its
// pids limit (package nri).
func nriPluginCmd() *cobra.Command {
	socket := nri.DefaultSocket
	cmd := &cobra.Command{
		Use:   "nri-plugin",
		Short: "On each Kubernetes node: the containerd/CRI-O NRI plugin that makes a sandbox Pod's pids limit its containers' pids.max (deploy/kubernetes/nri.yaml)",
		Long: `nri-plugin connects to the container runtime's NRI socket and gives every
container of a Pod annotated sheepfold.dev/pids-max=N a pids cgroup limit
of N: one bound on all of a sandbox's tasks, whatever their uid. Run it on
every node sandboxes may start on (the DaemonSet of deploy/kubernetes/nri.yaml,
which needs NRI on in containerd: on by default since containerd 2.0). A
sandbox's agent refuses to start in a container without its limit, so a node
without the plugin fails its sandboxes' Pods. It connects again when the
runtime restarts, and stops on SIGTERM.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), unix.SIGTERM, unix.SIGINT)
			defer stop()
			log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("component", "nri-plugin")
			log.Info("starting", "socket", socket, "version", version)
			return nri.Run(ctx, socket, log)
		},
	}
	cmd.Flags().StringVar(&socket, "socket", socket, "the runtime's NRI socket")
	return cmd
}
