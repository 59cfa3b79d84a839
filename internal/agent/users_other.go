//go:build !linux

package agent

import "github.com/sheepfold/sheepfold/internal/agentproto"

// asFileUser: elsewhere file operations are refused anyway.
func (s *server) asFileUser(_ *agentproto.Request, fn func() agentproto.Event) agentproto.Event {
	return fn()
}

// contextDir: elsewhere kernels start where they are told or fail.
func (s *server) contextDir(string) *agentproto.Event { return nil }
