package policy

import (
	"bytes"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
)

// Rules per destination (issue 33). A network policy may carry rules that
// transform the plain HTTP requests the gateway carries to matching
// destinations: headers set or replaced, whose values may name the
// account's secrets as ${secrets.NAME} (or E2B's ${e2b.secrets.NAME},
// whose NAME is lower-cased, as E2B stores names). The gateway substitutes a value
// only into a request that matches a rule naming it (host, method, path
// prefix), and only in that rule's headers or in a header the sandbox
// sent with the placeholder; a placeholder anywhere else is refused
// (internal/egress, inject.go). A rule grants no access: the host must be
// allowed by the mode or the allowlist as any other.

// NetworkRule is one entry of Network.Rules.
type NetworkRule struct {
	// Host is an exact host name or "*.domain" (names strictly below
	// it); no port, no address.
	Host string `json:"host"`
	// Methods, when given, are the request methods the rule matches.
	Methods []string `json:"methods,omitempty"`
	// PathPrefix, when given, is the path prefix the rule matches: at a
	// segment boundary ("/v1" matches "/v1" and "/v1/x", not "/v10").
	PathPrefix string `json:"path_prefix,omitempty"`
	// Transform is what the rule does to a matching request.
	Transform *Transform `json:"transform,omitempty"`
	// Audience is the aud claim of the identity tokens the rule's
	// ${identity.token} placeholders become (default: the request's
	// host). Only with such a placeholder.
	Audience string `json:"audience,omitempty"`
}

// Transform changes a request.
type Transform struct {
	// Headers are set on the request, replacing any the sandbox sent
	// under the same name. Values may hold ${secrets.NAME}, E2B's
	// ${e2b.secrets.NAME} (NAME lower-cased) and ${identity.token}.
	Headers map[string]string `json:"headers,omitempty"`
}

// Bounds of the rules.
const (
	MaxNetworkRules   = 64
	MaxRuleHeaders    = 16
	MaxRuleMethods    = 16
	MaxRuleHeaderLen  = 4096
	MaxRulePathPrefix = 1024
	MaxRuleAudience   = 256
)

// IdentityPlaceholder becomes, on each request a rule covers, a token
// the gateway mints for the sandbox (internal/identity): a short-lived
// JWT whose audience is the rule's.
const IdentityPlaceholder = "${identity.token}"

// IdentityPrefix starts every identity placeholder.
const IdentityPrefix = "${identity."

// placeholderRE finds ${secrets.NAME} and E2B's ${e2b.secrets.NAME}; a
// name is what internal/secrets accepts (1 to 64 letters, digits,
// underscores and hyphens, not starting with a digit or a hyphen).
var placeholderRE = regexp.MustCompile(`\$\{(e2b\.)?secrets\.([A-Za-z_][A-Za-z0-9_-]{0,63})\}`)

// PlaceholderPrefix starts every placeholder of Sheepfold's form, and
// E2BPlaceholderPrefix every one of E2B's (the E2B SDKs' Secret.fill).
const (
	PlaceholderPrefix    = "${secrets."
	E2BPlaceholderPrefix = "${e2b.secrets."
)

// Placeholder is the placeholder of the secret name: what a sandbox holds
// in place of its value.
func Placeholder(name string) string { return PlaceholderPrefix + name + "}" }

// HasPlaceholder reports whether s holds the start of a placeholder of
// either form.
func HasPlaceholder(s []byte) bool {
	return bytes.Contains(s, []byte(PlaceholderPrefix)) || bytes.Contains(s, []byte(E2BPlaceholderPrefix))
}

// placeholderName is the secret a match of placeholderRE names: E2B's
// form names the secret in E2B's canonical form, lower-cased (E2B stores
// names lower-cased), Sheepfold's as written.
func placeholderName(m []string) string {
	if m[1] != "" {
		return strings.ToLower(m[2])
	}
	return m[2]
}

// Placeholders returns the secret names the placeholders in s name, in
// order, each once, and false when s holds "${secrets." or
// "${e2b.secrets." that does not start a well-formed placeholder.
func Placeholders(s string) ([]string, bool) {
	var names []string
	ms := placeholderRE.FindAllStringSubmatch(s, -1)
	for _, m := range ms {
		if n := placeholderName(m); !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names, strings.Count(s, PlaceholderPrefix)+strings.Count(s, E2BPlaceholderPrefix) == len(ms)
}

// Substitute replaces each placeholder in s by value(name).
func Substitute(s string, value func(name string) string) string {
	return placeholderRE.ReplaceAllStringFunc(s, func(m string) string {
		return value(placeholderName(placeholderRE.FindStringSubmatch(m)))
	})
}

// HeaderTransform is one header a rule sets.
type HeaderTransform struct {
	Name  string // canonical
	Value string // may hold placeholders
}

// InjectRule is a parsed NetworkRule.
type InjectRule struct {
	Index      int    // its place in Network.Rules
	Host       string // lowercase, no trailing dot
	Wildcard   bool
	Methods    []string // upper case; empty: any
	PathPrefix string
	Headers    []HeaderTransform // by name
	Secrets    []string          // the secrets its headers name
	Identity   bool              // its headers hold IdentityPlaceholder
	Audience   string            // NetworkRule.Audience
}

// reservedHeaders frame or route a request: a rule may not set them.
var reservedHeaders = []string{"Host", "Content-Length", "Transfer-Encoding", "Connection", "Upgrade", "Te", "Trailer",
	"Keep-Alive", "Proxy-Connection", "Expect"}

// compileRules parses n.Rules.
func compileRules(n *Network) ([]InjectRule, error) {
	if len(n.Rules) == 0 {
		return nil, nil
	}
	if n.Mode != NetworkAllowlist && n.Mode != NetworkPublic {
		return nil, bad("network.rules", "need mode \"allowlist\" or \"public\"")
	}
	if len(n.Rules) > MaxNetworkRules {
		return nil, bad("network.rules", "at most %d rules", MaxNetworkRules)
	}
	out := make([]InjectRule, 0, len(n.Rules))
	for i, r := range n.Rules {
		at := fmt.Sprintf("network.rules[%d]", i)
		ir := InjectRule{Index: i, PathPrefix: r.PathPrefix}
		host := r.Host
		if rest, ok := strings.CutPrefix(host, "*."); ok {
			ir.Wildcard, host = true, rest
		}
		name, ok := NormalizeName(host)
		if !ok || strings.Contains(r.Host, ":") {
			return nil, bad(at+".host", "%q is not a host name or *.domain (no port, no address)", r.Host)
		}
		ir.Host = name
		if len(r.Methods) > MaxRuleMethods {
			return nil, bad(at+".methods", "at most %d methods", MaxRuleMethods)
		}
		for _, m := range r.Methods {
			if !isTokenString(m) {
				return nil, bad(at+".methods", "%q is not a method", m)
			}
			ir.Methods = append(ir.Methods, strings.ToUpper(m))
		}
		if p := r.PathPrefix; p != "" {
			if !strings.HasPrefix(p, "/") || len(p) > MaxRulePathPrefix || strings.ContainsAny(p, "?#%") || !visibleASCII(p) {
				return nil, bad(at+".path_prefix", "must start with / and be at most %d visible ASCII characters without ? # %%", MaxRulePathPrefix)
			}
		}
		if r.Transform == nil || len(r.Transform.Headers) == 0 {
			return nil, bad(at+".transform.headers", "a rule needs at least one header to set")
		}
		if len(r.Transform.Headers) > MaxRuleHeaders {
			return nil, bad(at+".transform.headers", "at most %d headers", MaxRuleHeaders)
		}
		for k, v := range r.Transform.Headers {
			field := at + ".transform.headers." + k
			if !isTokenString(k) {
				return nil, bad(field, "not a header name")
			}
			ck := http.CanonicalHeaderKey(k)
			if slices.Contains(reservedHeaders, ck) || strings.HasPrefix(ck, "Proxy-") {
				return nil, bad(field, "a rule may not set %s", ck)
			}
			if len(v) > MaxRuleHeaderLen || !headerValue(v) {
				return nil, bad(field, "must be at most %d bytes without control characters", MaxRuleHeaderLen)
			}
			if strings.Count(v, "${e2b.") != strings.Count(v, E2BPlaceholderPrefix) {
				return nil, bad(field, "holds an E2B placeholder other than ${e2b.secrets.NAME}, which this policy does not substitute (E2B's workload tokens are mapped by the E2B surface from iam.tokens)")
			}
			names, ok := Placeholders(v)
			if !ok {
				return nil, bad(field, "holds a malformed placeholder: write ${secrets.NAME} or ${e2b.secrets.NAME}, NAME being 1 to 64 letters, digits, underscores and hyphens, not starting with a digit or a hyphen")
			}
			for _, s := range names {
				if !slices.Contains(ir.Secrets, s) {
					ir.Secrets = append(ir.Secrets, s)
				}
			}
			if n := strings.Count(v, IdentityPrefix); n > 0 {
				if n != strings.Count(v, IdentityPlaceholder) {
					return nil, bad(field, "holds a malformed identity placeholder: write %s", IdentityPlaceholder)
				}
				ir.Identity = true
			}
			ir.Headers = append(ir.Headers, HeaderTransform{Name: ck, Value: v})
		}
		slices.SortFunc(ir.Headers, func(a, b HeaderTransform) int { return strings.Compare(a.Name, b.Name) })
		for j := 1; j < len(ir.Headers); j++ {
			if ir.Headers[j].Name == ir.Headers[j-1].Name {
				return nil, bad(at+".transform.headers", "%s is given twice", ir.Headers[j].Name)
			}
		}
		if a := r.Audience; a != "" {
			if !ir.Identity {
				return nil, bad(at+".audience", "an audience needs a header holding %s", IdentityPlaceholder)
			}
			if len(a) > MaxRuleAudience || !visibleASCII(a) {
				return nil, bad(at+".audience", "must be at most %d visible ASCII characters", MaxRuleAudience)
			}
			ir.Audience = a
		}
		slices.Sort(ir.Secrets)
		out = append(out, ir)
	}
	return out, nil
}

// RuleSecrets returns the secrets n's rules name, sorted, each once, with
// the field of the first that names each.
func RuleSecrets(n *Network) map[string]string {
	out := map[string]string{}
	if n == nil {
		return out
	}
	for i, r := range n.Rules {
		if r.Transform == nil {
			continue
		}
		keys := make([]string, 0, len(r.Transform.Headers))
		for k := range r.Transform.Headers {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			names, _ := Placeholders(r.Transform.Headers[k])
			for _, s := range names {
				if _, ok := out[s]; !ok {
					out[s] = fmt.Sprintf("network.rules[%d].transform.headers.%s", i, k)
				}
			}
		}
	}
	return out
}

// Match reports whether the rule covers a request for path (its escaped
// path, without query) with method to host (normalized). A path with dot
// segments, an empty segment or an escaped slash or dot matches no rule
// with a path prefix: servers read such paths differently.
func (r *InjectRule) Match(host, method, path string) bool {
	if r.Wildcard {
		if !strings.HasSuffix(host, "."+r.Host) {
			return false
		}
	} else if host != r.Host {
		return false
	}
	if len(r.Methods) > 0 && !slices.Contains(r.Methods, method) {
		return false
	}
	if r.PathPrefix == "" {
		return true
	}
	if !cleanPath(path) || !strings.HasPrefix(path, r.PathPrefix) {
		return false
	}
	return strings.HasSuffix(r.PathPrefix, "/") || len(path) == len(r.PathPrefix) || path[len(r.PathPrefix)] == '/'
}

// MatchName reports whether the rule's host covers name (normalized).
func (r *InjectRule) MatchName(name string) bool {
	if r.Wildcard {
		return strings.HasSuffix(name, "."+r.Host)
	}
	return name == r.Host
}

// cleanPath reports whether p is an absolute path without dot segments,
// empty segments or escaped slashes, dots or backslashes.
func cleanPath(p string) bool {
	if !strings.HasPrefix(p, "/") || strings.Contains(p, "//") || strings.Contains(p, "\\") {
		return false
	}
	l := strings.ToLower(p)
	if strings.Contains(l, "%2f") || strings.Contains(l, "%2e") || strings.Contains(l, "%5c") {
		return false
	}
	for seg := range strings.SplitSeq(p, "/") {
		if seg == "." || seg == ".." {
			return false
		}
	}
	return true
}

// Rule returns the first rule that covers the request, or nil.
func (e *Egress) Rule(host, method, path string) *InjectRule {
	for i := range e.Inject {
		if e.Inject[i].Match(host, method, path) {
			return &e.Inject[i]
		}
	}
	return nil
}

// Injects reports whether the policy has rules per destination.
func (e *Egress) Injects() bool { return e != nil && len(e.Inject) > 0 }

func isTokenString(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

func visibleASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= 0x20 || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

func headerValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}
