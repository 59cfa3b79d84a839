// Package ui is the dashboard's built front end (web/, built by
// `make ui` into dist/), embedded so that a server needs no Node.
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
