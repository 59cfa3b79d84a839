package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sheepfold/sheepfold/client"
)

// batchCmd runs batches on a running server.
func batchCmd() *cobra.Command {
	r := &remote{}
	cmd := &cobra.Command{Use: "batch", Short: "Run a handler over many inputs on a running server"}
	r.flags(cmd)
	var (
		inputs      string
		concurrency int
		retries     int
		timeout     time.Duration
		tmpl        string
		poll        time.Duration
		reuse       string
	)
	run := &cobra.Command{
		Use:   "run HANDLER.py",
		Short: "Run HANDLER.py's handler(item) over each line of --inputs (JSON Lines) and print the results as JSON Lines",
		Long: "Each input runs in a fresh sandbox of your account, --concurrency at a time. The results, one JSON object a line " +
			"by input (index, status, result or error), go to stdout once the batch ends; a progress line (done, failed, " +
			"rate, ETA) goes to stderr. An interrupt cancels the batch.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := r.client()
			if err != nil {
				return err
			}
			code, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			in, err := readInputs(inputs, cmd.InOrStdin())
			if err != nil {
				return err
			}
			b, err := c.CreateBatch(cmd.Context(), client.BatchRequest{Template: tmpl, Code: string(code), Inputs: in,
				Concurrency: concurrency, Retries: retries, TimeoutMS: timeout.Milliseconds(), Reuse: reuse})
			if err != nil {
				return err
			}
			if b, err = followBatch(cmd.Context(), c, b, poll, cmd.ErrOrStderr()); err != nil {
				if cmd.Context().Err() != nil {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					if _, cerr := c.CancelBatch(ctx, b.ID); cerr == nil {
						return fmt.Errorf("batch %s canceled", b.ID)
					}
				}
				return err
			}
			out := bufio.NewWriter(cmd.OutOrStdout())
			enc := json.NewEncoder(out)
			enc.SetEscapeHTML(false)
			for after := -1; ; {
				page, next, err := c.BatchResults(cmd.Context(), b.ID, after, 1000)
				if err != nil {
					return err
				}
				for _, res := range page {
					if err := enc.Encode(res); err != nil {
						return err
					}
				}
				if next < 0 {
					break
				}
				after = next
			}
			if err := out.Flush(); err != nil {
				return err
			}
			if b.Status != "done" {
				msg := b.Status
				if b.Error != nil {
					msg += ": " + b.Error.Code + ": " + b.Error.Message
				}
				return fmt.Errorf("batch %s %s", b.ID, msg)
			}
			return nil
		},
	}
	run.Flags().StringVar(&inputs, "inputs", "-", "the inputs, one JSON value a line (- for stdin)")
	run.Flags().IntVarP(&concurrency, "concurrency", "c", 1, "inputs run at once (each a sandbox)")
	run.Flags().IntVar(&retries, "retries", 0, "more runs of an input that failed")
	run.Flags().DurationVar(&timeout, "timeout", 0, "each run's execution timeout (default: the server's)")
	run.Flags().StringVarP(&tmpl, "template", "t", "", "template (default: python)")
	run.Flags().DurationVar(&poll, "poll", time.Second, "how often the progress is read")
	run.Flags().StringVar(&reuse, "reuse", "", `"worker": each of the --concurrency workers keeps one sandbox (the handler file runs once in it)`)
	cmd.AddCommand(run)
	return cmd
}

// readInputs reads one JSON value a line (blank lines skipped) from path,
// or from stdin for "-".
func readInputs(path string, stdin io.Reader) ([]json.RawMessage, error) {
	f := stdin
	if path != "-" {
		file, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer file.Close()
		f = file
	}
	var out []json.RawMessage
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		if !json.Valid(line) {
			return nil, fmt.Errorf("%s:%d: not a JSON value", path, n)
		}
		out = append(out, json.RawMessage(bytes.Clone(line)))
	}
	return out, sc.Err()
}

// followBatch polls a batch until it ends, writing a progress line to
// progress at each poll.
func followBatch(ctx context.Context, c *client.Client, b *client.Batch, poll time.Duration, progress io.Writer) (*client.Batch, error) {
	start := time.Now()
	for {
		ended := b.Done + b.Failed
		rate := float64(ended) / max(time.Since(start).Seconds(), 1e-3)
		eta := "?"
		if rate > 0 {
			eta = time.Duration(float64(b.Pending) / rate * float64(time.Second)).Round(time.Second).String()
		}
		fmt.Fprintf(progress, "\r%s %s: %d/%d done, %d failed, %.1f items/s, ETA %s   ", bar(ended, b.Total, 20), b.ID, b.Done, b.Total,
			b.Failed, rate, eta)
		if b.Status != "running" {
			u := b.Usage
			fmt.Fprintf(progress, "\n%s %s: %d sandboxes, %.1f CPU-s, %.1f GB-s, %d executions, cost %s\n", b.ID, b.Status, u.Sandboxes,
				u.CPUSeconds, u.GBSecondsReserved, u.Executions, u.Cost)
			return b, nil
		}
		t := time.NewTimer(poll)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			fmt.Fprintln(progress)
			return b, ctx.Err()
		}
		next, err := c.GetBatch(ctx, b.ID)
		if err != nil {
			return b, err
		}
		b = next
	}
}

// bar draws n of total as a bar width characters wide.
func bar(n, total, width int) string {
	full := 0
	if total > 0 {
		full = min(width, n*width/total)
	}
	return "[" + strings.Repeat("#", full) + strings.Repeat(".", width-full) + "]"
}
