package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/server"
)

// executeWithin runs code in sandbox id through /v1 and returns how long
// it took, or an error when it did not finish within limit (the client
// then goes away, which cancels it).
func (e *env) executeWithin(key, id, code string, limit time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	b, _ := json.Marshal(map[string]any{"code": code})
	req, _ := http.NewRequestWithContext(ctx, "POST", e.url+"/v1/sandboxes/"+id+"/execute", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+key)
	start := time.Now()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, err
	}
	if res.StatusCode != http.StatusOK || !strings.Contains(string(body), `"status":"success"`) {
		return 0, fmt.Errorf("execute: %d %s", res.StatusCode, body)
	}
	return time.Since(start), nil
}

// waitRecorded waits until sandbox id has n execution records whose code
// contains code (written as each execution starts).
func (e *env) waitRecorded(t *testing.T, id, code string, n int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		recs, err := e.store.ListExecutions(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for _, r := range recs {
			if strings.Contains(r.Code, code) {
				got++
			}
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d executions of %q recorded", got, n, code)
		}
	}
}

// TestAbandonedExecutionsStop: ten executions of time.sleep(30) whose
// client goes away stop their code, on every transport that runs code
// (MCP's run_code, E2B's code interpreter, /v1 plain and streamed): the
// next execution in the same context starts at once. Before, MCP calls
// ran to their end and the next execution waited behind them (the
// report: 39.5 s). The control: while the ten callers are there, their
// code does hold the context.
func TestAbandonedExecutionsStop(t *testing.T) {
	t.Parallel()
	const sleep = "import time; time.sleep(30)"
	for _, tr := range []struct {
		name string
		req  func(e *env, sb e2bSandbox, i int) *http.Request
	}{
		{"mcp run_code", func(e *env, sb e2bSandbox, i int) *http.Request {
			body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"run_code","arguments":{"sandbox_id":%q,"code":%q}}}`, i+1, sb.ID, sleep)
			req, _ := http.NewRequest("POST", e.url+"/mcp", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+e.keyA)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			return req
		}},
		{"e2b interpreter", func(e *env, sb e2bSandbox, i int) *http.Request {
			req, _ := http.NewRequest("POST", e.url+"/execute", strings.NewReader(fmt.Sprintf(`{"code":%q}`, sleep)))
			req.Header.Set("E2b-Sandbox-Id", sb.ID)
			req.Header.Set("E2b-Sandbox-Port", "49999")
			req.Header.Set("X-Access-Token", sb.Token)
			return req
		}},
		{"v1 execute", func(e *env, sb e2bSandbox, i int) *http.Request {
			req, _ := http.NewRequest("POST", e.url+"/v1/sandboxes/"+sb.ID+"/execute", strings.NewReader(fmt.Sprintf(`{"code":%q}`, sleep)))
			req.Header.Set("Authorization", "Bearer "+e.keyA)
			return req
		}},
		{"v1 execute stream", func(e *env, sb e2bSandbox, i int) *http.Request {
			req, _ := http.NewRequest("POST", e.url+"/v1/sandboxes/"+sb.ID+"/execute", strings.NewReader(fmt.Sprintf(`{"code":%q}`, sleep)))
			req.Header.Set("Authorization", "Bearer "+e.keyA)
			req.Header.Set("Accept", "text/event-stream")
			return req
		}},
	} {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, server.Config{})
			sb := e.e2bCreate(e.keyA, map[string]any{"templateID": "base"})
			if _, err := e.executeWithin(e.keyA, sb.ID, "1", 30*time.Second); err != nil {
				t.Fatal(err) // the kernel is started
			}
			ctx, abandon := context.WithCancel(context.Background())
			defer abandon()
			done := make(chan error, 10)
			for i := range 10 {
				req := tr.req(e, sb, i).WithContext(ctx)
				go func() {
					res, err := http.DefaultClient.Do(req)
					if err == nil {
						_, err = io.ReadAll(res.Body)
						res.Body.Close()
					}
					done <- err
				}()
			}
			e.waitRecorded(t, sb.ID, sleep, 10)
			// The control: the sleeps hold the context while their callers wait.
			if d, err := e.executeWithin(e.keyA, sb.ID, "2", time.Second); err == nil {
				t.Fatalf("an execution ran in %v beside ten sleeping calls: they do not hold the context", d)
			}
			abandon()
			for range 10 {
				<-done
			}
			d, err := e.executeWithin(e.keyA, sb.ID, "3", 10*time.Second)
			if err != nil {
				t.Fatalf("the next execution after ten abandoned calls: %v", err)
			}
			if d > 3*time.Second {
				t.Fatalf("the next execution after ten abandoned calls took %v", d)
			}
			t.Logf("the next execution after ten abandoned calls took %v", d)
		})
	}
}
