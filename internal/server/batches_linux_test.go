package server_test

import (
	"net/http"
	"testing"

	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/server"
)

// TestBatchRunc runs a batch on the real engine (runc, the python
// template) under an account cap of 2 sandboxes at once at concurrency 4:
// every item runs in a fresh sandbox (a file one item leaves in /tmp is
// never seen by another), returns len(item), and the batch ends with no
// sandbox left.
func TestBatchRunc(t *testing.T) {
	e := runcEnvWith(t, server.Config{Accounts: account.Config{Defaults: account.Limits{MaxSandboxes: 2}}})
	code := `import os
def handler(item):
    seen = os.path.exists("/tmp/batch-mark")
    open("/tmp/batch-mark", "w").close()
    if item == "boom":
        raise KeyError(item)
    return [len(item), seen]
`
	inputs := append(lenInputs(20), "boom")
	r := e.do("POST", "/v1/batches", e.keyA, map[string]any{"code": code, "inputs": inputs, "concurrency": 4})
	want(t, r, http.StatusCreated, "")
	id := r.json(t)["id"].(string)
	b := waitBatch(t, func() resp { return e.do("GET", "/v1/batches/"+id, e.keyA, nil) }, ended)
	if b["status"] != "done" || b["done"] != float64(20) || b["failed"] != float64(1) {
		t.Fatalf("ended %v", b)
	}
	res := e.batchResults(t, e.keyA, id, 100)
	for i, m := range res[:20] {
		got, _ := m["result"].([]any)
		if len(got) != 2 || got[0] != float64(i) || got[1] != false {
			t.Fatalf("item %d: %v (true: a sandbox served two items)", i, m)
		}
	}
	if errObj, _ := res[20]["error"].(map[string]any); errObj["name"] != "KeyError" {
		t.Fatalf("the failed item: %v", res[20])
	}
	waitEngineEmpty(t, e)
}
