package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/runtime"
	"github.com/sheepfold/sheepfold/internal/runtime/fake"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// fakeEngine is a Manager over the fake runtime: the real agent, on the
// host, without isolation.
func fakeEngine(t *testing.T, cfg sandbox.Config) (*sandbox.Manager, *fake.Runtime) {
	t.Helper()
	rt := &fake.Runtime{AgentBin: testutil.AgentBin(t), Dir: testutil.ShortTempDir(t)}
	cfg.Runtime = rt
	if cfg.Templates == nil {
		cfg.Templates = sandbox.TemplatesFunc(func(name string) (string, error) {
			if name != "python" {
				return "", os.ErrNotExist
			}
			return "/", nil
		})
	}
	return startEngine(t, cfg, rt), rt
}

// startEngine starts a Manager with cfg, whose runtime is rt or wraps it,
// and closes it when the test ends, checking that it leaves no sandbox
// in rt.
func startEngine(t *testing.T, cfg sandbox.Config, rt *fake.Runtime) *sandbox.Manager {
	t.Helper()
	m, err := sandbox.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(context.Background()); err != nil {
			t.Error(err)
		}
		if ids, _ := rt.List(context.Background()); len(ids) != 0 {
			t.Errorf("sandboxes left after Close: %v", ids)
		}
	})
	return m
}

func wantCode(t *testing.T, err error, code apierr.Code) {
	t.Helper()
	if got := apierr.CodeOf(err); got != code {
		t.Fatalf("error %v: code %q, want %q", err, got, code)
	}
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	m, rt := fakeEngine(t, sandbox.Config{})
	s, err := m.Create(context.Background(), sandbox.CreateOptions{Metadata: map[string]string{"ticket": "42"}})
	if err != nil {
		t.Fatal(err)
	}
	if s.State() != sandbox.StateRunning {
		t.Fatalf("state %s", s.State())
	}
	if got, err := m.Get(s.ID); err != nil || got != s {
		t.Fatalf("Get: %v", err)
	}
	if l := m.List(); len(l) != 1 || l[0].ID != s.ID || l[0].Metadata["ticket"] != "42" {
		t.Fatalf("List = %+v", l)
	}
	before := s.Deadline()
	if err := s.SetTimeout(context.Background(), time.Hour); err != nil || !s.Deadline().After(before) {
		t.Fatalf("SetTimeout: %v", err)
	}
	wantCode(t, s.SetTimeout(context.Background(), 0), apierr.BadRequest)

	if err := m.Kill(context.Background(), s.ID); err != nil {
		t.Fatal(err)
	}
	if s.State() != sandbox.StateStopped || s.Info().StopReason != "killed" {
		t.Fatalf("after kill: %+v", s.Info())
	}
	_, err = m.Get(s.ID)
	wantCode(t, err, apierr.SandboxNotFound)
	wantCode(t, m.Kill(context.Background(), s.ID), apierr.SandboxNotFound)
	_, err = s.Execute(context.Background(), sandbox.ExecuteRequest{Code: "1"}, nil)
	wantCode(t, err, apierr.SandboxState)
	if ids, _ := rt.List(context.Background()); len(ids) != 0 {
		t.Fatalf("runtime still has %v", ids)
	}
}

func TestCreateRejectsBadInput(t *testing.T) {
	t.Parallel()
	m, _ := fakeEngine(t, sandbox.Config{MaxSandboxes: 1})
	tests := []struct {
		name string
		opt  sandbox.CreateOptions
		code apierr.Code
	}{
		{"unknown template", sandbox.CreateOptions{Template: "cobol"}, apierr.TemplateNotFound},
		{"negative timeout", sandbox.CreateOptions{Timeout: -time.Second}, apierr.BadRequest},
		{"huge timeout", sandbox.CreateOptions{Timeout: 1000 * time.Hour}, apierr.BadRequest},
		{"tiny memory", sandbox.CreateOptions{Limits: runtime.Limits{MemoryBytes: 1 << 20}}, apierr.BadRequest},
		{"huge disk", sandbox.CreateOptions{Limits: runtime.Limits{DiskBytes: 1 << 50}}, apierr.BadRequest},
		{"too many cpus", sandbox.CreateOptions{Limits: runtime.Limits{CPUs: 64}}, apierr.BadRequest},
		{"bad env", sandbox.CreateOptions{Env: map[string]string{"A=B": "c"}}, apierr.BadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := m.Create(context.Background(), tt.opt)
			wantCode(t, err, tt.code)
		})
	}
	if _, err := m.Create(context.Background(), sandbox.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := m.Create(context.Background(), sandbox.CreateOptions{})
	wantCode(t, err, apierr.Capacity)
}

func TestSandboxExpires(t *testing.T) {
	t.Parallel()
	m, _ := fakeEngine(t, sandbox.Config{})
	s, err := m.Create(context.Background(), sandbox.CreateOptions{Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.State() != sandbox.StateStopped {
		if time.Now().After(deadline) {
			t.Fatalf("sandbox still %s after its timeout", s.State())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r := s.Info().StopReason; r != "timed out" {
		t.Fatalf("stop reason %q", r)
	}
	_, err = s.Stat(context.Background(), "/")
	wantCode(t, err, apierr.SandboxState)
}

func TestReconcileDestroysLeftovers(t *testing.T) {
	t.Parallel()
	rt := &fake.Runtime{AgentBin: testutil.AgentBin(t), Dir: testutil.ShortTempDir(t)}
	if _, err := rt.Create(context.Background(), runtime.Spec{ID: "leftover"}); err != nil {
		t.Fatal(err)
	}
	m, err := sandbox.New(context.Background(), sandbox.Config{Runtime: rt,
		Templates: sandbox.TemplatesFunc(func(string) (string, error) { return "/", nil })})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	if ids, _ := rt.List(context.Background()); len(ids) != 0 {
		t.Fatalf("leftover not destroyed: %v", ids)
	}
}

func TestFilesStayInsideTheSandbox(t *testing.T) {
	t.Parallel()
	m, rt := fakeEngine(t, sandbox.Config{})
	s, err := m.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	root := filepath.Join(rt.Dir, s.ID, "root")
	for _, p := range []string{"../../../../../../tmp/escape.txt", "/../../etc/escape.txt", "docs/../../../../x.txt"} {
		info, err := s.WriteFile(ctx, p, strings.NewReader("data"), 0, 0)
		if err != nil {
			t.Fatalf("write %s: %v", p, err)
		}
		if _, err := os.Stat(filepath.Join(root, info.Path)); err != nil {
			t.Errorf("write %s landed outside the sandbox root (reported %s): %v", p, info.Path, err)
		}
	}
	if _, err := os.Stat("/etc/escape.txt"); err == nil {
		os.Remove("/etc/escape.txt")
		t.Fatal("a write escaped to the host's /etc")
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	if _, err := s.WriteFile(ctx, "big.bin", bytes.NewReader(big), 0, 512<<10); apierr.CodeOf(err) != apierr.FileTooLarge {
		t.Fatalf("oversized write: %v", err)
	}
	if _, err := s.Stat(ctx, "big.bin"); apierr.CodeOf(err) != apierr.NotFound {
		t.Fatalf("a refused write left a file: %v", err)
	}
	if _, err := s.WriteFile(ctx, "dir/big.bin", bytes.NewReader(big), 0o600, 0); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	info, err := s.ReadFile(ctx, "dir/big.bin", &got, 0)
	if err != nil || !bytes.Equal(got.Bytes(), big) || info.Size != int64(len(big)) || info.Mode != 0o600 {
		t.Fatalf("read back: %v size %d mode %o equal %v", err, info.Size, info.Mode, bytes.Equal(got.Bytes(), big))
	}
	entries, err := s.ListDir(ctx, "dir", 1)
	if err != nil || len(entries) != 1 || entries[0].Name != "big.bin" {
		t.Fatalf("list: %v %+v", err, entries)
	}
	if _, err := s.Move(ctx, "dir/big.bin", "moved/big.bin"); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, "moved"); err != nil {
		t.Fatal(err)
	}
	_, err = s.ReadFile(ctx, "moved/big.bin", &got, 0)
	wantCode(t, err, apierr.NotFound)
	_, err = s.ReadFile(ctx, "", &got, 0)
	wantCode(t, err, apierr.BadRequest)
}

func TestParallelSandboxes(t *testing.T) {
	t.Parallel()
	m, _ := fakeEngine(t, sandbox.Config{})
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := m.Create(context.Background(), sandbox.CreateOptions{})
			if err != nil {
				errs <- err
				return
			}
			res, err := s.Run(context.Background(), sandbox.ProcessSpec{Cmd: "echo", Args: []string{s.ID}}, nil)
			if err != nil || res.ExitCode != 0 {
				errs <- errors.Join(err, errors.New("echo failed"))
			}
			errs <- m.Kill(context.Background(), s.ID)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// TestIdleCheckOfHungSandbox: a sandbox whose usage cannot be read does
// not hold up the idle stop of the others.
func TestIdleCheckOfHungSandbox(t *testing.T) {
	t.Parallel()
	m, rt := fakeEngine(t, sandbox.Config{IdleTimeout: 300 * time.Millisecond})
	hung, err := m.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, release := rt.HangUsage(hung.ID)
	t.Cleanup(release) // before the engine closes
	// Several others: checked one after another, most would wait behind
	// the hung one, whatever the order.
	var others []*sandbox.Sandbox
	for range 4 {
		s, err := m.Create(context.Background(), sandbox.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		others = append(others, s)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, s := range others {
		for s.State() != sandbox.StateStopped {
			if time.Now().After(deadline) {
				t.Fatalf("sandbox %s not stopped as idle while another's usage hangs: %+v", s.ID, s.Info())
			}
			time.Sleep(20 * time.Millisecond)
		}
		if r := s.Info().StopReason; r != "idle" {
			t.Fatalf("sandbox %s stopped for %q", s.ID, r)
		}
	}
}

func TestIdleSandboxIsStopped(t *testing.T) {
	t.Parallel()
	m, _ := fakeEngine(t, sandbox.Config{IdleTimeout: 400 * time.Millisecond})
	idle, err := m.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	busy, err := m.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A request running longer than the idle limit keeps its sandbox alive.
	res, err := busy.Run(context.Background(), sandbox.ProcessSpec{Cmd: "sleep", Args: []string{"1.2"}}, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("long request: %v %+v", err, res)
	}
	if busy.State() != sandbox.StateRunning {
		t.Fatalf("busy sandbox stopped as idle: %+v", busy.Info())
	}
	if idle.State() != sandbox.StateStopped || idle.Info().StopReason != "idle" {
		t.Fatalf("idle sandbox: %+v", idle.Info())
	}
}
