package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/lang"
	"github.com/sheepfold/sheepfold/internal/llm"
	"github.com/sheepfold/sheepfold/internal/store"
)

// The ask loop: the session's model gets the prompt and a run_code tool;
// each tool call runs in the session's sandbox and its output goes back
// to the model, until the model answers in text, or the step or time
// limit is reached. A reply with fenced code instead of a tool call (the
// seeds' models) has its code run the same way, its output sent back as
// a user message. Model calls go through the relay with the session's
// account: metered, quota-checked (with the fallback model) and priced
// like any completion.

// Limits of one ask.
const (
	defaultAskSteps   = 8
	maxAskSteps       = 50
	defaultAskTimeout = 5 * time.Minute
	maxAskTimeout     = 30 * time.Minute
	// toolOutputLimit bounds the output sent back to the model per
	// execution (the answer keeps it whole).
	toolOutputLimit = 16 << 10
	maxAskFiles     = 100
	maxAskFileBytes = 8 << 20
)

// systemPrompt tells the model what it has.
const systemPrompt = `You answer questions by running Python code in a sandbox.
Call the run_code tool with the code to run; you get its output (stdout, stderr, errors) back.
Files the user gave are in /home/user. Charts shown with matplotlib (plt.show()) reach the user.
When you have the answer, reply in plain text without calling the tool.`

var runCodeTool = llm.Tool{Type: "function", Function: llm.FunctionDef{
	Name:        "run_code",
	Description: "Run code in the session's sandbox (state persists between calls) and return its output.",
	Parameters: json.RawMessage(`{"type":"object","properties":{` +
		`"code":{"type":"string","description":"the code to run"},` +
		`"language":{"type":"string","enum":["python","javascript","bash"],"description":"default python"}},` +
		`"required":["code"]}`),
}}

type askFile struct {
	Path     string `json:"path"`
	Content  string `json:"content"`
	Encoding string `json:"encoding"` // "" or "utf-8": text; "base64"
}

type askRequest struct {
	Prompt    string    `json:"prompt"`
	Files     []askFile `json:"files"`
	MaxSteps  int       `json:"max_steps"`
	TimeoutMS int64     `json:"timeout_ms"`
}

type tokensJSON struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

// answerJSON is an ask's outcome.
type answerJSON struct {
	SessionID  string            `json:"session_id"`
	Model      string            `json:"model"`
	Text       string            `json:"text"`
	StopReason string            `json:"stop_reason"` // answered, max_steps or time_limit
	Steps      int               `json:"steps"`
	Executions []sessionExecJSON `json:"executions"`
	Tokens     tokensJSON        `json:"tokens"`
	TimeMS     float64           `json:"time_ms"`
	// ModelTimeMS is the time spent waiting for the model;
	// SheepfoldTimeMS the rest (executions, files, the loop itself).
	ModelTimeMS     float64 `json:"model_time_ms"`
	SheepfoldTimeMS float64 `json:"sheepfold_time_ms"`
	CostMicros      int64   `json:"cost_micros"`
	Cost            string  `json:"cost"`
}

// stepJSON is one streamed step: a model reply or an execution.
type stepJSON struct {
	Type      string           `json:"type"` // "model" or "execution"
	Step      int              `json:"step"`
	Content   string           `json:"content,omitempty"`
	ToolCalls []llm.ToolCall   `json:"tool_calls,omitempty"`
	Execution *sessionExecJSON `json:"execution,omitempty"`
}

var fence = regexp.MustCompile("(?s)```([A-Za-z0-9_+-]*)[^\\n]*\\n(.*?)```")

// askLanguages are the languages an ask's model may run (its tool's
// enum); a fence's tag is one of their names or aliases (internal/lang),
// or none for Python.
var askLanguages = []string{lang.Python, lang.JavaScript, lang.Bash}

// fencedCode returns the code of a reply's fenced blocks in a language the
// sandbox runs (joined, in order), and that language.
func fencedCode(text string) (code, language string, ok bool) {
	var parts []string
	for _, m := range fence.FindAllStringSubmatch(text, -1) {
		l, err := lang.Canonical(m[1])
		if err != nil || !slices.Contains(askLanguages, l) {
			continue
		}
		if language == "" {
			language = l
		}
		if l == language {
			parts = append(parts, m[2])
		}
	}
	if len(parts) == 0 {
		return "", "", false
	}
	return strings.Join(parts, "\n"), language, true
}

func clipOutput(s string) string {
	if len(s) <= toolOutputLimit {
		return s
	}
	return s[:toolOutputLimit] + fmt.Sprintf("\n[... %d more bytes]", len(s)-toolOutputLimit)
}

// forModel is what the model reads of an execution.
func forModel(ex sessionExecJSON) string {
	var b strings.Builder
	b.WriteString(clipOutput(ex.Output))
	for _, t := range ex.Results {
		b.WriteString(clipOutput(t))
		b.WriteByte('\n')
	}
	if n := len(ex.Charts); n > 0 {
		fmt.Fprintf(&b, "[%d chart(s) shown to the user]\n", n)
	}
	if ex.Error != nil {
		fmt.Fprintf(&b, "Error: %s %s\n%s", ex.Error.Name, ex.Error.Message, clipOutput(ex.Error.Traceback))
	}
	if b.Len() == 0 {
		return "(no output)"
	}
	return b.String()
}

func (s *Server) sessionAsk(w http.ResponseWriter, r *http.Request) error {
	var req askRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if strings.TrimSpace(req.Prompt) == "" {
		return apierr.New(apierr.BadRequest, "prompt is required")
	}
	if req.MaxSteps == 0 {
		req.MaxSteps = defaultAskSteps
	}
	if req.MaxSteps < 1 || req.MaxSteps > maxAskSteps {
		return apierr.New(apierr.BadRequest, "max_steps must be between 1 and %d", maxAskSteps)
	}
	limit := defaultAskTimeout
	if req.TimeoutMS != 0 {
		if req.TimeoutMS < 0 || req.TimeoutMS > maxAskTimeout.Milliseconds() {
			return apierr.New(apierr.BadRequest, "timeout_ms must be between 1 and %d", maxAskTimeout.Milliseconds())
		}
		limit = time.Duration(req.TimeoutMS) * time.Millisecond
	}
	if len(req.Files) > maxAskFiles {
		return apierr.New(apierr.BadRequest, "at most %d files may be given", maxAskFiles)
	}
	rec, b, err := s.sessionBox(r)
	if err != nil {
		return err
	}
	if s.cfg.Models.Provider(rec.Model) == nil {
		return apierr.New(apierr.ModelNotFound, "the session's model %q is no longer served by this server", rec.Model)
	}
	mode := wantStream(r, streamNone)
	var st *streamer
	emit := func(stepJSON) {}
	if mode != streamNone {
		st = newStreamer(w, mode)
		emit = func(sj stepJSON) { st.send("step", sj, map[string]any{"type": "step", "step": sj}) }
	}
	ans, err := s.ask(r, rec, b, req, limit, emit)
	if st == nil {
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, ans)
		return nil
	}
	s.end(st, w, r, err, "done", ans, map[string]any{"type": "done", "answer": ans})
	return nil
}

// writeAskFiles puts the ask's files in the sandbox (relative paths under
// /home/user).
func (s *Server) writeAskFiles(ctx context.Context, b *box, files []askFile) error {
	for i, f := range files {
		p := f.Path
		if p == "" || strings.ContainsRune(p, 0) {
			return apierr.New(apierr.BadRequest, "files[%d].path is required", i)
		}
		if !path.IsAbs(p) {
			p = path.Join("/home/user", p)
		}
		var data []byte
		switch f.Encoding {
		case "", "utf-8", "utf8", "text":
			data = []byte(f.Content)
		case "base64":
			var err error
			if data, err = base64.StdEncoding.DecodeString(f.Content); err != nil {
				return apierr.New(apierr.BadRequest, "files[%d].content is not base64", i)
			}
		default:
			return apierr.New(apierr.BadRequest, "files[%d].encoding must be utf-8 or base64", i)
		}
		if len(data) > maxAskFileBytes {
			return apierr.New(apierr.FileTooLarge, "files[%d] is larger than %d bytes", i, maxAskFileBytes)
		}
		if _, err := b.sb.WriteFile(ctx, p, strings.NewReader(string(data)), 0o644, maxAskFileBytes); err != nil {
			return err
		}
	}
	return nil
}

func (s *Server) ask(r *http.Request, rec store.Session, b *box, req askRequest, limit time.Duration, emit func(stepJSON)) (*answerJSON, error) {
	start := time.Now()
	ans := &answerJSON{SessionID: rec.ID, Model: rec.Model, Executions: []sessionExecJSON{}}
	parent := r.Context()
	ctx, cancel := context.WithTimeout(parent, limit)
	defer cancel()
	r = r.WithContext(ctx)
	if err := s.writeAskFiles(ctx, b, req.Files); err != nil {
		return nil, err
	}
	prompt := req.Prompt
	if len(req.Files) > 0 {
		names := make([]string, len(req.Files))
		for i, f := range req.Files {
			names[i] = f.Path
		}
		prompt += "\n\nFiles in /home/user: " + strings.Join(names, ", ")
	}
	msgs := []llm.Message{{Role: "system", Content: systemPrompt}, {Role: "user", Content: prompt}}
	var usage llm.Usage
	var cost float64
	var modelTime time.Duration
	finish := func(reason string) *answerJSON {
		ans.StopReason = reason
		ans.Tokens = tokensJSON{PromptTokens: usage.PromptTokens, CompletionTokens: usage.CompletionTokens, TotalTokens: usage.Total()}
		total := time.Since(start)
		ans.TimeMS = ms(total)
		ans.ModelTimeMS = ms(modelTime)
		ans.SheepfoldTimeMS = ms(total - modelTime)
		ans.CostMicros = int64(math.Round(cost))
		ans.Cost = account.FormatMicros(ans.CostMicros)
		return ans
	}
	run := func(code, language string) (sessionExecJSON, error) {
		ex, err := s.runInSession(r, b, code, language, nil)
		if err != nil {
			return ex, err
		}
		ex.Code, ex.Language = code, language
		if ex.Language == "" {
			ex.Language = lang.Python
		}
		ans.Executions = append(ans.Executions, ex)
		emit(stepJSON{Type: "execution", Step: ans.Steps, Execution: &ex})
		return ex, nil
	}
	for ans.Steps < req.MaxSteps {
		if ctx.Err() != nil {
			break
		}
		ans.Steps++
		body, err := json.Marshal(llm.ChatRequest{Model: rec.Model, Messages: msgs, Tools: []llm.Tool{runCodeTool}})
		if err != nil {
			return nil, err
		}
		call, err := s.admitModel(ctx, rec.Owner, rec.Model, llm.Request{}.Reservation(body))
		if err != nil {
			return nil, err
		}
		model, p := call.model, call.p
		if model != rec.Model {
			if body, err = json.Marshal(llm.ChatRequest{Model: model, Messages: msgs, Tools: []llm.Tool{runCodeTool}}); err != nil {
				call.release()
				return nil, err
			}
		}
		t0 := time.Now()
		resp, err := s.cfg.Models.Complete(ctx, llm.Request{Model: model}, body)
		modelTime += time.Since(t0)
		if err != nil {
			call.release()
			if ctx.Err() != nil && parent.Err() == nil && errCtx(err) {
				break // the ask's time limit, not the caller
			}
			return nil, err
		}
		call.settle(resp.Usage)
		usage.Add(resp.Usage)
		cost += p.Cost(resp.Usage)
		ans.Model = model
		var cr llm.ChatResponse
		if err := json.Unmarshal(resp.Body, &cr); err != nil || len(cr.Choices) == 0 {
			return nil, apierr.New(apierr.Provider, "the model %q answered with no choice", model)
		}
		msg := cr.Choices[0].Message
		emit(stepJSON{Type: "model", Step: ans.Steps, Content: msg.Content, ToolCalls: msg.ToolCalls})
		if len(msg.ToolCalls) > 0 {
			msgs = append(msgs, llm.Message{Role: "assistant", Content: msg.Content, ToolCalls: msg.ToolCalls})
			for _, call := range msg.ToolCalls {
				reply := ""
				var args struct {
					Code     string `json:"code"`
					Language string `json:"language"`
				}
				switch {
				case call.Function.Name != runCodeTool.Function.Name:
					reply = fmt.Sprintf("Error: there is no tool %q; use run_code", call.Function.Name)
				case json.Unmarshal([]byte(call.Function.Arguments), &args) != nil || args.Code == "":
					reply = `Error: the arguments must be a JSON object {"code": "...", "language": "python"}`
				default:
					ex, err := run(args.Code, args.Language)
					if err != nil {
						if ctx.Err() != nil && parent.Err() == nil {
							return finish("time_limit"), nil
						}
						return nil, err
					}
					reply = forModel(ex)
				}
				msgs = append(msgs, llm.Message{Role: "tool", ToolCallID: call.ID, Content: reply})
			}
			continue
		}
		ans.Text = msg.Content
		code, lang, ok := fencedCode(msg.Content)
		if !ok {
			return finish("answered"), nil
		}
		ex, err := run(code, lang)
		if err != nil {
			if ctx.Err() != nil && parent.Err() == nil {
				return finish("time_limit"), nil
			}
			return nil, err
		}
		msgs = append(msgs, llm.Message{Role: "assistant", Content: msg.Content},
			llm.Message{Role: "user", Content: "The code ran. Its output:\n" + forModel(ex) +
				"\nAnswer the question in plain text now, or run more code."})
	}
	if ctx.Err() != nil && parent.Err() == nil {
		return finish("time_limit"), nil
	}
	if parent.Err() != nil {
		return nil, parent.Err()
	}
	return finish("max_steps"), nil
}

// errCtx reports whether err is a timeout of the relay or the context.
func errCtx(err error) bool {
	c := apierr.CodeOf(err)
	return c == apierr.ProviderTimeout || c == apierr.Internal
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
