package llm_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/llm"
	"github.com/sheepfold/sheepfold/internal/llm/llmtest"
)

// streamText is a reply long enough to be cut: 40 words in 10 chunks.
var streamText = strings.Repeat("word ", 40)

// TestStreamCutIsMetered: the caller goes away after two chunks of text,
// before the provider's usage chunk (which comes last). What was
// delivered is metered: the prompt's estimate and at least a token a
// chunk delivered. The control: the same stream read to its end is
// metered as the provider reports it, so the usage chunk does exist and
// only the cut keeps it away.
func TestStreamCutIsMetered(t *testing.T) {
	r, prov := newRelay(t, llm.Provider{})
	full := llm.Usage{PromptTokens: 500, CompletionTokens: 900}
	prov.Push(llmtest.Reply{Content: streamText, Usage: &full})
	_, u, err := stream(t, r, streamBody)
	if err != nil || u != full {
		t.Fatalf("the whole stream metered %+v, %v; want the provider's %+v", u, err, full)
	}

	for _, how := range []string{"emit fails", "context cancelled"} {
		t.Run(how, func(t *testing.T) {
			prov.Push(llmtest.Reply{Content: streamText, Usage: &full})
			req, _ := llm.ParseRequest([]byte(streamBody))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var delivered []string
			gone := errors.New("the client went away")
			u, err := r.Stream(ctx, req, []byte(streamBody), func(d []byte) error {
				delivered = append(delivered, string(d))
				if len(delivered) == 3 { // the role chunk and two of text
					if how == "emit fails" {
						return gone
					}
					cancel()
				}
				return nil
			})
			if err == nil {
				t.Fatal("the cut stream reported no error")
			}
			var text int
			for _, d := range delivered {
				var c struct {
					Choices []struct {
						Delta struct{ Content string } `json:"delta"`
					} `json:"choices"`
				}
				json.Unmarshal([]byte(d), &c)
				if len(c.Choices) > 0 {
					text += len(c.Choices[0].Delta.Content)
				}
			}
			if text == 0 {
				t.Fatalf("nothing was delivered before the cut: %q", delivered)
			}
			if u.PromptTokens < int64(len(streamBody))/4 || u.CompletionTokens < int64(text+3)/4 || u.CompletionTokens < 2 {
				t.Fatalf("a stream cut after %d bytes of text metered %+v", text, u)
			}
			if u == full {
				t.Fatalf("metered the provider's usage of the whole answer, which never came: %+v", u)
			}
		})
	}
}

// TestStreamAlwaysAsksForUsage: a caller that says include_usage false
// (or null options) does not stop the relay from asking the provider, and
// the usage chunk it did not ask for does not reach it.
func TestStreamAlwaysAsksForUsage(t *testing.T) {
	r, prov := newRelay(t, llm.Provider{})
	for i, b := range []string{
		`{"model":"m1","stream":true,"stream_options":{"include_usage":false},"messages":[]}`,
		`{"model":"m1","stream":true,"stream_options":null,"messages":[]}`,
		`{"model":"m1","stream":true,"stream_options":{},"messages":[]}`,
	} {
		prov.Push(llmtest.Reply{Content: "a b c", Usage: &llm.Usage{PromptTokens: 11, CompletionTokens: 13}})
		got, u, err := stream(t, r, b)
		if err != nil || u != (llm.Usage{PromptTokens: 11, CompletionTokens: 13}) {
			t.Fatalf("%s: usage %+v, %v", b, u, err)
		}
		if !prov.Requests()[i].IncludeUsage {
			t.Fatalf("%s: the provider was not asked for usage: %s", b, prov.Requests()[i].Raw)
		}
		if strings.Contains(strings.Join(got, "\n"), `"usage"`) {
			t.Fatalf("%s: the caller got the usage chunk it did not ask for", b)
		}
	}
}

// TestProviderUsageNotBelieved: a provider that reports negative tokens
// (which would credit the account), more than any context, fractions or
// text is metered from the estimate or clamped. The control: a sane
// report is metered as it is.
func TestProviderUsageNotBelieved(t *testing.T) {
	for _, tc := range []struct {
		name string
		raw  string
		want func(u llm.Usage) bool
	}{
		{"sane", `{"prompt_tokens":12,"completion_tokens":34}`, func(u llm.Usage) bool { return u == llm.Usage{PromptTokens: 12, CompletionTokens: 34} }},
		{"negative", `{"prompt_tokens":-1000000,"completion_tokens":-5}`, func(u llm.Usage) bool { return u.PromptTokens > 0 && u.CompletionTokens > 0 }},
		{"absurd", `{"prompt_tokens":1e30,"completion_tokens":99999999999}`,
			func(u llm.Usage) bool {
				return u == llm.Usage{PromptTokens: llm.MaxCallTokens, CompletionTokens: llm.MaxCallTokens}
			}},
		{"fraction", `{"prompt_tokens":12.4,"completion_tokens":33.6}`, func(u llm.Usage) bool { return u == llm.Usage{PromptTokens: 12, CompletionTokens: 34} }},
		{"text", `{"prompt_tokens":"many","completion_tokens":{}}`, func(u llm.Usage) bool { return u.PromptTokens > 0 && u.CompletionTokens > 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, prov := newRelay(t, llm.Provider{})
			prov.Push(llmtest.Reply{Content: "some answer text", RawUsage: json.RawMessage(tc.raw)})
			resp, err := complete(t, r)
			if err != nil || !tc.want(resp.Usage) {
				t.Fatalf("completion metered %+v, %v", resp, err)
			}
			prov.Push(llmtest.Reply{Content: "some answer text", RawUsage: json.RawMessage(tc.raw)})
			_, u, err := stream(t, r, streamBody)
			if err != nil || !tc.want(u) {
				t.Fatalf("stream metered %+v, %v", u, err)
			}
		})
	}
}

// A completion without usage is estimated from its text.
func TestCompletionWithoutUsage(t *testing.T) {
	r, prov := newRelay(t, llm.Provider{})
	prov.Push(llmtest.Reply{Content: strings.Repeat("x", 400), NoUsage: true})
	resp, err := complete(t, r)
	if err != nil || resp.Usage.CompletionTokens != 100 || resp.Usage.PromptTokens != int64(len(body)+3)/4 {
		t.Fatalf("estimated %+v, %v", resp, err)
	}
}

func TestReservation(t *testing.T) {
	for b, want := range map[string]int64{
		`{"model":"m"}`:                                          llm.DefaultReservedCompletion,
		`{"model":"m","max_tokens":50}`:                          50,
		`{"model":"m","max_completion_tokens":70}`:               70,
		`{"model":"m","max_tokens":0}`:                           llm.DefaultReservedCompletion,
		`{"model":"m","max_tokens":99999999999999}`:              llm.MaxCallTokens,
		`{"model":"m","max_tokens":-3}`:                          llm.DefaultReservedCompletion,
		`{"model":"m","max_completion_tokens":9,"max_tokens":8}`: 9,
	} {
		req, err := llm.ParseRequest([]byte(b))
		if err != nil {
			t.Fatal(err)
		}
		u := req.Reservation([]byte(b))
		if u.CompletionTokens != want || u.PromptTokens != int64(len(b)+3)/4 {
			t.Errorf("%s: reserved %+v, want %d completion tokens", b, u, want)
		}
	}
}
