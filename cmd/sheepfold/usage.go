package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sheepfold/sheepfold/client"
)

// usageCmd prints the caller's account's usage from a running server.
func usageCmd() *cobra.Command {
	r := &remote{}
	var (
		from, to, groupBy string
		asJSON            bool
	)
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Print your account's metered usage and its estimated cost (from a running server)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := r.client()
			if err != nil {
				return err
			}
			q := client.UsageQuery{GroupBy: groupBy}
			for _, p := range []struct {
				flag, v string
				dst     *time.Time
			}{{"--from", from, &q.From}, {"--to", to, &q.To}} {
				if p.v == "" {
					continue
				}
				t, err := time.Parse(time.RFC3339, p.v)
				if err != nil {
					if t, err = time.Parse(time.DateOnly, p.v); err != nil {
						return fmt.Errorf("%s must be a date (YYYY-MM-DD) or an RFC 3339 time", p.flag)
					}
				}
				*p.dst = t
			}
			rep, err := c.Usage(cmd.Context(), q)
			if err != nil {
				return err
			}
			return printUsage(cmd.OutOrStdout(), rep, asJSON)
		},
	}
	r.flags(cmd)
	cmd.Flags().StringVar(&from, "from", "", "start (date or RFC 3339; default: the start of this month)")
	cmd.Flags().StringVar(&to, "to", "", "end (default: now)")
	cmd.Flags().StringVar(&groupBy, "group-by", "day", "day, hour, sandbox or template")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}

func printUsage(w io.Writer, rep *client.UsageReport, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	fmt.Fprintf(w, "usage %s – %s by %s\n\n", rep.From.Format(time.RFC3339), rep.To.Format(time.RFC3339), rep.GroupBy)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "GROUP\tSANDBOX-S\tCPU-S\tGB-S RESERVED\tGB-S USED\tEXECUTIONS\tCOMMANDS\tEGRESS\tSTORAGE GB-S\tCOST\t")
	row := func(key string, f client.UsageFigures) {
		fmt.Fprintf(tw, "%s\t%.1f\t%.3f\t%.3f\t%.3f\t%d\t%d\t%d\t%.6f\t%s\t\n", key, f.SandboxSeconds, f.CPUSeconds,
			f.GBSecondsReserved, f.GBSecondsUsed, f.Executions, f.Commands, f.EgressRequests, f.StorageGBSeconds, f.Cost)
	}
	for _, g := range rep.Groups {
		row(g.Key, g.UsageFigures)
	}
	row("total", rep.Total)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nstorage (records kept in the database): %.6f GB-seconds, %s (in the total)\n", rep.Storage.GBSeconds, rep.Storage.Cost)
	fmt.Fprintf(w, "prices (micro-units): %g per CPU-second, %g per GB-second reserved, %g per execution, %g per GB-second stored\n",
		rep.Prices.CPUSecondMicros, rep.Prices.GBSecondMicros, rep.Prices.ExecutionMicros, rep.Prices.StorageGBSecond)
	return nil
}
