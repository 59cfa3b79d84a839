package sandbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// TestPolicyRateLimit: rate_limiting.requests_per_minute bounds one
// sandbox's executions (a minute's worth at once, then Retry-After), and
// a neighbour without the rule is not affected.
func TestPolicyRateLimit(t *testing.T) {
	t.Parallel()
	m, _ := fakeEngine(t, sandbox.Config{})
	perMinute := int64(3)
	limited, err := m.Create(context.Background(), sandbox.CreateOptions{
		Policy: &policy.Policy{RateLimiting: &policy.RateLimiting{RequestsPerMinute: &perMinute}}})
	if err != nil {
		t.Fatal(err)
	}
	free, err := m.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	run := func(s *sandbox.Sandbox) error {
		_, err := s.Execute(context.Background(), sandbox.ExecuteRequest{Language: "bash", Code: "true"}, nil)
		return err
	}
	for i := 0; i < 3; i++ {
		if err := run(limited); err != nil {
			t.Fatalf("execution %d within the limit: %v", i+1, err)
		}
	}
	err = run(limited)
	wantCode(t, err, apierr.RateLimited)
	var e *apierr.Error
	if !errors.As(err, &e) || e.RetryAfter <= 0 || e.RetryAfter > 20*time.Second ||
		!strings.Contains(e.Message, "3 executions per minute") {
		t.Fatalf("refusal = %+v, want Retry-After within 20 s and the limit named", e)
	}
	for i := 0; i < 5; i++ {
		if err := run(free); err != nil {
			t.Fatalf("the neighbour's execution %d: %v", i+1, err)
		}
	}
}
