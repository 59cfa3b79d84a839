package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sheepfold/sheepfold/client"
)

// remote holds how the CLI reaches a running server.
type remote struct{ url, key string }

func (r *remote) client() (*client.Client, error) {
	if r.key == "" {
		return nil, fmt.Errorf("no API key: pass --api-key or set SHEEPFOLD_API_KEY (create one with `sheepfold keys create`)")
	}
	return client.New(r.url, r.key), nil
}

func (r *remote) flags(cmd *cobra.Command) {
	url := os.Getenv("SHEEPFOLD_URL")
	if url == "" {
		url = "http://127.0.0.1:8080"
	}
	cmd.PersistentFlags().StringVar(&r.url, "url", url, "server URL (env SHEEPFOLD_URL)")
	cmd.PersistentFlags().StringVar(&r.key, "api-key", os.Getenv("SHEEPFOLD_API_KEY"), "API key (env SHEEPFOLD_API_KEY)")
}

// sandboxCmd manages sandboxes on a running server.
func sandboxCmd() *cobra.Command {
	r := &remote{}
	cmd := &cobra.Command{Use: "sandbox", Short: "Create, list and kill sandboxes on a running server"}
	r.flags(cmd)
	var (
		tmpl    string
		timeout time.Duration
		res     client.Resources
	)
	create := &cobra.Command{
		Use: "create", Short: "Create a sandbox and print its id", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := r.client()
			if err != nil {
				return err
			}
			req := client.CreateSandboxRequest{Template: tmpl, Timeout: timeout}
			if res.CPUs != 0 || res.MemoryMB != 0 || res.DiskMB != 0 || res.Pids != 0 || res.GPU != 0 || len(res.Devices) > 0 {
				req.Resources = &res // the server grants them within the account's ceiling
			}
			sb, err := c.CreateSandbox(cmd.Context(), req)
			if err != nil {
				return err
			}
			fmt.Println(sb.ID)
			return nil
		},
	}
	create.Flags().StringVarP(&tmpl, "template", "t", "", "template (default: the server's)")
	create.Flags().DurationVar(&timeout, "timeout", 0, "lifetime (default: the server's)")
	create.Flags().Float64Var(&res.CPUs, "cpus", 0, "CPU quota in cores (default: the server's)")
	create.Flags().Int64Var(&res.MemoryMB, "memory-mb", 0, "memory limit, MiB (default: the server's)")
	create.Flags().Int64Var(&res.DiskMB, "disk-mb", 0, "size of the writable disk, MiB (default: the server's)")
	create.Flags().Int64Var(&res.Pids, "pids", 0, "most processes and threads (default: the server's)")
	create.Flags().IntVar(&res.GPU, "gpu", 0, "number of GPUs (devices of the server's --gpu-class) to give the sandbox")
	create.Flags().StringSliceVar(&res.Devices, "device", nil, "a device to give the sandbox, by its CDI name (e.g. nvidia.com/gpu=0); repeat for more")
	list := &cobra.Command{
		Use: "list", Short: "List your sandboxes", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := r.client()
			if err != nil {
				return err
			}
			sbs, err := c.ListSandboxes(cmd.Context(), false)
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tTEMPLATE\tSTATE\tEXPIRES")
			for _, s := range sbs {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", s.ID, s.Template, s.State, s.ExpiresAt.Format(time.DateTime))
			}
			return w.Flush()
		},
	}
	kill := &cobra.Command{
		Use: "kill ID...", Short: "Kill sandboxes", Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := r.client()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := c.Kill(cmd.Context(), id); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.AddCommand(create, list, kill)
	return cmd
}

// execCmd runs code in a context of a sandbox on a running server, streaming.
func execCmd() *cobra.Command {
	r := &remote{}
	var (
		lang, ctxID string
		timeout     time.Duration
	)
	cmd := &cobra.Command{
		Use:   "exec SANDBOX [FILE|-]",
		Short: "Run code in a sandbox on a running server (state persists between calls)",
		Long: `Run code in a stateful context of a sandbox on a running server, streaming its
output. Exit status: 0 on success, 1 when the code raised, 124 on timeout.

  id=$(sheepfold sandbox create)
  echo 'x = 41' | sheepfold exec $id
  echo 'x + 1' | sheepfold exec $id      # prints 42`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := r.client()
			if err != nil {
				return err
			}
			code, err := readProgram(args[1:])
			if err != nil {
				return err
			}
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			ex, err := c.ExecuteStream(ctx, args[0], client.ExecuteRequest{Code: code, Language: lang, ContextID: ctxID, Timeout: timeout},
				client.ExecuteHandlers{
					OnStdout: func(s string) { fmt.Fprint(os.Stdout, s) },
					OnStderr: func(s string) { fmt.Fprint(os.Stderr, s) },
					OnResult: func(res client.Result) {
						switch {
						case res.Text != "" && res.IsMainResult:
							fmt.Println(res.Text)
						case res.PNG != "":
							fmt.Fprintf(os.Stderr, "[image/png result, %d bytes base64]\n", len(res.PNG))
						}
					},
				})
			if err != nil {
				return err
			}
			if e := ex.Error; e != nil {
				if e.Traceback != "" {
					fmt.Fprint(os.Stderr, e.Traceback)
				} else {
					fmt.Fprintf(os.Stderr, "%s: %s\n", e.Name, e.Value)
				}
			}
			switch ex.Status {
			case "success":
				return nil
			case "timeout":
				return exitError{124}
			default:
				return exitError{1}
			}
		},
	}
	r.flags(cmd)
	cmd.Flags().StringVarP(&lang, "lang", "l", "python", "language: python, javascript, typescript, bash, r or java")
	cmd.Flags().StringVar(&ctxID, "context", "", "context id (default: the sandbox's default context for the language)")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "wall-clock limit (default: the sandbox's)")
	return cmd
}
