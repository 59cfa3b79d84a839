package server

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Webhooks: an owner registers URLs; every stored event of the owner's
// sandboxes (of the webhook's types) is POSTed to each, signed, and
// retried with exponential backoff; each attempt is logged in the store.
//
// Destinations: a webhook makes the server send requests where its
// owner says, so link-local addresses (169.254.0.0/16 with the cloud
// metadata service, fe80::/10) and unspecified or multicast ones are
// always refused, checked on the address actually dialled (after DNS,
// so a name cannot rebind to them), redirects are not followed, and no
// proxy from the environment is used. Loopback and private addresses are
// allowed by default (a receiver on the same host or network is the
// common case); an operator who does not want that lists the allowed
// destinations in Config.WebhookAllowHosts (serve --webhook-allow-hosts).

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
	webhookQueue        = 10000 // deliveries waiting for a worker
	webhookWorkers      = 4
	webhookTimeout      = 10 * time.Second // one attempt
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

// hostRule is one entry of Config.WebhookAllowHosts: a host name (exact,
// or "*.example.com" for its subdomains) or a CIDR.
type hostRule struct {
	name   string // lowercase; "*.x" matches subdomains of x
	prefix netip.Prefix
}

// CheckWebhookHosts reports an entry of Config.WebhookAllowHosts that is
// neither a host name nor a CIDR.
func CheckWebhookHosts(list []string) error {
	_, err := parseHostRules(list)
	return err
}

func parseHostRules(list []string) ([]hostRule, error) {
	var out []hostRule
	for _, h := range list {
		h = strings.ToLower(strings.TrimSpace(h))
		if h == "" {
			continue
		}
		if p, err := netip.ParsePrefix(h); err == nil {
			out = append(out, hostRule{prefix: p.Masked()})
		} else if a, err := netip.ParseAddr(h); err == nil {
			out = append(out, hostRule{prefix: netip.PrefixFrom(a, a.BitLen())})
		} else if strings.ContainsAny(h, "/:@ ") {
			return nil, fmt.Errorf("webhook allowed host %q is neither a host name nor a CIDR", h)
		} else {
			out = append(out, hostRule{name: h})
		}
	}
	return out, nil
}

// forbiddenAddr reports addresses no webhook may reach, whatever the
// configuration: link-local (cloud metadata), unspecified, multicast.
func forbiddenAddr(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || a.IsUnspecified() || a.IsMulticast() ||
		a.IsInterfaceLocalMulticast() || a == netip.MustParseAddr("fd00:ec2::254") // AWS's IPv6 metadata
}

// webhooks delivers events to the registered URLs.
type webhooks struct {
	s      *Server
	rules  []hostRule
	client *http.Client
	queue  chan delivery
	quit   chan struct{}
	once   sync.Once // closes quit
	wg     sync.WaitGroup
	// lookup resolves host names [net.DefaultResolver]; tests replace it.
	lookup func(ctx context.Context, host string) ([]netip.Addr, error)

	// mu guards hooks.
	mu    sync.RWMutex
	hooks map[string][]store.Webhook // by owner
}

// delivery is one attempt to make.
type delivery struct {
	hook    store.Webhook
	event   events.Event
	body    []byte
	attempt int
}

func newWebhooks(s *Server, rules []hostRule) *webhooks {
	w := &webhooks{s: s, rules: rules, queue: make(chan delivery, webhookQueue), quit: make(chan struct{}),
		hooks: map[string][]store.Webhook{}}
	w.lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
		return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	}
	w.client = &http.Client{
		Timeout: webhookTimeout,
		Transport: &http.Transport{Proxy: nil, DialContext: w.dial, MaxIdleConnsPerHost: 2,
			IdleConnTimeout: time.Minute, TLSHandshakeTimeout: webhookTimeout, ResponseHeaderTimeout: webhookTimeout},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return w
}

// start loads the registered webhooks and starts the workers.
func (w *webhooks) start(ctx context.Context) error {
	all, err := w.s.store.ListWebhooks(ctx, "")
	if err != nil {
		return err
	}
	w.mu.Lock()
	for _, h := range all {
		w.hooks[h.Owner] = append(w.hooks[h.Owner], h)
	}
	w.mu.Unlock()
	for i := 0; i < webhookWorkers; i++ {
		w.wg.Add(1)
		go w.work()
	}
	w.s.bus.OnEvent(w.enqueue)
	return nil
}

// stop ends the workers; deliveries not yet made are dropped.
func (w *webhooks) stop() {
	w.once.Do(func() { close(w.quit) })
	w.wg.Wait()
	w.client.CloseIdleConnections()
}

// dial resolves the host itself and connects only to an address that
// is allowed (never a forbidden one; with WebhookAllowHosts, one the
// rules admit), so what was checked is what is dialled: a name cannot
// rebind between the check and the connection.
func (w *webhooks) dial(ctx context.Context, network, address string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	addrs, err := w.resolve(ctx, host)
	if err != nil {
		return nil, err
	}
	d := &net.Dialer{Timeout: webhookTimeout, Control: checkDialled}
	var errs []error
	for _, a := range addrs {
		if forbiddenAddr(a) {
			errs = append(errs, fmt.Errorf("%s is link-local, unspecified or multicast", a))
			continue
		}
		if !w.hostAllowed(host, []netip.Addr{a}) {
			errs = append(errs, fmt.Errorf("%s (%s) is not among the allowed webhook hosts", host, a))
			continue
		}
		c, err := d.DialContext(ctx, network, net.JoinHostPort(a.Unmap().String(), port))
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("%s has no address", host)
	}
	return nil, errors.Join(errs...)
}

// checkDialled is the last check, on the socket's own address.
func checkDialled(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("webhook destination %s: %w", address, err)
	}
	if forbiddenAddr(ap.Addr()) {
		return fmt.Errorf("webhook destination %s is not allowed (link-local, unspecified or multicast)", ap.Addr())
	}
	return nil
}

// hostAllowed applies Config.WebhookAllowHosts to a URL's host: names
// match name rules; addresses (literal or resolved) must all match CIDR
// rules.
func (w *webhooks) hostAllowed(host string, addrs []netip.Addr) bool {
	if len(w.rules) == 0 {
		return true
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, r := range w.rules {
		switch {
		case r.name != "" && strings.HasPrefix(r.name, "*."):
			if strings.HasSuffix(host, r.name[1:]) {
				return true
			}
		case r.name != "":
			if host == r.name {
				return true
			}
		default:
			if len(addrs) > 0 && !slices.ContainsFunc(addrs, func(a netip.Addr) bool { return !r.prefix.Contains(a.Unmap()) }) {
				return true
			}
		}
	}
	return false
}

// checkURL validates a webhook URL and its destination.
func (w *webhooks) checkURL(ctx context.Context, raw string) (*url.URL, error) {
	if raw == "" {
		return nil, apierr.New(apierr.BadRequest, "url is required")
	}
	if len(raw) > maxWebhookURL {
		return nil, apierr.New(apierr.BadRequest, "url is longer than %d bytes", maxWebhookURL)
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return nil, apierr.New(apierr.BadRequest, "url must be an http or https URL with a host")
	}
	if u.User != nil {
		return nil, apierr.New(apierr.BadRequest, "url must not carry credentials; the signature authenticates deliveries")
	}
	if u.Fragment != "" {
		return nil, apierr.New(apierr.BadRequest, "url must not have a fragment")
	}
	addrs, err := w.resolve(ctx, u.Hostname())
	if err != nil {
		return nil, apierr.Wrap(err, apierr.BadRequest, "url host %q does not resolve", u.Hostname())
	}
	for _, a := range addrs {
		if forbiddenAddr(a) {
			return nil, apierr.New(apierr.BadRequest, "url host %q is a link-local, unspecified or multicast address, which webhooks may not reach", u.Hostname())
		}
	}
	if !w.hostAllowed(u.Hostname(), addrs) {
		return nil, apierr.New(apierr.BadRequest, "url host %q is not among the server's allowed webhook hosts", u.Hostname())
	}
	return u, nil
}

func (w *webhooks) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return []netip.Addr{a}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return w.lookup(ctx, host)
}

// enqueue is the bus hook: it queues a delivery per matching webhook and
// never blocks (a full queue drops, logged).
func (w *webhooks) enqueue(e events.Event) {
	w.mu.RLock()
	hooks := w.hooks[e.Owner]
	w.mu.RUnlock()
	if len(hooks) == 0 || e.ID == 0 {
		return
	}
	body, err := json.Marshal(e)
	if err != nil {
		w.s.log.Error("webhook event", "event", e.ID, "err", err)
		return
	}
	for _, h := range hooks {
		if len(h.Types) > 0 && !slices.Contains(h.Types, string(e.Type)) {
			continue
		}
		w.push(delivery{hook: h, event: e, body: body, attempt: 1})
	}
}

func (w *webhooks) push(d delivery) {
	select {
	case w.queue <- d:
	default:
		w.s.log.Error("webhook delivery dropped: the queue is full", "webhook", d.hook.ID, "event", d.event.ID)
	}
}

func (w *webhooks) work() {
	defer w.wg.Done()
	for {
		select {
		case <-w.quit:
			return
		case d := <-w.queue:
			w.deliver(d)
		}
	}
}

// deliver makes one attempt, logs it, and schedules the next one when it
// failed: after base, 2·base, 4·base ... until WebhookMaxAttempts.
func (w *webhooks) deliver(d delivery) {
	if !w.registered(d.hook) {
		return // deleted meanwhile
	}
	start := time.Now()
	status, err := w.post(d)
	rec := store.WebhookDelivery{WebhookID: d.hook.ID, EventID: d.event.ID, EventType: string(d.event.Type),
		Attempt: d.attempt, StatusCode: status, Succeeded: err == nil, Time: start,
		DurationMS: float64(time.Since(start).Microseconds()) / 1000}
	if err != nil {
		rec.Error = err.Error()
	}
	if serr := w.s.store.AddDelivery(context.Background(), rec); serr != nil && w.registered(d.hook) {
		w.s.log.Error("record webhook delivery", "webhook", d.hook.ID, "err", serr)
	}
	if err == nil || d.attempt >= w.s.cfg.WebhookMaxAttempts {
		if err != nil {
			w.s.log.Warn("webhook delivery failed for good", "webhook", d.hook.ID, "event", d.event.ID, "attempts", d.attempt, "err", err)
		}
		return
	}
	wait := w.s.cfg.WebhookRetryBase << (d.attempt - 1)
	d.attempt++
	t := time.NewTimer(wait)
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer t.Stop()
		select {
		case <-t.C:
			w.push(d)
		case <-w.quit:
		}
	}()
}

// post sends one delivery; an error unless the receiver answered 2xx.
func (w *webhooks) post(d delivery) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), webhookTimeout)
	defer cancel()
	go func() {
		select {
		case <-w.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.hook.URL, bytes.NewReader(d.body))
	if err != nil {
		return 0, err
	}
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "sheepfold-webhooks/1")
	req.Header.Set(headerTimestamp, ts)
	req.Header.Set(headerSignature, Sign(d.hook.Secret, ts, d.body))
	req.Header.Set(headerEventID, strconv.FormatInt(d.event.ID, 10))
	req.Header.Set(headerEventType, string(d.event.Type))
	req.Header.Set(headerWebhookID, d.hook.ID)
	res, err := w.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	if res.StatusCode < 200 || res.StatusCode > 299 {
		return res.StatusCode, fmt.Errorf("the receiver answered %d", res.StatusCode)
	}
	return res.StatusCode, nil
}

func (w *webhooks) registered(h store.Webhook) bool {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return slices.ContainsFunc(w.hooks[h.Owner], func(x store.Webhook) bool { return x.ID == h.ID })
}

// The endpoints.

func (s *Server) webhookRoutes(add addFunc) {
	add("POST /v1/webhooks", true, s.createWebhook)
	add("GET /v1/webhooks", true, s.listWebhooks)
	add("DELETE /v1/webhooks/{id}", true, s.deleteWebhook)
	add("GET /v1/webhooks/{id}/deliveries", true, s.listDeliveries)
}

type webhookRequest struct {
	URL   string   `json:"url"`
	Types []string `json:"types"`
}

type webhookJSON struct {
	ID        string    `json:"id"`
	URL       string    `json:"url"`
	Types     []string  `json:"types"`
	CreatedAt time.Time `json:"created_at"`
	Secret    string    `json:"secret,omitempty"`
}

func webhookOf(h store.Webhook) webhookJSON {
	t := h.Types
	if t == nil {
		t = []string{}
	}
	return webhookJSON{ID: h.ID, URL: h.URL, Types: t, CreatedAt: h.CreatedAt.UTC()}
}

func (s *Server) createWebhook(w http.ResponseWriter, r *http.Request) error {
	var req webhookRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	u, err := s.hooks.checkURL(r.Context(), req.URL)
	if err != nil {
		return err
	}
	for _, t := range req.Types {
		if !knownEventTypes[events.Type(t)] {
			return apierr.New(apierr.BadRequest, "unknown event type %q", t)
		}
	}
	own := owner(r)
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	h := store.Webhook{ID: newID("wh_"), Owner: own, URL: u.String(), Secret: "whsec_" + hex.EncodeToString(b[:]),
		Types: slices.Compact(slices.Sorted(slices.Values(req.Types))), CreatedAt: time.Now().UTC()}
	s.hooks.mu.Lock()
	if len(s.hooks.hooks[own]) >= maxWebhooksPerOwner {
		s.hooks.mu.Unlock()
		return apierr.New(apierr.BadRequest, "an account may register at most %d webhooks", maxWebhooksPerOwner)
	}
	if err := s.store.CreateWebhook(r.Context(), h); err != nil {
		s.hooks.mu.Unlock()
		return err
	}
	s.hooks.hooks[own] = append(s.hooks.hooks[own], h)
	s.hooks.mu.Unlock()
	out := webhookOf(h)
	out.Secret = h.Secret // shown this once
	writeJSON(w, http.StatusCreated, out)
	return nil
}

func (s *Server) listWebhooks(w http.ResponseWriter, r *http.Request) error {
	l, err := s.store.ListWebhooks(r.Context(), owner(r))
	if err != nil {
		return err
	}
	out := make([]webhookJSON, len(l))
	for i, h := range l {
		out[i] = webhookOf(h)
	}
	writeJSON(w, http.StatusOK, map[string]any{"webhooks": out})
	return nil
}

func webhookNotFound(id string) error {
	return apierr.New(apierr.NotFound, "webhook %q not found", id)
}

func (s *Server) deleteWebhook(w http.ResponseWriter, r *http.Request) error {
	own, id := owner(r), r.PathValue("id")
	s.hooks.mu.Lock()
	defer s.hooks.mu.Unlock()
	if err := s.store.DeleteWebhook(r.Context(), own, id); errors.Is(err, store.ErrNotFound) {
		return webhookNotFound(id)
	} else if err != nil {
		return err
	}
	s.hooks.hooks[own] = slices.DeleteFunc(s.hooks.hooks[own], func(h store.Webhook) bool { return h.ID == id })
	w.WriteHeader(http.StatusNoContent)
	return nil
}

type deliveryJSON struct {
	ID         int64     `json:"id"`
	EventID    int64     `json:"event_id"`
	EventType  string    `json:"event_type"`
	Attempt    int       `json:"attempt"`
	StatusCode int       `json:"status_code"`
	Error      string    `json:"error,omitempty"`
	Succeeded  bool      `json:"succeeded"`
	Time       time.Time `json:"timestamp"`
	DurationMS float64   `json:"duration_ms"`
}

func (s *Server) listDeliveries(w http.ResponseWriter, r *http.Request) error {
	own, id := owner(r), r.PathValue("id")
	if !s.hooks.registered(store.Webhook{ID: id, Owner: own}) {
		return webhookNotFound(id)
	}
	q := r.URL.Query()
	var after int64
	if c := q.Get("cursor"); c != "" {
		n, err := strconv.ParseInt(c, 10, 64)
		if err != nil || n < 0 {
			return apierr.New(apierr.BadRequest, "cursor must be a delivery id")
		}
		after = n
	}
	limit := defaultEventPage
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxEventPage {
			return apierr.New(apierr.BadRequest, "limit must be between 1 and %d", maxEventPage)
		}
		limit = n
	}
	l, err := s.store.ListDeliveries(r.Context(), id, after, limit+1)
	if err != nil {
		return err
	}
	var next *string
	if len(l) > limit {
		l = l[:limit]
		c := strconv.FormatInt(l[limit-1].ID, 10)
		next = &c
	}
	out := make([]deliveryJSON, len(l))
	for i, d := range l {
		out[i] = deliveryJSON{ID: d.ID, EventID: d.EventID, EventType: d.EventType, Attempt: d.Attempt,
			StatusCode: d.StatusCode, Error: d.Error, Succeeded: d.Succeeded, Time: d.Time.UTC(), DurationMS: d.DurationMS}
	}
	writeJSON(w, http.StatusOK, map[string]any{"deliveries": out, "next_cursor": next})
	return nil
}
