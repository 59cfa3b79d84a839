package server_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// An unpaced flood from another process: a tenant's clients run on their
// own machine, not on the server's CPUs. BenchmarkUnpacedFlood runs them
// in a child process (this test binary again, floodClientEnv set) on the
// host's last CPU, and the server with the measured tenant on the
// others, so that what the flood costs the other tenant is what it costs
// the server, not what its clients cost.

const floodClientEnv = "SHEEPFOLD_TEST_FLOOD_CLIENT" // "URL KEY"

// floodWarm is how many answers each flood client has before the flood
// counts as steady.
const floodWarm = 20

// runFloodClient is the child's whole life: 16 clients send the key's
// requests (a list of its sandboxes, a dashboard login), each as soon as
// its last was answered, until stdin closes; then it prints how many
// were answered. It prints "flooding" once every client has been
// answered floodWarm times: from then on the flood is steady (its
// connections open, its account's burst spent), and what is measured is
// the flood, not its start.
func runFloodClient(spec string) int {
	url, key, _ := strings.Cut(spec, " ")
	ctx, cancel := context.WithCancel(context.Background())
	go func() { io.Copy(io.Discard, os.Stdin); cancel() }()
	var answered atomic.Int64
	var warm sync.WaitGroup
	warm.Add(16)
	go func() { warm.Wait(); fmt.Println("flooding") }()
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			for n := 0; ctx.Err() == nil; n++ {
				if n == floodWarm {
					warm.Done()
				}
				var req *http.Request
				if i%2 == 0 {
					req, _ = http.NewRequestWithContext(ctx, "GET", url+"/v1/sandboxes", nil)
					req.Header.Set("Authorization", "Bearer "+key)
				} else {
					req, _ = http.NewRequestWithContext(ctx, "POST", url+"/ui/login", strings.NewReader(`{"key":"`+key+`"}`))
					req.Header.Set("X-Sheepfold-UI", "1")
				}
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					continue
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				answered.Add(1)
			}
		})
	}
	wg.Wait()
	fmt.Println(answered.Load())
	return 0
}

// floodFromAfar starts the child flooding url with key on the host's
// last CPU; stop ends it and returns how many of its requests were
// answered.
func floodFromAfar(t testing.TB, url, key string) (stop func() int64) {
	last := strconv.Itoa(runtime.NumCPU() - 1)
	cmd := exec.Command("taskset", "-c", last, os.Args[0])
	cmd.Env = append(os.Environ(), floodClientEnv+"="+url+" "+key)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewReader(out)
	if line, err := lines.ReadString('\n'); line != "flooding\n" {
		t.Fatalf("the flood's client did not start: %q, %v", line, err)
	}
	return func() int64 {
		in.Close()
		line, _ := lines.ReadString('\n')
		if err := cmd.Wait(); err != nil {
			t.Fatalf("the flood's client: %v", err)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
		if err != nil {
			t.Fatalf("the flood's client printed %q", line)
		}
		return n
	}
}

// pinAwayFromLast runs every thread of this process on the CPUs but the
// last (the flood's), and returns what undoes it. On one CPU it pins
// nothing.
func pinAwayFromLast(t testing.TB) (undo func()) {
	n := runtime.NumCPU()
	if n < 2 {
		return func() {}
	}
	var mine, all unix.CPUSet
	for c := range n {
		all.Set(c)
		if c < n-1 {
			mine.Set(c)
		}
	}
	set := func(s *unix.CPUSet) {
		tids, err := filepath.Glob("/proc/self/task/*")
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range tids {
			tid, _ := strconv.Atoi(filepath.Base(p))
			unix.SchedSetaffinity(tid, s) // a thread that ended meanwhile: nothing to pin
		}
	}
	set(&mine)
	// As many Ps as CPUs left, as the runtime would choose on a host
	// of n-1 CPUs: with more, two threads running goroutines take turns
	// on one CPU in the kernel's time slices (milliseconds each), which
	// delays a request far more than the flood's work does.
	procs := runtime.GOMAXPROCS(n - 1)
	return func() {
		runtime.GOMAXPROCS(procs)
		set(&all)
	}
}
