package llm_test

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/llm"
	"github.com/sheepfold/sheepfold/internal/llm/llmtest"
)

func newRelay(t *testing.T, p llm.Provider) (*llm.Relay, *llmtest.Server) {
	t.Helper()
	prov := llmtest.New(nil)
	t.Cleanup(prov.Close)
	prov.RequireKey("sk-test")
	p.Name, p.BaseURL, p.APIKeyEnv = "scripted", prov.URL, "TEST_KEY"
	if p.Models == nil {
		p.Models = []string{"m1"}
	}
	r, err := llm.New([]llm.Provider{p}, func(string) string { return "sk-test" })
	if err != nil {
		t.Fatal(err)
	}
	r.SetBackoff(time.Millisecond)
	return r, prov
}

const body = `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`

func complete(t *testing.T, r *llm.Relay) (*llm.Response, error) {
	t.Helper()
	req, err := llm.ParseRequest([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return r.Complete(context.Background(), req, []byte(body))
}

func wantCode(t *testing.T, err error, code apierr.Code, msg string) {
	t.Helper()
	if apierr.CodeOf(err) != code {
		t.Fatalf("err = %v, want code %s", err, code)
	}
	if !strings.Contains(apierr.From(err).Message, msg) {
		t.Fatalf("message %q does not contain %q", apierr.From(err).Message, msg)
	}
}

func TestCompletePassesBodyAndKey(t *testing.T) {
	r, prov := newRelay(t, llm.Provider{PriceInputPerMTok: 1, PriceOutputPerMTok: 2})
	prov.Push(llmtest.Reply{Content: "hello", Usage: &llm.Usage{PromptTokens: 10, CompletionTokens: 5}})
	resp, err := complete(t, r)
	if err != nil {
		t.Fatal(err)
	}
	var c llm.ChatResponse
	if err := json.Unmarshal(resp.Body, &c); err != nil || c.Choices[0].Message.Content != "hello" {
		t.Fatalf("body %s: %v", resp.Body, err)
	}
	if resp.Usage != (llm.Usage{PromptTokens: 10, CompletionTokens: 5}) {
		t.Fatalf("usage = %+v", resp.Usage)
	}
	if got := r.Provider("m1").Cost(resp.Usage); got != 20 {
		t.Fatalf("cost = %v micros, want 20", got)
	}
	reqs := prov.Requests()
	if len(reqs) != 1 || string(reqs[0].Raw) != body {
		t.Fatalf("provider got %q, want the body unchanged", reqs[0].Raw)
	}
}

func TestRetries(t *testing.T) {
	r, prov := newRelay(t, llm.Provider{})
	prov.Push(llmtest.Reply{Status: 429, ErrorMessage: "slow down"}, llmtest.Reply{Status: 503}, llmtest.Text("third time"))
	resp, err := complete(t, r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(resp.Body), "third time") || len(prov.Requests()) != 3 {
		t.Fatalf("got %s after %d requests", resp.Body, len(prov.Requests()))
	}
}

func TestProviderErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		p       llm.Provider
		replies []llmtest.Reply
		code    apierr.Code
		msg     string
	}{
		{"5xx after retries", llm.Provider{MaxRetries: 1}, []llmtest.Reply{{Status: 500}, {Status: 502, ErrorMessage: "upstream down"}},
			apierr.Provider, `provider "scripted" failed (HTTP 502): upstream down`},
		{"429 after retries", llm.Provider{MaxRetries: -1}, []llmtest.Reply{{Status: 429, ErrorMessage: "quota"}},
			apierr.RateLimited, `provider "scripted" is rate limiting requests (HTTP 429): quota`},
		{"bad request is not retried", llm.Provider{}, []llmtest.Reply{{Status: 400, ErrorMessage: "bad messages"}},
			apierr.BadRequest, `provider "scripted" refused the request (HTTP 400): bad messages`},
		{"garbage", llm.Provider{}, []llmtest.Reply{{Garbage: true}},
			apierr.Provider, `provider "scripted" answered with something that is not a chat completion`},
		{"hang", llm.Provider{TimeoutSeconds: 0.3}, []llmtest.Reply{{Hang: true}},
			apierr.ProviderTimeout, `provider "scripted" did not answer within 300ms`},
		{"body dropped mid-way", llm.Provider{MaxRetries: -1}, []llmtest.Reply{{Content: "a long answer", DropAfter: 40}},
			apierr.Provider, `the connection to provider "scripted" broke`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, prov := newRelay(t, tc.p)
			prov.Push(tc.replies...)
			start := time.Now()
			_, err := complete(t, r)
			wantCode(t, err, tc.code, tc.msg)
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("took %s", d)
			}
		})
	}
}

func TestWrongKeyIsTheOperatorsProblem(t *testing.T) {
	r, prov := newRelay(t, llm.Provider{})
	prov.RequireKey("another")
	_, err := complete(t, r)
	wantCode(t, err, apierr.Provider, "refused the server's credentials (HTTP 401)")
}

func stream(t *testing.T, r *llm.Relay, b string) ([]string, llm.Usage, error) {
	t.Helper()
	req, err := llm.ParseRequest([]byte(b))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	u, err := r.Stream(context.Background(), req, []byte(b), func(d []byte) error {
		got = append(got, string(d))
		return nil
	})
	return got, u, err
}

const streamBody = `{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}`

func TestStream(t *testing.T) {
	r, prov := newRelay(t, llm.Provider{})
	prov.Push(llmtest.Reply{Content: "one two three four five", Usage: &llm.Usage{PromptTokens: 7, CompletionTokens: 3}})
	got, u, err := stream(t, r, streamBody)
	if err != nil {
		t.Fatal(err)
	}
	if u != (llm.Usage{PromptTokens: 7, CompletionTokens: 3}) {
		t.Fatalf("usage = %+v", u)
	}
	if got[len(got)-1] != "[DONE]" {
		t.Fatalf("last event %q", got[len(got)-1])
	}
	var text strings.Builder
	for _, d := range got[:len(got)-1] {
		if strings.Contains(d, `"usage"`) {
			t.Fatalf("the usage chunk the relay asked for reached the caller: %s", d)
		}
		var c struct {
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
		}
		json.Unmarshal([]byte(d), &c)
		text.WriteString(c.Choices[0].Delta.Content)
	}
	if text.String() != "one two three four five" {
		t.Fatalf("text %q", text.String())
	}
	if !prov.Requests()[0].IncludeUsage {
		t.Fatal("the relay did not ask for usage")
	}

	// A caller that asks for usage itself gets the chunk.
	prov.Push(llmtest.Text("x"))
	got, _, err = stream(t, r, `{"model":"m1","stream":true,"stream_options":{"include_usage":true},"messages":[]}`)
	if err != nil || !strings.Contains(got[len(got)-2], `"usage"`) {
		t.Fatalf("err %v, events %q", err, got)
	}
}

func TestStreamToolCalls(t *testing.T) {
	r, prov := newRelay(t, llm.Provider{})
	prov.Push(llmtest.RunCode("print(1)"))
	got, _, err := stream(t, r, streamBody)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(got, "\n")
	if !strings.Contains(all, `"name":"run_code"`) || !strings.Contains(all, `"finish_reason":"tool_calls"`) {
		t.Fatalf("events %s", all)
	}
}

func TestStreamFailures(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply llmtest.Reply
		code  apierr.Code
		msg   string
	}{
		{"dropped mid-way", llmtest.Reply{Content: "a b c d e f g h i j", DropAfter: 2}, apierr.Provider, "ended the stream before it was complete"},
		{"garbage chunk", llmtest.Reply{Content: "a", Garbage: true}, apierr.Provider, "sent a stream chunk that is not JSON"},
		{"hang", llmtest.Reply{Hang: true}, apierr.ProviderTimeout, "did not answer within 300ms"},
		{"stalls mid-way", llmtest.Reply{Content: "a b c d e f g h i j", StallAfter: 2}, apierr.ProviderTimeout, "sent nothing for 300ms during the stream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, prov := newRelay(t, llm.Provider{TimeoutSeconds: 0.3})
			prov.Push(tc.reply)
			start := time.Now()
			_, _, err := stream(t, r, streamBody)
			wantCode(t, err, tc.code, tc.msg)
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("took %s", d)
			}
			// The next call is answered.
			prov.Push(llmtest.Text("fine"))
			if _, _, err := stream(t, r, streamBody); err != nil {
				t.Fatalf("after the failure: %v", err)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	ok := llm.Provider{Name: "a", BaseURL: "http://127.0.0.1:1/v1", Models: []string{"m"}}
	for _, tc := range []struct {
		name string
		ps   []llm.Provider
		want string
	}{
		{"no name", []llm.Provider{{BaseURL: ok.BaseURL, Models: ok.Models}}, "name is required"},
		{"bad url", []llm.Provider{{Name: "a", BaseURL: "ftp://x", Models: ok.Models}}, "must be an absolute http or https URL"},
		{"no models", []llm.Provider{{Name: "a", BaseURL: ok.BaseURL}}, "models must name at least one model"},
		{"model twice", []llm.Provider{ok, {Name: "b", BaseURL: ok.BaseURL, Models: []string{"m"}}}, `model "m" is also served by provider "a"`},
		{"bad fallback", []llm.Provider{{Name: "a", BaseURL: ok.BaseURL, Models: ok.Models, QuotaFallbackModel: "zz"}}, `quota_fallback_model "zz" is not a configured model`},
		{"negative price", []llm.Provider{{Name: "a", BaseURL: ok.BaseURL, Models: ok.Models, PriceInputPerMTok: -1}}, "prices must not be negative"},
		// Numbers past what the sums they join can hold.
		{"infinite price", []llm.Provider{{Name: "a", BaseURL: ok.BaseURL, Models: ok.Models, PriceOutputPerMTok: math.Inf(1)}}, "prices must be at most"},
		{"huge price", []llm.Provider{{Name: "a", BaseURL: ok.BaseURL, Models: ok.Models, PriceInputPerMTok: 1e300}}, "prices must be at most"},
		{"huge quota", []llm.Provider{{Name: "a", BaseURL: ok.BaseURL, Models: ok.Models, MonthlyTokenQuota: math.MaxInt64}}, "monthly_token_quota must be from 0"},
		{"infinite timeout", []llm.Provider{{Name: "a", BaseURL: ok.BaseURL, Models: ok.Models, TimeoutSeconds: math.Inf(1)}}, "timeout_seconds must be from 0"},
		{"wrapping timeout", []llm.Provider{{Name: "a", BaseURL: ok.BaseURL, Models: ok.Models, TimeoutSeconds: 18446744074}}, "timeout_seconds must be from 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := llm.Validate(tc.ps)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	if err := llm.Validate([]llm.Provider{ok}); err != nil {
		t.Fatal(err)
	}
	if _, err := llm.New([]llm.Provider{{Name: "a", BaseURL: ok.BaseURL, Models: ok.Models, APIKeyEnv: "NOPE"}},
		func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "NOPE") {
		t.Fatalf("a missing key variable: err = %v", err)
	}
}
