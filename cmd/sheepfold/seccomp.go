package main

import (
	"encoding/json"
	"os"

	"github.com/spf13/cobra"

	"github.com/sheepfold/sheepfold/internal/runtime/oci"
)

func seccompProfileCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "seccomp-profile",
		Short: "Print the sandboxes' seccomp profile as JSON (for Kubernetes nodes: /var/lib/kubelet/seccomp/sheepfold/agent.json)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := oci.SeccompProfile()
			if err != nil {
				return err
			}
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(p)
		},
	}
}
