package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// TestServeShutdown leaves the agent busy in every way it can be, stops
// it, and checks that no goroutine of the package and no process it
// started is left, and every kernel is closed. Not parallel: it counts
// goroutines.
func TestServeShutdown(t *testing.T) {
	fk := &fakeKernels{}
	home := t.TempDir()
	a := startAgent(t, Config{Root: "/", Home: home, NewKernel: fk.new, Languages: []string{"python"}})

	var pids []int
	// a background process whose client left
	bg := a.open(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{Cmd: "sleep", Args: []string{"60"}}})
	pids = append(pids, bg.next().PID)
	bg.nc.Close()
	// a process with a child in its group, with a live subscriber
	grp := a.open(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: sh(`sleep 60 & echo $!; wait`)})
	pids = append(pids, grp.next().PID)
	ev, _ := grp.until(agentproto.EventStdout)
	child, err := strconv.Atoi(strings.TrimSpace(string(ev.Data)))
	if err != nil {
		t.Fatal(err)
	}
	pids = append(pids, child)
	// a process whose leftover child holds the output pipe after it exited
	left := a.call(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: sh(`sleep 60 & echo $!`)}).mustOK(t)
	leftover, _ := strconv.Atoi(strings.TrimSpace(left.output(agentproto.EventStdout)))
	pids = append(pids, leftover)
	// a process that closed its own output (nothing left to read)
	quiet := a.open(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: sh(`exec >/dev/null 2>&1; sleep 60`)})
	pids = append(pids, quiet.next().PID)
	quiet.nc.Close()
	// a finished process whose background child lives on in its group
	// without its pipes
	bgq := a.call(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: sh(`sleep 60 >/dev/null 2>&1 & echo $! >&2`)}).mustOK(t)
	bgqPID, _ := strconv.Atoi(strings.TrimSpace(bgq.output(agentproto.EventStderr)))
	pids = append(pids, bgqPID)
	// a process blocked writing to stdin nobody reads... and its writer
	in := a.open(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{Cmd: "sleep", Args: []string{"60"}, Stdin: true}})
	inPID := in.next().PID
	pids = append(pids, inPID)
	a.open(t, agentproto.Request{Op: agentproto.OpProcessInput, PID: inPID, Data: make([]byte, 1<<20)})
	// an execution in progress
	ex := a.open(t, agentproto.Request{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{Code: "block"}})
	ex.next()
	a.call(t, agentproto.Request{Op: agentproto.OpContextCreate, Context: &agentproto.ContextSpec{Language: "python"}}).mustOK(t)
	// an upload stalled mid-body
	_, up := a.upload(t, agentproto.Request{Op: agentproto.OpFileWrite, Path: "stalled"})
	up.WriteData([]byte("partial"))
	waitFor(t, "the stalled upload's temporary file to hold its data", func() bool { return uploadedBytes(t, home) == len("partial") })
	// a connection that never sends its request
	a.dial(t)

	start := time.Now()
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("shutdown took %v", el)
	}
	for _, pid := range pids {
		waitGone(t, pid)
	}
	fk.mu.Lock()
	for i, k := range fk.all {
		if !k.closed {
			t.Errorf("kernel %d not closed", i)
		}
	}
	fk.mu.Unlock()
	if ents, _ := os.ReadDir(home); len(ents) != 0 {
		t.Errorf("left in home: %v", ents)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		leaks := agentGoroutines()
		if len(leaks) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines left:\n%s", len(leaks), strings.Join(leaks, "\n\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// agentGoroutines returns the stacks of goroutines running code of this
// package, other than tests.
func agentGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "internal/agent.") && !strings.Contains(g, "internal/agent.Test") {
			out = append(out, g)
		}
	}
	return out
}

// TestConcurrentClients runs many clients at once, each using every kind
// of operation.
func TestConcurrentClients(t *testing.T) {
	t.Parallel()
	root := sandboxRoot(t)
	a := startAgent(t, Config{Root: root, Env: []string{"PATH=/usr/bin:/bin"}})
	os.MkdirAll(filepath.Join(root, "home/user"), 0o755)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			name := fmt.Sprintf("dir%d/file", i)
			body := bytes.Repeat([]byte{byte(i)}, 300<<10+i)
			a.callBody(t, agentproto.Request{Op: agentproto.OpFileWrite, Path: name}, bytes.NewReader(body)).mustOK(t)
			if r := a.call(t, agentproto.Request{Op: agentproto.OpFileRead, Path: name}).mustOK(t); !bytes.Equal(r.data, body) {
				t.Errorf("client %d read back %d bytes", i, len(r.data))
			}
			a.call(t, agentproto.Request{Op: agentproto.OpFileList, Path: "/", Depth: 3}).mustOK(t)
			p := a.call(t, agentproto.Request{Op: agentproto.OpProcessStart, Process: &agentproto.ProcessSpec{Cmd: "echo", Args: []string{strconv.Itoa(i)}, Cwd: "/"}}).mustOK(t)
			if got := p.output(agentproto.EventStdout); got != strconv.Itoa(i)+"\n" {
				t.Errorf("client %d: echo %q", i, got)
			}
			x := a.call(t, agentproto.Request{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{Code: fmt.Sprintf("print %d", i)}}).mustOK(t)
			if got := x.output(agentproto.EventStdout); got != strconv.Itoa(i) {
				t.Errorf("client %d: execute %q", i, got)
			}
			a.call(t, agentproto.Request{Op: agentproto.OpFileRemove, Path: fmt.Sprintf("dir%d", i)}).mustOK(t)
		})
	}
	wg.Wait()
}

// FuzzRequest sends arbitrary bytes as a request (never process.start: the
// fuzzer must not run commands) to an agent confined to a temporary Root.
// The agent must answer or hang up without panicking or hanging.
func FuzzRequest(f *testing.F) {
	seeds := []agentproto.Request{
		{Op: agentproto.OpPing},
		{Op: agentproto.OpProcessList},
		{Op: agentproto.OpProcessConnect, PID: 1},
		{Op: agentproto.OpProcessSignal, PID: 1, Signal: 9},
		{Op: agentproto.OpProcessInput, PID: 1, Data: []byte("x"), EOF: true},
		{Op: agentproto.OpContextCreate, Context: &agentproto.ContextSpec{Language: "python", Cwd: "../x"}},
		{Op: agentproto.OpContextList},
		{Op: agentproto.OpContextRestart, ContextID: "default-python"},
		{Op: agentproto.OpContextDelete, ContextID: "default-python"},
		{Op: agentproto.OpExecute, Execute: &agentproto.ExecuteSpec{Code: "print x", Language: "bash"}},
		{Op: agentproto.OpFileRead, Path: "../../etc/passwd", Limit: 10},
		{Op: agentproto.OpFileWrite, Path: "a/b", Mode: 0o7777, Limit: 3},
		{Op: agentproto.OpFileList, Path: "/", Depth: 1000},
		{Op: agentproto.OpFileStat, Path: "~"},
		{Op: agentproto.OpFileMkdir, Path: "d/e", Mode: 1},
		{Op: agentproto.OpFileRemove, Path: "d"},
		{Op: agentproto.OpFileMove, Path: "a", NewPath: "/b/../c"},
	}
	for _, req := range seeds {
		b, _ := json.Marshal(req)
		var buf bytes.Buffer
		agentproto.WriteFrame(&buf, agentproto.FrameJSON, b)
		if req.Op == agentproto.OpFileWrite {
			agentproto.WriteFrame(&buf, agentproto.FrameData, []byte("data"))
			agentproto.WriteFrame(&buf, agentproto.FrameData, nil)
		}
		f.Add(buf.Bytes())
	}
	root := f.TempDir()
	os.MkdirAll(filepath.Join(root, "home/user"), 0o755)
	a := startAgent(f, Config{Root: root, Env: []string{}})
	f.Fuzz(func(t *testing.T, in []byte) {
		if _, p, err := agentproto.ReadFrame(bytes.NewReader(in)); err == nil {
			var req agentproto.Request
			if json.Unmarshal(p, &req) == nil && req.Op == agentproto.OpProcessStart {
				t.Skip("never start processes from fuzz input")
			}
		}
		c, err := net.Dial("unix", a.sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.Write(in)
		c.(*net.UnixConn).CloseWrite()
		var sink bytes.Buffer
		if _, err := sink.ReadFrom(c); err != nil {
			t.Fatalf("agent did not hang up: %v", err)
		}
		s := <-a.srv
		a.srv <- s
		if n := s.panics.Load(); n > 0 {
			t.Fatalf("%d panics", n)
		}
	})
}
