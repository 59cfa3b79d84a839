package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// The egress decisions below are pure: the gateway (internal/egress)
// feeds them names, addresses and ports and enforces the answer.

// EgressRule is one parsed entry of Network.Allow: a host name (exact, or
// "*." for any name below it) with an optional port, or an address or
// CIDR (any port).
type EgressRule struct {
	Raw      string       // the entry as written
	Host     string       // lowercase, no trailing dot; "" for an address rule
	Wildcard bool         // "*.Host": names strictly below Host
	Port     uint16       // 0: any port
	Prefix   netip.Prefix // an address rule (a single address is a /32)
}

// ParseEgressRule parses one entry of Network.Allow.
func ParseEgressRule(s string) (EgressRule, error) {
	r := EgressRule{Raw: s}
	if s == "" || len(s) > 260 {
		return r, errors.New("empty or too long")
	}
	if p, err := netip.ParsePrefix(s); err == nil {
		if p.Addr().Zone() != "" {
			return r, errors.New("an address zone is not allowed")
		}
		r.Prefix = p.Masked()
		return r, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Zone() != "" {
			return r, errors.New("an address zone is not allowed")
		}
		r.Prefix = netip.PrefixFrom(a, a.BitLen())
		return r, nil
	}
	host := s
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		port, err := strconv.ParseUint(s[i+1:], 10, 16)
		if err != nil || port == 0 {
			return r, fmt.Errorf("bad port %q", s[i+1:])
		}
		host, r.Port = s[:i], uint16(port)
	}
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		r.Wildcard, host = true, rest
	}
	name, ok := NormalizeName(host)
	if !ok {
		return r, fmt.Errorf("%q is not a host name, address or CIDR", s)
	}
	if _, err := netip.ParseAddr(name); err == nil {
		return r, errors.New("an address cannot take a port or wildcard; list it alone")
	}
	r.Host = name
	return r, nil
}

// NormalizeName lowercases a DNS name and drops a trailing dot. It reports
// false for anything that is not letters, digits, '-' and '_' in labels of
// 1 to 63 characters, 253 in all.
func NormalizeName(name string) (string, bool) {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if name == "" || len(name) > 253 {
		return "", false
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 {
			return "", false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", false
			}
		}
	}
	return name, true
}

// matchName reports whether the rule's host part covers name (normalized).
func (r EgressRule) matchName(name string) bool {
	if r.Host == "" {
		return false
	}
	if r.Wildcard {
		return strings.HasSuffix(name, "."+r.Host)
	}
	return name == r.Host
}

// Egress is a sandbox's network policy, parsed once.
type Egress struct {
	Mode   string // NetworkNone, NetworkAllowlist or NetworkPublic
	Rules  []EgressRule
	Inject []InjectRule // Network.Rules (rules.go)
}

// CompileEgress parses a network policy; nil or an empty mode is "none".
// Its errors are *FieldError.
func CompileEgress(n *Network) (*Egress, error) {
	e := &Egress{Mode: NetworkNone}
	if n == nil {
		return e, nil
	}
	switch n.Mode {
	case "", NetworkNone:
		if len(n.Allow) > 0 {
			return nil, bad("network.allow", "needs mode \"allowlist\"")
		}
		if len(n.Rules) > 0 {
			return nil, bad("network.rules", "need mode \"allowlist\" or \"public\"")
		}
		return e, nil
	case NetworkAllowlist, NetworkPublic:
		e.Mode = n.Mode
	default:
		return nil, bad("network.mode", "must be none, allowlist or public, not %q", n.Mode)
	}
	if e.Mode == NetworkPublic && len(n.Allow) > 0 {
		return nil, bad("network.allow", "is only for mode \"allowlist\"")
	}
	if len(n.Allow) > 256 {
		return nil, bad("network.allow", "at most 256 entries")
	}
	for i, s := range n.Allow {
		r, err := ParseEgressRule(s)
		if err != nil {
			return nil, bad(fmt.Sprintf("network.allow[%d]", i), "%q: %v", s, err)
		}
		e.Rules = append(e.Rules, r)
	}
	var err error
	if e.Inject, err = compileRules(n); err != nil {
		return nil, err
	}
	return e, nil
}

// Enabled reports whether the sandbox has a network at all.
func (e *Egress) Enabled() bool { return e != nil && e.Mode != NetworkNone && e.Mode != "" }

// ResolveName decides whether the gateway answers a DNS query for name
// (normalized) on behalf of the sandbox: in allowlist mode only names some
// rule covers, at any port. It returns the rule that decided.
func (e *Egress) ResolveName(name string) (rule string, ok bool) {
	switch {
	case !e.Enabled():
		return "mode none", false
	case e.Mode == NetworkPublic:
		return "mode public", true
	}
	for _, r := range e.Rules {
		if r.matchName(name) {
			return r.Raw, true
		}
	}
	return "not in allowlist", false
}

// AllowNamePort decides a connection to port that claims name (the name it
// was resolved from, its TLS SNI or its HTTP Host).
func (e *Egress) AllowNamePort(name string, port uint16) (rule string, ok bool) {
	switch {
	case !e.Enabled():
		return "mode none", false
	case e.Mode == NetworkPublic:
		return "mode public", true
	}
	for _, r := range e.Rules {
		if r.matchName(name) && (r.Port == 0 || r.Port == port) {
			return r.Raw, true
		}
	}
	return "not in allowlist", false
}

// AllowAddrRule decides a connection by its address alone: public mode
// allows every address, allowlist mode the listed addresses and CIDRs.
// ForbiddenAddr is checked apart and always wins.
func (e *Egress) AllowAddrRule(a netip.Addr) (rule string, ok bool) {
	switch {
	case !e.Enabled():
		return "mode none", false
	case e.Mode == NetworkPublic:
		return "mode public", true
	}
	for _, r := range e.Rules {
		if r.Prefix.IsValid() && r.Prefix.Contains(a) {
			return r.Raw, true
		}
	}
	return "not in allowlist", false
}

// forbidden are the destinations no mode reaches, whatever a name
// resolves to: the host and its networks, every cloud's metadata and
// host-service addresses, and addresses that embed or translate to IPv4
// ones.
var forbidden = func() []struct {
	p      netip.Prefix
	reason string
} {
	list := []struct{ cidr, reason string }{
		// Cloud metadata and host services first, so that the reason
		// names them. Most sit in ranges refused below anyway; Azure's
		// wireserver is a public address reachable only from Azure's
		// hosts.
		{"169.254.169.254/32", "cloud metadata (AWS, GCP, Azure, Oracle, OpenStack and others)"},
		{"169.254.169.253/32", "cloud metadata (AWS DNS)"},
		{"169.254.169.123/32", "cloud metadata (AWS time sync)"},
		{"169.254.170.2/32", "cloud metadata (AWS ECS task credentials)"},
		{"169.254.170.23/32", "cloud metadata (AWS EKS Pod Identity)"},
		{"169.254.0.23/32", "cloud metadata (Tencent)"},
		{"168.63.129.16/32", "cloud metadata (Azure wireserver)"},
		{"100.100.100.200/32", "cloud metadata (Alibaba)"},
		{"192.0.0.192/32", "cloud metadata (Oracle)"},
		{"fd00:ec2::/64", "cloud metadata (AWS IPv6: IMDS fd00:ec2::254, DNS, time, EKS)"},
		{"fd20:ce::254/128", "cloud metadata (GCP IPv6)"},
		{"0.0.0.0/8", "this network"},
		{"10.0.0.0/8", "private"},
		{"100.64.0.0/10", "carrier-grade NAT"},
		{"127.0.0.0/8", "loopback"},
		{"169.254.0.0/16", "link-local"},
		{"172.16.0.0/12", "private"},
		{"192.0.0.0/24", "IETF protocol assignments"},
		{"192.168.0.0/16", "private"},
		{"198.18.0.0/15", "benchmarking"},
		{"224.0.0.0/4", "multicast"},
		{"240.0.0.0/4", "reserved"},
		{"::/128", "unspecified"},
		{"::1/128", "loopback"},
		{"::ffff:0:0/96", "IPv4-mapped"},
		{"64:ff9b::/96", "NAT64"},
		{"64:ff9b:1::/48", "NAT64"},
		{"2002::/16", "6to4"},
		{"2001::/32", "Teredo"},
		{"fc00::/7", "private"},
		{"fe80::/10", "link-local"},
		{"fec0::/10", "site-local"},
		{"ff00::/8", "multicast"},
	}
	out := make([]struct {
		p      netip.Prefix
		reason string
	}, len(list))
	for i, f := range list {
		out[i].p, out[i].reason = netip.MustParsePrefix(f.cidr), f.reason
	}
	return out
}()

// ForbiddenAddr reports whether a is a destination no sandbox may reach in
// any mode, and why. Invalid addresses and zones are forbidden.
func ForbiddenAddr(a netip.Addr) (reason string, bad bool) {
	if !a.IsValid() || a.Zone() != "" {
		return "invalid address", true
	}
	for _, f := range forbidden {
		if f.p.Contains(a) {
			return f.reason, true
		}
	}
	if a.Is6() && !netip.MustParsePrefix("2000::/3").Contains(a) {
		return "not global unicast", true
	}
	return "", false
}

// CloudMetadata reports whether a is one of the clouds' metadata or
// host-service addresses ForbiddenAddr refuses, and whose: for dialers
// that allow private addresses but never these (webhooks).
func CloudMetadata(a netip.Addr) (reason string, bad bool) {
	a = a.Unmap()
	for _, f := range forbidden {
		if strings.HasPrefix(f.reason, "cloud metadata") && f.p.Contains(a) {
			return f.reason, true
		}
	}
	return "", false
}

// DNS tunnelling limits: names longer than these are refused before any
// upstream lookup, in every mode. Real host names stay well below them.
const (
	MaxDNSLabel  = 40
	MaxDNSName   = 100
	MaxDNSLabels = 10
)

// DNSTunnelling reports whether a query name (normalized) looks like data
// smuggled through DNS: an overlong label, an overlong name or too many
// labels. (Many distinct names under one parent are counted per sandbox
// by the gateway; see Parent.)
func DNSTunnelling(name string) (reason string, bad bool) {
	if len(name) > MaxDNSName {
		return fmt.Sprintf("name longer than %d characters", MaxDNSName), true
	}
	n := 0
	for label := range strings.SplitSeq(name, ".") {
		n++
		if len(label) > MaxDNSLabel {
			return fmt.Sprintf("label longer than %d characters", MaxDNSLabel), true
		}
	}
	if n > MaxDNSLabels {
		return fmt.Sprintf("more than %d labels", MaxDNSLabels), true
	}
	return "", false
}

// Parent returns the last two labels of a normalized name (the zone a
// tunnel's queries share), or the name itself if it has fewer.
func Parent(name string) string {
	i := strings.LastIndexByte(name, '.')
	if i < 0 {
		return name
	}
	if j := strings.LastIndexByte(name[:i], '.'); j >= 0 {
		return name[j+1:]
	}
	return name
}

// NetworkPolicy returns the network part of p (nil: none).
func (p *Policy) NetworkPolicy() *Network {
	if p == nil {
		return nil
	}
	return p.Network
}

// NetworkRequests is resource_limits.network_requests, 0 when unset.
func (p *Policy) NetworkRequests() int64 {
	if p == nil || p.ResourceLimits == nil || p.ResourceLimits.NetworkRequests == nil {
		return 0
	}
	return *p.ResourceLimits.NetworkRequests
}
