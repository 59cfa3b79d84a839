package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/store/postgres"
	"github.com/sheepfold/sheepfold/internal/store/transfer"
)

// databaseCmd is `sheepfold database`: moving the server's records.
func databaseCmd(cfg *config.Config) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "database",
		Short: "Move the server's records between databases",
	}
	var from, to string
	cp := &cobra.Command{
		Use:   "copy",
		Short: "Copy a stopped server's SQLite database into a new PostgreSQL database",
		Long: `Copy every record of a one-host server's SQLite database (keys, accounts,
sandboxes, executions, events, webhooks and their deliveries, usage, credits,
alerts, model tokens and sessions, admission counts) into an empty PostgreSQL
database, so that servers sharing it (replicas on Kubernetes) take over.

Stop the server first: the copy refuses a SQLite database another sheepfold
process has open, and keeps servers from opening it until it is done. The
target is migrated to this version's schema, must hold no records, and is
written in one transaction: all or nothing. Both databases must be at this
binary's schema version. Ids are kept (event ids, the SSE cursor, keep
growing); times keep microseconds, as PostgreSQL does.`,
		Example: `  sheepfold database copy --to postgres://sheepfold@db/sheepfold
  sheepfold database copy --from /srv/sheepfold.db --to postgres://sheepfold@db/sheepfold`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			src, dst, err := copyEnds(cfg, from, to)
			if err != nil {
				return err
			}
			return copyDatabase(cmd.Context(), cmd.OutOrStdout(), src, dst)
		},
	}
	cp.Flags().StringVar(&from, "from", "", "the SQLite database to copy (default: --database when it is a file, else DATA_DIR/sheepfold.db)")
	cp.Flags().StringVar(&to, "to", "", "the PostgreSQL database to copy into, a postgres:// URL (default: --database when it is one)")
	cmd.AddCommand(cp)
	return cmd
}

// copyEnds resolves the copy's source and target from its flags and the
// global --database.
func copyEnds(cfg *config.Config, from, to string) (src, dst string, err error) {
	if to == "" && postgres.IsURL(cfg.Database) {
		to = cfg.Database
	}
	if to == "" {
		return "", "", errors.New("give the target database: --to postgres://USER@HOST/DB")
	}
	if !postgres.IsURL(to) {
		return "", "", errors.New("--to must be a postgres:// or postgresql:// URL")
	}
	if from == "" {
		if err := cfg.ResolveDataDir(); err != nil {
			return "", "", err
		}
		from = dbPath(*cfg)
	}
	if postgres.IsURL(from) {
		return "", "", errors.New("--from must be a SQLite database file")
	}
	return from, to, nil
}

func copyDatabase(ctx context.Context, out io.Writer, src, dst string) error {
	tables, err := transfer.Copy(ctx, src, dst)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TABLE\tROWS")
	var total int64
	for _, t := range tables {
		fmt.Fprintf(tw, "%s\t%d\n", t.Name, t.Rows)
		total += t.Rows
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "\ncopied %d rows of %s into PostgreSQL; serve with --database set to its URL\n", total, src)
	return nil
}
