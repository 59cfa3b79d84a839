//go:build !linux

// Command sheepfold-agent is the agent inside every sandbox; it runs on
// Linux only (see main.go).
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "sheepfold-agent runs inside Linux sandboxes only")
	os.Exit(1)
}
