package server_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// restartStore makes what a test that restarts the server keeps across
// the restart: a store (closed when t ends) with one key, owner A's, and
// the python template's rootfs.
func restartStore(t *testing.T) (rootfs string, st *sqlite.DB, key string) {
	t.Helper()
	rootfs = testutil.TemplateRootFS(t, "python")
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "sheepfold.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, key, err = auth.Create(context.Background(), st, auth.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return rootfs, st, key
}

// traversableDir is a fresh short directory that a sandbox's ids may
// traverse (0711), as the data dir is.
func traversableDir(t *testing.T) string {
	t.Helper()
	d := testutil.ShortTempDir(t)
	if err := os.Chmod(d, 0o711); err != nil {
		t.Fatal(err)
	}
	return d
}

// serveOn starts a server over st and a new runtime of rcfg, with the
// engine of scfg (its Runtime set here) and key as owner A, as `sheepfold
// serve` does; restart tests start one after another over the same store
// and data. The func returned stops it in serve's order; with
// recordStopped, the records of what still runs are marked stopped, as
// serve's shutdown does.
func serveOn(t *testing.T, st *sqlite.DB, key string, rcfg oci.Config, scfg sandbox.Config, log *slog.Logger, recordStopped bool) (*env, func()) {
	t.Helper()
	return serveWith(t, server.Config{Version: "test"}, st, key, rcfg, scfg, log, recordStopped)
}

// serveWith is serveOn with the server's Config.
func serveWith(t *testing.T, cfg server.Config, st *sqlite.DB, key string, rcfg oci.Config, scfg sandbox.Config, log *slog.Logger, recordStopped bool) (*env, func()) {
	t.Helper()
	ctx := context.Background()
	rt, err := oci.New(rcfg)
	if err != nil {
		t.Fatal(err)
	}
	scfg.Runtime, scfg.Logger = rt, log
	m, err := sandbox.New(ctx, scfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(cfg, st, m, log)
	hs := httptest.NewServer(srv)
	return &env{t: t, srv: srv, url: hs.URL, store: st, engine: m, keyA: key}, func() {
		hs.Close()
		srv.Shutdown(ctx)
		if err := m.Close(ctx); err != nil {
			t.Errorf("close the engine: %v", err)
		}
		if err := srv.Close(ctx); err != nil {
			t.Error(err)
		}
		if recordStopped {
			srv.RecordStopped(ctx)
			if _, err := st.StopAllRunning(ctx, "server shut down", time.Now()); err != nil {
				t.Error(err)
			}
		}
		if err := rt.Close(); err != nil {
			t.Errorf("close the runtime: %v", err)
		}
	}
}
