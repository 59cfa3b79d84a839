//go:build !linux

package kernel

import (
	"errors"
	"net"
	"os"
	"sync"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// Off Linux (where kernels do not run) there is no seccomp: no listener
// comes back, and SeccompExec fails.

type denials struct{ kick chan struct{} }

func newDenials() *denials { return &denials{} }

func (d *denials) take() map[agentproto.Violation]int64 { return nil }

func listenerChannel() (*os.File, *net.UnixConn, error) {
	return nil, nil, errors.New("seccomp user notification needs Linux")
}

func receiveListener(*net.UnixConn, int, *denials, *sync.Mutex, **os.File) {}

// SeccompExec fails off Linux.
func SeccompExec([]string) int { return 126 }
