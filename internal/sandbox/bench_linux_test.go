package sandbox_test

import (
	"context"
	"os/exec"
	"testing"

	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// The benchmarks report ns/op; compare each with BenchmarkBaselineHostPython
// from the same run (`make bench` prints the ratios), so the figures do
// not depend on how fast the machine is.

// BenchmarkBaselineHostPython is a bare host interpreter start.
func BenchmarkBaselineHostPython(b *testing.B) {
	for b.Loop() {
		if err := exec.Command("/usr/bin/python3", "-S", "-c", "pass").Run(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCreateFirstExec creates a sandbox, runs print(1) in a fresh
// Python context and destroys the sandbox (no warm pool yet).
func BenchmarkCreateFirstExec(b *testing.B) {
	m := runcEngine(b)
	ctx := context.Background()
	for b.Loop() {
		s, err := m.Create(ctx, sandbox.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		ex, err := s.Execute(ctx, sandbox.ExecuteRequest{Code: "print(1)"}, nil)
		if err != nil || ex.Stdout != "1\n" {
			b.Fatalf("%v %+v", err, ex)
		}
		if err := m.Kill(ctx, s.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWarmExec is one 1+1 round trip in a warm context, engine-side
// (no HTTP).
func BenchmarkWarmExec(b *testing.B) {
	m := runcEngine(b)
	ctx := context.Background()
	s, err := m.Create(ctx, sandbox.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.Execute(ctx, sandbox.ExecuteRequest{Code: "1"}, nil); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		ex, err := s.Execute(ctx, sandbox.ExecuteRequest{Code: "1+1"}, nil)
		if err != nil || len(ex.Results) != 1 {
			b.Fatalf("%v %+v", err, ex)
		}
	}
}
