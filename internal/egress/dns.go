package egress

import (
	"context"
	"net/netip"
	"strings"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
)

// dnsTTL is the TTL of the gateway's answers. What a name resolved to is
// remembered for the sandbox's life regardless.
const dnsTTL = 30

// answerDNS answers one DNS query from the sandbox, or returns nil for a
// message it cannot parse (which is dropped).
func (g *Gateway) answerDNS(ctx context.Context, req []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(req)
	if err != nil || h.Response {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	resp := dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode,
		RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	rcode, addrs := g.resolveQuestion(ctx, h, q)
	resp.RCode = rcode
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), resp)
	b.EnableCompression()
	if b.StartQuestions() != nil || b.Question(q) != nil || b.StartAnswers() != nil {
		return nil
	}
	for _, a := range addrs {
		rh := dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: dnsTTL}
		if b.AResource(rh, dnsmessage.AResource{A: a.As4()}) != nil {
			return nil
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// resolveQuestion decides and answers one question: the response code and
// the A records (IPv4 only; AAAA and other types are answered empty).
func (g *Gateway) resolveQuestion(ctx context.Context, h dnsmessage.Header, q dnsmessage.Question) (dnsmessage.RCode, []netip.Addr) {
	if h.OpCode != 0 || q.Class != dnsmessage.ClassINET {
		return dnsmessage.RCodeNotImplemented, nil
	}
	raw := strings.TrimSuffix(q.Name.String(), ".")
	name, ok := policy.NormalizeName(raw)
	if !ok {
		g.report(deny(events.KindDNSDenied, "not a valid host name"), "dns", raw)
		return dnsmessage.RCodeNameError, nil
	}
	if reason, bad := policy.DNSTunnelling(name); bad {
		g.report(deny(events.KindDNSDenied, "dns tunnelling: "+reason), "dns", name)
		return dnsmessage.RCodeRefused, nil
	}
	rule, ok := g.pol.Load().ResolveName(name)
	if !ok {
		g.report(deny(events.KindDNSDenied, rule), "dns", name)
		return dnsmessage.RCodeNameError, nil
	}
	if g.tooManyUnder(name) {
		g.report(deny(events.KindDNSDenied, "dns tunnelling: too many names under "+policy.Parent(name)), "dns", name)
		return dnsmessage.RCodeRefused, nil
	}
	if q.Type != dnsmessage.TypeA {
		// No IPv6 route and no other record types: an empty answer makes
		// resolvers fall back to the A record.
		return dnsmessage.RCodeSuccess, nil
	}
	addrs, err := g.lookup(ctx, name)
	if err != nil {
		g.log.Info("dns lookup failed", "name", name, "err", err)
		return dnsmessage.RCodeServerFailure, nil
	}
	var ok4 []netip.Addr
	var refused string
	for _, a := range addrs {
		a = a.Unmap()
		if !a.Is4() {
			continue
		}
		if reason, bad := policy.ForbiddenAddr(a); bad {
			refused = a.String() + " (" + reason + ")"
			continue
		}
		ok4 = append(ok4, a)
	}
	if len(ok4) == 0 && refused != "" {
		g.report(deny(events.KindDNSDenied, "resolves to a forbidden destination: "+refused), "dns", name)
		return dnsmessage.RCodeNameError, nil
	}
	if len(ok4) == 0 {
		return dnsmessage.RCodeNameError, nil
	}
	g.remember(name, ok4)
	g.report(allow(rule), "dns", name)
	return dnsmessage.RCodeSuccess, ok4
}
