package server

import "time"

// SetStreamWriteTimeout shortens the write deadline of streams for one
// test (not a parallel one) and returns what restores it.
func SetStreamWriteTimeout(d time.Duration) (restore func()) {
	old := streamWriteTimeout
	streamWriteTimeout = d
	return func() { streamWriteTimeout = old }
}
