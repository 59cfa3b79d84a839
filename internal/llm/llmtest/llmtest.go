// Package llmtest is a scripted OpenAI-compatible chat completion server
// on loopback, for tests, the examples' tests and the bench: each request
// gets the next scripted Reply, or the answer of a handler function, as
// JSON or as SSE (when the request streams), with tool calls, fenced code,
// error statuses, delays, a hang, garbage, a body or stream dropped
// mid-way and a stream that stalls.
//
// # Uses
//
// internal/llm/llmtest is a scripted OpenAI-compatible server (JSON, SSE,
// tool calls, fenced code, error statuses, delays, hangs, garbage, a body
// or stream dropped mid-way, a stream that stalls) for tests, the examples and the bench; its `Brain` plays a model
// that follows the conversation (run the code it is told to, answer with the
// output, write the Black Friday example's pandas code). `sheepfold bench`
// gives its own server that model as a provider and measures the relay's
// overhead (the same completion direct and through `/v1/chat/completions`,
// alternating) and the Black Friday tickets through sessions (Sheepfold's own
// time per ticket: the answer's `sheepfold_time_ms`).
//
// Imports: internal/llm (the chat shapes) and the standard library.
package llmtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/internal/llm"
)

// Reply is one scripted answer.
type Reply struct {
	// Content is the assistant's text; ToolCalls its tool calls (IDs are
	// filled in when empty).
	Content   string
	ToolCalls []llm.ToolCall
	// Status, when not 0 or 200, answers with that status and an OpenAI
	// error body carrying ErrorMessage (and Retry-After, when set).
	Status       int
	ErrorMessage string
	RetryAfter   string
	// Delay waits before answering; Hang never answers (until the caller
	// gives up or the server closes).
	Delay time.Duration
	Hang  bool
	// Garbage answers 200 with a body that is not a chat completion (a
	// stream: a chunk that is not JSON).
	Garbage bool
	// DropAfter, for a stream, breaks the connection after this many
	// chunks, before [DONE]; for a JSON reply, after this many bytes of
	// the body (its Content-Length announcing the whole).
	DropAfter int
	// StallAfter, for a stream, stops sending after this many chunks and
	// holds the connection open, as a provider stuck mid-answer (until the
	// caller gives up or the server closes).
	StallAfter int
	// Usage is the usage reported; nil computes one from the sizes.
	// NoUsage reports none. RawUsage, when set, is sent as the usage
	// object as it is (a provider's malformed or absurd report).
	Usage    *llm.Usage
	NoUsage  bool
	RawUsage json.RawMessage
}

// Text is a reply of plain text.
func Text(s string) Reply { return Reply{Content: s} }

// Fenced is a reply of code in a Markdown fence, as models often write it.
func Fenced(lang, code string) Reply {
	return Reply{Content: fmt.Sprintf("Here is the code:\n\n```%s\n%s\n```\n", lang, code)}
}

// RunCode is a reply calling the session's run_code tool.
func RunCode(code string) Reply {
	args, _ := json.Marshal(map[string]string{"code": code, "language": "python"})
	return Reply{ToolCalls: []llm.ToolCall{{Type: "function", Function: llm.FunctionCall{Name: "run_code", Arguments: string(args)}}}}
}

// Request is one request the server received.
type Request struct {
	Header       http.Header
	Raw          []byte
	Chat         llm.ChatRequest
	IncludeUsage bool
}

// LastUser returns the content of the request's last user message.
func (r Request) LastUser() string {
	for i := len(r.Chat.Messages) - 1; i >= 0; i-- {
		if r.Chat.Messages[i].Role == "user" {
			return r.Chat.Messages[i].Content
		}
	}
	return ""
}

// Server is a running scripted provider.
type Server struct {
	// URL is the base URL of the API (ending in /v1), as a provider's
	// base_url.
	URL string

	srv    *httptest.Server
	closed chan struct{}
	once   sync.Once

	// mu guards the fields below.
	mu       sync.Mutex
	handler  func(Request) Reply
	key      string
	script   []Reply
	requests []Request
	n        int
}

// New starts a server. Each request gets the next scripted reply (Push);
// with none left, handler's answer (nil: the text "ok").
func New(handler func(Request) Reply) *Server {
	s := &Server{handler: handler, closed: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.complete)
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]any{"object": "list", "data": []any{}})
	})
	s.srv = httptest.NewServer(mux)
	s.URL = s.srv.URL + "/v1"
	return s
}

// Close stops the server, ending hanging replies first.
func (s *Server) Close() {
	s.once.Do(func() { close(s.closed) })
	s.srv.CloseClientConnections()
	s.srv.Close()
}

// SetHandler replaces the handler that answers once the script is done.
func (s *Server) SetHandler(h func(Request) Reply) {
	s.mu.Lock()
	s.handler = h
	s.mu.Unlock()
}

// RequireKey makes requests without "Authorization: Bearer key" fail 401.
func (s *Server) RequireKey(key string) {
	s.mu.Lock()
	s.key = key
	s.mu.Unlock()
}

// Push appends replies to the script.
func (s *Server) Push(replies ...Reply) {
	s.mu.Lock()
	s.script = append(s.script, replies...)
	s.mu.Unlock()
}

// Requests returns the requests received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": "scripted_error"}})
}

func (s *Server) complete(w http.ResponseWriter, r *http.Request) {
	var raw json.RawMessage
	if err := json.NewDecoder(r.Body).Decode(&raw); err != nil {
		writeError(w, 400, "malformed JSON: "+err.Error())
		return
	}
	req := Request{Header: r.Header.Clone(), Raw: raw}
	var opts struct {
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.Unmarshal(raw, &req.Chat); err != nil {
		writeError(w, 400, "not a chat completion request: "+err.Error())
		return
	}
	json.Unmarshal(raw, &opts)
	req.IncludeUsage = opts.StreamOptions.IncludeUsage
	s.mu.Lock()
	key := s.key
	s.requests = append(s.requests, req)
	var reply Reply
	scripted := len(s.script) > 0
	if scripted {
		reply, s.script = s.script[0], s.script[1:]
	}
	s.n++
	id := fmt.Sprintf("chatcmpl-%d", s.n)
	handler := s.handler
	s.mu.Unlock()
	if key != "" && r.Header.Get("Authorization") != "Bearer "+key {
		writeError(w, 401, "invalid API key")
		return
	}
	switch {
	case scripted:
	case handler != nil:
		reply = handler(req)
	default:
		reply = Text("ok")
	}
	if reply.Hang {
		select {
		case <-r.Context().Done():
		case <-s.closed:
		}
		return
	}
	if reply.Delay > 0 {
		t := time.NewTimer(reply.Delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		case <-s.closed:
			t.Stop()
			return
		}
	}
	if reply.Status != 0 && reply.Status != 200 {
		if reply.RetryAfter != "" {
			w.Header().Set("Retry-After", reply.RetryAfter)
		}
		writeError(w, reply.Status, reply.ErrorMessage)
		return
	}
	for i := range reply.ToolCalls {
		if reply.ToolCalls[i].ID == "" {
			reply.ToolCalls[i].ID = fmt.Sprintf("call_%d_%d", s.n, i)
		}
		if reply.ToolCalls[i].Type == "" {
			reply.ToolCalls[i].Type = "function"
		}
	}
	usage := reply.Usage
	if usage == nil {
		u := llm.Usage{PromptTokens: int64(len(raw))/4 + 1, CompletionTokens: int64(len(reply.Content))/4 + 1}
		for _, c := range reply.ToolCalls {
			u.CompletionTokens += int64(len(c.Function.Arguments)) / 4
		}
		usage = &u
	}
	if reply.NoUsage {
		usage = nil
	}
	if req.Chat.Stream {
		s.stream(r.Context(), w, id, req, reply, usage)
		return
	}
	if reply.Garbage {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`<html>502 Bad Gateway</html>`))
		return
	}
	finish := "stop"
	if len(reply.ToolCalls) > 0 {
		finish = "tool_calls"
	}
	msg := map[string]any{"role": "assistant", "content": reply.Content}
	if reply.Content == "" && len(reply.ToolCalls) > 0 {
		msg["content"] = nil
	}
	if len(reply.ToolCalls) > 0 {
		msg["tool_calls"] = reply.ToolCalls
	}
	out := map[string]any{"id": id, "object": "chat.completion", "created": time.Now().Unix(), "model": req.Chat.Model,
		"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish, "logprobs": nil}}}
	if usage != nil {
		out["usage"] = usageJSON(*usage)
	}
	if reply.RawUsage != nil {
		out["usage"] = reply.RawUsage
	}
	if reply.DropAfter > 0 {
		b, _ := json.Marshal(out)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		w.WriteHeader(200)
		w.Write(b[:min(reply.DropAfter, len(b)-1)])
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the connection breaks mid-body
	}
	writeJSON(w, 200, out)
}

func usageJSON(u llm.Usage) map[string]int64 {
	return map[string]int64{"prompt_tokens": u.PromptTokens, "completion_tokens": u.CompletionTokens, "total_tokens": u.Total()}
}

// stream answers as OpenAI streams: a role chunk, content in pieces, tool
// calls (name, then arguments in two pieces), the finish chunk, the usage
// chunk when asked for, [DONE].
func (s *Server) stream(ctx context.Context, w http.ResponseWriter, id string, req Request, reply Reply, usage *llm.Usage) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(200)
	fl := w.(http.Flusher)
	sent := 0
	send := func(v any) {
		if reply.DropAfter > 0 && sent == reply.DropAfter {
			fl.Flush()
			panic(http.ErrAbortHandler) // the connection breaks mid-way
		}
		if reply.StallAfter > 0 && sent == reply.StallAfter {
			fl.Flush()
			select { // stuck mid-answer
			case <-ctx.Done():
			case <-s.closed:
			}
			panic(http.ErrAbortHandler)
		}
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", b)
		fl.Flush()
		sent++
	}
	chunk := func(delta map[string]any, finish any) map[string]any {
		return map[string]any{"id": id, "object": "chat.completion.chunk", "created": time.Now().Unix(), "model": req.Chat.Model,
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}}
	}
	send(chunk(map[string]any{"role": "assistant", "content": ""}, nil))
	if reply.Garbage {
		fmt.Fprint(w, "data: {not json\n\n")
		fl.Flush()
		return
	}
	for _, piece := range pieces(reply.Content) {
		send(chunk(map[string]any{"content": piece}, nil))
	}
	for i, c := range reply.ToolCalls {
		send(chunk(map[string]any{"tool_calls": []any{map[string]any{"index": i, "id": c.ID, "type": "function",
			"function": map[string]any{"name": c.Function.Name, "arguments": ""}}}}, nil))
		half := len(c.Function.Arguments) / 2
		for _, a := range []string{c.Function.Arguments[:half], c.Function.Arguments[half:]} {
			send(chunk(map[string]any{"tool_calls": []any{map[string]any{"index": i, "function": map[string]any{"arguments": a}}}}, nil))
		}
	}
	finish := "stop"
	if len(reply.ToolCalls) > 0 {
		finish = "tool_calls"
	}
	send(chunk(map[string]any{}, finish))
	if req.IncludeUsage && (usage != nil || reply.RawUsage != nil) {
		var u any = reply.RawUsage
		if reply.RawUsage == nil {
			u = usageJSON(*usage)
		}
		send(map[string]any{"id": id, "object": "chat.completion.chunk", "created": time.Now().Unix(), "model": req.Chat.Model,
			"choices": []any{}, "usage": u})
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	fl.Flush()
}

// pieces splits text into a few chunks at spaces.
func pieces(s string) []string {
	if s == "" {
		return nil
	}
	words := strings.SplitAfter(s, " ")
	var out []string
	for i := 0; i < len(words); i += 4 {
		out = append(out, strings.Join(words[i:min(i+4, len(words))], ""))
	}
	return out
}
