// Package webhooks delivers an owner's events to the URLs it registers:
// every stored event of the owner's sandboxes (of the webhook's types) is
// POSTed to each, signed, and retried with exponential backoff (jittered:
// internal/backoff); each attempt is logged in the store. The server
// (internal/server) serves its endpoints, /v1/webhooks, over a Service.
//
// A webhook makes the server send requests where a tenant says, so three
// rules keep it from being a way into the server's own networks
// (docs/security.md, "9. Webhooks"):
//
//   - Destinations. The address actually connected to is checked, in the
//     dialler's Control hook after DNS (a name cannot rebind around it):
//     every address policy.ForbiddenAddr classifies (loopback, private,
//     link-local, carrier-grade NAT, multicast, reserved, cloud metadata)
//     and the host's own addresses are refused unless the operator allows
//     their range (Config.AllowCIDRs, serve --webhook-allow-cidr);
//     unspecified, multicast, link-local and cloud metadata addresses are
//     refused whatever the operator allows. Config.AllowHosts restricts
//     destinations further and never widens them: a name it lists must
//     still resolve to an address allowed above. Redirects are not
//     followed; no proxy from the environment is used (destinations.go).
//   - Reports. The tenant learns "delivered" or "not delivered", nothing
//     of why: a failed attempt is recorded with status 0, the error "not
//     delivered" and no duration, and it is recorded (and its retry
//     scheduled, and its account's slot released) only when the attempt's
//     whole timeout has passed, so that a refused connection, an answer
//     401 and a receiver that hangs look the same, also in time. The cause
//     goes to the operator's log (deliver.go).
//   - Fairness. Each account has its own queue; a round-robin scheduler
//     gives the server's delivery slots (Config.Workers) to the accounts
//     in turn, each account holding at most Config.AccountWorkers of
//     them, so one account's slow or hanging receivers delay only its own
//     deliveries (deliver.go).
//
// What it needs of the rest is narrow: the store's webhook and delivery
// methods (Store) and a bus to hook (Bus).
//
// # In detail
//
// Through the server's endpoints an owner registers URLs
// (`POST/GET/DELETE /v1/webhooks`; the signing secret is shown once, at
// creation, and kept in the store because signing needs it). A bus hook
// queues a delivery per matching webhook in its account's queue (bounded per
// account and in all, never blocking the bus); a round-robin scheduler starts
// deliveries from the accounts with work in turn, at most
// `Config.Workers` (32; the server's `WebhookWorkers`) in flight and
// `AccountWorkers` (4) per account, so one account's hanging receivers hold only its own slots. Each
// delivery POSTs the event JSON with `Sheepfold-Timestamp` and
// `Sheepfold-Signature: v1=<hex HMAC-SHA256 of "<timestamp>.<body>">`,
// retries anything but 2xx after about 1 s, 2 s, 4 s ... (each wait drawn
// in its upper half by internal/backoff; 6 attempts in all), and logs
// every attempt (`GET /v1/webhooks/{id}/deliveries`) as delivered or "not
// delivered": the cause goes to the server's log, and a failed attempt keeps
// its slot and is recorded only when its whole timeout has passed, so the
// record and its timing tell nothing of the remote. The server dials webhook
// destinations itself: it resolves the host and connects through a dialler
// whose Control hook checks the socket's address (no rebinding between check
// and connect) with policy.ForbiddenAddr, the egress gateway's
// classification (loopback, private, CGNAT, link-local, metadata, reserved),
// and egress.HostAddr (the host's own); those are refused unless in an
// operator's range (`serve --webhook-allow-cidr`), and link-local, metadata,
// unspecified and multicast ones always. No redirects, no proxy from the
// environment; `serve --webhook-allow-hosts` (names, `*.domain`, CIDRs)
// narrows destinations further. Deliveries still queued or waiting for a
// retry at shutdown are dropped.
//
// Imports: api (the webhook and delivery as the API shows them),
// internal/store (the webhook and delivery records),
// internal/events (the events delivered), internal/apierr (the codes of
// its refusals), internal/backoff (retries), internal/bound (the URL's
// port), internal/policy (which addresses are not public) and
// internal/egress (the host's own addresses).
package webhooks

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Webhook headers.
const (
	headerSignature = "Sheepfold-Signature" // v1=<hex HMAC-SHA256 of "<timestamp>.<body>">
	headerTimestamp = "Sheepfold-Timestamp" // Unix seconds
	headerEventID   = "Sheepfold-Event-Id"
	headerEventType = "Sheepfold-Event-Type"
	headerWebhookID = "Sheepfold-Webhook-Id"
)

// Bounds of webhooks.
const (
	maxWebhooksPerOwner = 20
	maxWebhookURL       = 2048
	webhookQueue        = 50000 // deliveries waiting, all accounts
	webhookAccountQueue = 1000  // deliveries waiting, one account
	// notDelivered is what the tenant sees of any failed attempt.
	notDelivered = "not delivered"
)

// Sign returns the signature header value of a webhook delivery: "v1="
// and the hex HMAC-SHA256, under secret, of the timestamp, a dot and the
// body. Receivers compute the same and compare in constant time.
func Sign(secret, timestamp string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(timestamp))
	mac.Write([]byte("."))
	mac.Write(body)
	return "v1=" + hex.EncodeToString(mac.Sum(nil))
}

// Config configures a Service. Zero fields take the defaults in
// brackets.
type Config struct {
	// AllowHosts restricts where webhooks may deliver: host names (exact,
	// or "*.example.com") and CIDRs (CheckHosts). Empty restricts
	// nothing. It never widens AllowCIDRs' rule, except that its CIDRs
	// count as allowed ranges too.
	AllowHosts []string
	// AllowCIDRs are the address ranges webhooks may reach although they
	// are not public or are the host's own (CheckCIDRs). Empty: only
	// public addresses.
	AllowCIDRs []string
	// Timeout bounds one delivery attempt; a failed attempt holds its
	// slot this long whatever failed [10s].
	Timeout time.Duration
	// Workers bounds the deliveries in flight [32], AccountWorkers those
	// of one account [4].
	Workers        int
	AccountWorkers int
	// RetryBase is the wait before a failed delivery's second attempt;
	// each later wait doubles [1s], each drawn in its upper half
	// (internal/backoff). MaxAttempts bounds the attempts of one
	// delivery [6].
	RetryBase   time.Duration
	MaxAttempts int
	// Logger is the operator's log [slog.Default()].
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.RetryBase <= 0 {
		c.RetryBase = time.Second
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 6
	}
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	if c.Workers <= 0 {
		c.Workers = 32
	}
	if c.AccountWorkers <= 0 {
		c.AccountWorkers = 4
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Store is what webhooks keep: the webhooks and their delivery log (of
// store.EventStore).
type Store interface {
	CreateWebhook(ctx context.Context, w store.Webhook) error
	ListWebhooks(ctx context.Context, owner string) ([]store.Webhook, error)
	DeleteWebhook(ctx context.Context, owner, id string) error
	AddDelivery(ctx context.Context, d store.WebhookDelivery) error
	ListDeliveries(ctx context.Context, webhookID string, afterID int64, limit int) ([]store.WebhookDelivery, error)
}

var _ Store = store.EventStore(nil)

// Bus is where the events come from: every stored event is handed to the
// hooks it was given, without blocking it (events.Bus).
type Bus interface {
	OnEvent(func(events.Event))
}

var _ Bus = (*events.Bus)(nil)

// Service registers webhooks and delivers events to them.
type Service struct {
	cfg     Config
	store   Store
	log     *slog.Logger
	dest    *destinations
	client  *http.Client
	timeout time.Duration // one attempt, and how long a failed one holds its slot
	workers int           // deliveries in flight, all accounts
	per     int           // deliveries in flight, one account
	quit    chan struct{}
	once    sync.Once // closes quit
	wg      sync.WaitGroup
	// lookup resolves host names [net.DefaultResolver]; tests replace it.
	lookup func(ctx context.Context, host string) ([]netip.Addr, error)
	// send makes one delivery in a slot [deliver]; tests replace it.
	send func(delivery)

	// mu guards hooks.
	mu    sync.RWMutex
	hooks map[string][]store.Webhook // by owner

	// qmu guards the scheduler's fields below.
	qmu      sync.Mutex
	queues   map[string]*hookQueue // by owner, while it has work
	ready    []string              // owners with work waiting and a slot of their own free, in turn
	inflight int                   // deliveries running, all accounts
	queued   int                   // deliveries waiting, all accounts
	closed   bool
}

// New returns a Service over a store; Start loads the registered webhooks
// and hooks a bus. A rule of cfg.AllowHosts or cfg.AllowCIDRs that does
// not parse (callers check with CheckHosts and CheckCIDRs first) is
// logged, and then every destination is refused.
func New(cfg Config, st Store) *Service {
	cfg.setDefaults()
	dest, err := parseDestinations(cfg.AllowHosts, cfg.AllowCIDRs)
	if err != nil {
		// Refuse every host but public ones named "\x00".
		cfg.Logger.Error("webhook destinations", "err", err)
		dest = &destinations{restrict: true, names: []string{"\x00"}}
	}
	return newService(cfg, st, dest)
}

func newService(cfg Config, st Store, dest *destinations) *Service {
	cfg.setDefaults()
	w := &Service{cfg: cfg, store: st, log: cfg.Logger, dest: dest, quit: make(chan struct{}), hooks: map[string][]store.Webhook{},
		queues: map[string]*hookQueue{}, timeout: cfg.Timeout, workers: cfg.Workers, per: cfg.AccountWorkers}
	w.lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
		return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	}
	w.send = w.deliver
	w.client = &http.Client{
		Timeout: w.timeout,
		Transport: &http.Transport{Proxy: nil, DialContext: w.dial, MaxIdleConnsPerHost: 2,
			IdleConnTimeout: time.Minute, TLSHandshakeTimeout: w.timeout, ResponseHeaderTimeout: w.timeout},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return w
}

// Start loads the registered webhooks and hooks the bus.
func (w *Service) Start(ctx context.Context, bus Bus) error {
	all, err := w.store.ListWebhooks(ctx, "")
	if err != nil {
		return err
	}
	w.mu.Lock()
	for _, h := range all {
		w.hooks[h.Owner] = append(w.hooks[h.Owner], h)
	}
	w.mu.Unlock()
	bus.OnEvent(w.enqueue)
	return nil
}

// Stop ends the deliveries in flight; those not yet made are dropped.
func (w *Service) Stop() {
	w.qmu.Lock()
	w.closed = true
	w.queues, w.ready, w.queued = map[string]*hookQueue{}, nil, 0
	w.qmu.Unlock()
	w.once.Do(func() { close(w.quit) })
	w.wg.Wait()
	w.client.CloseIdleConnections()
}

// Registered reports whether owner has the webhook id.
func (w *Service) Registered(owner, id string) bool {
	return w.registered(store.Webhook{ID: id, Owner: owner})
}

func (w *Service) registered(h store.Webhook) bool {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return slices.ContainsFunc(w.hooks[h.Owner], func(x store.Webhook) bool { return x.ID == h.ID })
}

// Hook is a webhook as its owner sees it.
type Hook = api.Webhook

func hookOf(h store.Webhook) Hook {
	t := h.Types
	if t == nil {
		t = []string{}
	}
	return Hook{ID: h.ID, URL: h.URL, Types: t, CreatedAt: h.CreatedAt.UTC()}
}

// Create registers rawURL to receive owner's events of types (all when
// none); the Hook returned carries the signing secret, shown this once.
// Errors of the caller's input are apierr.BadRequest.
func (w *Service) Create(ctx context.Context, owner, rawURL string, types []string) (Hook, error) {
	u, err := w.checkURL(rawURL)
	if err != nil {
		return Hook{}, err
	}
	for _, t := range types {
		if !events.Known(events.Type(t)) {
			return Hook{}, apierr.New(apierr.BadRequest, "unknown event type %q", t)
		}
	}
	var id [10]byte
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return Hook{}, err
	}
	if _, err := rand.Read(id[:]); err != nil {
		return Hook{}, err
	}
	h := store.Webhook{ID: "wh_" + hex.EncodeToString(id[:]), Owner: owner, URL: u.String(), Secret: "whsec_" + hex.EncodeToString(b[:]),
		Types: slices.Compact(slices.Sorted(slices.Values(types))), CreatedAt: time.Now().UTC()}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.hooks[owner]) >= maxWebhooksPerOwner {
		return Hook{}, apierr.New(apierr.BadRequest, "an account may register at most %d webhooks", maxWebhooksPerOwner)
	}
	if err := w.store.CreateWebhook(ctx, h); err != nil {
		return Hook{}, err
	}
	w.hooks[owner] = append(w.hooks[owner], h)
	out := hookOf(h)
	out.Secret = h.Secret
	return out, nil
}

// List returns owner's webhooks, without their secrets.
func (w *Service) List(ctx context.Context, owner string) ([]Hook, error) {
	l, err := w.store.ListWebhooks(ctx, owner)
	if err != nil {
		return nil, err
	}
	out := make([]Hook, len(l))
	for i, h := range l {
		out[i] = hookOf(h)
	}
	return out, nil
}

// NotFound is the error of a webhook its caller does not have.
func NotFound(id string) error {
	return apierr.New(apierr.NotFound, "webhook %q not found", id)
}

// Delete removes owner's webhook id and its delivery log; NotFound when
// owner has no such webhook.
func (w *Service) Delete(ctx context.Context, owner, id string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.store.DeleteWebhook(ctx, owner, id); errors.Is(err, store.ErrNotFound) {
		return NotFound(id)
	} else if err != nil {
		return err
	}
	w.hooks[owner] = slices.DeleteFunc(w.hooks[owner], func(h store.Webhook) bool { return h.ID == id })
	return nil
}

// Delivery is one attempt of the delivery log as the webhook's owner sees
// it: of a failed one, only that it failed.
type Delivery = api.WebhookDelivery

// Deliveries returns a page of webhook id's delivery log: at most limit
// attempts after the one numbered after, oldest first, and the cursor of
// the next page ("" at the end). The caller checks first that the webhook
// is its own (Registered).
func (w *Service) Deliveries(ctx context.Context, id string, after int64, limit int) ([]Delivery, string, error) {
	l, err := w.store.ListDeliveries(ctx, id, after, limit+1)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(l) > limit {
		l = l[:limit]
		next = strconv.FormatInt(l[limit-1].ID, 10)
	}
	out := make([]Delivery, len(l))
	for i, d := range l {
		out[i] = Delivery{ID: d.ID, EventID: d.EventID, EventType: d.EventType, Attempt: d.Attempt,
			Succeeded: d.Succeeded, Timestamp: d.Time.UTC()}
		if d.Succeeded {
			out[i].StatusCode, out[i].DurationMS = d.StatusCode, d.DurationMS
		} else {
			out[i].Error = notDelivered // also of records written before causes were kept from tenants
		}
	}
	return out, next, nil
}
