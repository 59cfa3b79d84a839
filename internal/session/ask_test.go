package session_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/llm"
	"github.com/sheepfold/sheepfold/internal/session"
)

// script is a Relay whose model answers with its replies in turn, and
// whose calls are counted: admitted, settled, released.
type script struct {
	replies  []llm.Message
	fallback string // the model serving every call ("": the one asked for)
	asked    [][]llm.Message
	settled  int
	released int
	usage    llm.Usage
}

type call struct {
	s     *script
	model string
}

func (c call) Model() string            { return c.model }
func (c call) Cost(u llm.Usage) float64 { return float64(u.Total()) * 10 }
func (c call) Settle(llm.Usage)         { c.s.settled++ }
func (c call) Release()                 { c.s.released++ }

func (s *script) Admit(_ context.Context, model string, _ llm.Usage) (session.Call, error) {
	if s.fallback != "" {
		model = s.fallback
	}
	return call{s, model}, nil
}

func (s *script) Complete(ctx context.Context, model string, body []byte) (*llm.Response, error) {
	var req llm.ChatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, err
	}
	if req.Model != model {
		return nil, apierr.New(apierr.BadRequest, "body for %q sent to %q", req.Model, model)
	}
	s.asked = append(s.asked, req.Messages)
	if len(s.replies) == 0 {
		<-ctx.Done() // a model that never answers
		return nil, apierr.New(apierr.ProviderTimeout, "timed out")
	}
	msg := s.replies[0]
	s.replies = s.replies[1:]
	out, _ := json.Marshal(llm.ChatResponse{Choices: []llm.Choice{{Message: msg}}})
	return &llm.Response{Body: out, Usage: s.usage}, nil
}

// box is a Sandbox that records what it was given and echoes code.
type box struct {
	files map[string]string
	ran   []string
}

func (b *box) WriteFile(_ context.Context, p string, data []byte) error {
	b.files[p] = string(data)
	return nil
}

func (b *box) Run(_ context.Context, code, language string) (session.Execution, error) {
	b.ran = append(b.ran, language+":"+code)
	return session.Execution{Output: "ran " + code, Status: "success", Charts: []session.Chart{}}, nil
}

func toolCall(name, args string) llm.Message {
	return llm.Message{Role: "assistant", ToolCalls: []llm.ToolCall{{ID: "c1", Type: "function", Function: llm.FunctionCall{Name: name, Arguments: args}}}}
}

func TestAskLoop(t *testing.T) {
	t.Parallel()
	relay := &script{usage: llm.Usage{PromptTokens: 3, CompletionTokens: 2}, replies: []llm.Message{
		toolCall("run_code", `{"code":"print(6*7)"}`),
		toolCall("shell", `{}`),
		{Role: "assistant", Content: "Let me check:\n```bash\necho hi\n```\n"},
		{Role: "assistant", Content: "It is 42."},
	}}
	sb := &box{files: map[string]string{}}
	var steps []session.Step
	req := session.Request{Prompt: "6*7?", Files: []session.File{{Path: "data.txt", Content: "x"}, {Path: "/tmp/b", Content: "eQ==", Encoding: "base64"}}}
	limit, err := session.Check(&req)
	if err != nil {
		t.Fatal(err)
	}
	ans, err := session.Ask(context.Background(), "sbx", "m", relay, sb, req, limit, func(s session.Step) { steps = append(steps, s) })
	if err != nil {
		t.Fatal(err)
	}
	if ans.StopReason != "answered" || ans.Text != "It is 42." || ans.Steps != 4 || ans.SessionID != "sbx" || ans.Model != "m" {
		t.Fatalf("answer %+v", ans)
	}
	if got := strings.Join(sb.ran, "|"); got != ":print(6*7)|bash:echo hi\n" {
		t.Fatalf("ran %q", got)
	}
	if sb.files["/home/user/data.txt"] != "x" || sb.files["/tmp/b"] != "y" {
		t.Fatalf("files %v", sb.files)
	}
	if len(ans.Executions) != 2 || ans.Executions[0].Language != "python" || ans.Executions[1].Language != "bash" {
		t.Fatalf("executions %+v", ans.Executions)
	}
	if ans.Tokens.TotalTokens != 20 || ans.CostMicros != 200 || relay.settled != 4 || relay.released != 0 {
		t.Fatalf("tokens %+v, cost %d, settled %d, released %d", ans.Tokens, ans.CostMicros, relay.settled, relay.released)
	}
	if len(steps) != 6 { // 4 model replies, 2 executions
		t.Fatalf("%d steps", len(steps))
	}
	// What the model read back: the tool's output, the unknown tool's
	// error, the fenced code's output as a user message.
	last := relay.asked[3]
	if !strings.Contains(last[1].Content, "Files in /home/user: data.txt, /tmp/b") ||
		last[3].Role != "tool" || last[3].Content != "ran print(6*7)" ||
		!strings.Contains(last[5].Content, `there is no tool "shell"`) ||
		last[7].Role != "user" || !strings.Contains(last[7].Content, "ran echo hi") {
		t.Fatalf("messages %+v", last)
	}
}

func TestAskStops(t *testing.T) {
	t.Parallel()
	loop := func() []llm.Message {
		var m []llm.Message
		for range 10 {
			m = append(m, toolCall("run_code", `{"code":"1"}`))
		}
		return m
	}
	relay := &script{replies: loop(), fallback: "cheap"}
	ans, err := session.Ask(context.Background(), "sbx", "m", relay, &box{files: map[string]string{}}, session.Request{Prompt: "p", MaxSteps: 3}, time.Minute, func(session.Step) {})
	if err != nil || ans.StopReason != "max_steps" || ans.Steps != 3 || ans.Model != "cheap" {
		t.Fatalf("max_steps: %+v %v", ans, err)
	}

	// A model that never answers: the limit ends the ask, with its
	// answer, and the call is released, not metered.
	relay = &script{}
	ans, err = session.Ask(context.Background(), "sbx", "m", relay, &box{files: map[string]string{}}, session.Request{Prompt: "p", MaxSteps: 3}, 50*time.Millisecond, func(session.Step) {})
	if err != nil || ans.StopReason != "time_limit" || relay.released != 1 || relay.settled != 0 {
		t.Fatalf("time_limit: %+v %v, released %d", ans, err, relay.released)
	}

	// The caller's end is an error, not an answer.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := session.Ask(ctx, "sbx", "m", &script{}, &box{files: map[string]string{}}, session.Request{Prompt: "p", MaxSteps: 3}, time.Minute, func(session.Step) {}); err == nil {
		t.Fatal("a canceled caller got an answer")
	}
}

func TestRequestCheck(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		req   session.Request
		limit time.Duration
		code  apierr.Code
	}{
		{session.Request{Prompt: "p"}, 5 * time.Minute, ""},
		{session.Request{Prompt: "p", TimeoutMS: 1500}, 1500 * time.Millisecond, ""},
		{session.Request{Prompt: " "}, 0, apierr.BadRequest},
		{session.Request{Prompt: "p", MaxSteps: 51}, 0, apierr.BadRequest},
		{session.Request{Prompt: "p", TimeoutMS: -1}, 0, apierr.BadRequest},
		{session.Request{Prompt: "p", Files: make([]session.File, 101)}, 0, apierr.BadRequest},
	} {
		limit, err := session.Check(&c.req)
		if apierr.CodeOf(err) != c.code && !(c.code == "" && err == nil) || limit != c.limit {
			t.Errorf("%+v: %v, %v", c.req, limit, err)
		}
	}
	bad := session.Request{Prompt: "p", Files: []session.File{{Path: "a", Content: "!", Encoding: "base64"}}}
	if _, err := session.Ask(context.Background(), "s", "m", &script{}, &box{files: map[string]string{}}, bad, time.Minute, func(session.Step) {}); apierr.CodeOf(err) != apierr.BadRequest {
		t.Errorf("bad base64: %v", err)
	}
}
