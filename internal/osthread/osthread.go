//go:build linux

// Package osthread runs a function on an OS thread of its own that ends
// when the function returns. It is for system calls that change the
// calling thread for good: a uid switch with no way back, a smaller
// capability bounding set. Such a thread must never run other goroutines
// again, and it must not be the process's main thread, which Go cannot end
// (it would keep it, wedged, with the changed credentials, and
// /proc/<pid>/status shows the main thread's credentials as the process's).
//
// Because Go ends threads so, a process started with a Pdeathsig from an
// ordinary goroutine dies when that goroutine's thread happens to be the
// next one ended; Kept starts such processes on the one thread that never
// ends (kept.go).
//
// Imports: the standard library and x/sys only (the agent and the runtime
// both use it).
package osthread

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// Discarded calls fn on a locked OS thread other than the main thread and
// ends that thread when fn returns.
func Discarded(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// The main thread: hold it, so that the retry's goroutine
			// runs elsewhere, then give it back untouched.
			errc <- Discarded(fn)
			runtime.UnlockOSThread()
			return
		}
		errc <- fn()
		// Returning while locked ends the thread.
	}()
	return <-errc
}
