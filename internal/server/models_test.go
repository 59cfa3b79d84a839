package server_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/llm"
	"github.com/sheepfold/sheepfold/internal/llm/llmtest"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
)

// newModelEnv starts a server whose models are served by a scripted
// provider: "small" (cheap, no quota) and "big" (with quota and fallback
// when fallback is set).
func newModelEnv(t *testing.T, quota int64, fallback bool, cfg server.Config, opts ...func(*sandbox.Config)) (*env, *llmtest.Server) {
	t.Helper()
	prov := llmtest.New(nil)
	t.Cleanup(prov.Close)
	prov.RequireKey("sk-provider")
	ps := []llm.Provider{
		{Name: "cheap", BaseURL: prov.URL, APIKeyEnv: "K", Models: []string{"small"}, PriceInputPerMTok: 0.1, PriceOutputPerMTok: 0.2},
		{Name: "dear", BaseURL: prov.URL, APIKeyEnv: "K", Models: []string{"big"}, PriceInputPerMTok: 1000, PriceOutputPerMTok: 2000,
			MonthlyTokenQuota: quota, TimeoutSeconds: 2, MaxRetries: -1},
	}
	if fallback {
		ps[1].QuotaFallbackModel = "small"
	}
	relay, err := llm.New(ps, func(string) string { return "sk-provider" })
	if err != nil {
		t.Fatal(err)
	}
	relay.SetBackoff(time.Millisecond)
	cfg.Models = relay
	return newEnv(t, cfg, opts...), prov
}

const chatBody = `{"model":"big","messages":[{"role":"user","content":"hi"}]}`

func TestChatCompletionsRelay(t *testing.T) {
	e, prov := newModelEnv(t, 0, false, server.Config{})
	prov.Push(llmtest.Reply{Content: "hello there", Usage: &llm.Usage{PromptTokens: 100, CompletionTokens: 50}})
	r := e.do("POST", "/v1/chat/completions", e.keyA, chatBody)
	want(t, r, 200, "")
	m := r.json(t)
	if got := m["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"]; got != "hello there" {
		t.Fatalf("content %v", got)
	}
	got := prov.Requests()[0]
	if got.Header.Get("Authorization") != "Bearer sk-provider" || string(got.Raw) != chatBody {
		t.Fatalf("provider got %q with %q", got.Raw, got.Header.Get("Authorization"))
	}

	// The tokens show in the usage report, per model.
	u := e.do("GET", "/v1/account/usage", e.keyA, nil).json(t)
	if u["tokens_used"] != 150.0 {
		t.Fatalf("tokens_used %v in %v", u["tokens_used"], u)
	}
	models := u["models"].([]any)
	if len(models) != 1 || models[0].(map[string]any)["model"] != "big" || models[0].(map[string]any)["cost_micros"] != 200000.0 {
		t.Fatalf("models %v", models)
	}
	// Another account sees none of them.
	if u := e.do("GET", "/v1/account/usage", e.keyB, nil).json(t); u["tokens_used"] != 0.0 {
		t.Fatalf("B's tokens %v", u["tokens_used"])
	}

	// Errors.
	want(t, e.do("POST", "/v1/chat/completions", e.keyA, `{"model":"nope","messages":[]}`), 404, "ERR_MODEL_NOT_FOUND")
	want(t, e.do("POST", "/v1/chat/completions", e.keyA, `{"messages":[]}`), 400, "ERR_BAD_REQUEST")
	want(t, e.do("POST", "/v1/chat/completions", "", chatBody), 401, "ERR_AUTHENTICATION_FAILED")
	prov.Push(llmtest.Reply{Status: 500, ErrorMessage: "boom"})
	want(t, e.do("POST", "/v1/chat/completions", e.keyA, chatBody), 502, "ERR_PROVIDER")
	prov.Push(llmtest.Reply{Hang: true})
	start := time.Now()
	want(t, e.do("POST", "/v1/chat/completions", e.keyA, chatBody), 504, "ERR_PROVIDER_TIMEOUT")
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("a hanging provider took %s", d)
	}
	// The relay still works afterwards.
	want(t, e.do("POST", "/v1/chat/completions", e.keyA, chatBody), 200, "")

	// GET /v1/models.
	lm := e.do("GET", "/v1/models", e.keyA, nil).json(t)
	data := lm["data"].([]any)
	if lm["object"] != "list" || len(data) != 2 || data[0].(map[string]any)["id"] != "big" || data[0].(map[string]any)["owned_by"] != "dear" {
		t.Fatalf("models %v", lm)
	}
}

func TestChatCompletionsStream(t *testing.T) {
	e, prov := newModelEnv(t, 0, false, server.Config{})
	prov.Push(llmtest.Reply{Content: "a b c d e f", Usage: &llm.Usage{PromptTokens: 3, CompletionTokens: 4}})
	r := e.do("POST", "/v1/chat/completions", e.keyA, `{"model":"small","stream":true,"messages":[]}`)
	want(t, r, 200, "")
	if ct := r.header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	body := string(r.body)
	if !strings.HasSuffix(body, "data: [DONE]\n\n") || strings.Contains(body, `"usage"`) {
		t.Fatalf("stream %s", body)
	}
	if u := e.do("GET", "/v1/account/usage", e.keyA, nil).json(t); u["tokens_used"] != 7.0 {
		t.Fatalf("tokens_used %v", u["tokens_used"])
	}
	// A stream the provider drops mid-way ends with an error event.
	prov.Push(llmtest.Reply{Content: "a b c d e f g h i j k l", DropAfter: 2})
	r = e.do("POST", "/v1/chat/completions", e.keyA, `{"model":"small","stream":true,"messages":[]}`)
	if !strings.Contains(string(r.body), `"code":"ERR_PROVIDER"`) || strings.Contains(string(r.body), "[DONE]") {
		t.Fatalf("dropped stream gave %s", r.body)
	}
	// A stream that stalls mid-way ends with a timeout event within the
	// provider's timeout (2 s for "big"), and the relay works afterwards.
	prov.Push(llmtest.Reply{Content: "a b c d e f g h i j k l", StallAfter: 2})
	start := time.Now()
	r = e.do("POST", "/v1/chat/completions", e.keyA, `{"model":"big","stream":true,"messages":[]}`)
	if !strings.Contains(string(r.body), `"code":"ERR_PROVIDER_TIMEOUT"`) || !strings.Contains(string(r.body), "sent nothing for 2s") ||
		strings.Contains(string(r.body), "[DONE]") {
		t.Fatalf("stalled stream gave %s", r.body)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("a stalled stream took %s", d)
	}
	prov.Push(llmtest.Text("again"))
	r = e.do("POST", "/v1/chat/completions", e.keyA, `{"model":"big","stream":true,"messages":[]}`)
	if !strings.HasSuffix(string(r.body), "data: [DONE]\n\n") || !strings.Contains(string(r.body), "again") {
		t.Fatalf("after the failures: %s", r.body)
	}
}

func TestModelQuota(t *testing.T) {
	e, prov := newModelEnv(t, 100, false, server.Config{})
	prov.Push(llmtest.Reply{Content: "x", Usage: &llm.Usage{PromptTokens: 90, CompletionTokens: 20}})
	want(t, e.do("POST", "/v1/chat/completions", e.keyA, chatBody), 200, "")
	r := e.do("POST", "/v1/chat/completions", e.keyA, chatBody)
	want(t, r, 429, "ERR_SESSION_QUOTA_EXCEEDED")
	if msg := r.json(t)["error"].(map[string]any)["message"]; msg != "Monthly quota exceeded for model big" {
		t.Fatalf("message %q", msg)
	}
	// The quota is per account: B still may.
	want(t, e.do("POST", "/v1/chat/completions", e.keyB, chatBody), 200, "")
	if n := len(prov.Requests()); n != 2 {
		t.Fatalf("the provider saw %d requests, want 2 (the refused one never reaches it)", n)
	}
}

func TestModelQuotaFallback(t *testing.T) {
	e, prov := newModelEnv(t, 10, true, server.Config{})
	prov.Push(llmtest.Reply{Content: "x", Usage: &llm.Usage{PromptTokens: 10, CompletionTokens: 1}})
	want(t, e.do("POST", "/v1/chat/completions", e.keyA, chatBody), 200, "")
	r := e.do("POST", "/v1/chat/completions", e.keyA, chatBody)
	want(t, r, 200, "")
	if r.header.Get("Sheepfold-Model-Fallback") != "small" {
		t.Fatalf("no fallback header: %v", r.header)
	}
	if reqs := prov.Requests(); !strings.Contains(string(reqs[1].Raw), `"model":"small"`) {
		t.Fatalf("the provider got %s", reqs[1].Raw)
	}
}

func TestModelCostDeductedFromCredits(t *testing.T) {
	e, prov := newModelEnv(t, 0, false, server.Config{
		Accounts: account.Config{FreeCreditsMicros: 5_000_000, EnforceCredits: true, CreditsGrace: time.Minute, CreditsLowMicros: 1},
	})
	admin := e.adminKey()
	want(t, e.do("POST", "/v1/admin/accounts", admin, map[string]any{"name": "tokens"}), 201, "")
	r := e.do("POST", "/v1/admin/keys", admin, map[string]any{"account": "tokens"})
	want(t, r, 201, "")
	key := r.json(t)["key"].(string)
	prov.Push(llmtest.Reply{Content: "x", Usage: &llm.Usage{PromptTokens: 1000, CompletionTokens: 2000}}) // 1000*1000 + 2000*2000 micros = 5.0
	want(t, e.do("POST", "/v1/chat/completions", key, chatBody), 200, "")
	c := e.do("GET", "/v1/account/credits", key, nil).json(t)
	if c["available_micros"] != 0.0 {
		t.Fatalf("credits %v", c)
	}
	want(t, e.do("POST", "/v1/chat/completions", key, chatBody), 429, "ERR_SESSION_QUOTA_EXCEEDED")
}

// TestOpenAIGoClient drives /v1 with the official Go client, unchanged.
func TestOpenAIGoClient(t *testing.T) {
	e, prov := newModelEnv(t, 0, false, server.Config{})
	ctx := context.Background()
	c := openai.NewClient(option.WithAPIKey(e.keyA), option.WithBaseURL(e.url+"/v1/"), option.WithMaxRetries(0))

	prov.Push(llmtest.Text("plain answer"))
	res, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "small", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Choices[0].Message.Content != "plain answer" {
		t.Fatalf("content %q", res.Choices[0].Message.Content)
	}

	// Tool calls, streamed, accumulated by the client.
	prov.Push(llmtest.RunCode("print(6*7)"))
	st := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model: "small", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("compute")},
		Tools: []openai.ChatCompletionToolParam{{Function: openai.FunctionDefinitionParam{Name: "run_code",
			Parameters: openai.FunctionParameters{"type": "object", "properties": map[string]any{"code": map[string]any{"type": "string"}}}}}},
	})
	var acc openai.ChatCompletionAccumulator
	for st.Next() {
		acc.AddChunk(st.Current())
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	calls := acc.Choices[0].Message.ToolCalls
	if len(calls) != 1 || calls[0].Function.Name != "run_code" || !strings.Contains(calls[0].Function.Arguments, `print(6*7)`) {
		t.Fatalf("tool calls %+v", calls)
	}
	if got := prov.Requests()[1]; !strings.Contains(string(got.Raw), `"tools"`) {
		t.Fatalf("the tools did not reach the provider: %s", got.Raw)
	}

	page, err := c.Models.List(ctx)
	if err != nil || len(page.Data) != 2 || page.Data[1].ID != "small" {
		t.Fatalf("models %+v, %v", page, err)
	}

	// Errors arrive as the client's API errors, with our code.
	_, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "missing",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || !strings.Contains(apiErr.RawJSON(), "ERR_MODEL_NOT_FOUND") {
		t.Fatalf("err = %v", err)
	}

	// A stream dropped mid-way is an error in the client, not a hang or a
	// short answer taken for a whole one.
	prov.Push(llmtest.Reply{Content: "a b c d e f g h i j k l", DropAfter: 2})
	st = c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "small",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	for st.Next() {
	}
	if err := st.Err(); err == nil || !strings.Contains(err.Error(), "ended the stream before it was complete") {
		t.Fatalf("dropped stream: err = %v", err)
	}
}

// tokensUsed is the account's tokens_used once it is at least min (the
// relay meters a call as its handler ends, which may be after the client
// has gone).
func (e *env) tokensUsed(t *testing.T, key string, min float64) float64 {
	t.Helper()
	var used float64
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if used, _ = e.do("GET", "/v1/account/usage", key, nil).json(t)["tokens_used"].(float64); used >= min {
			break
		}
	}
	return used
}

// TestChatStreamCutIsMetered: the client reads a few chunks of a stream
// and hangs up before the provider's usage chunk (the last one). The
// relay meters what it delivered: the prompt's estimate and a token a
// chunk at least. Control: the same stream read to its end is metered as
// the provider reports it.
func TestChatStreamCutIsMetered(t *testing.T) {
	t.Parallel()
	e, prov := newModelEnv(t, 0, false, server.Config{})
	full := llm.Usage{PromptTokens: 5000, CompletionTokens: 9000}
	text := strings.Repeat("token ", 80)
	const req = `{"model":"small","stream":true,"messages":[{"role":"user","content":"tell me everything"}]}`

	prov.Push(llmtest.Reply{Content: text, Usage: &full})
	want(t, e.do("POST", "/v1/chat/completions", e.keyA, req), 200, "")
	if used := e.tokensUsed(t, e.keyA, 14000); used != 14000 {
		t.Fatalf("the whole stream metered %v tokens, want the provider's 14000", used)
	}

	prov.Push(llmtest.Reply{Content: text, Usage: &full, StallAfter: 5}) // the role chunk and four of text, then nothing
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hr, _ := http.NewRequestWithContext(ctx, "POST", e.url+"/v1/chat/completions", strings.NewReader(req))
	hr.Header.Set("Authorization", "Bearer "+e.keyB)
	res, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(res.Body)
	data := 0
	for data < 3 && sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			data++
		}
	}
	cancel() // the client hangs up mid-stream
	res.Body.Close()
	if data != 3 {
		t.Fatalf("read %d chunks", data)
	}
	used := e.tokensUsed(t, e.keyB, float64(len(req)/4+2))
	if used < float64(len(req)/4+2) || used >= 14000 {
		t.Fatalf("a stream cut after 2 chunks of text metered %v tokens", used)
	}
	t.Logf("the cut stream metered %v tokens", used)
}

// concurrently makes n calls of body at once against a provider that
// holds every call until all n are either waiting at it or refused, and
// returns the statuses.
func concurrently(t *testing.T, e *env, prov *llmtest.Server, key, body string, n int, reply llmtest.Reply) []int {
	t.Helper()
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	t.Cleanup(open)
	before := len(prov.Requests())
	prov.SetHandler(func(llmtest.Request) llmtest.Reply { <-release; return reply })
	done := make(chan int, n)
	for range n {
		go func() {
			hr, _ := http.NewRequest("POST", e.url+"/v1/chat/completions", strings.NewReader(body))
			hr.Header.Set("Authorization", "Bearer "+key)
			res, err := http.DefaultClient.Do(hr)
			if err != nil {
				done <- 0
				return
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			done <- res.StatusCode
		}()
	}
	var statuses []int
	for deadline := time.Now().Add(10 * time.Second); len(prov.Requests())-before+len(statuses) < n; {
		if time.Now().After(deadline) {
			t.Fatalf("of %d calls, %d reached the provider and %d were answered", n, len(prov.Requests())-before, len(statuses))
		}
		select {
		case st := <-done:
			statuses = append(statuses, st)
		case <-time.After(5 * time.Millisecond):
		}
	}
	open()
	for len(statuses) < n {
		statuses = append(statuses, <-done)
	}
	return statuses
}

func count(statuses []int, status int) int {
	n := 0
	for _, s := range statuses {
		if s == status {
			n++
		}
	}
	return n
}

// TestModelQuotaConcurrent: a quota of 100 tokens admits two calls of 50
// (max_tokens 40 and a prompt of about 10), one after the other. Ten at
// once: at most two pass, the rest are refused before reaching the
// provider. Control: the same ten calls of a model without a quota all
// reach the provider at once and pass.
func TestModelQuotaConcurrent(t *testing.T) {
	t.Parallel()
	e, prov := newModelEnv(t, 100, false, server.Config{})
	const big = `{"model":"big","max_tokens":40,"messages":[]}` // a prompt of 11 tokens by the estimate
	reply := llmtest.Reply{Content: "x", Usage: &llm.Usage{PromptTokens: 10, CompletionTokens: 40}}

	st := concurrently(t, e, prov, e.keyB, strings.Replace(big, "big", "small", 1), 10, reply)
	if count(st, 200) != 10 {
		t.Fatalf("control: the model without a quota answered %v", st)
	}

	st = concurrently(t, e, prov, e.keyA, big, 10, reply)
	if ok, refused := count(st, 200), count(st, 429); ok > 2 || ok+refused != 10 {
		t.Fatalf("ten concurrent calls under a quota of two: %v", st)
	}
	if used := e.tokensUsed(t, e.keyA, 100); used > 100 {
		t.Fatalf("the quota of 100 tokens was passed: %v used", used)
	}
	want(t, e.do("POST", "/v1/chat/completions", e.keyA, big), 429, "ERR_SESSION_QUOTA_EXCEEDED")
}

// TestModelCreditsConcurrent: an account whose credits pay for two calls
// (4.00; a call of max_tokens 1000 at 2000 a million completion tokens
// holds 2.01). Ten at once: at most two pass. Control: with credits not
// enforced all ten pass.
func TestModelCreditsConcurrent(t *testing.T) {
	t.Parallel()
	const body = `{"model":"big","max_tokens":1000,"messages":[]}`
	reply := llmtest.Reply{Content: "x", Usage: &llm.Usage{PromptTokens: 10, CompletionTokens: 1000}}
	for _, enforce := range []bool{false, true} {
		e, prov := newModelEnv(t, 0, false, server.Config{
			Accounts: account.Config{FreeCreditsMicros: 4_000_000, EnforceCredits: enforce, CreditsGrace: time.Minute, CreditsLowMicros: 1},
		})
		admin := e.adminKey()
		want(t, e.do("POST", "/v1/admin/accounts", admin, map[string]any{"name": "tokens"}), 201, "")
		r := e.do("POST", "/v1/admin/keys", admin, map[string]any{"account": "tokens"})
		want(t, r, 201, "")
		key := r.json(t)["key"].(string)
		st := concurrently(t, e, prov, key, body, 10, reply)
		switch ok := count(st, 200); {
		case !enforce && ok != 10:
			t.Fatalf("control: without enforcement %v", st)
		case enforce && (ok > 2 || ok+count(st, 429) != 10):
			t.Fatalf("ten concurrent calls on credits for two: %v", st)
		}
		if enforce {
			// The holds were given back: what is left is the balance less
			// what the calls that passed cost.
			c := e.do("GET", "/v1/account/credits", key, nil).json(t)
			if c["available_micros"].(float64) < -2_020_000 {
				t.Fatalf("credits overshot by more than one call: %v", c)
			}
		}
	}
}

// TestModelQuotaReservationsReturn: calls that fail give their
// reservation back; three failures in a row do not use up a quota that
// two reservations would fill.
func TestModelQuotaReservationsReturn(t *testing.T) {
	t.Parallel()
	e, prov := newModelEnv(t, 100, false, server.Config{})
	const big = `{"model":"big","max_tokens":40,"messages":[]}`
	for range 3 {
		prov.Push(llmtest.Reply{Status: 400, ErrorMessage: "no"})
		want(t, e.do("POST", "/v1/chat/completions", e.keyA, big), 400, "ERR_BAD_REQUEST")
	}
	prov.Push(llmtest.Reply{Content: "x", Usage: &llm.Usage{PromptTokens: 10, CompletionTokens: 40}})
	want(t, e.do("POST", "/v1/chat/completions", e.keyA, big), 200, "")
}
