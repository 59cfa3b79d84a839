//go:build race

package testutil

// Race reports whether the tests were built with the race detector, which
// slows code several times and adds shadow memory: tests that measure time
// or memory skip their measurement then (`make test` runs them without
// -race too).
const Race = true
