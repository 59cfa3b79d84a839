package policy

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseEgressRule(t *testing.T) {
	t.Parallel()
	good := map[string]EgressRule{
		"api.github.com":              {Host: "api.github.com"},
		"API.GitHub.com.":             {Host: "api.github.com"},
		"*.pypi.org":                  {Host: "pypi.org", Wildcard: true},
		"files.pythonhosted.org:443":  {Host: "files.pythonhosted.org", Port: 443},
		"*.example.com:8080":          {Host: "example.com", Wildcard: true, Port: 8080},
		"203.0.113.0/24":              {Prefix: netip.MustParsePrefix("203.0.113.0/24")},
		"203.0.113.7/24":              {Prefix: netip.MustParsePrefix("203.0.113.0/24")},
		"198.51.100.4":                {Prefix: netip.MustParsePrefix("198.51.100.4/32")},
		"2001:db8::/32":               {Prefix: netip.MustParsePrefix("2001:db8::/32")},
		"under_score.example.com:1":   {Host: "under_score.example.com", Port: 1},
		"xn--bcher-kva.example:65535": {Host: "xn--bcher-kva.example", Port: 65535},
	}
	for in, want := range good {
		got, err := ParseEgressRule(in)
		if err != nil {
			t.Errorf("ParseEgressRule(%q): %v", in, err)
			continue
		}
		want.Raw = in
		if got != want {
			t.Errorf("ParseEgressRule(%q) = %+v, want %+v", in, got, want)
		}
	}
	bad := []string{"", "*", "*.", "a..b", "host:0", "host:65536", "host:x", "1.2.3.4:80",
		"*.1.2.3.4", "fe80::1%eth0", "bad host", "a/b", "ex ample.com", strings.Repeat("a", 64) + ".com",
		"**.example.com", "*.*.example.com", "http://example.com"}
	for _, in := range bad {
		if r, err := ParseEgressRule(in); err == nil {
			t.Errorf("ParseEgressRule(%q) = %+v, want an error", in, r)
		}
	}
}

func TestCompileEgress(t *testing.T) {
	t.Parallel()
	for _, n := range []*Network{nil, {}, {Mode: "none"}} {
		e, err := CompileEgress(n)
		if err != nil || e.Enabled() {
			t.Errorf("CompileEgress(%+v) = %+v, %v; want mode none", n, e, err)
		}
	}
	for _, n := range []*Network{
		{Mode: "open"}, {Mode: "none", Allow: []string{"a.com"}}, {Mode: "public", Allow: []string{"a.com"}},
		{Mode: "allowlist", Allow: []string{"a.com", "bad host"}},
	} {
		if e, err := CompileEgress(n); err == nil {
			t.Errorf("CompileEgress(%+v) = %+v, want an error", n, e)
		}
	}
}

func TestEgressDecisions(t *testing.T) {
	t.Parallel()
	e, err := CompileEgress(&Network{Mode: "allowlist", Allow: []string{
		"api.github.com", "*.pypi.org", "files.pythonhosted.org:443", "203.0.113.0/24"}})
	if err != nil {
		t.Fatal(err)
	}
	names := []struct {
		name string
		port uint16
		dns  bool
		conn bool
	}{
		{"api.github.com", 443, true, true},
		{"api.github.com", 22, true, true},
		{"github.com", 443, false, false},
		{"evilapi.github.com", 443, false, false},
		{"pypi.org", 443, false, false},
		{"x.pypi.org", 443, true, true},
		{"a.b.pypi.org", 80, true, true},
		{"evilpypi.org", 443, false, false},
		{"files.pythonhosted.org", 443, true, true},
		{"files.pythonhosted.org", 80, true, false},
	}
	for _, c := range names {
		if _, ok := e.ResolveName(c.name); ok != c.dns {
			t.Errorf("ResolveName(%q) = %v, want %v", c.name, ok, c.dns)
		}
		if _, ok := e.AllowNamePort(c.name, c.port); ok != c.conn {
			t.Errorf("AllowNamePort(%q, %d) = %v, want %v", c.name, c.port, ok, c.conn)
		}
	}
	if rule, ok := e.AllowAddrRule(netip.MustParseAddr("203.0.113.9")); !ok || rule != "203.0.113.0/24" {
		t.Errorf("AllowAddrRule(203.0.113.9) = %q, %v", rule, ok)
	}
	if _, ok := e.AllowAddrRule(netip.MustParseAddr("8.8.8.8")); ok {
		t.Error("AllowAddrRule(8.8.8.8) allowed in allowlist mode")
	}

	pub, _ := CompileEgress(&Network{Mode: "public"})
	if _, ok := pub.AllowAddrRule(netip.MustParseAddr("8.8.8.8")); !ok {
		t.Error("public mode refuses 8.8.8.8")
	}
	if _, ok := pub.ResolveName("anything.example"); !ok {
		t.Error("public mode refuses to resolve")
	}
	none, _ := CompileEgress(nil)
	if _, ok := none.ResolveName("api.github.com"); ok {
		t.Error("mode none resolves")
	}
	if _, ok := none.AllowAddrRule(netip.MustParseAddr("8.8.8.8")); ok {
		t.Error("mode none connects")
	}
}

func TestForbiddenAddr(t *testing.T) {
	t.Parallel()
	forbiddenAddrs := []string{"127.0.0.1", "127.255.0.9", "10.1.2.3", "172.16.0.1", "172.31.255.255",
		"192.168.1.1", "169.254.169.254", "169.254.1.1", "100.64.0.1", "100.127.255.254", "0.0.0.0",
		"224.0.0.1", "255.255.255.255", "198.18.0.1", "192.0.0.170", "::1", "::", "::ffff:127.0.0.1",
		"::ffff:8.8.8.8", "fe80::1", "fc00::1", "fd12::1", "ff02::1", "64:ff9b::a00:1", "2002:a00:1::1", "::127.0.0.1"}
	for _, s := range forbiddenAddrs {
		if reason, bad := ForbiddenAddr(netip.MustParseAddr(s)); !bad || reason == "" {
			t.Errorf("ForbiddenAddr(%s) = %q, %v; want forbidden", s, reason, bad)
		}
	}
	for _, s := range []string{"8.8.8.8", "1.1.1.1", "203.0.113.5", "172.32.0.1", "100.128.0.1", "2606:4700::1111"} {
		if reason, bad := ForbiddenAddr(netip.MustParseAddr(s)); bad {
			t.Errorf("ForbiddenAddr(%s) = %q; want allowed", s, reason)
		}
	}
	if _, bad := ForbiddenAddr(netip.Addr{}); !bad {
		t.Error("the zero address is not forbidden")
	}
}

// TestForbiddenCloudMetadata: every cloud's metadata and host-service
// address is refused by name, Azure's wireserver (a public address)
// included, while an ordinary public address next to it is not (the
// control).
func TestForbiddenCloudMetadata(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		"169.254.169.254", // AWS, GCP, Azure IMDS, Oracle, OpenStack, DigitalOcean, Hetzner, IBM
		"169.254.169.253", // AWS DNS
		"169.254.169.123", // AWS time sync
		"169.254.170.2",   // AWS ECS task credentials
		"169.254.170.23",  // AWS EKS Pod Identity
		"169.254.0.23",    // Tencent
		"168.63.129.16",   // Azure wireserver
		"100.100.100.200", // Alibaba
		"192.0.0.192",     // Oracle
		"fd00:ec2::254",   // AWS IMDS over IPv6
		"fd00:ec2::23",    // AWS EKS Pod Identity over IPv6
		"fd20:ce::254",    // GCP over IPv6
		"::ffff:168.63.129.16",
	} {
		reason, bad := ForbiddenAddr(netip.MustParseAddr(s))
		if !bad || (!strings.Contains(reason, "cloud metadata") && !strings.HasPrefix(s, "::ffff:")) {
			t.Errorf("ForbiddenAddr(%s) = %q, %v; want refused as cloud metadata", s, reason, bad)
		}
	}
	for _, s := range []string{"168.63.129.17", "168.63.128.16", "100.100.100.201"} {
		if reason, bad := ForbiddenAddr(netip.MustParseAddr(s)); bad && strings.Contains(reason, "cloud metadata") {
			t.Errorf("ForbiddenAddr(%s) = %q: a neighbour is not metadata", s, reason)
		}
	}
	if _, bad := ForbiddenAddr(netip.MustParseAddr("168.63.129.17")); bad {
		t.Error("168.63.129.17, a public address beside Azure's wireserver, is refused")
	}
	// CloudMetadata names these alone, IPv4-mapped spellings too, and
	// not the private or loopback ranges around them.
	for s, want := range map[string]bool{"168.63.129.16": true, "::ffff:100.100.100.200": true, "fd00:ec2::254": true,
		"169.254.169.254": true, "10.0.0.1": false, "127.0.0.1": false, "100.64.0.1": false, "fd12::1": false, "8.8.8.8": false} {
		if _, bad := CloudMetadata(netip.MustParseAddr(s)); bad != want {
			t.Errorf("CloudMetadata(%s) = %v, want %v", s, bad, want)
		}
	}
}

func TestDNSTunnelling(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"pypi.org", "files.pythonhosted.org", "d2ai8nxbm2e3la.cloudfront.net",
		"ec2-54-1-2-3.us-west-2.compute.amazonaws.com"} {
		if reason, bad := DNSTunnelling(s); bad {
			t.Errorf("DNSTunnelling(%q) = %q", s, reason)
		}
	}
	for _, s := range []string{
		strings.Repeat("a", MaxDNSLabel+1) + ".evil.com",
		strings.Repeat("abcdefghi.", 11) + "com",
		strings.Repeat("x", 39) + "." + strings.Repeat("y", 39) + "." + strings.Repeat("z", 30) + ".com",
	} {
		if _, bad := DNSTunnelling(s); !bad {
			t.Errorf("DNSTunnelling(%q) passes", s)
		}
	}
	if p := Parent("a.b.evil.com"); p != "evil.com" {
		t.Errorf("Parent = %q", p)
	}
	if p := Parent("com"); p != "com" {
		t.Errorf("Parent(com) = %q", p)
	}
}

func FuzzEgress(f *testing.F) {
	for _, s := range []string{"api.github.com", "*.pypi.org:443", "203.0.113.0/24", "::1", "a:b:c", "*.", "1.2.3.4"} {
		f.Add(s, "x.pypi.org", uint16(443))
	}
	f.Fuzz(func(t *testing.T, rule, name string, port uint16) {
		r, err := ParseEgressRule(rule)
		if err != nil {
			return
		}
		if r.Host != "" && r.Prefix.IsValid() || r.Host == "" && !r.Prefix.IsValid() {
			t.Fatalf("rule %q parsed to both or neither kind: %+v", rule, r)
		}
		if r.Host != "" {
			if n, ok := NormalizeName(r.Host); !ok || n != r.Host {
				t.Fatalf("rule host %q is not normalized", r.Host)
			}
		}
		e := &Egress{Mode: NetworkAllowlist, Rules: []EgressRule{r}}
		n, ok := NormalizeName(name)
		if !ok {
			return
		}
		_, conn := e.AllowNamePort(n, port)
		_, dns := e.ResolveName(n)
		if conn && !dns {
			t.Fatalf("%q allows a connection to %q:%d but not its resolution", rule, n, port)
		}
		if conn && n != r.Host && !strings.HasSuffix(n, "."+r.Host) {
			t.Fatalf("%q allows unrelated name %q", rule, n)
		}
		if a, err := netip.ParseAddr(name); err == nil {
			if _, bad := ForbiddenAddr(a); !bad && (a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.Is4In6()) {
				t.Fatalf("%s is not forbidden", a)
			}
		}
	})
}
