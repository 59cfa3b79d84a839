package policy

import (
	"slices"
	"strings"
	"testing"
)

func TestNetworkRulesParse(t *testing.T) {
	p, err := Parse([]byte(`{"network":{"mode":"allowlist","allow":["api.test"],"rules":[
		{"host":"api.test","methods":["post"],"path_prefix":"/v1","transform":{"headers":{"authorization":"Bearer ${secrets.openai}","X-Two":"${secrets.a}:${secrets.openai}"}}}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	e, err := CompileEgress(p.Network)
	if err != nil {
		t.Fatal(err)
	}
	if !e.Injects() || len(e.Inject) != 1 {
		t.Fatalf("rules: %+v", e.Inject)
	}
	r := e.Inject[0]
	if !slices.Equal(r.Secrets, []string{"a", "openai"}) || r.Headers[0].Name != "Authorization" || !slices.Equal(r.Methods, []string{"POST"}) {
		t.Fatalf("rule: %+v", r)
	}
	if got := RuleSecrets(p.Network); len(got) != 2 || got["openai"] != "network.rules[0].transform.headers.X-Two" && got["openai"] != "network.rules[0].transform.headers.authorization" {
		t.Fatalf("RuleSecrets: %v", got)
	}
	for _, c := range []struct {
		host, method, path string
		want               bool
	}{
		{"api.test", "POST", "/v1", true},
		{"api.test", "POST", "/v1/chat", true},
		{"api.test", "GET", "/v1/chat", false},
		{"api.test", "POST", "/v10", false},
		{"api.test", "POST", "/v1/../admin", false},
		{"api.test", "POST", "/v1/%2e%2e/admin", false},
		{"api.test", "POST", "/v1//x", false},
		{"x.api.test", "POST", "/v1", false},
		{"other.test", "POST", "/v1", false},
	} {
		if got := e.Rule(c.host, c.method, c.path) != nil; got != c.want {
			t.Errorf("Rule(%s %s %s) = %v, want %v", c.method, c.host, c.path, got, c.want)
		}
	}
	w, err := CompileEgress(&Network{Mode: NetworkPublic, Rules: []NetworkRule{{Host: "*.api.test", Transform: &Transform{Headers: map[string]string{"X": "y"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if w.Rule("a.api.test", "GET", "/") == nil || w.Rule("api.test", "GET", "/") != nil {
		t.Fatal("wildcard rule")
	}
	if none, _ := CompileEgress(&Network{Mode: NetworkPublic}); none.Injects() {
		t.Fatal("a policy without rules injects")
	}
}

func TestNetworkRulesInvalid(t *testing.T) {
	for _, c := range []struct{ json, field string }{
		{`{"mode":"none","rules":[{"host":"a.test","transform":{"headers":{"X":"y"}}}]}`, "network.rules"},
		{`{"mode":"public","rules":[{"host":"a.test:443","transform":{"headers":{"X":"y"}}}]}`, "network.rules[0].host"},
		{`{"mode":"public","rules":[{"host":"10.0.0.1/8","transform":{"headers":{"X":"y"}}}]}`, "network.rules[0].host"},
		{`{"mode":"public","rules":[{"host":"a.test"}]}`, "network.rules[0].transform.headers"},
		{`{"mode":"public","rules":[{"host":"a.test","transform":{"headers":{"Host":"b.test"}}}]}`, "network.rules[0].transform.headers.Host"},
		{`{"mode":"public","rules":[{"host":"a.test","transform":{"headers":{"content-length":"1"}}}]}`, "network.rules[0].transform.headers.content-length"},
		{`{"mode":"public","rules":[{"host":"a.test","transform":{"headers":{"X":"a\r\nB: c"}}}]}`, "network.rules[0].transform.headers.X"},
		{`{"mode":"public","rules":[{"host":"a.test","transform":{"headers":{"X":"${secrets.1bad}"}}}]}`, "network.rules[0].transform.headers.X"},
		{`{"mode":"public","rules":[{"host":"a.test","transform":{"headers":{"X":"${secrets.open"}}}]}`, "network.rules[0].transform.headers.X"},
		{`{"mode":"public","rules":[{"host":"a.test","transform":{"headers":{"X":"${e2b.secrets.a b}"}}}]}`, "network.rules[0].transform.headers.X"},
		{`{"mode":"public","rules":[{"host":"a.test","transform":{"headers":{"X":"${e2b.secrets.}"}}}]}`, "network.rules[0].transform.headers.X"},
		{`{"mode":"public","rules":[{"host":"a.test","transform":{"headers":{"X":"${e2b.identity.tokens.aws}"}}}]}`, "network.rules[0].transform.headers.X"},
		{`{"mode":"public","rules":[{"host":"a.test","path_prefix":"v1","transform":{"headers":{"X":"y"}}}]}`, "network.rules[0].path_prefix"},
		{`{"mode":"public","rules":[{"host":"a.test","methods":["GE T"],"transform":{"headers":{"X":"y"}}}]}`, "network.rules[0].methods"},
		{`{"mode":"public","rules":[{"host":"a.test","transform":{"headers":{"X":"y","x":"z"}}}]}`, "network.rules[0].transform.headers"},
		{`{"mode":"public","rules":[{"host":"a.test","transform":{"headers":{"X":"${identity.tok}"}}}]}`, "network.rules[0].transform.headers.X"},
		{`{"mode":"public","rules":[{"host":"a.test","transform":{"headers":{"X":"${identity.token"}}}]}`, "network.rules[0].transform.headers.X"},
		{`{"mode":"public","rules":[{"host":"a.test","audience":"aud","transform":{"headers":{"X":"y"}}}]}`, "network.rules[0].audience"},
		{`{"mode":"public","rules":[{"host":"a.test","audience":"a b","transform":{"headers":{"X":"${identity.token}"}}}]}`, "network.rules[0].audience"},
	} {
		_, err := Parse([]byte(`{"network":` + c.json + `}`))
		fe, ok := err.(*FieldError)
		if !ok || fe.Field != c.field {
			t.Errorf("%s: got %v, want an error on %s", c.json, err, c.field)
		}
	}
}

func TestNetworkRulesIdentity(t *testing.T) {
	e, err := CompileEgress(&Network{Mode: NetworkPublic, Rules: []NetworkRule{
		{Host: "sts.test", Audience: "https://sts.test/aud", Transform: &Transform{Headers: map[string]string{"Authorization": "Bearer ${identity.token}", "X-Key": "${secrets.k}"}}},
		{Host: "api.test", Transform: &Transform{Headers: map[string]string{"X": "y"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	r := e.Inject[0]
	if !r.Identity || r.Audience != "https://sts.test/aud" || !slices.Equal(r.Secrets, []string{"k"}) {
		t.Fatalf("rule: %+v", r)
	}
	if e.Inject[1].Identity {
		t.Fatalf("a rule without the placeholder: %+v", e.Inject[1])
	}
}

func TestPlaceholders(t *testing.T) {
	names, ok := Placeholders("Bearer ${secrets.a} ${secrets.b_2}${secrets.a}")
	if !ok || !slices.Equal(names, []string{"a", "b_2"}) {
		t.Fatalf("%v %v", names, ok)
	}
	if _, ok := Placeholders("x ${secrets.} y"); ok {
		t.Fatal("a malformed placeholder passed")
	}
	got := Substitute("Bearer ${secrets.a}/${secrets.b}", strings.ToUpper)
	if got != "Bearer A/B" {
		t.Fatal(got)
	}
	// E2B's form names the secret lower-cased (E2B's canonical names);
	// names may hold hyphens.
	names, ok = Placeholders("${e2b.secrets.OpenAI-Key} ${secrets.gh-token} ${e2b.secrets.openai-key}")
	if !ok || !slices.Equal(names, []string{"openai-key", "gh-token"}) {
		t.Fatalf("%v %v", names, ok)
	}
	if got := Substitute("k=${e2b.secrets.OpenAI-Key};${secrets.a}", func(n string) string { return "<" + n + ">" }); got != "k=<openai-key>;<a>" {
		t.Fatal(got)
	}
	for _, bad := range []string{"${e2b.secrets.}", "${e2b.secrets.-x}", "${e2b.secrets.a b}", "${secrets.a.b}"} {
		if _, ok := Placeholders(bad); ok {
			t.Errorf("%q passed", bad)
		}
	}
	if !HasPlaceholder([]byte("x ${e2b.secrets.a}")) || HasPlaceholder([]byte("e2b.secrets.a")) {
		t.Fatal("HasPlaceholder")
	}
}
