// Command sheepfold runs untrusted code in isolated sandboxes: one-off
// (`sheepfold run`), as a server (`sheepfold serve`), and manages the
// templates sandboxes start from.
package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/sheepfold/sheepfold/internal/config"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// exitError carries a process exit status out of a command.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func main() {
	cfg := config.FromEnv()
	var verbose bool
	root := &cobra.Command{
		Use:           "sheepfold",
		Short:         "Run untrusted code in isolated Linux sandboxes",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	root.PersistentFlags().StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "data directory (default /var/lib/sheepfold; env SHEEPFOLD_DATA_DIR)")
	root.PersistentFlags().StringVar(&cfg.Database, "database", cfg.Database, "the server's database: a postgres:// URL (servers may share it) or a SQLite file (default DATA_DIR/sheepfold.db; env SHEEPFOLD_DATABASE)")
	root.PersistentFlags().BoolVarP(&verbose, "verbose", "v", false, "log debug messages")
	logger := func() *slog.Logger {
		level := slog.LevelWarn
		if verbose {
			level = slog.LevelDebug
		}
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	}
	root.AddCommand(runCmd(&cfg, logger), templateCmd(&cfg), serveCmd(&cfg), keysCmd(&cfg), accountsCmd(&cfg), usageCmd(), sandboxCmd(), batchCmd(), execCmd(), mcpCmd(), benchCmd(&cfg), doctorCmd(&cfg), seccompProfileCmd(), nriPluginCmd(), databaseCmd(&cfg),
		configCmd(func() *cobra.Command { return serveCmd(&cfg) }))
	if err := root.Execute(); err != nil {
		var ee exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		fmt.Fprintln(os.Stderr, "sheepfold:", err)
		os.Exit(1)
	}
}
