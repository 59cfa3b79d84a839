package server

import "github.com/sheepfold/sheepfold/internal/secrets"

// Secrets is the server's secrets service, for tests to resolve a value
// as the gateway will.
func (s *Server) Secrets() *secrets.Service { return s.secrets }
