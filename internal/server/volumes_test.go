package server_test

import (
	"bytes"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/metering"
	"github.com/sheepfold/sheepfold/internal/server"
)

// TestVolumesAPI: the routes of /v1/volumes and their codes; a volume
// mounted by a sandbox (/v1 and E2B's create) is not deleted; another
// account cannot see, delete or mount it (404 ERR_VOLUME_NOT_FOUND, as a
// name that does not exist).
func TestVolumesAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{Volumes: server.VolumeLimits{MaxPerAccount: 3, MaxAccountMB: 100, MaxVolumeMB: 64}})
	r := e.do("POST", "/v1/volumes", e.keyA, map[string]any{"name": "data", "size_mb": 32})
	want(t, r, http.StatusCreated, "")
	if m := r.json(t); m["name"] != "data" || m["size_mb"] != 32.0 || m["created_at"] == nil {
		t.Fatalf("created: %s", r.body)
	}
	want(t, e.do("POST", "/v1/volumes", e.keyA, map[string]any{"name": "data", "size_mb": 8}), http.StatusConflict, "ERR_CONFLICT")
	for _, bad := range []map[string]any{
		{"name": "../x"}, {"name": ""}, {"name": "-x"}, {"name": strings.Repeat("a", 65)}, {"name": "x", "size_mb": 65},
		{"name": "x", "size_mb": 1}, {"name": "x", "extra": 1},
	} {
		want(t, e.do("POST", "/v1/volumes", e.keyA, bad), http.StatusBadRequest, "ERR_BAD_REQUEST")
	}
	// The account's bounds: 100 MiB in all, 3 volumes.
	want(t, e.do("POST", "/v1/volumes", e.keyA, map[string]any{"name": "big", "size_mb": 64}), http.StatusCreated, "")
	want(t, e.do("POST", "/v1/volumes", e.keyA, map[string]any{"name": "more", "size_mb": 8}), http.StatusTooManyRequests, "ERR_STORAGE_QUOTA_EXCEEDED")
	want(t, e.do("POST", "/v1/volumes", e.keyA, map[string]any{"name": "small", "size_mb": 4}), http.StatusCreated, "")
	want(t, e.do("POST", "/v1/volumes", e.keyA, map[string]any{"name": "four", "size_mb": 4}), http.StatusTooManyRequests, "ERR_STORAGE_QUOTA_EXCEEDED")
	want(t, e.do("DELETE", "/v1/volumes/big", e.keyA, nil), http.StatusNoContent, "")
	want(t, e.do("GET", "/v1/volumes", "", nil), http.StatusUnauthorized, "ERR_AUTHENTICATION_FAILED")

	r = e.do("GET", "/v1/volumes", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	if l := r.json(t)["volumes"].([]any); len(l) != 2 || l[0].(map[string]any)["name"] != "data" || l[1].(map[string]any)["name"] != "small" {
		t.Fatalf("list: %s", r.body)
	}

	// Another account: not found, whatever it tries.
	want(t, e.do("GET", "/v1/volumes/data", e.keyB, nil), http.StatusNotFound, "ERR_VOLUME_NOT_FOUND")
	want(t, e.do("DELETE", "/v1/volumes/data", e.keyB, nil), http.StatusNotFound, "ERR_VOLUME_NOT_FOUND")
	want(t, e.do("POST", "/v1/sandboxes", e.keyB, map[string]any{"volume_mounts": []map[string]any{{"name": "data", "path": "/data"}}}),
		http.StatusNotFound, "ERR_VOLUME_NOT_FOUND")
	if r := e.e2bDo("POST", "/v2/sandboxes", e.keyB, map[string]any{"templateID": "base", "volumeMounts": []map[string]any{{"name": "data", "path": "/data"}}}); r.status != http.StatusNotFound {
		t.Fatalf("B mounts A's volume through E2B: %d %s", r.status, r.body)
	}
	if r := e.do("GET", "/v1/volumes", e.keyB, nil); r.status != 200 || string(bytes.TrimSpace(r.body)) != `{"volumes":[]}` {
		t.Fatalf("B's list: %d %s", r.status, r.body)
	}
	// B's volume of the same name is B's own.
	want(t, e.do("POST", "/v1/volumes", e.keyB, map[string]any{"name": "data", "size_mb": 8}), http.StatusCreated, "")

	// Mounts: bad paths, then one sandbox of A's.
	for _, path := range []string{"data", "/etc", "/data/../etc", "/", "/home/user"} {
		want(t, e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"volume_mounts": []map[string]any{{"name": "data", "path": path}}}),
			http.StatusBadRequest, "ERR_BAD_REQUEST")
	}
	want(t, e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"volume_mounts": []map[string]any{{"name": "nope", "path": "/data"}}}),
		http.StatusNotFound, "ERR_VOLUME_NOT_FOUND")
	id := e.create(e.keyA, map[string]any{"volume_mounts": []map[string]any{{"name": "data", "path": "/data"}}})
	spec := e.rt.Spec(id)
	if len(spec.Volumes) != 1 || spec.Volumes[0].Path != "/data" || !strings.HasPrefix(spec.Volumes[0].ID, "vol-") {
		t.Fatalf("the runtime mounts %+v", spec.Volumes)
	}
	r = e.do("GET", "/v1/volumes/data", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	if m := r.json(t); m["mounted_by"] == nil || m["mounted_by"].([]any)[0] != id || m["used_bytes"] == nil {
		t.Fatalf("get while mounted: %s", r.body)
	}
	want(t, e.do("DELETE", "/v1/volumes/data", e.keyA, nil), http.StatusConflict, "ERR_VOLUME_IN_USE")
	// A second writer, through E2B's create: refused; B's volume "data"
	// is not A's.
	if r := e.e2bDo("POST", "/v2/sandboxes", e.keyA, map[string]any{"templateID": "base", "volumeMounts": []map[string]any{{"name": "data", "path": "/mnt/data"}}}); r.status != http.StatusConflict {
		t.Fatalf("a second writer through E2B: %d %s", r.status, r.body)
	}
	sb := e.e2bCreate(e.keyB, map[string]any{"templateID": "base", "volumeMounts": []map[string]any{{"name": "data", "path": "/mnt/data"}}})
	if v := e.rt.Spec(sb.ID).Volumes; len(v) != 1 || v[0].ID == spec.Volumes[0].ID || v[0].Path != "/mnt/data" {
		t.Fatalf("B's E2B sandbox mounts %+v (A's is %s)", v, spec.Volumes[0].ID)
	}
	want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	want(t, e.do("DELETE", "/v1/volumes/data", e.keyA, nil), http.StatusNoContent, "")
	want(t, e.do("GET", "/v1/volumes/data", e.keyA, nil), http.StatusNotFound, "ERR_VOLUME_NOT_FOUND")
	want(t, e.do("POST", "/v1/sandboxes", e.keyA, map[string]any{"volume_mounts": []map[string]any{{"name": "data", "path": "/data"}}}),
		http.StatusNotFound, "ERR_VOLUME_NOT_FOUND")
}

// TestUsageVolumes: an account's volumes are metered in its usage's
// storage, at their sizes, and charged at the storage price, also for an
// account that keeps nothing else; another account is charged nothing
// for them.
func TestUsageVolumes(t *testing.T) {
	t.Parallel()
	prices := metering.Prices{StorageGBSecond: 1e6}
	e := newEnv(t, server.Config{Metering: metering.Config{SampleInterval: 20 * time.Millisecond, FlushInterval: 100 * time.Millisecond, Prices: &prices}})
	want(t, e.do("POST", "/v1/volumes", e.keyB, map[string]any{"name": "data", "size_mb": 64}), http.StatusCreated, "")
	start := time.Now()
	// A second of 64 MiB.
	const second = 64.0 / 1024
	var storage map[string]any
	for deadline := start.Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		storage = e.do("GET", "/v1/account/usage", e.keyB, nil).json(t)["storage"].(map[string]any)
		if storage["volumes_gb_seconds"].(float64) >= second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the volume was never metered a second: %v", storage)
		}
	}
	vol := storage["volumes_gb_seconds"].(float64)
	if most := second * time.Since(start.Add(-time.Second)).Seconds(); vol > most || storage["gb_seconds"].(float64) < vol ||
		storage["cost_micros"].(float64) < math.Floor(vol*1e6) {
		t.Fatalf("storage %v after %v: at most %g volume GB-seconds, all within gb_seconds and charged", storage, time.Since(start), most)
	}
	if a := e.do("GET", "/v1/account/usage", e.keyA, nil).json(t)["storage"].(map[string]any); a["volumes_gb_seconds"] != 0.0 {
		t.Fatalf("A, without volumes: %v", a)
	}
}

// TestVolumeFilesAPI: a volume's files without a sandbox: write, read,
// list, remove; "..", a missing file, a directory; another account's
// volume is not found; no write while a sandbox writes the volume.
func TestVolumeFilesAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{MaxUploadBytes: 1 << 10})
	want(t, e.do("POST", "/v1/volumes", e.keyA, map[string]any{"name": "data", "size_mb": 8}), http.StatusCreated, "")
	base := "/v1/volumes/data/files"
	r := e.do("PUT", base+"?path=/in/a.txt", e.keyA, "hello")
	want(t, r, http.StatusCreated, "")
	if m := r.json(t); m["path"] != "/in/a.txt" || m["size"] != 5.0 || m["type"] != "file" {
		t.Fatalf("write: %s", r.body)
	}
	if r = e.do("GET", base+"?path=in/a.txt", e.keyA, nil); r.status != 200 || string(r.body) != "hello" {
		t.Fatalf("read: %d %q", r.status, r.body)
	}
	// ".." stays in the volume: /../../in/a.txt is /in/a.txt.
	if r = e.do("GET", base+"?path=/../../in/a.txt", e.keyA, nil); r.status != 200 || string(r.body) != "hello" {
		t.Fatalf("read through ..: %d %q", r.status, r.body)
	}
	want(t, e.do("GET", base+"?path=/../../etc/passwd", e.keyA, nil), http.StatusNotFound, "ERR_NOT_FOUND")
	want(t, e.do("GET", base+"?path=/in", e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("GET", base, e.keyA, nil), http.StatusBadRequest, "ERR_BAD_REQUEST")
	want(t, e.do("PUT", base+"?path=/big", e.keyA, strings.Repeat("x", 2<<10)), http.StatusRequestEntityTooLarge, "ERR_FILE_TOO_LARGE")
	r = e.do("GET", base+"/list?path=/in", e.keyA, nil)
	want(t, r, http.StatusOK, "")
	if l := r.json(t)["entries"].([]any); len(l) != 1 || l[0].(map[string]any)["name"] != "a.txt" {
		t.Fatalf("list: %s", r.body)
	}
	want(t, e.do("DELETE", base+"?path=/in", e.keyA, nil), http.StatusConflict, "ERR_CONFLICT")

	// Another account.
	want(t, e.do("GET", base+"?path=/in/a.txt", e.keyB, nil), http.StatusNotFound, "ERR_VOLUME_NOT_FOUND")
	want(t, e.do("PUT", base+"?path=/x", e.keyB, "x"), http.StatusNotFound, "ERR_VOLUME_NOT_FOUND")
	want(t, e.do("GET", base+"/list", e.keyB, nil), http.StatusNotFound, "ERR_VOLUME_NOT_FOUND")
	want(t, e.do("DELETE", base+"?path=/in/a.txt", e.keyB, nil), http.StatusNotFound, "ERR_VOLUME_NOT_FOUND")

	// A sandbox writes it: the file API reads but does not write.
	id := e.create(e.keyA, map[string]any{"volume_mounts": []map[string]any{{"name": "data", "path": "/data"}}})
	want(t, e.do("PUT", base+"?path=/in/b.txt", e.keyA, "x"), http.StatusConflict, "ERR_VOLUME_IN_USE")
	want(t, e.do("DELETE", base+"?path=/in/a.txt", e.keyA, nil), http.StatusConflict, "ERR_VOLUME_IN_USE")
	if r = e.do("GET", base+"?path=/in/a.txt", e.keyA, nil); r.status != 200 {
		t.Fatalf("read while mounted: %d %s", r.status, r.body)
	}
	want(t, e.do("DELETE", "/v1/sandboxes/"+id, e.keyA, nil), http.StatusNoContent, "")
	want(t, e.do("DELETE", base+"?path=/in/a.txt", e.keyA, nil), http.StatusNoContent, "")
	want(t, e.do("DELETE", base+"?path=/in", e.keyA, nil), http.StatusNoContent, "")
	want(t, e.do("GET", base+"?path=/in/a.txt", e.keyA, nil), http.StatusNotFound, "ERR_NOT_FOUND")
}

// TestE2BVolumes: E2B's Volume API over the account's volumes: create,
// list, get, mount by name, no delete while mounted, another account's
// not found.
func TestE2BVolumes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{Volumes: server.VolumeLimits{DefaultMB: 8}})
	r := e.e2bDo("POST", "/volumes", e.keyA, map[string]any{"name": "e2b-data"})
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	if m := r.json(t); m["volumeID"] != "e2b-data" || m["name"] != "e2b-data" {
		t.Fatalf("create: %s", r.body)
	}
	if r := e.e2bDo("POST", "/volumes", e.keyA, map[string]any{"name": "e2b-data"}); r.status != http.StatusConflict {
		t.Fatalf("create twice: %d %s", r.status, r.body)
	}
	if r := e.e2bDo("GET", "/volumes", e.keyA, nil); r.status != 200 || string(bytes.TrimSpace(r.body)) != `[{"volumeID":"e2b-data","name":"e2b-data"}]` {
		t.Fatalf("list: %d %s", r.status, r.body)
	}
	if r := e.do("GET", "/v1/volumes/e2b-data", e.keyA, nil); r.status != 200 || r.json(t)["size_mb"] != 8.0 {
		t.Fatalf("the same volume through /v1: %d %s", r.status, r.body)
	}
	for _, m := range []string{"GET", "DELETE"} {
		if r := e.e2bDo(m, "/volumes/e2b-data", e.keyB, nil); r.status != http.StatusNotFound {
			t.Fatalf("%s of another account's volume: %d %s", m, r.status, r.body)
		}
	}
	if r := e.e2bDo("GET", "/volumes", e.keyB, nil); r.status != 200 || string(bytes.TrimSpace(r.body)) != `[]` {
		t.Fatalf("B's list: %d %s", r.status, r.body)
	}
	sb := e.e2bCreate(e.keyA, map[string]any{"templateID": "base", "volumeMounts": []map[string]any{{"name": "e2b-data", "path": "/mnt/data"}}})
	if r := e.e2bDo("GET", "/sandboxes/"+sb.ID, e.keyA, nil); r.status != 200 || !bytes.Contains(r.body, []byte(`"volumeMounts":[{"name":"e2b-data","path":"/mnt/data"}]`)) {
		t.Fatalf("the sandbox's detail: %d %s", r.status, r.body)
	}
	if r := e.e2bDo("DELETE", "/volumes/e2b-data", e.keyA, nil); r.status != http.StatusConflict {
		t.Fatalf("delete while mounted: %d %s", r.status, r.body)
	}
	if r := e.e2bDo("DELETE", "/sandboxes/"+sb.ID, e.keyA, nil); r.status != http.StatusNoContent {
		t.Fatalf("kill: %d %s", r.status, r.body)
	}
	if r := e.e2bDo("GET", "/volumes/e2b-data", e.keyA, nil); r.status != 200 {
		t.Fatalf("get: %d %s", r.status, r.body)
	}
	if r := e.e2bDo("DELETE", "/volumes/e2b-data", e.keyA, nil); r.status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	if r := e.e2bDo("GET", "/volumes/e2b-data", e.keyA, nil); r.status != http.StatusNotFound {
		t.Fatalf("get after the delete: %d %s", r.status, r.body)
	}
}

// TestVolumeUnmeasured: on a runtime that cannot measure its volumes
// (Kubernetes' claims) a volume's GET leaves used_bytes and total_bytes
// out instead of failing; the control, a measured one, has them.
func TestVolumeUnmeasured(t *testing.T) {
	e := newEnv(t, server.Config{})
	want(t, e.do("POST", "/v1/volumes", e.keyA, map[string]any{"name": "data", "size_mb": 16}), http.StatusCreated, "")
	r := e.do("GET", "/v1/volumes/data", e.keyA, nil)
	if m := r.json(t); r.status != http.StatusOK || m["used_bytes"] == nil || m["total_bytes"] == nil {
		t.Fatalf("control, measured: %d %s", r.status, r.body)
	}
	e.rt.VolumesUnmeasured.Store(true)
	r = e.do("GET", "/v1/volumes/data", e.keyA, nil)
	if m := r.json(t); r.status != http.StatusOK || m["used_bytes"] != nil || m["total_bytes"] != nil || m["name"] != "data" {
		t.Fatalf("unmeasured: %d %s", r.status, r.body)
	}
}
