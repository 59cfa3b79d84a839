package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/bound"
	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/store"
)

// limitFlags are the flags named after the account limits.
type limitFlags struct {
	ints   map[string]*int64 // flag name → value
	cpus   float64
	prefix string
}

// intLimits pairs each integer limit's flag with its JSON name.
var intLimits = []struct{ flag, usage string }{
	{"max-sandboxes", "sandboxes running at once"},
	{"requests-per-minute", "API requests per minute (token bucket)"},
	{"executions-per-minute", "executions and commands per minute"},
	{"monthly-sandbox-seconds", "wall seconds of sandboxes per month"},
	{"monthly-cpu-seconds", "CPU-seconds per month"},
	{"monthly-gb-seconds", "GB-seconds of memory reserved per month"},
	{"monthly-executions", "executions per month"},
	{"max-memory-mb", "memory one sandbox may ask for, MiB"},
	{"max-disk-mb", "disk one sandbox may ask for, MiB"},
	{"max-timeout", "lifetime one sandbox may ask for, seconds"},
	{"max-devices", "devices (GPUs, CDI devices) its live sandboxes hold at once"},
}

func addLimitFlags(fs *pflag.FlagSet, prefix, what string) *limitFlags {
	lf := &limitFlags{ints: map[string]*int64{}, prefix: prefix}
	for _, l := range intLimits {
		lf.ints[l.flag] = fs.Int64(prefix+l.flag, 0, what+l.usage+" (0: unlimited)")
	}
	fs.Float64Var(&lf.cpus, prefix+"max-cpus", 0, what+"CPUs one sandbox may ask for (0: unlimited)")
	return lf
}

// overrides returns the limits whose flags were given, refusing values
// out of their range (account.Overrides.Validate) with the flag's name.
func (lf *limitFlags) overrides(fs *pflag.FlagSet) (account.Overrides, error) {
	m := map[string]any{}
	for _, l := range intLimits {
		name := lf.prefix + l.flag
		if !fs.Changed(name) {
			continue
		}
		v := *lf.ints[l.flag]
		if v < 0 {
			return account.Overrides{}, fmt.Errorf("--%s must not be negative (0 means unlimited)", name)
		}
		m[strings.ReplaceAll(l.flag, "-", "_")] = v
	}
	if fs.Changed(lf.prefix + "max-cpus") {
		if lf.cpus < 0 {
			return account.Overrides{}, fmt.Errorf("--%smax-cpus must not be negative (0 means unlimited)", lf.prefix)
		}
		if err := checkFlags(bound.Float("--"+lf.prefix+"max-cpus", lf.cpus, 0, bound.MaxCPUs)); err != nil {
			return account.Overrides{}, err // NaN and Inf too, which JSON cannot carry
		}
		m["max_cpus"] = lf.cpus
	}
	b, err := json.Marshal(m)
	if err != nil {
		return account.Overrides{}, err
	}
	o, err := account.ParseOverrides(b)
	if err != nil {
		return o, err
	}
	if err := o.Validate(); err != nil {
		// The limit's JSON name as the flag's.
		e := apierr.From(err)
		if f, ok := e.Details["field"].(string); ok {
			return o, fmt.Errorf("--%s%s%s", lf.prefix, strings.ReplaceAll(f, "_", "-"), strings.TrimPrefix(e.Message, f))
		}
		return o, err
	}
	return o, nil
}

func accountsCmd(cfg *config.Config) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "accounts",
		Short: "Create, list, show, limit and credit accounts (works on the database; a running server picks changes up within 10 s)",
	}
	withStore := func(f func(ctx context.Context, st store.Store, out io.Writer, args []string) error) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			st, err := openStore(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			defer st.Close()
			return f(cmd.Context(), st, cmd.OutOrStdout(), args)
		}
	}
	var freeCredits string
	create := &cobra.Command{Use: "create NAME", Short: "Create an account", Args: cobra.ExactArgs(1)}
	createLimits := addLimitFlags(create.Flags(), "", "")
	create.Flags().StringVar(&freeCredits, "credits", "", "credits it starts with, e.g. 10.00 (default: the server's free-credits setting, from SHEEPFOLD_FREE_CREDITS or the config file)")
	create.RunE = withStore(func(ctx context.Context, st store.Store, out io.Writer, args []string) error {
		over, err := createLimits.overrides(create.Flags())
		if err != nil {
			return err
		}
		micros, err := configuredFreeCredits(cfg)
		if err != nil {
			return err
		}
		if freeCredits != "" {
			if micros, err = account.ParseAmount(freeCredits); err != nil || micros < 0 {
				return fmt.Errorf("--credits must not be negative: %s", account.AmountRange)
			}
		}
		return createAccount(ctx, st, out, args[0], over, micros)
	})
	list := &cobra.Command{Use: "list", Short: "List accounts", Args: cobra.NoArgs,
		RunE: withStore(func(ctx context.Context, st store.Store, out io.Writer, _ []string) error {
			return listAccounts(ctx, st, out)
		})}
	show := &cobra.Command{Use: "show NAME", Short: "Show an account: limits, keys, this month's usage, credits", Args: cobra.ExactArgs(1),
		RunE: withStore(func(ctx context.Context, st store.Store, out io.Writer, args []string) error {
			return showAccount(ctx, st, out, args[0])
		})}
	setLimits := &cobra.Command{Use: "set-limits NAME", Short: "Override limits of an account (flags not given stay as they are)", Args: cobra.ExactArgs(1)}
	lf := addLimitFlags(setLimits.Flags(), "", "")
	var reset []string
	setLimits.Flags().StringSliceVar(&reset, "reset", nil, "limits to set back to the server's default, e.g. --reset max-sandboxes,max-cpus")
	setLimits.RunE = withStore(func(ctx context.Context, st store.Store, out io.Writer, args []string) error {
		over, err := lf.overrides(setLimits.Flags())
		if err != nil {
			return err
		}
		return setAccountLimits(ctx, st, out, args[0], over, reset)
	})
	var lock bool
	setRuntime := &cobra.Command{Use: "set-runtime NAME RUNTIME", Args: cobra.ExactArgs(2),
		Short: `Set the runtime of an account's sandboxes whose request and template name none (runc, gvisor; "" the server's default); --lock makes it their only one`}
	setRuntime.Flags().BoolVar(&lock, "lock", false, "the account's sandboxes run under RUNTIME alone: a create whose request or template names another is refused (403 ERR_FORBIDDEN)")
	setRuntime.RunE = withStore(func(ctx context.Context, st store.Store, out io.Writer, args []string) error {
		return setAccountRuntime(ctx, st, out, args[0], args[1], lock)
	})
	var reason string
	credit := &cobra.Command{Use: "credit NAME AMOUNT", Short: "Grant credits (a negative amount takes them back); every grant is a ledger row", Args: cobra.ExactArgs(2)}
	credit.Flags().StringVar(&reason, "reason", "", "why, kept in the ledger")
	credit.RunE = withStore(func(ctx context.Context, st store.Store, out io.Writer, args []string) error {
		return creditAccount(ctx, st, out, args[0], args[1], reason)
	})
	cmd.AddCommand(create, list, show, setLimits, setRuntime, credit)
	return cmd
}

// findAccount resolves an account by id, then by name (account.Find).
func findAccount(ctx context.Context, st store.Store, ref string) (store.Account, error) {
	a, err := account.Find(ctx, st, ref)
	if errors.Is(err, store.ErrNotFound) {
		return a, fmt.Errorf("no account %q (see `sheepfold accounts list`)", ref)
	}
	return a, err
}

func createAccount(ctx context.Context, st store.Store, out io.Writer, name string, over account.Overrides, freeMicros int64) error {
	a, err := account.Create(ctx, st, name, over, freeMicros)
	if errors.Is(err, store.ErrExists) {
		return fmt.Errorf("an account named %q exists already", name)
	}
	if e := apierr.From(err); err != nil && e.Code == apierr.BadRequest {
		return fmt.Errorf("NAME %q: %s", name, strings.TrimPrefix(e.Message, "name "))
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "id:     %s\nname:   %s\n\nCreate a key for it with: sheepfold keys create --account %s\n", a.ID, a.Name, a.Name)
	return nil
}

func listAccounts(ctx context.Context, st store.Store, out io.Writer) error {
	accts, err := st.ListAccounts(ctx)
	if err != nil {
		return err
	}
	bal, err := st.Balances(ctx)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tCREATED\tBALANCE\tLIMITS")
	for _, a := range accts {
		lim := string(a.Limits)
		if lim == "{}" || lim == "" {
			lim = "defaults"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", a.Name, a.ID, a.CreatedAt.UTC().Format(time.RFC3339), account.FormatMicros(bal[a.ID]), lim)
	}
	return tw.Flush()
}

func showAccount(ctx context.Context, st store.Store, out io.Writer, ref string) error {
	a, err := findAccount(ctx, st, ref)
	if err != nil {
		return err
	}
	over, err := account.ParseOverrides(a.Limits)
	if err != nil {
		return err
	}
	ct, err := st.CreditTotals(ctx, a.ID)
	if err != nil {
		return err
	}
	now := time.Now()
	rows, err := st.QueryUsage(ctx, store.UsageFilter{Account: a.ID, From: account.MonthStart(now), GroupBy: store.GroupNone})
	if err != nil {
		return err
	}
	var u store.UsageDelta
	for _, r := range rows {
		u = r.UsageDelta
	}
	keys, err := st.ListKeys(ctx)
	if err != nil {
		return err
	}
	lim, _ := json.Marshal(over)
	fmt.Fprintf(out, "id:       %s\nname:     %s\ncreated:  %s\nlimits:   %s (the rest: the server's defaults)\n", a.ID, a.Name,
		a.CreatedAt.UTC().Format(time.RFC3339), lim)
	fmt.Fprintf(out, "runtime:  %s\n", describeRuntime(a.Runtime, a.RuntimeLocked))
	fmt.Fprintf(out, "credits:  balance %s (free %s, granted %s, spent %s)\n", account.FormatMicros(ct.Balance()),
		account.FormatMicros(ct.FreeMicros), account.FormatMicros(ct.GrantedMicros), account.FormatMicros(ct.SpentMicros))
	fmt.Fprintf(out, "month:    %.1f sandbox-seconds, %.3f CPU-seconds, %.3f GB-seconds reserved, %d executions (resets %s)\n",
		float64(u.WallNanos)/1e9, float64(u.CPUNanos)/1e9, u.GBSecondsReserved, u.Executions, account.NextMonth(now).Format(time.RFC3339))
	fmt.Fprintln(out, "keys:")
	for _, k := range keys {
		if k.Owner != a.ID {
			continue
		}
		state := "active"
		if k.RevokedAt != nil {
			state = "revoked"
		}
		fmt.Fprintf(out, "  %s  %-5s  %-7s  %s\n", k.ID, k.Role, state, k.Name)
	}
	return nil
}

func setAccountLimits(ctx context.Context, st store.Store, out io.Writer, ref string, set account.Overrides, reset []string) error {
	a, err := findAccount(ctx, st, ref)
	if err != nil {
		return err
	}
	cur, err := account.ParseOverrides(a.Limits)
	if err != nil {
		return err
	}
	merged := cur.Merge(set)
	for _, r := range reset {
		name := strings.ReplaceAll(strings.TrimPrefix(r, "--"), "-", "_")
		if !merged.Known(name) {
			return fmt.Errorf("--reset: no limit named %q", r)
		}
		merged.Clear(name)
	}
	b, err := json.Marshal(merged)
	if err != nil {
		return err
	}
	if err := st.SetAccountLimits(ctx, a.ID, b); err != nil {
		return err
	}
	fmt.Fprintf(out, "limits of %s: %s\n", a.Name, b)
	return nil
}

// runtimeName is a runtime's name: runc, gvisor, or on Kubernetes a name
// of --kubernetes-runtime-classes. Whether the server offers it is
// checked when a sandbox asks (the CLI works on the database alone).
var runtimeName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$`)

func setAccountRuntime(ctx context.Context, st store.Store, out io.Writer, ref, rt string, lock bool) error {
	switch {
	case rt == "" && lock:
		return errors.New("--lock needs a runtime: name the one the account's sandboxes must run under")
	case rt != "" && !runtimeName.MatchString(rt):
		return fmt.Errorf("runtime %q: lowercase letters, digits and '-', e.g. runc or gvisor", rt)
	}
	a, err := findAccount(ctx, st, ref)
	if err != nil {
		return err
	}
	if err := st.SetAccountRuntime(ctx, a.ID, rt, lock); err != nil {
		return err
	}
	fmt.Fprintf(out, "runtime of %s: %s\n", a.Name, describeRuntime(rt, lock))
	return nil
}

// describeRuntime says an account's runtime as show prints it.
func describeRuntime(rt string, locked bool) string {
	switch {
	case rt == "":
		return "the server's default"
	case locked:
		return rt + " (locked: its sandboxes run under it alone)"
	}
	return rt + " (the default of its sandboxes; a request or template may name another)"
}

func creditAccount(ctx context.Context, st store.Store, out io.Writer, ref, amount, reason string) error {
	a, err := findAccount(ctx, st, ref)
	if err != nil {
		return err
	}
	micros, err := account.ParseAmount(amount)
	if err != nil || micros == 0 {
		return fmt.Errorf("AMOUNT must be non-zero: %s", account.AmountRange)
	}
	before, err := st.CreditTotals(ctx, a.ID)
	if err != nil {
		return err
	}
	if err := checkFlags(account.CheckGrant("AMOUNT", before.Balance(), micros)); err != nil {
		return err
	}
	if err := st.AddLedger(ctx, store.LedgerEntry{Account: a.ID, CreatedAt: time.Now(), Kind: store.LedgerGrant,
		AmountMicros: micros, Reason: reason}); err != nil {
		return err
	}
	ct, err := st.CreditTotals(ctx, a.ID)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "granted %s to %s; balance %s\n", account.FormatMicros(micros), a.Name, account.FormatMicros(ct.Balance()))
	return nil
}
