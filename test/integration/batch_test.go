package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
)

// TestBatchKill9: a `sheepfold serve` killed with SIGKILL in the middle of
// a batch loses none of it: a server started again on the same data dir
// runs the items that had not ended, and none of those that had (each
// item's executions are counted in the store: the crash may only repeat
// what was running, at most the batch's concurrency). Two ways: 40
// items each in a fresh sandbox, and issue 36's 1,000 len(item) items at
// concurrency 8 with workers that keep their sandboxes (killed once 300
// have ended); the bench measures 1,000 in fresh sandboxes.
func TestBatchKill9(t *testing.T) {
	for _, c := range []struct {
		name, reuse string
		n, killAt   int
		sleep       string
	}{
		{"fresh", "", 40, 10, "0.2"},
		{"worker", "worker", 1000, 300, "0.01"},
	} {
		t.Run(c.name, func(t *testing.T) { batchKill9(t, c.reuse, c.n, c.killAt, c.sleep) })
	}
}

func batchKill9(t *testing.T, reuse string, n, killAt int, sleep string) {
	s := newCrashServer(t)
	ctx := context.Background()
	s.start(2)
	c := s.client()
	const conc = 8
	inputs := make([]json.RawMessage, n)
	for i := range inputs {
		inputs[i], _ = json.Marshal(strings.Repeat("x", i))
	}
	b, err := c.CreateBatch(ctx, client.BatchRequest{Code: "import time\ndef handler(item):\n    time.sleep(" + sleep + ")\n    return len(item)\n",
		Inputs: inputs, Concurrency: conc, Reuse: reuse})
	if err != nil {
		t.Fatal(err)
	}
	var before []client.BatchResult
	eventually(t, 300*time.Second, fmt.Sprintf("%d items to end", killAt), func() bool {
		before, _, err = c.BatchResults(ctx, b.ID, -1, 1000)
		return err == nil && len(before) >= killAt
	})
	if len(before) == n {
		t.Fatalf("every item ended before the kill")
	}
	s.kill9()
	s.start(2)
	c = s.client()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if b, err = c.WaitBatch(wctx, b.ID, 100*time.Millisecond); err != nil || b.Status != "done" || b.Done != n || b.Failed != 0 {
		t.Fatalf("after the restart: %+v, %v", b, err)
	}
	var res []client.BatchResult
	for after := -1; ; {
		page, next, err := c.BatchResults(ctx, b.ID, after, 1000)
		if err != nil {
			t.Fatal(err)
		}
		res = append(res, page...)
		if next < 0 {
			break
		}
		after = next
	}
	if len(res) != n {
		t.Fatalf("%d results", len(res))
	}
	for i, r := range res {
		if r.Index != i || string(r.Result) != jsonNumber(i) || r.Attempts != 1 {
			t.Fatalf("result %d: %+v", i, r)
		}
	}
	// Count each item's executions.
	db, err := sqlite.Open(ctx, filepath.Join(s.dir, "sheepfold.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	sbs, err := db.ListSandboxes(ctx, store.SandboxFilter{AnyOwner: true})
	if err != nil {
		t.Fatal(err)
	}
	item := regexp.MustCompile(`_sf_json\.loads\("\\"(x*)\\""\)`)
	runs := map[int]int{}
	for _, sb := range sbs {
		exs, err := db.ListExecutions(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, ex := range exs {
			if m := item.FindStringSubmatch(ex.Code); m != nil {
				runs[len(m[1])]++
			}
		}
	}
	twice := 0
	for i := 0; i < n; i++ {
		switch {
		case runs[i] == 0 || runs[i] > 2:
			t.Errorf("item %d ran %d times", i, runs[i])
		case runs[i] == 2:
			twice++
		}
	}
	for _, r := range before {
		if runs[r.Index] != 1 {
			t.Errorf("item %d ended before the kill and ran %d times", r.Index, runs[r.Index])
		}
	}
	if twice > conc {
		t.Errorf("%d items ran twice, more than the %d running at the kill", twice, conc)
	}
	t.Logf("%d of %d items ended before the kill; %d ran again after it", len(before), n, twice)
}

func jsonNumber(i int) string { j, _ := json.Marshal(i); return string(j) }
