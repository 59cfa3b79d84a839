// Package llm relays OpenAI-compatible chat completions to the model
// providers the operator configures ([[providers]] in the server's config
// file). A request names a model; the provider serving it gets the
// request's bytes unchanged, with the provider's own key (read from the
// environment at start, never from the file) in place of the caller's.
// Responses come back as the provider sent them, streamed (SSE) or not.
//
// Every call is bounded: a non-streamed one by the provider's timeout,
// retries included (429 and 5xx are retried with exponential backoff,
// honouring Retry-After, while time is left); a stream by the same timeout
// between two chunks. A provider that hangs, answers with something that
// is not a chat completion, or ends a stream before its [DONE] gives a
// coded error (ERR_PROVIDER_TIMEOUT, ERR_PROVIDER), never a hang.
//
// The package meters nothing itself: each call returns the tokens it
// delivered, and Provider.Cost prices them. That is the provider's report
// (streams always ask for it with stream_options.include_usage, and the
// usage-only chunk reaches the caller only if it asked too), checked: a
// negative count is replaced by the estimate and one above MaxCallTokens
// cut to it, logged. Without a report (the provider sent none, or the
// stream ended early: the caller went away, the provider broke off) it is
// an estimate from the request's bytes and the text delivered (relay.go:
// promptEstimate, completionEstimate). Request.Reservation is what a call
// may use, which the server holds of quotas and credits while it runs.
//
// # The relay and its accounting
//
// internal/llm relays OpenAI-compatible chat completions to the providers of
// the config file's `[[providers]]` (cmd/sheepfold reads them beside the flag
// keys; `llm.New` reads each key from the environment and refuses to start
// without it). The relay reads only `model`, `stream`, `stream_options` and
// `max_tokens` (or `max_completion_tokens`) of a request and passes its bytes
// on with the provider's key, changed only to ask for usage (below); a
// non-streamed answer is checked to be a completion (`choices`) and passed
// back as sent. Retries (429, 5xx, failed connections; backoff doubling, jittered, from
// 200 ms, Retry-After honoured) happen only before anything reached the
// caller, inside one timeout per call; a stream's timeout applies to each
// line. Every stream asks the provider for its usage chunk
// (`stream_options.include_usage: true`, set whatever the caller sent) and
// withholds it unless the caller asked for it. What a call returns to meter is
// what it delivered: the provider's usage, or, when none came (the caller
// hung up, the provider broke off or reports none), an estimate of the
// request (a quarter of its bytes) and of the text passed on (a token per
// four bytes, at least one per chunk); a negative or unparseable count is
// replaced by the estimate, one above 10 million tokens cut, and logged.
// internal/server/models.go admits a completion (model configured,
// credits, the model's monthly token quota per account, else its fallback
// model) and holds what it may use (`Request.Reservation`: the prompt's
// estimate plus `max_tokens`, else 4096) of the quota (metering's
// `ReserveTokens`, counted with the month's tokens until released) and its
// price of the credits (account's `HoldCredits`), so that concurrent calls
// are admitted against what the calls before them may use; it relays the
// call and settles it: internal/metering's `AddTokens` (a map
// update) adds tokens to per-hour, per-account, per-model buckets
// (`token_hours`, migration 0007) written after each flush's usage
// transaction, and accrues the cost to the account, so it reaches the
// credit ledger with the sandboxes' cost. The month's tokens per account and
// model are kept in memory (read once per month) for the quota check.
//
// Imports: api (a model as GET /v1/models lists it), internal/apierr,
// internal/bound (the ranges of a provider's numbers), internal/backoff
// (the waits between retries) and the standard library. llmtest/ is a
// scripted OpenAI-compatible server for tests, examples and the bench.
package llm

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/bound"
)

// Defaults of a provider's settings.
const (
	DefaultTimeout    = 60 * time.Second
	DefaultMaxRetries = 2
	// MaxPricePerMTok bounds a price per million tokens (in units): a
	// call's tokens (at most MaxCallTokens each way) cost at most
	// 2e13 micro-units, well within an amount (bound.MaxAmountMicros).
	MaxPricePerMTok = 1e6
)

// Provider is one OpenAI-compatible provider, as the config file gives it.
type Provider struct {
	// Name names the provider in errors and in GET /v1/models (owned_by).
	Name string `toml:"name"`
	// BaseURL is the provider's API root; chat completions go to
	// BaseURL + "/chat/completions".
	BaseURL string `toml:"base_url"`
	// APIKeyEnv is the environment variable holding the provider's key;
	// "" sends no key (a local server).
	APIKeyEnv string `toml:"api_key_env"`
	// Models are the model names this provider serves.
	Models []string `toml:"models"`
	// Prices per million tokens, in units of the operator's currency.
	PriceInputPerMTok  float64 `toml:"price_input_per_mtok"`
	PriceOutputPerMTok float64 `toml:"price_output_per_mtok"`
	// MonthlyTokenQuota bounds the tokens (prompt plus completion) each
	// account may use of each of these models in a calendar month (UTC);
	// 0 is no bound.
	MonthlyTokenQuota int64 `toml:"monthly_token_quota"`
	// QuotaFallbackModel, when set, serves requests of an account past
	// the quota instead of refusing them; it must be a configured model.
	QuotaFallbackModel string `toml:"quota_fallback_model"`
	// TimeoutSeconds bounds one call, retries included, and the wait for
	// each chunk of a stream [60].
	TimeoutSeconds float64 `toml:"timeout_seconds"`
	// MaxRetries is how many times a 429, a 5xx or a failed connection is
	// retried [2]; -1 is none.
	MaxRetries int `toml:"max_retries"`
}

// Timeout is the provider's timeout.
func (p *Provider) Timeout() time.Duration {
	if p.TimeoutSeconds <= 0 {
		return DefaultTimeout
	}
	return time.Duration(p.TimeoutSeconds * float64(time.Second))
}

// Retries is how many retries a call may make.
func (p *Provider) Retries() int {
	switch {
	case p.MaxRetries < 0:
		return 0
	case p.MaxRetries == 0:
		return DefaultMaxRetries
	}
	return p.MaxRetries
}

// Cost is what usage costs at the provider's prices, in micro-units: a
// price per million tokens is a price in micro-units per token.
func (p *Provider) Cost(u Usage) float64 {
	return float64(u.PromptTokens)*p.PriceInputPerMTok + float64(u.CompletionTokens)*p.PriceOutputPerMTok
}

// Usage is the tokens of one call.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

// UnmarshalJSON reads a provider's usage without failing on its numbers:
// a fraction is rounded, a huge number saturates, and anything that is
// not a number reads as -1, which the relay does not believe
// (Relay.meter).
func (u *Usage) UnmarshalJSON(b []byte) error {
	var v struct {
		PromptTokens     json.RawMessage `json:"prompt_tokens"`
		CompletionTokens json.RawMessage `json:"completion_tokens"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	count := func(raw json.RawMessage) int64 {
		if len(raw) == 0 || string(raw) == "null" {
			return 0
		}
		var f float64
		if err := json.Unmarshal(raw, &f); err != nil {
			return -1
		}
		var n int64
		if err := json.Unmarshal(raw, &n); err == nil {
			return n
		}
		switch {
		case f >= math.MaxInt64:
			return math.MaxInt64
		case f <= math.MinInt64:
			return math.MinInt64
		}
		return int64(math.Round(f))
	}
	u.PromptTokens, u.CompletionTokens = count(v.PromptTokens), count(v.CompletionTokens)
	return nil
}

// Total is prompt plus completion tokens.
func (u Usage) Total() int64 { return u.PromptTokens + u.CompletionTokens }

// Add adds d to u.
func (u *Usage) Add(d Usage) {
	u.PromptTokens += d.PromptTokens
	u.CompletionTokens += d.CompletionTokens
}

// Validate checks the providers as a whole, naming the one at fault:
// names and models unique, URLs absolute http(s), prices and quotas not
// negative, fallbacks configured models.
func Validate(ps []Provider) error {
	names := map[string]bool{}
	models := map[string]string{}
	for i := range ps {
		p := &ps[i]
		what := fmt.Sprintf("providers[%d]", i)
		if p.Name != "" {
			what = fmt.Sprintf("provider %q", p.Name)
		}
		switch {
		case p.Name == "":
			return fmt.Errorf("%s: name is required", what)
		case names[p.Name]:
			return fmt.Errorf("%s: the name is given twice", what)
		case len(p.Models) == 0:
			return fmt.Errorf("%s: models must name at least one model", what)
		case p.PriceInputPerMTok < 0 || p.PriceOutputPerMTok < 0 || math.IsNaN(p.PriceInputPerMTok+p.PriceOutputPerMTok):
			return fmt.Errorf("%s: prices must not be negative", what)
		case p.PriceInputPerMTok > MaxPricePerMTok || p.PriceOutputPerMTok > MaxPricePerMTok:
			return fmt.Errorf("%s: prices must be at most %d per million tokens", what, int64(MaxPricePerMTok))
		case p.MonthlyTokenQuota < 0 || p.MonthlyTokenQuota > bound.MaxCount:
			return fmt.Errorf("%s: monthly_token_quota must be from 0 to %d", what, bound.MaxCount)
		case p.TimeoutSeconds < 0 || math.IsNaN(p.TimeoutSeconds) || p.TimeoutSeconds > bound.MaxDuration.Seconds():
			return fmt.Errorf("%s: timeout_seconds must be from 0 to %d", what, int64(bound.MaxDuration.Seconds()))
		case p.MaxRetries < -1 || p.MaxRetries > 10:
			return fmt.Errorf("%s: max_retries must be between -1 and 10", what)
		}
		names[p.Name] = true
		u, err := url.Parse(p.BaseURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			return fmt.Errorf("%s: base_url %q must be an absolute http or https URL", what, p.BaseURL)
		}
		for _, m := range p.Models {
			if m == "" || strings.TrimSpace(m) != m || len(m) > 256 {
				return fmt.Errorf("%s: model %q is not a valid model name", what, m)
			}
			if other, dup := models[m]; dup {
				return fmt.Errorf("%s: model %q is also served by provider %q", what, m, other)
			}
			models[m] = p.Name
		}
	}
	for i := range ps {
		if f := ps[i].QuotaFallbackModel; f != "" {
			if _, ok := models[f]; !ok {
				return fmt.Errorf("provider %q: quota_fallback_model %q is not a configured model", ps[i].Name, f)
			}
			if f == ps[i].Models[0] && len(ps[i].Models) == 1 {
				return fmt.Errorf("provider %q: quota_fallback_model %q is its own model", ps[i].Name, f)
			}
		}
	}
	return nil
}

// Model is one configured model as GET /v1/models lists it.
type Model = api.Model

// Relay relays chat completions to the configured providers. Safe for
// concurrent use.
type Relay struct {
	byModel map[string]*provider
	models  []Model
	client  *http.Client
	// backoff is the wait before the first retry; each later one doubles
	// (jittered: internal/backoff).
	backoff time.Duration
	log     *slog.Logger // [slog.Default]; SetLogger before use
}

type provider struct {
	*Provider
	key      string
	endpoint string // BaseURL + "/chat/completions"
}

// ErrNoKey reports a provider whose api_key_env is not set.
var ErrNoKey = errors.New("the provider's API key variable is not set")

// New returns a Relay over validated providers, reading each provider's
// key from getenv. A provider whose api_key_env is empty in the
// environment is an error naming it: a server would otherwise answer every
// request of its models with the provider's 401.
func New(ps []Provider, getenv func(string) string) (*Relay, error) {
	if err := Validate(ps); err != nil {
		return nil, err
	}
	r := &Relay{byModel: map[string]*provider{}, backoff: 200 * time.Millisecond, log: slog.Default(),
		client: &http.Client{Transport: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			MaxIdleConns:        256,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
			TLSHandshakeTimeout: 10 * time.Second,
			ForceAttemptHTTP2:   true,
		}}}
	now := time.Now().Unix()
	for i := range ps {
		p := &provider{Provider: &ps[i], endpoint: strings.TrimRight(ps[i].BaseURL, "/") + "/chat/completions"}
		if p.APIKeyEnv != "" {
			if p.key = getenv(p.APIKeyEnv); p.key == "" {
				return nil, fmt.Errorf("provider %q: %s: %w", p.Name, p.APIKeyEnv, ErrNoKey)
			}
		}
		for _, m := range p.Models {
			r.byModel[m] = p
			r.models = append(r.models, Model{ID: m, Object: "model", Created: now, OwnedBy: p.Name})
		}
	}
	sort.Slice(r.models, func(i, j int) bool { return r.models[i].ID < r.models[j].ID })
	return r, nil
}

// SetBackoff sets the wait before the first retry (tests shorten it).
func (r *Relay) SetBackoff(d time.Duration) { r.backoff = d }

// SetLogger sets where the relay logs what it does not believe of a
// provider (before the relay is used).
func (r *Relay) SetLogger(l *slog.Logger) { r.log = l }

// Models lists the configured models, by name. A nil Relay has none.
func (r *Relay) Models() []Model {
	if r == nil {
		return nil
	}
	return append([]Model(nil), r.models...)
}

// Provider returns the provider serving a model, or nil.
func (r *Relay) Provider(model string) *Provider {
	if r == nil {
		return nil
	}
	if p := r.byModel[model]; p != nil {
		return p.Provider
	}
	return nil
}
