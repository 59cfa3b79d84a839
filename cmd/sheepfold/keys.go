package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/store/postgres"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
)

// dbPath is where the server's SQLite database lives unless --database
// says otherwise.
func dbPath(cfg config.Config) string {
	if cfg.Database != "" && !postgres.IsURL(cfg.Database) {
		return cfg.Database
	}
	return filepath.Join(cfg.DataDir, "sheepfold.db")
}

// openStore opens the server's database: PostgreSQL for a postgres:// URL,
// else SQLite (creating the data directory).
func openStore(ctx context.Context, cfg *config.Config) (store.Store, error) {
	if postgres.IsURL(cfg.Database) {
		return postgres.Open(ctx, cfg.Database)
	}
	if err := cfg.ResolveDataDir(); err != nil {
		return nil, err
	}
	// 0711, as setup makes it: each sandbox's own host user must pass
	// through to its rootfs, and nobody may list what is here (the
	// database itself is 0600).
	if err := os.MkdirAll(cfg.DataDir, 0o711); err != nil {
		return nil, fmt.Errorf("create data directory: %w", err)
	}
	return sqlite.Open(ctx, dbPath(*cfg))
}

func keysCmd(cfg *config.Config) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Create, list and revoke API keys (works on the database; the server need not run)",
	}
	var name, owner, acct string
	var e2b, admin bool
	create := &cobra.Command{
		Use:   "create",
		Short: "Create an API key and print it (it is shown only once)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := openStore(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			defer st.Close()
			free, err := configuredFreeCredits(cfg)
			if err != nil {
				return err
			}
			opt := auth.CreateOptions{Name: name, Owner: owner, E2B: e2b, Admin: admin, FreeMicros: free}
			if acct != "" {
				if owner != "" {
					return errors.New("give --account or --owner, not both")
				}
				a, err := findAccount(cmd.Context(), st, acct)
				if err != nil {
					return err
				}
				opt.Owner = a.ID
			}
			return createKey(cmd.Context(), st, cmd.OutOrStdout(), opt)
		},
	}
	create.Flags().StringVar(&name, "name", "", "a label for the key")
	create.Flags().StringVar(&acct, "account", "", "the account (name or id) the key acts for (default: a new account of its own)")
	create.Flags().BoolVar(&admin, "admin", false, "an admin key: may also manage accounts through /v1/admin")
	create.Flags().StringVar(&owner, "owner", "", "the account id the key acts for, made if missing (older spelling of --account)")
	create.Flags().BoolVar(&e2b, "e2b", false, "make an E2B-shaped key (e2b_...) for E2B SDKs")
	list := &cobra.Command{
		Use:   "list",
		Short: "List API keys (never their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := openStore(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			defer st.Close()
			return listKeys(cmd.Context(), st, cmd.OutOrStdout())
		},
	}
	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke an API key; requests with it fail from now on",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := openStore(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			defer st.Close()
			return revokeKey(cmd.Context(), st, cmd.OutOrStdout(), args[0])
		},
	}
	cmd.AddCommand(create, list, revoke)
	return cmd
}

func createKey(ctx context.Context, st store.Store, out io.Writer, opt auth.CreateOptions) error {
	k, secret, err := auth.Create(ctx, st, opt)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "id:     %s\nname:   %s\nowner:  %s\nrole:   %s\nkey:    %s\n\nKeep the key now: it is stored only as a hash and cannot be shown again.\n",
		k.ID, k.Name, k.Owner, k.Role, secret)
	return nil
}

func listKeys(ctx context.Context, st store.Store, out io.Writer) error {
	keys, err := st.ListKeys(ctx)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tOWNER\tROLE\tCREATED\tREVOKED")
	for _, k := range keys {
		revoked := "-"
		if k.RevokedAt != nil {
			revoked = k.RevokedAt.UTC().Format(time.RFC3339)
		}
		name := k.Name
		if name == "" {
			name = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, name, k.Owner, k.Role, k.CreatedAt.UTC().Format(time.RFC3339), revoked)
	}
	return tw.Flush()
}

func revokeKey(ctx context.Context, st store.Store, out io.Writer, id string) error {
	err := st.RevokeKey(ctx, id, time.Now())
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("no key %q (see `sheepfold keys list`)", id)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "revoked %s\n", id)
	return nil
}
