//go:build !linux

package agent

import "github.com/sheepfold/sheepfold/internal/agentproto"

func (s *server) fileWatch(*conn, *agentproto.Request) agentproto.Event { return unsupported() }
