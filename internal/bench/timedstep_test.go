package bench

import (
	"errors"
	"slices"
	"testing"

	"github.com/sheepfold/sheepfold/client"
)

// TestTimedStep: a step the server cannot do is noted and answers
// errNotSupported; another failure is the step's; a success its time.
func TestTimedStep(t *testing.T) {
	b := &bencher{res: &benchResults{}}
	_, err := b.timedStep("pause", "pause: not supported: ", func() error {
		return &client.Error{Code: "ERR_NOT_SUPPORTED", Message: "no CRIU"}
	})
	if !errors.Is(err, errNotSupported) || !slices.Equal(b.res.Notes, []string{"pause: not supported: no CRIU"}) {
		t.Fatalf("not supported: %v, notes %q", err, b.res.Notes)
	}
	boom := errors.New("boom")
	if _, err := b.timedStep("pause", "", func() error { return boom }); err != boom || len(b.res.Notes) != 1 {
		t.Fatalf("a failure: %v, notes %q", err, b.res.Notes)
	}
	if ms, err := b.timedStep("pause", "", func() error { return nil }); err != nil || ms < 0 {
		t.Fatalf("a success: %v ms, %v", ms, err)
	}
}
