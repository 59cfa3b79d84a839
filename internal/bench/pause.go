package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/sheepfold/sheepfold/client"
)

// Names of the pause step's series.
const (
	benchPause        = "pause to disk (pandas and matplotlib loaded)"
	benchResume       = "resume → first 1+1 (pandas and matplotlib loaded)"
	benchFreeze       = "pause, memory kept (freezer)"
	benchThawFirst    = "resume from the freezer → first 1+1"
	benchPauseWarmups = 1
)

// pauseResume measures, for a sandbox whose Python has pandas and
// matplotlib imported (the data-science interpreter of issue 31), a
// pause to disk (CRIU: processes and memory written out, memory freed),
// the resume to the first result after it, and the same for the
// freezer's pause (memory kept). Each round checks the interpreter's
// state survived. A server whose runtime cannot checkpoint answers
// ERR_NOT_SUPPORTED: the step says so and records nothing.
func (b *bencher) pauseResume(ctx context.Context) error {
	sb, err := b.c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: 30 * time.Minute})
	if err != nil {
		return err
	}
	defer b.c.Kill(context.WithoutCancel(ctx), sb.ID)
	if ex, err := b.c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "import pandas as pd, matplotlib.pyplot as plt\nrounds = 0"}); err != nil || ex.Error != nil {
		return fmt.Errorf("import pandas: %v %+v", err, ex)
	}
	n := max(3, min(b.o.Iterations, 10))
	for _, mode := range []struct {
		pause, resume string
		do            func(context.Context, string) (*client.Sandbox, error)
	}{{benchPause, benchResume, b.c.PauseSandbox}, {benchFreeze, benchThawFirst, b.c.FreezeSandbox}} {
		var paused, resumed []float64
		for i := -benchPauseWarmups; i < n; i++ {
			p, err := b.timedStep("pause", "pause: not supported by this server's runtime: ", func() error {
				_, err := mode.do(ctx, sb.ID)
				return err
			})
			if errors.Is(err, errNotSupported) {
				return nil
			} else if err != nil {
				return err
			}
			// The execution resumes the sandbox: what a caller waits
			// for after a pause is its first result.
			t := time.Now()
			ex, err := b.c.Execute(ctx, sb.ID, client.ExecuteRequest{Code: "rounds += 1\nlen(pd.DataFrame({'a': [1, 2]})) + rounds"})
			r := since(t)
			if err != nil || ex.Error != nil || len(ex.Results) != 1 {
				return fmt.Errorf("after the pause: %v %+v", err, ex)
			}
			if i >= 0 {
				paused, resumed = append(paused, p), append(resumed, r)
			}
		}
		b.record(mode.pause, paused)
		b.record(mode.resume, resumed)
	}
	return nil
}

// errNotSupported is timedStep's answer for a step the server cannot do.
var errNotSupported = errors.New("not supported by the server")

// timedStep runs step and returns how long it took, in milliseconds. A
// step the server cannot do (ERR_NOT_SUPPORTED) is said on stderr as
// what's, noted (note, then the server's message) in the results, and
// answers errNotSupported: the caller records nothing of its series.
func (b *bencher) timedStep(what, note string, step func() error) (float64, error) {
	t := time.Now()
	if err := step(); err != nil {
		var ae *client.Error
		if errors.As(err, &ae) && ae.Code == "ERR_NOT_SUPPORTED" {
			fmt.Fprintf(os.Stderr, "bench: %s: %v\n", what, err)
			b.res.Notes = append(b.res.Notes, note+ae.Message)
			return 0, errNotSupported
		}
		return 0, err
	}
	return since(t), nil
}
