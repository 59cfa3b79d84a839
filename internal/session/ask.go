package session

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/lang"
	"github.com/sheepfold/sheepfold/internal/llm"
)

// Limits of one ask.
const (
	defaultAskSteps   = 8
	maxAskSteps       = 50
	defaultAskTimeout = 5 * time.Minute
	maxAskTimeout     = 30 * time.Minute
	// ToolOutputLimit bounds the output sent back to the model per
	// execution (the answer keeps it whole).
	ToolOutputLimit = 16 << 10
	maxAskFiles     = 100
	// MaxFileBytes bounds each file an ask gives.
	MaxFileBytes = 8 << 20
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

// File is a file an ask puts in the sandbox before it starts.
type File = api.AskFile

// Request is an ask.
type Request = api.AskRequest

// Check fills in req's defaults and checks its bounds; it returns the
// ask's time limit.
func Check(req *Request) (time.Duration, error) {
	if strings.TrimSpace(req.Prompt) == "" {
		return 0, apierr.New(apierr.BadRequest, "prompt is required")
	}
	if req.MaxSteps == 0 {
		req.MaxSteps = defaultAskSteps
	}
	if req.MaxSteps < 1 || req.MaxSteps > maxAskSteps {
		return 0, apierr.New(apierr.BadRequest, "max_steps must be between 1 and %d", maxAskSteps)
	}
	limit := defaultAskTimeout
	if req.TimeoutMS != 0 {
		if req.TimeoutMS < 0 || req.TimeoutMS > maxAskTimeout.Milliseconds() {
			return 0, apierr.New(apierr.BadRequest, "timeout_ms must be between 1 and %d", maxAskTimeout.Milliseconds())
		}
		limit = time.Duration(req.TimeoutMS) * time.Millisecond
	}
	if len(req.Files) > maxAskFiles {
		return 0, apierr.New(apierr.BadRequest, "at most %d files may be given", maxAskFiles)
	}
	return limit, nil
}

// Tokens are an ask's tokens, all steps together.
type Tokens = api.Tokens

// Answer is an ask's outcome.
type Answer = api.Answer

// Step is one streamed step: a model reply or an execution.
type Step = api.AskStep

// Relay is the model relay as an ask uses it, with the session's
// account.
type Relay interface {
	// Admit admits one completion of model that may use need
	// (llm.Request.Reservation): metered to the session's account,
	// within its credits and the model's quota, or served by the
	// model's fallback.
	Admit(ctx context.Context, model string, need llm.Usage) (Call, error)
	// Complete runs one completion of body with model.
	Complete(ctx context.Context, model string, body []byte) (*llm.Response, error)
}

// Call is an admitted completion.
type Call interface {
	// Model is the model that serves it (the one asked for, or its
	// fallback).
	Model() string
	// Cost is the price of u with that model, in micros.
	Cost(u llm.Usage) float64
	// Settle meters what the completion delivered and gives back what
	// the call held; Release gives it back, metering nothing.
	Settle(u llm.Usage)
	Release()
}

// Sandbox is the session's sandbox as an ask uses it.
type Sandbox interface {
	// WriteFile writes data to the absolute path p.
	WriteFile(ctx context.Context, p string, data []byte) error
	// Run runs code in language ("" for Python) under the sandbox's
	// policy, and records the execution.
	Run(ctx context.Context, code, language string) (Execution, error)
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
	if len(s) <= ToolOutputLimit {
		return s
	}
	return s[:ToolOutputLimit] + fmt.Sprintf("\n[... %d more bytes]", len(s)-ToolOutputLimit)
}

// forModel is what the model reads of an execution.
func forModel(ex Execution) string {
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

// writeFiles puts the ask's files in the sandbox (relative paths under
// /home/user).
func writeFiles(ctx context.Context, sb Sandbox, files []File) error {
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
		if len(data) > MaxFileBytes {
			return apierr.New(apierr.FileTooLarge, "files[%d] is larger than %d bytes", i, MaxFileBytes)
		}
		if err := sb.WriteFile(ctx, p, data); err != nil {
			return err
		}
	}
	return nil
}

// Ask runs req (checked: Request.Check) for session id, whose model is
// model, within limit: the loop of the package's doc. emit gets each
// step as it happens. parent is the caller's context: its end is the
// caller's, an error, where the limit's is the answer's time_limit.
func Ask(parent context.Context, id, model string, relay Relay, sb Sandbox, req Request, limit time.Duration, emit func(Step)) (*Answer, error) {
	start := time.Now()
	ans := &Answer{SessionID: id, Model: model, Executions: []Execution{}}
	ctx, cancel := context.WithTimeout(parent, limit)
	defer cancel()
	if err := writeFiles(ctx, sb, req.Files); err != nil {
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
	finish := func(reason string) *Answer {
		ans.StopReason = reason
		ans.Tokens = Tokens{PromptTokens: usage.PromptTokens, CompletionTokens: usage.CompletionTokens, TotalTokens: usage.Total()}
		total := time.Since(start)
		ans.TimeMS = ms(total)
		ans.ModelTimeMS = ms(modelTime)
		ans.SheepfoldTimeMS = ms(total - modelTime)
		ans.CostMicros = int64(math.Round(cost))
		ans.Cost = account.FormatMicros(ans.CostMicros)
		return ans
	}
	run := func(code, language string) (Execution, error) {
		ex, err := sb.Run(ctx, code, language)
		if err != nil {
			return ex, err
		}
		ex.Code, ex.Language = code, language
		if ex.Language == "" {
			ex.Language = lang.Python
		}
		ans.Executions = append(ans.Executions, ex)
		emit(Step{Type: "execution", Step: ans.Steps, Execution: &ex})
		return ex, nil
	}
	for ans.Steps < req.MaxSteps {
		if ctx.Err() != nil {
			break
		}
		ans.Steps++
		body, err := json.Marshal(llm.ChatRequest{Model: model, Messages: msgs, Tools: []llm.Tool{runCodeTool}})
		if err != nil {
			return nil, err
		}
		call, err := relay.Admit(ctx, model, llm.Request{}.Reservation(body))
		if err != nil {
			return nil, err
		}
		serving := call.Model()
		if serving != model {
			if body, err = json.Marshal(llm.ChatRequest{Model: serving, Messages: msgs, Tools: []llm.Tool{runCodeTool}}); err != nil {
				call.Release()
				return nil, err
			}
		}
		t0 := time.Now()
		resp, err := relay.Complete(ctx, serving, body)
		modelTime += time.Since(t0)
		if err != nil {
			call.Release()
			if ctx.Err() != nil && parent.Err() == nil && errCtx(err) {
				break // the ask's time limit, not the caller
			}
			return nil, err
		}
		call.Settle(resp.Usage)
		usage.Add(resp.Usage)
		cost += call.Cost(resp.Usage)
		ans.Model = serving
		var cr llm.ChatResponse
		if err := json.Unmarshal(resp.Body, &cr); err != nil || len(cr.Choices) == 0 {
			return nil, apierr.New(apierr.Provider, "the model %q answered with no choice", serving)
		}
		msg := cr.Choices[0].Message
		emit(Step{Type: "model", Step: ans.Steps, Content: msg.Content, ToolCalls: rawCalls(msg.ToolCalls)})
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
		code, language, ok := fencedCode(msg.Content)
		if !ok {
			return finish("answered"), nil
		}
		ex, err := run(code, language)
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

// rawCalls is a model reply's tool calls as a step shows them: each as
// the relay's JSON, which the API passes through.
func rawCalls(calls []llm.ToolCall) []json.RawMessage {
	if len(calls) == 0 {
		return nil
	}
	out := make([]json.RawMessage, len(calls))
	for i, c := range calls {
		out[i], _ = json.Marshal(c) // strings and a raw message: cannot fail
	}
	return out
}
