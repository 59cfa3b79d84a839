package server

import (
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/mcpserver"
)

// mcpRoutes serves Sheepfold's MCP tools over streamable HTTP at /mcp
// (stateless: each POST is a whole exchange, so no MCP session outlives
// the key that opened it). The tools call this server in process with the
// caller's own key: each MCP message counts as a request, and each API
// call a tool makes counts as one more, under the caller's limits and
// policies.
func (s *Server) mcpRoutes(add addFunc) {
	h := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		hc := &http.Client{Transport: mcpserver.Transport{Handler: http.HandlerFunc(s.ServeHTTP), Logger: s.log}}
		return mcpserver.New(client.New("http://sheepfold.internal", auth.FromRequest(r), client.WithHTTPClient(hc)), s.cfg.Version)
	}, &mcp.StreamableHTTPOptions{Stateless: true, Logger: s.log, MaxRequestBodyBytes: maxJSONBody,
		// The SDK's DNS-rebinding guard refuses a loopback connection
		// whose Host is another name: that is every deployment behind a
		// local reverse proxy. Rebinding gains a page nothing here: each
		// request needs the caller's API key, which a page cannot read.
		DisableLocalhostProtection: true})
	add("POST /mcp", true, func(w http.ResponseWriter, r *http.Request) error {
		h.ServeHTTP(w, r)
		return nil
	})
}
