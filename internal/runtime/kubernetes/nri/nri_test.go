package nri

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"

	"github.com/sheepfold/sheepfold/internal/runtime/kubernetes"
)

func pod(annotations map[string]string) *api.PodSandbox {
	return &api.PodSandbox{Id: "p1", Name: "sf-abc", Namespace: "sandboxes", Uid: "u1", Annotations: annotations}
}

// The plugin's answer for each Pod: the annotated limit as the
// container's pids limit, nothing for a Pod without the annotation, and
// a refusal (no container) for an annotation that is not a limit.
func TestCreateContainer(t *testing.T) {
	t.Parallel()
	p := &Plugin{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctr := &api.Container{Id: "c1", PodSandboxId: "p1", Name: "sandbox"}
	for _, tc := range []struct {
		ann  map[string]string
		want int64 // 0: no adjustment; -1: refused
	}{
		{map[string]string{kubernetes.AnnotationPids: "256"}, 256},
		{map[string]string{kubernetes.AnnotationPids: "64", "other": "x"}, 64},
		{nil, 0},
		{map[string]string{"other": "64"}, 0},
		{map[string]string{kubernetes.AnnotationPids: "0"}, -1},
		{map[string]string{kubernetes.AnnotationPids: "many"}, -1},
	} {
		adj, upd, err := p.CreateContainer(context.Background(), pod(tc.ann), ctr)
		switch {
		case len(upd) != 0:
			t.Errorf("%v: updates %v", tc.ann, upd)
		case tc.want < 0:
			if err == nil || !strings.Contains(err.Error(), "sandboxes/sf-abc") {
				t.Errorf("%v: %v, %v; want a refusal naming the Pod", tc.ann, adj, err)
			}
		case tc.want == 0:
			if adj != nil || err != nil {
				t.Errorf("%v: %v, %v; want nothing", tc.ann, adj, err)
			}
		default:
			if err != nil || adj.GetLinux().GetResources().GetPids().GetLimit() != tc.want {
				t.Errorf("%v: %v, %v; want pids limit %d", tc.ann, adj, err, tc.want)
			}
		}
	}
}

// Over the real protocol: a runtime's NRI side (the library containerd
// itself uses) listening on a socket, the plugin connected by Run; a
// container of an annotated Pod comes out with the Pod's pids limit, any
// other untouched, and a bad annotation fails the container's creation.
func TestRunOverNRI(t *testing.T) {
	dir := t.TempDir()
	socket := filepath.Join(dir, "nri.sock")
	sync := func(ctx context.Context, cb adaptation.SyncCB) error {
		_, err := cb(ctx, nil, nil)
		return err
	}
	update := func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		return nil, nil
	}
	rt, err := adaptation.New("test-runtime", "v1", sync, update,
		adaptation.WithSocketPath(socket), adaptation.WithPluginPath(filepath.Join(dir, "plugins")), adaptation.WithPluginConfigPath(filepath.Join(dir, "conf.d")))
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(); err != nil {
		t.Fatal(err)
	}
	defer rt.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, socket, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	create := func(ann map[string]string) (*adaptation.CreateContainerResponse, error) {
		return rt.CreateContainer(context.Background(), &adaptation.CreateContainerRequest{
			Pod: pod(ann), Container: &api.Container{Id: "c1", PodSandboxId: "p1", Name: "sandbox"}})
	}
	// Until the plugin has registered, the runtime asks no one.
	var res *adaptation.CreateContainerResponse
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if res, err = create(map[string]string{kubernetes.AnnotationPids: "64"}); err != nil {
			t.Fatal(err)
		}
		if res.GetAdjust().GetLinux().GetResources().GetPids() != nil || time.Now().After(deadline) {
			break
		}
	}
	if got := res.GetAdjust().GetLinux().GetResources().GetPids().GetLimit(); got != 64 {
		t.Fatalf("pids limit of an annotated Pod's container: %d (%v)", got, res)
	}
	if res, err := create(nil); err != nil || res.GetAdjust().GetLinux().GetResources().GetPids() != nil {
		t.Fatalf("a Pod without the annotation: %v, %v", res, err)
	}
	if _, err := create(map[string]string{kubernetes.AnnotationPids: "-1"}); err == nil || !strings.Contains(err.Error(), "not a positive number") {
		t.Fatalf("a bad annotation: %v", err)
	}
}

// TestRunRejoinsRestartedRuntime: a runtime that restarts (containerd
// killed and started again, its socket made anew) is rejoined by Run's
// reconnect, whose jittered wait (internal/backoff) stays within retry.
// Each runtime is a process of its own (this test binary as
// runtimeProcess), as the NRI library ends a plugin's connection only
// with its runtime's process. Each runtime creates containers until one
// gets the limit (those before the plugin joined get none) and says
// whether any came before it.
func TestRunRejoinsRestartedRuntime(t *testing.T) {
	if os.Getenv("SHEEPFOLD_NRI_RUNTIME") != "" {
		runtimeProcess(t, os.Getenv("SHEEPFOLD_NRI_RUNTIME"))
		return
	}
	dir := t.TempDir()
	socket := filepath.Join(dir, "nri.sock")
	start := func() (*exec.Cmd, time.Duration) {
		t.Helper()
		cmd := exec.Command(os.Args[0], "-test.run=^TestRunRejoinsRestartedRuntime$")
		cmd.Env = append(os.Environ(), "SHEEPFOLD_NRI_RUNTIME="+socket)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		begun := time.Now()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, "pids ") {
				if line != "pids 64 after none" && line != "pids 64 after unasked" {
					t.Fatalf("the runtime: %s", line)
				}
				t.Logf("the runtime: %s", line)
				return cmd, time.Since(begun)
			}
		}
		t.Fatalf("the runtime ended before the plugin joined it: %v", cmd.Wait())
		return nil, 0
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, socket, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	first, _ := start()
	first.Process.Kill()
	first.Wait()
	_, took := start()
	t.Logf("the restarted runtime was rejoined after %v (the reconnect waits at most %v)", took.Round(time.Millisecond), retry)
}

// runtimeProcess is the runtime's side of TestRunRejoinsRestartedRuntime:
// it listens on socket, creates an annotated Pod's container every 10 ms
// until one gets a pids limit (at most 10 s), prints "pids N after
// none" (or what went wrong), and serves until killed.
func runtimeProcess(t *testing.T, socket string) {
	dir := filepath.Dir(socket)
	sync := func(ctx context.Context, cb adaptation.SyncCB) error {
		_, err := cb(ctx, nil, nil)
		return err
	}
	update := func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		return nil, nil
	}
	os.Remove(socket) // a killed runtime's
	rt, err := adaptation.New("test-runtime", "v1", sync, update,
		adaptation.WithSocketPath(socket), adaptation.WithPluginPath(filepath.Join(dir, "plugins")), adaptation.WithPluginConfigPath(filepath.Join(dir, "conf.d")))
	if err == nil {
		err = rt.Start()
	}
	if err != nil {
		fmt.Println("pids none:", err)
		return
	}
	seen := "unasked"
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		res, err := rt.CreateContainer(context.Background(), &adaptation.CreateContainerRequest{
			Pod: pod(map[string]string{kubernetes.AnnotationPids: "64"}), Container: &api.Container{Id: "c1", PodSandboxId: "p1", Name: "sandbox"}})
		if err != nil {
			fmt.Println("pids none:", err)
			return
		}
		if p := res.GetAdjust().GetLinux().GetResources().GetPids(); p != nil {
			fmt.Printf("pids %d after %s\n", p.GetLimit(), seen)
			select {} // serve until killed
		}
		seen = "none"
	}
	fmt.Println("pids none: the plugin did not join within 10 s")
}
