//go:build !race

package testutil

// Race reports whether the tests were built with the race detector (see
// race_on.go).
const Race = false
