package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/llm"
)

// DefaultConfigFile is read by `sheepfold serve` when --config is not
// given and SHEEPFOLD_CONFIG is not set, if it exists.
const DefaultConfigFile = "/etc/sheepfold/config.toml"

// A serve setting comes from, in rising order of precedence: its default,
// the config file, the environment, the command line.
const (
	sourceDefault = "default"
	sourceFile    = "file"
	sourceEnv     = "env"
	sourceFlag    = "flag"
)

// setting is one flag's effective value and where it came from.
type setting struct {
	Name, Value, Source string
}

// envName is the environment variable of a flag: SHEEPFOLD_ and the
// flag's name in capitals with '_' for '-' (--max-sandboxes:
// SHEEPFOLD_MAX_SANDBOXES).
func envName(flag string) string {
	return "SHEEPFOLD_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// applyConfig fills every flag of fl not given on the command line from
// the environment, then from the config file at path ("" reads
// DefaultConfigFile if it exists), and returns each flag's effective value
// and source. The file's keys are the flags' names (`max-sandboxes = 10`;
// '_' may stand for '-'); a key that names no flag, or a value the flag
// refuses, is an error naming it.
func applyConfig(fl *pflag.FlagSet, path string, getenv func(string) string) ([]setting, error) {
	file, path, err := readConfig(path)
	if err != nil {
		return nil, err
	}
	for key := range file {
		if fl.Lookup(key) == nil || key == "config" {
			return nil, fmt.Errorf("config file %s: unknown key %q", path, key)
		}
	}
	var out []setting
	var errs []error
	fl.VisitAll(func(f *pflag.Flag) {
		if f.Name == "config" || f.Name == "help" {
			return
		}
		s := setting{Name: f.Name, Source: sourceDefault}
		switch v, inFile := file[f.Name]; {
		case f.Changed:
			s.Source = sourceFlag
		case getenv(envName(f.Name)) != "":
			s.Source = sourceEnv
			if err := fl.Set(f.Name, getenv(envName(f.Name))); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", envName(f.Name), err))
			}
		case inFile:
			s.Source = sourceFile
			if err := fl.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("config file %s: %s: %w", path, f.Name, err))
			}
		}
		s.Value = f.Value.String()
		out = append(out, s)
	})
	return out, errors.Join(errs...)
}

// readConfig reads a TOML config file into flag name → value as text. A
// missing default file is no file; a missing named one is an error.
func readConfig(path string) (map[string]string, string, error) {
	named := path != ""
	if !named {
		path = DefaultConfigFile
	}
	raw := map[string]any{}
	if _, err := toml.DecodeFile(path, &raw); err != nil {
		if !named && errors.Is(err, fs.ErrNotExist) {
			return nil, path, nil
		}
		return nil, path, fmt.Errorf("config file %s: %w", path, err)
	}
	out := make(map[string]string, len(raw))
	for k, v := range raw {
		if k == providersKey {
			continue // tables of their own (readProviders)
		}
		key := strings.ReplaceAll(k, "_", "-")
		if _, dup := out[key]; dup {
			return nil, path, fmt.Errorf("config file %s: %q is given twice", path, key)
		}
		text, err := configText(v)
		if err != nil {
			return nil, path, fmt.Errorf("config file %s: %s: %w", path, k, err)
		}
		out[key] = text
	}
	return out, path, nil
}

// providersKey is the config file's array of model provider tables
// ([[providers]]), the one key that is not a flag.
const providersKey = "providers"

// readProviders reads the model providers of the config file at path (""
// reads DefaultConfigFile if it exists), checked by llm.Validate; an
// unknown key of a provider is an error naming it.
func readProviders(path string) ([]llm.Provider, error) {
	if path == "" {
		path = DefaultConfigFile
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
	}
	var file struct {
		Providers []llm.Provider `toml:"providers"`
	}
	md, err := toml.DecodeFile(path, &file)
	if err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	for _, k := range md.Undecoded() {
		if len(k) > 0 && k[0] == providersKey {
			return nil, fmt.Errorf("config file %s: unknown key %q", path, k.String())
		}
	}
	if err := llm.Validate(file.Providers); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	return file.Providers, nil
}

// configText turns a TOML value into the text its flag parses: lists are
// joined with commas; tables are not settings.
func configText(v any) (string, error) {
	switch v := v.(type) {
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			t, err := configText(e)
			if err != nil {
				return "", err
			}
			parts[i] = t
		}
		return strings.Join(parts, ","), nil
	case map[string]any:
		return "", errors.New("a table is not a setting (keys are serve's flag names)")
	default:
		return fmt.Sprint(v), nil
	}
}

// configuredFreeCredits returns the free credits a new account gets
// under the server's configuration (serve's --free-credits from the
// environment or the config file), for accounts the CLI creates.
func configuredFreeCredits(cfg *config.Config) (int64, error) {
	s := serveCmd(cfg)
	if _, err := applyConfig(s.Flags(), os.Getenv("SHEEPFOLD_CONFIG"), os.Getenv); err != nil {
		return 0, err
	}
	v := s.Flags().Lookup("free-credits").Value.String()
	if v == "" {
		return 0, nil
	}
	micros, err := account.ParseAmount(v)
	if err != nil || micros < 0 {
		return 0, fmt.Errorf("free-credits %.40q must not be negative: %s", v, account.AmountRange)
	}
	return micros, nil
}

// printSettings writes settings as a TOML file with each value's source.
func printSettings(w io.Writer, settings []setting) {
	sort.Slice(settings, func(i, j int) bool { return settings[i].Name < settings[j].Name })
	for _, s := range settings {
		fmt.Fprintf(w, "%s = %q  # %s\n", s.Name, s.Value, s.Source)
	}
}

// configCmd is `sheepfold config print`: serve's effective settings.
func configCmd(serve func() *cobra.Command) *cobra.Command {
	cmd := &cobra.Command{Use: "config", Short: "Show the server's configuration"}
	var path string
	print := &cobra.Command{
		Use:   "print [-- SERVE FLAGS]",
		Short: "Print the settings `sheepfold serve` would run with, and where each comes from",
		Long: `Print every setting of ` + "`sheepfold serve`" + ` as TOML, each with its source: the
command line (flags after --), the environment (SHEEPFOLD_<FLAG>), the config file
(--config, SHEEPFOLD_CONFIG, else ` + DefaultConfigFile + ` if it exists) or the default.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			s := serve()
			s.Flags().AddFlagSet(cmd.Root().PersistentFlags())
			if err := s.ParseFlags(args); err != nil {
				return err
			}
			if path == "" {
				path = os.Getenv("SHEEPFOLD_CONFIG")
			}
			settings, err := applyConfig(s.Flags(), path, os.Getenv)
			if err != nil {
				return err
			}
			printSettings(cmd.OutOrStdout(), settings)
			return nil
		},
	}
	print.Flags().StringVar(&path, "config", "", "config file (default: $SHEEPFOLD_CONFIG, else "+DefaultConfigFile+" if it exists)")
	cmd.AddCommand(print)
	return cmd
}
