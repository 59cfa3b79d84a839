package webhooks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/bound"
	"github.com/sheepfold/sheepfold/internal/egress"
	"github.com/sheepfold/sheepfold/internal/policy"
)

// destinations are the operator's rules of where webhooks may deliver.
type destinations struct {
	// restrict is set when Config.AllowHosts lists anything: then
	// only its names and CIDRs are destinations.
	restrict bool
	names    []string       // lowercase; "*.x" matches subdomains of x
	cidrs    []netip.Prefix // AllowHosts' CIDRs
	// allowed are the ranges reachable although policy.ForbiddenAddr
	// forbids them or they are the host's: Config.AllowCIDRs and
	// the CIDRs of AllowHosts (an operator who lists 10.0.0.0/8
	// as a destination means it).
	allowed []netip.Prefix
	// hostAddr reports the host's own addresses [egress.HostAddr].
	hostAddr func(netip.Addr) bool
}

// CheckHosts reports an entry of Config.AllowHosts that is
// neither a host name nor a CIDR.
func CheckHosts(list []string) error {
	_, err := parseDestinations(list, nil)
	return err
}

// CheckCIDRs reports an entry of Config.AllowCIDRs that is
// not a CIDR or an address.
func CheckCIDRs(list []string) error {
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

// hostAllowed applies Config.AllowHosts to a URL's host and one of
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

// dial resolves the host itself and connects to its addresses one by
// one; the dialler's Control hook refuses any address checkAddr refuses,
// on the socket about to connect, so what is checked is what is
// connected to.
func (w *Service) dial(ctx context.Context, network, address string) (net.Conn, error) {
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
func (w *Service) control(_ context.Context, _, address string, _ syscall.RawConn) error {
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
func (w *Service) checkURL(raw string) (*url.URL, error) {
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

func (w *Service) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return []netip.Addr{a}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return w.lookup(ctx, host)
}
