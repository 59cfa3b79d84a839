//go:build linux

package osthread

import (
	"runtime"
	"sync"
)

// A child started with Pdeathsig gets that signal when the OS thread
// that forked it ends, not when the process does (prctl(2):
// PR_SET_PDEATHSIG). Go ends a thread whenever a goroutine exits while
// locked to it (Discarded, and every namespace switch done that way), and
// any goroutine may be scheduled on any thread: a child started from an
// ordinary goroutine is killed at random the first time its thread is
// taken by such a goroutine. Kept runs the start on a thread that never
// ends.

var kept struct {
	once sync.Once
	reqs chan keptReq
}

type keptReq struct {
	fn   func() error
	done chan error
}

// Kept runs fn on the one OS thread of the process that never ends (a
// goroutine locked to it for the life of the process), and returns its
// error. Start every process that has a Pdeathsig through it
// (exec.Cmd.Start, os.StartProcess), so that the signal comes only when
// this process ends. fn must not block for long: the starts take turns.
func Kept(fn func() error) error {
	kept.once.Do(func() {
		kept.reqs = make(chan keptReq)
		go func() {
			runtime.LockOSThread() // never unlocked, and the goroutine never returns
			for r := range kept.reqs {
				r.done <- r.fn()
			}
		}()
	})
	done := make(chan error, 1)
	kept.reqs <- keptReq{fn, done}
	return <-done
}
