// Package ui is the dashboard's built front end (web/, built by
// `make ui` into dist/), embedded so that a server needs no Node.
//
// # The dashboard
//
// `web/` (Vite, Preact with htm, TypeScript) builds into `internal/ui/dist`,
// which `internal/ui` embeds and serves under `/ui/` with a strict CSP
// (own scripts only; frames and images from data). Login (`POST /ui/login`)
// checks the key and keeps it in the server's memory under a random session
// token; the cookie carries only the token (HttpOnly, SameSite=Strict,
// Secure behind TLS). The API's authentication takes a session only together
// with the `X-Sheepfold-UI` header, which a cross-site page cannot send
// without a CORS preflight the server never grants: that is the CSRF guard.
// Every request re-checks the key, so revocation ends sessions at once; a
// server restart ends them all. The live list polls
// `GET /v1/sandboxes?usage=1` (one request for every sandbox: CPU time so far
// and memory now, sampled from the cgroups by the meter); the page derives
// CPU load from successive polls. Untrusted output is rendered as data:
// images as data URLs, an HTML result holding a table (a pandas DataFrame)
// drawn by the page from the text of its cells (parsed inert with
// `DOMParser`, at most 200 rows and 50 columns), other HTML in
// `<iframe sandbox srcdoc>` with no script, and text as a terminal shows
// it (colour escapes removed, a line rewritten with `\r` shown as it
// ended); test/ui/history.mjs checks a DataFrame's cells on a screenshot.
// The sandbox page shows the sandbox's execution history from the server
// (`GET /v1/sandboxes/{id}/executions`, newest first, 10 a page, older
// pages on demand), so code run by an SDK or the API shows as well as code
// run from the page (the E2B code-interpreter surface records its
// executions through `e2b.Backend.BeginExecution`, the same record); it reloads the first page when its event stream
// reports an `execution.finished`. The execution's record (migration 0008)
// keeps its code (up to 64 KiB) and its output as the API showed it
// (stdout and stderr up to 64 KiB each, results up to 1 MiB of JSON in
// all, the rest counted as `omitted_results`); a streamed execution's
// output is gathered as it streams. Only a sandbox's newest 50 executions
// keep their output (each write with output clears older ones), so a
// sandbox's history is bounded at about 50 MiB even at the worst; records
// go with the retention of the rest. The secrets page (`#/secrets`,
// web/src/secrets.ts) lists the account's secrets from `GET /v1/secrets`
// (version, use count, last use) and a secret's recent uses from `GET
// /v1/secrets/{name}/uses` (50 a page, older on demand): no answer it
// reads holds a value (internal/server's TestDashboardSecrets).
package ui

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed all:dist
var dist embed.FS

// Handler serves the dashboard under prefix ("/ui/"): the built files,
// and index.html for every other path (the page routes itself). Every
// answer carries a strict Content-Security-Policy: the page loads only its
// own scripts and styles, and what sandboxes produce (HTML results) is
// shown in sandboxed frames with no script.
func Handler(prefix string) http.Handler {
	files, err := fs.Sub(dist, "dist")
	if err != nil {
		panic(err) // the embed directive guarantees dist
	}
	static := http.StripPrefix(prefix, http.FileServerFS(files))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; "+
			"frame-src 'self' data: blob:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		name := strings.TrimPrefix(path.Clean("/"+strings.TrimPrefix(r.URL.Path, prefix)), "/")
		if f, err := fs.Stat(files, name); err != nil || f.IsDir() {
			h.Set("Cache-Control", "no-cache")
			http.ServeFileFS(w, r, files, "index.html")
			return
		}
		if strings.HasPrefix(name, "assets/") {
			h.Set("Cache-Control", "public, max-age=31536000, immutable") // hashed names
		}
		static.ServeHTTP(w, r)
	})
}
