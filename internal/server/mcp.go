package server

import (
	"context"
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
// policies (the POST holds the caller's stream, conns.go; its tools'
// calls hold none of their own).
//
// A tool's calls end with the POST that asked for them: when its client
// goes away, their requests are canceled as a REST client's would be, so
// an abandoned run_code stops its code. The MCP SDK itself gives a tool's
// handler a context that outlives the POST (PropagateRequestCancellation
// covers only the newest protocol), and waits for the handler before it
// returns. A drain's cut (drain.go) cuts the tools' calls but not the
// POST, which the SDK would end without their answers: the calls end
// with ERR_SHUTTING_DOWN, and the POST with those answers.
func (s *Server) mcpRoutes(add addFunc) {
	h := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		post := r.Context()
		inner := http.HandlerFunc(func(w http.ResponseWriter, ir *http.Request) {
			ctx, cancel := context.WithCancelCause(withInProcess(ir.Context()))
			defer cancel(nil)
			stop := context.AfterFunc(post, func() { cancel(context.Cause(post)) })
			defer stop()
			stopCut := context.AfterFunc(s.base, func() { cancel(context.Cause(s.base)) })
			defer stopCut()
			s.ServeHTTP(w, ir.WithContext(ctx))
		})
		hc := &http.Client{Transport: mcpserver.Transport{Handler: inner, Logger: s.log}}
		return mcpserver.New(client.New("http://sheepfold.internal", auth.FromRequest(r), client.WithHTTPClient(hc)), s.cfg.Version)
	}, &mcp.StreamableHTTPOptions{Stateless: true, Logger: s.log, MaxRequestBodyBytes: maxJSONBody,
		PropagateRequestCancellation: true,
		// The SDK's DNS-rebinding guard refuses a loopback connection
		// whose Host is another name: that is every deployment behind a
		// local reverse proxy. Rebinding gains a page nothing here: each
		// request needs the caller's API key, which a page cannot read.
		DisableLocalhostProtection: true})
	add("POST /mcp", true, func(w http.ResponseWriter, r *http.Request) error {
		ctx, cancel := context.WithCancelCause(context.WithoutCancel(r.Context()))
		defer cancel(nil)
		stop := context.AfterFunc(r.Context(), func() {
			if clientGone(r.Context()) {
				cancel(context.Cause(r.Context()))
			}
		})
		defer stop()
		h.ServeHTTP(w, r.WithContext(ctx))
		return nil
	})
}
