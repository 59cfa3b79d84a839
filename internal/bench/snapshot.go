package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/client"
)

// Names of the snapshot step's series.
const (
	benchSnapshot     = "snapshot (pandas and matplotlib loaded)"
	benchFromSnapshot = "create from snapshot → first result (pandas and matplotlib loaded)"
	benchFork4        = "fork of 4 (pandas and matplotlib loaded)"
	benchFromPool     = "create from a pooled snapshot → first result (pandas and matplotlib loaded)"
)

// snapshotFork measures, for a sandbox whose Python has pandas and
// matplotlib imported, a snapshot (the sandbox runs on), a create from
// that snapshot to the first result of the new sandbox, and a fork into
// four. Each new sandbox is checked to hold the interpreter's state. A
// server that cannot snapshot answers ERR_NOT_SUPPORTED: the step says
// so and records nothing.
func (b *bencher) snapshotFork(ctx context.Context) error {
	sb, err := b.c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: 30 * time.Minute})
	if err != nil {
		return err
	}
	defer b.c.Kill(context.WithoutCancel(ctx), sb.ID)
	if ex, err := b.c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "import pandas as pd, matplotlib.pyplot as plt\nrounds = 41"}); err != nil || ex.Error != nil {
		return fmt.Errorf("import pandas: %v %+v", err, ex)
	}
	check := func(id string) error {
		ex, err := b.c.Execute(ctx, id, client.ExecuteRequest{Code: "len(pd.DataFrame({'a': [1]})) + rounds"})
		if err != nil || ex.Error != nil || len(ex.Results) != 1 || ex.Results[0].Text != "42" {
			return fmt.Errorf("a sandbox from the snapshot: %v %+v", err, ex)
		}
		return nil
	}
	n := max(3, min(b.o.Iterations, 10))
	var snaps, starts []float64
	for i := -benchPauseWarmups; i < n; i++ {
		name := fmt.Sprintf("bench-%d", time.Now().UnixNano())
		s, err := b.timedStep("snapshot", "snapshot: not supported by this server: ", func() error {
			_, err := b.c.CreateSnapshot(ctx, sb.ID, name)
			return err
		})
		if errors.Is(err, errNotSupported) {
			return nil
		} else if err != nil {
			return err
		}
		r, err := b.startFrom(ctx, name, check)
		_ = b.c.DeleteSnapshot(context.WithoutCancel(ctx), name)
		if err != nil {
			return err
		}
		if i >= 0 {
			snaps, starts = append(snaps, s), append(starts, r)
		}
	}
	b.record(benchSnapshot, snaps)
	b.record(benchFromSnapshot, starts)
	if err := b.fromPooledSnapshot(ctx, sb.ID, n, check); err != nil {
		return err
	}
	var forks []float64
	for i := -benchPauseWarmups; i < min(n, 5); i++ {
		t := time.Now()
		made, err := b.c.Fork(ctx, sb.ID, 4)
		f := since(t)
		for _, m := range made {
			if err == nil {
				err = check(m.ID)
			}
			_ = b.c.Kill(context.WithoutCancel(ctx), m.ID)
		}
		if err != nil {
			return fmt.Errorf("fork: %w", err)
		}
		if i >= 0 {
			forks = append(forks, f)
		}
	}
	b.record(benchFork4, forks)
	return nil
}

// fromPooledSnapshot measures a create from a snapshot whose pool
// (POST /v1/snapshots/{name}/pool) holds a member ready, to the first
// result of the new sandbox: each round waits for the pool to be full
// again first. A server that keeps no snapshot pools says so in a note.
func (b *bencher) fromPooledSnapshot(ctx context.Context, id string, n int, check func(string) error) error {
	name := fmt.Sprintf("bench-pool-%d", time.Now().UnixNano())
	if _, err := b.c.CreateSnapshot(ctx, id, name); err != nil {
		return err
	}
	defer b.c.DeleteSnapshot(context.WithoutCancel(ctx), name)
	if _, err := b.c.SetSnapshotPool(ctx, name, 1); err != nil {
		var ae *client.Error
		if errors.As(err, &ae) && (ae.Code == "ERR_NOT_SUPPORTED" || ae.Code == "ERR_SESSION_QUOTA_EXCEEDED") {
			fmt.Fprintf(os.Stderr, "bench: snapshot pool: %v\n", err)
			b.res.Notes = append(b.res.Notes, "snapshot pool: not available on this server (--max-snapshot-pool-per-account): "+ae.Message)
			return nil
		}
		return err
	}
	var starts []float64
	for i := -benchPauseWarmups; i < n; i++ {
		for {
			p, err := b.c.GetSnapshotPool(ctx, name)
			if err != nil {
				return err
			}
			if p.Ready >= 1 {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
		r, err := b.startFrom(ctx, name, check)
		if err != nil {
			return fmt.Errorf("from a pooled snapshot: %w", err)
		}
		if i >= 0 {
			starts = append(starts, r)
		}
	}
	b.record(benchFromPool, starts)
	return nil
}

// restorePhases adds to the breakdown where the restores of the server
// the bench started spent their time, from its log: the runtime logs
// each restore's phases ("restore phases": the whole `runc restore`,
// CRIU's own phases read from its log, what follows CRIU) and each
// clone's ("sandbox cloned": its files, its restore). Resumes and clones
// (starts from a snapshot, pool fills, forks) are told apart. A runtime
// that logs none adds nothing.
func restorePhases(serveLog string, res *benchResults) {
	// The order the breakdown prints them in (it sorts by name).
	phaseOrder := []string{"files", "restore", "runc", "runc_before", "criu_start", "criu_tasks", "criu_memory", "criu_finish", "after"}
	data, err := os.ReadFile(serveLog)
	if err != nil {
		return
	}
	series := map[string][]float64{}
	for _, line := range strings.Split(string(data), "\n") {
		var kind string
		var keys []string
		switch {
		case strings.Contains(line, `msg="restore phases"`):
			keys = []string{"runc", "runc_before", "criu_start", "criu_tasks", "criu_memory", "criu_finish", "after"}
		case strings.Contains(line, `msg="sandbox cloned"`):
			kind, keys = "clone", []string{"files", "restore"}
		default:
			continue
		}
		vals := map[string]string{}
		for _, f := range strings.Fields(line) {
			if k, v, ok := strings.Cut(f, "="); ok {
				vals[k] = v
			}
		}
		if kind == "" {
			kind = vals["what"]
		}
		for _, k := range keys {
			if d, err := time.ParseDuration(vals[k]); err == nil {
				name := fmt.Sprintf("restore phases, %s: %d %s", kind, slices.Index(phaseOrder, k)+1, k)
				series[name] = append(series[name], float64(d.Microseconds())/1000)
			}
		}
	}
	for name, ms := range series {
		res.Breakdown[name] = summarize(ms)
	}
}

// startFrom creates a sandbox from the snapshot name, checks it and kills
// it, and returns the time from the create to its checked first result.
func (b *bencher) startFrom(ctx context.Context, name string, check func(string) error) (float64, error) {
	t := time.Now()
	from, err := b.c.CreateSandbox(ctx, client.CreateSandboxRequest{Snapshot: name})
	if err == nil {
		err = check(from.ID)
	}
	r := since(t)
	if from != nil {
		_ = b.c.Kill(context.WithoutCancel(ctx), from.ID)
	}
	return r, err
}
