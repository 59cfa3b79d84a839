//go:build !linux

package agent

import (
	"log/slog"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// The agent runs in Linux sandboxes only. Elsewhere the package builds (so
// that its callers' tests build anywhere) and refuses processes and files.

type fileSystem struct{}

func openFileSystem(root, home string) (*fileSystem, error) { return &fileSystem{}, nil }

func (*fileSystem) Close() error { return nil }

type processTable struct{}

func newProcessTable() *processTable { return &processTable{} }

func (*processTable) closeAll(*slog.Logger) {}

func unsupported() agentproto.Event {
	return fail(agentproto.CodeUnsupported, "processes and files need Linux")
}

func (s *server) processStart(*conn, *agentproto.Request) agentproto.Event   { return unsupported() }
func (s *server) processConnect(*conn, *agentproto.Request) agentproto.Event { return unsupported() }
func (s *server) processInput(*agentproto.Request) agentproto.Event          { return unsupported() }
func (s *server) processSignal(*agentproto.Request) agentproto.Event         { return unsupported() }
func (s *server) processResize(*agentproto.Request) agentproto.Event         { return unsupported() }
func (s *server) processList() agentproto.Event                              { return unsupported() }
func (s *server) fileRead(*conn, *agentproto.Request) agentproto.Event       { return unsupported() }
func (s *server) fileWrite(*conn, *agentproto.Request) agentproto.Event      { return unsupported() }
func (s *server) fileList(*agentproto.Request) agentproto.Event              { return unsupported() }
func (s *server) fileStat(*agentproto.Request) agentproto.Event              { return unsupported() }
func (s *server) fileMkdir(*agentproto.Request) agentproto.Event             { return unsupported() }
func (s *server) fileRemove(*agentproto.Request) agentproto.Event            { return unsupported() }
func (s *server) fileMove(*agentproto.Request) agentproto.Event              { return unsupported() }

// serveSudo: sudo exists inside Linux sandboxes only.
func (s *server) serveSudo() {}
