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
	"github.com/sheepfold/sheepfold/internal/backoff"
	"github.com/sheepfold/sheepfold/internal/bound"
	"github.com/sheepfold/sheepfold/internal/egress"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Webhooks: an owner registers URLs; every stored event of the owner's
// sandboxes (of the webhook's types) is POSTed to each, signed, and
// retried with exponential backoff (jittered: internal/backoff); each
// attempt is logged in the store.
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
//     their range (Config.WebhookAllowCIDRs, serve --webhook-allow-cidr);
//     unspecified, multicast, link-local and cloud metadata addresses are
//     refused whatever the operator allows. Config.WebhookAllowHosts
//     restricts destinations further and never widens them: a name it
//     lists must still resolve to an address allowed above. Redirects are
//     not followed; no proxy from the environment is used.
//   - Reports. The tenant learns "delivered" or "not delivered", nothing
//     of why: a failed attempt is recorded with status 0, the error "not
//     delivered" and no duration, and it is recorded (and its retry
//     scheduled, and its account's slot released) only when the attempt's
//     whole timeout has passed, so that a refused connection, an answer
//     401 and a receiver that hangs look the same, also in time. The cause
//     goes to the operator's log.
//   - Fairness. Each account has its own queue; a round-robin scheduler
//     gives the server's delivery slots (Config.WebhookWorkers) to the
//     accounts in turn, each account holding at most
//     Config.WebhookAccountWorkers of them, so one account's slow or
//     hanging receivers delay only its own deliveries.

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

// destinations are the operator's rules of where webhooks may deliver.
type destinations struct {
	// restrict is set when Config.WebhookAllowHosts lists anything: then
	// only its names and CIDRs are destinations.
	restrict bool
	names    []string       // lowercase; "*.x" matches subdomains of x
	cidrs    []netip.Prefix // WebhookAllowHosts' CIDRs
	// allowed are the ranges reachable although policy.ForbiddenAddr
	// forbids them or they are the host's: Config.WebhookAllowCIDRs and
	// the CIDRs of WebhookAllowHosts (an operator who lists 10.0.0.0/8
	// as a destination means it).
	allowed []netip.Prefix
	// hostAddr reports the host's own addresses [egress.HostAddr].
	hostAddr func(netip.Addr) bool
}

// CheckWebhookHosts reports an entry of Config.WebhookAllowHosts that is
// neither a host name nor a CIDR.
func CheckWebhookHosts(list []string) error {
	_, err := parseDestinations(list, nil)
	return err
}

// CheckWebhookCIDRs reports an entry of Config.WebhookAllowCIDRs that is
// not a CIDR or an address.
func CheckWebhookCIDRs(list []string) error {
	_, err := parseDestinations(nil, list)
	return err
}

func parsePrefix(s string) (netip.Prefix, bool) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), true
	}
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return netip.PrefixFrom(a, a.BitLen()), true
	}
	return netip.Prefix{}, false
}

func parseDestinations(hosts, cidrs []string) (*destinations, error) {
	d := &destinations{hostAddr: egress.HostAddr}
	for _, h := range hosts {
		h = strings.ToLower(strings.TrimSpace(h))
		if h == "" {
			continue
		}
		d.restrict = true
		if p, ok := parsePrefix(h); ok {
			d.cidrs = append(d.cidrs, p)
			d.allowed = append(d.allowed, p)
		} else if strings.ContainsAny(h, "/:@ ") {
			return nil, fmt.Errorf("webhook allowed host %q is neither a host name nor a CIDR", h)
		} else {
			d.names = append(d.names, strings.TrimSuffix(h, "."))
		}
	}
	for _, c := range cidrs {
		c = strings.TrimSpace(c)
		if c == "" {
			continue
		}
		p, ok := parsePrefix(c)
		if !ok {
			return nil, fmt.Errorf("webhook allowed range %q is not a CIDR (such as 10.0.0.0/8) or an address", c)
		}
		d.allowed = append(d.allowed, p)
	}
	return d, nil
}

// never reports why no operator rule makes a a destination: unspecified,
// multicast, link-local and cloud metadata addresses ("" if none of these).
func never(a netip.Addr) string {
	switch {
	case !a.IsValid() || a.Zone() != "":
		return "not a plain address"
	case a.IsUnspecified():
		return "unspecified"
	case a.IsMulticast():
		return "multicast"
	case a.IsLinkLocalUnicast():
		return "link-local"
	}
	if reason, bad := policy.CloudMetadata(a); bad {
		return reason
	}
	return ""
}

// checkAddr decides an address to connect to: nil if webhooks may
// reach it, else the reason (for the operator's log).
func (d *destinations) checkAddr(a netip.Addr) error {
	a = a.Unmap()
	if reason := never(a); reason != "" {
		return fmt.Errorf("%s is %s, which no webhook may reach", a, reason)
	}
	if slices.ContainsFunc(d.allowed, func(p netip.Prefix) bool { return p.Contains(a) }) {
		return nil
	}
	if reason, bad := policy.ForbiddenAddr(a); bad {
		return fmt.Errorf("%s is %s, which webhooks reach only in a range the operator allows (--webhook-allow-cidr)", a, reason)
	}
	if d.hostAddr != nil && d.hostAddr(a) {
		return fmt.Errorf("%s is the host's own address, which webhooks reach only in a range the operator allows (--webhook-allow-cidr)", a)
	}
	return nil
}

// hostAllowed applies Config.WebhookAllowHosts to a URL's host and one of
// its addresses: the name matches a name rule, or the address a CIDR
// rule. It only narrows: checkAddr still decides the address.
func (d *destinations) hostAllowed(host string, a netip.Addr) bool {
	if !d.restrict {
		return true
	}
	return d.nameAllowed(host) || a.IsValid() && slices.ContainsFunc(d.cidrs, func(p netip.Prefix) bool { return p.Contains(a.Unmap()) })
}

func (d *destinations) nameAllowed(host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, n := range d.names {
		if strings.HasPrefix(n, "*.") && strings.HasSuffix(host, n[1:]) || host == n {
			return true
		}
	}
	return false
}

// webhooks delivers events to the registered URLs.
type webhooks struct {
	s       *Server
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

// hookQueue is one account's deliveries; guarded by webhooks.qmu.
type hookQueue struct {
	pending []delivery // first in, first out
	active  int        // deliveries running
	ready   bool       // in webhooks.ready
}

// delivery is one attempt to make.
type delivery struct {
	hook    store.Webhook
	event   events.Event
	body    []byte
	attempt int
}

func newWebhooks(s *Server, dest *destinations) *webhooks {
	w := &webhooks{s: s, dest: dest, quit: make(chan struct{}), hooks: map[string][]store.Webhook{},
		queues: map[string]*hookQueue{}, timeout: s.cfg.WebhookTimeout, workers: s.cfg.WebhookWorkers, per: s.cfg.WebhookAccountWorkers}
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

// start loads the registered webhooks and hooks the bus.
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
	w.s.bus.OnEvent(w.enqueue)
	return nil
}

// stop ends the deliveries in flight; those not yet made are dropped.
func (w *webhooks) stop() {
	w.qmu.Lock()
	w.closed = true
	w.queues, w.ready, w.queued = map[string]*hookQueue{}, nil, 0
	w.qmu.Unlock()
	w.once.Do(func() { close(w.quit) })
	w.wg.Wait()
	w.client.CloseIdleConnections()
}

// dial resolves the host itself and connects to its addresses one by
// one; the dialler's Control hook refuses any address checkAddr refuses,
// on the socket about to connect, so what is checked is what is
// connected to.
func (w *webhooks) dial(ctx context.Context, network, address string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	addrs, err := w.resolve(ctx, host)
	if err != nil {
		return nil, err
	}
	d := &net.Dialer{Timeout: w.timeout, ControlContext: w.control}
	var errs []error
	for _, a := range addrs {
		if !w.dest.hostAllowed(host, a) {
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

// control is the dialler's Control hook: the last word on the address.
func (w *webhooks) control(_ context.Context, _, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("webhook destination %s: %w", address, err)
	}
	return w.dest.checkAddr(ap.Addr())
}

// checkURL validates a webhook URL. An address in it is checked now (a
// clear error for a mistake); a name is not resolved here, so that
// registering is no way to learn what the server's resolver answers: it
// is checked where it is dialled.
func (w *webhooks) checkURL(raw string) (*url.URL, error) {
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
	if p := u.Port(); p != "" {
		if _, err := bound.ParseInt("url", p, 1, 65535); err != nil {
			return nil, bound.Error("url", "port %.20q must be from 1 to 65535", p)
		}
	}
	host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	a, err := netip.ParseAddr(host)
	if err != nil {
		a = netip.Addr{}
		if host == "localhost" || strings.HasSuffix(host, ".localhost") {
			a = netip.MustParseAddr("127.0.0.1")
		}
	}
	if a.IsValid() {
		if err := w.dest.checkAddr(a); err != nil {
			return nil, apierr.Wrap(err, apierr.BadRequest,
				"url host %q is an address webhooks may not reach (loopback, private, link-local, metadata and other non-public addresses are refused unless the operator allows their range)", u.Hostname())
		}
	}
	// With an allowlist, a name it does not list may still resolve into
	// one of its ranges: that is decided where it is dialled.
	unlisted := a.IsValid() && !w.dest.hostAllowed(host, a) || !a.IsValid() && !w.dest.nameAllowed(host) && len(w.dest.cidrs) == 0
	if w.dest.restrict && unlisted {
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

// push queues a delivery in its account's queue and starts what may start.
func (w *webhooks) push(d delivery) {
	own := d.hook.Owner
	w.qmu.Lock()
	defer w.qmu.Unlock()
	if w.closed {
		return
	}
	q := w.queues[own]
	if q == nil {
		q = &hookQueue{}
		w.queues[own] = q
	}
	if len(q.pending) >= webhookAccountQueue || w.queued >= webhookQueue {
		w.s.log.Error("webhook delivery dropped: the queue is full", "owner", own, "webhook", d.hook.ID, "event", d.event.ID,
			"account_queued", len(q.pending), "queued", w.queued)
		return
	}
	q.pending = append(q.pending, d)
	w.queued++
	w.markReady(own, q)
	w.dispatch()
}

// markReady puts an account in turn when it has work waiting and a slot
// of its own free; w.qmu is held.
func (w *webhooks) markReady(own string, q *hookQueue) {
	if !q.ready && len(q.pending) > 0 && q.active < w.per {
		q.ready = true
		w.ready = append(w.ready, own)
	}
}

// dispatch starts deliveries while slots are free, taking the accounts
// in turn, one delivery each; w.qmu is held.
func (w *webhooks) dispatch() {
	for w.inflight < w.workers && len(w.ready) > 0 {
		own := w.ready[0]
		w.ready[0] = ""
		w.ready = w.ready[1:]
		q := w.queues[own]
		q.ready = false
		d := q.pending[0]
		q.pending[0] = delivery{}
		q.pending = q.pending[1:]
		w.queued--
		q.active++
		w.inflight++
		w.markReady(own, q) // to the back of the turn
		w.wg.Add(1)
		go w.run(own, q, d)
	}
}

// run makes one delivery in its slot and gives the slot back.
func (w *webhooks) run(own string, q *hookQueue, d delivery) {
	defer w.wg.Done()
	w.send(d)
	w.qmu.Lock()
	defer w.qmu.Unlock()
	q.active--
	w.inflight--
	if w.closed {
		return
	}
	w.markReady(own, q)
	if q.active == 0 && len(q.pending) == 0 && w.queues[own] == q {
		delete(w.queues, own)
	}
	w.dispatch()
}

// deliver makes one attempt, logs it, and schedules the next one when it
// failed: after base, 2·base, 4·base ... until WebhookMaxAttempts. A
// failed attempt returns only once its whole timeout has passed (see
// the package comment: the tenant learns nothing from its timing).
func (w *webhooks) deliver(d delivery) {
	if !w.registered(d.hook) {
		return // deleted meanwhile
	}
	start := time.Now()
	status, err := w.post(d)
	rec := store.WebhookDelivery{WebhookID: d.hook.ID, EventID: d.event.ID, EventType: string(d.event.Type),
		Attempt: d.attempt, Succeeded: err == nil, Time: start}
	if err == nil {
		rec.StatusCode, rec.DurationMS = status, float64(time.Since(start).Microseconds())/1000
	} else {
		rec.Error = notDelivered
		w.s.log.Debug("webhook delivery attempt failed", "owner", d.hook.Owner, "webhook", d.hook.ID, "event", d.event.ID,
			"attempt", d.attempt, "status", status, "err", err)
		t := time.NewTimer(time.Until(start.Add(w.timeout)))
		select {
		case <-t.C:
		case <-w.quit:
			t.Stop()
			return
		}
	}
	if serr := w.s.store.AddDelivery(context.Background(), rec); serr != nil && w.registered(d.hook) {
		w.s.log.Error("record webhook delivery", "webhook", d.hook.ID, "err", serr)
	}
	if err == nil || d.attempt >= w.s.cfg.WebhookMaxAttempts {
		if err != nil {
			w.s.log.Warn("webhook delivery failed for good", "owner", d.hook.Owner, "webhook", d.hook.ID, "event", d.event.ID,
				"attempts", d.attempt, "status", status, "err", err)
		}
		return
	}
	wait := backoff.Delay(w.s.cfg.WebhookRetryBase, 0, d.attempt)
	d.attempt++
	time.AfterFunc(wait, func() { w.push(d) }) // dropped by push after stop
}

// post sends one delivery; an error unless the receiver answered 2xx.
func (w *webhooks) post(d delivery) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
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
	u, err := s.hooks.checkURL(req.URL)
	if err != nil {
		return err
	}
	for _, t := range req.Types {
		if !events.Known(events.Type(t)) {
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
			Succeeded: d.Succeeded, Time: d.Time.UTC()}
		if d.Succeeded {
			out[i].StatusCode, out[i].DurationMS = d.StatusCode, d.DurationMS
		} else {
			out[i].Error = notDelivered // also of records written before causes were kept from tenants
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"deliveries": out, "next_cursor": next})
	return nil
}
