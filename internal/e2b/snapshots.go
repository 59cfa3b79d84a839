package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// E2B's snapshots and forks, on the server's (internal/server,
// snapshots.go and fork.go).
//
// E2B keeps a snapshot as a template: createSnapshot answers its id
// (snapshotID, a template name with a tag), Sandbox.create(snapshotID)
// starts a sandbox from it, listSnapshots lists them and deleteSnapshot
// deletes the template (DELETE /templates/{id}). Here a snapshot is named
// per account; its name is its id, and E2B's namespace and tag
// ("team/name:v1") are dropped from a name given. A create whose
// templateID names one of the account's snapshots starts from it (the
// snapshot wins over a template of the same name); fork answers one
// entry per fork, each with its sandbox (the forks start all or none).

// SnapshotBackend is implemented by backends that keep snapshots and
// fork sandboxes; without it the routes are not served.
type SnapshotBackend interface {
	// Snapshot saves owner's running sandbox id under name and returns
	// the name.
	Snapshot(ctx context.Context, owner, id, name string) (string, error)
	// Snapshots lists owner's snapshot names, those of sandbox id alone
	// when it is not "".
	Snapshots(ctx context.Context, owner, id string) ([]string, error)
	// DeleteSnapshot deletes owner's snapshot name.
	DeleteSnapshot(ctx context.Context, owner, name string) error
	// Fork makes count forks of owner's sandbox id, each living
	// timeout, with origin.
	Fork(ctx context.Context, owner, id string, count int, timeout time.Duration, origin Origin) ([]*sandbox.Sandbox, error)
}

// SnapshotName is E2B's snapshot or template id as a snapshot name here:
// its namespace ("team/") and tag (":v1") dropped.
func SnapshotName(id string) string {
	if i := strings.LastIndexByte(id, '/'); i >= 0 {
		id = id[i+1:]
	}
	if i := strings.IndexByte(id, ':'); i >= 0 {
		id = id[:i]
	}
	return id
}

// snapshotInfoJSON is E2B's SnapshotInfo.
type snapshotInfoJSON struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

// forkResultJSON is E2B's SandboxForkResult.
type forkResultJSON struct {
	Sandbox *sandboxJSON `json:"sandbox,omitempty"`
}

// maxForks bounds one fork's count (the server's bound too).
const maxForks = 8

func (h *Handler) snapshotRoutes(add func(string, func(http.ResponseWriter, *http.Request, string) error)) {
	sb, ok := h.backend.(SnapshotBackend)
	if !ok {
		return
	}
	add("POST /sandboxes/{id}/snapshots", func(w http.ResponseWriter, r *http.Request, owner string) error {
		var req struct {
			Name string `json:"name"`
		}
		if err := decodeBody(r, &req); err != nil {
			return err
		}
		name := SnapshotName(req.Name)
		if name == "" {
			var b [6]byte
			_, _ = rand.Read(b[:])
			name = "snapshot-" + hex.EncodeToString(b[:])
		}
		name, err := sb.Snapshot(context.WithoutCancel(r.Context()), owner, r.PathValue("id"), name)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusCreated, snapshotInfoJSON{SnapshotID: name, Names: []string{name}})
		return nil
	})
	add("GET /snapshots", func(w http.ResponseWriter, r *http.Request, owner string) error {
		names, err := sb.Snapshots(r.Context(), owner, r.URL.Query().Get("sandboxID"))
		if err != nil {
			return err
		}
		want := SnapshotName(r.URL.Query().Get("name"))
		out := []snapshotInfoJSON{}
		for _, n := range names {
			if want == "" || n == want {
				out = append(out, snapshotInfoJSON{SnapshotID: n, Names: []string{n}})
			}
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	})
	add("DELETE /templates/{id}", func(w http.ResponseWriter, r *http.Request, owner string) error {
		if err := sb.DeleteSnapshot(r.Context(), owner, SnapshotName(r.PathValue("id"))); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
	add("POST /sandboxes/{id}/fork", func(w http.ResponseWriter, r *http.Request, owner string) error {
		var req struct {
			Count   *int   `json:"count"`
			Timeout *int64 `json:"timeout"`
		}
		if err := decodeBody(r, &req); err != nil {
			return err
		}
		count, timeout := 1, defaultTimeoutV1
		if req.Count != nil {
			count = *req.Count
		}
		if count < 1 || count > maxForks {
			return badRequest("count must be 1 to %d", maxForks)
		}
		if req.Timeout != nil {
			d, err := h.timeoutOf("timeout", *req.Timeout)
			if err != nil {
				return err
			}
			timeout = d
		}
		parent, err := h.backend.Sandbox(r.Context(), owner, r.PathValue("id"))
		if err != nil {
			return err
		}
		h.mu.Lock()
		origin := Origin{Alias: h.aliases[parent.ID], PublicTraffic: h.traffic[parent.ID]}
		h.mu.Unlock()
		made, err := sb.Fork(context.WithoutCancel(r.Context()), owner, parent.ID, count, timeout, origin)
		if err != nil {
			return err
		}
		out := make([]forkResultJSON, 0, len(made))
		for _, f := range made {
			h.Adopted(f.ID, origin)
			go h.watchMetrics(f)
			j := h.sandboxOf(r.Context(), f)
			out = append(out, forkResultJSON{Sandbox: &j})
		}
		writeJSON(w, http.StatusCreated, out)
		return nil
	})
}
