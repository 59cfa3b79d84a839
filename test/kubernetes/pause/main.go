// Command pause is the sandbox ("pause") image of the test cluster that
// test/kubernetes/cluster.sh starts: no registry is reachable there, so
// containerd's CRI is pointed at this program, built static and imported as
// a local OCI image. It holds the pod's namespaces: it sleeps until SIGTERM
// or SIGINT and, being PID 1 of a pod that shares its PID namespace, reaps
// the children that are reparented to it.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every exited child without blocking.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
