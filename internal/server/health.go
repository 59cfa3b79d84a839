package server

import (
	"net/http"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

func (s *Server) healthRoutes(add addFunc) {
	add("GET /healthz", false, s.healthz)
	add("GET /readyz", false, s.readyz)
	add("GET /v1/version", true, s.version)
	add("GET /v1/openapi.json", false, s.openapi)
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}

// readyz answers 200 when a default sandbox could be created now: not
// while draining, when the store does not answer (a ping, its verdict
// kept a second: drain.go), when the engine is not ready, when the
// sandbox caps (count, committed memory) are reached, or when the data
// dir is full.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) error {
	s.readyAsked.Store(true)
	if s.draining.Load() {
		return apierr.New(apierr.ShuttingDown, "the server is shutting down")
	}
	if err := s.storeReady(r.Context()); err != nil {
		return &apierr.Error{Code: apierr.StorageUnavailable, Err: err, RetryAfter: time.Second,
			Message: "the server's database does not answer"}
	}
	if s.cfg.Ready != nil {
		if err := s.cfg.Ready(r.Context()); err != nil {
			return apierr.Wrap(err, apierr.Capacity, "the engine cannot create sandboxes: %v", err)
		}
	}
	// A default sandbox's footprint, reckoned before s.mu is taken (a
	// server without an engine, as some tests build, needs none).
	var need int64
	if s.engine != nil {
		need = s.engine.Footprint(runtime.Limits{})
	}
	s.mu.Lock()
	err := s.admit(need)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if s.cfg.DataDir != "" {
		var st unix.Statfs_t
		if err := unix.Statfs(s.cfg.DataDir, &st); err != nil {
			return apierr.Wrap(err, apierr.Capacity, "the data dir cannot be read")
		}
		if free := int64(st.Bavail) * st.Bsize; free < s.cfg.MinFreeDiskBytes {
			return apierr.New(apierr.Capacity, "the data dir has %d MiB free, less than %d MiB", free>>20, s.cfg.MinFreeDiskBytes>>20)
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	return nil
}

func (s *Server) version(w http.ResponseWriter, r *http.Request) error {
	out := api.Version{Version: s.cfg.Version, Runtime: s.cfg.Runtime, Cgroups: s.cfg.Cgroups, API: "v1"}
	if s.engine != nil {
		p := s.engine.PoolStats() // the warm pool: floor, ceiling, wanted, ready, hits, misses
		out.Pool = &api.PoolStats{Size: p.Size, Max: p.Max, Wanted: p.Wanted, Nodes: p.Nodes, Ready: p.Ready, Hits: p.Hits, Misses: p.Misses}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) openapi(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/json")
	w.Write(api.OpenAPI)
	return nil
}
