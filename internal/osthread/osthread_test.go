//go:build linux

package osthread

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestDiscarded: fn never runs on the main thread nor on a thread another
// goroutine runs on afterwards.
func TestDiscarded(t *testing.T) {
	// Park the test's goroutine on the main thread if it can be, so that
	// Discarded's goroutine is likely to be offered the main thread too.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var mu sync.Mutex
	used := map[int]bool{}
	for range 50 {
		if err := Discarded(func() error {
			mu.Lock()
			defer mu.Unlock()
			tid := unix.Gettid()
			if tid == unix.Getpid() {
				t.Error("ran on the main thread")
			}
			if used[tid] {
				t.Errorf("thread %d reused", tid)
			}
			used[tid] = true
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	// A discarded thread ends (just after fn's goroutine does).
	deadline := time.Now().Add(5 * time.Second)
	for tid := range used {
		for unix.Tgkill(unix.Getpid(), tid, 0) != unix.ESRCH {
			if time.Now().After(deadline) {
				t.Fatalf("thread %d still exists", tid)
			}
			time.Sleep(time.Millisecond)
		}
	}
}
