package e2b

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/sheepfold/sheepfold/internal/policy"
)

func TestNetworkOf(t *testing.T) {
	t.Parallel()
	cases := []struct {
		body string
		want *policy.Network
		bad  bool
	}{
		{`{}`, nil, false},
		{`{"allow_internet_access": false}`, nil, false},
		{`{"allow_internet_access": true}`, &policy.Network{Mode: "public"}, false},
		{`{"allow_internet_access": true, "network": {"denyOut": ["0.0.0.0/0"]}}`, nil, false},
		{`{"network": {"allowOut": ["api.github.com", "1.1.1.1"], "denyOut": ["0.0.0.0/0"]}}`,
			&policy.Network{Mode: "allowlist", Allow: []string{"api.github.com", "1.1.1.1"}}, false},
		{`{"allow_internet_access": false, "network": {"allowOut": ["8.8.8.0/24"]}}`,
			&policy.Network{Mode: "allowlist", Allow: []string{"8.8.8.0/24"}}, false},
		{`{"network": {"denyOut": ["1.1.1.1"]}}`, nil, true},
		{`{"network": {"allowOut": ["not a host"]}}`, nil, true},
		{`{"network": {"allowOut": ["api.openai.com", "b.test"], "rules": {"b.test": [{"transform": {"headers": {"X": "1"}}}],
			"api.openai.com": [{"transform": {"headers": {"Authorization": "Bearer ${secrets.openai}"}}}]}}}`,
			&policy.Network{Mode: "allowlist", Allow: []string{"api.openai.com", "b.test"}, Rules: []policy.NetworkRule{
				{Host: "api.openai.com", Transform: &policy.Transform{Headers: map[string]string{"Authorization": "Bearer ${secrets.openai}"}}},
				{Host: "b.test", Transform: &policy.Transform{Headers: map[string]string{"X": "1"}}}}}, false},
		{`{"network": {"rules": {"api.openai.com": [{"transform": {"headers": {"X": "1"}}}]}}}`, nil, true},
		{`{"network": {"allowOut": ["a.test"], "rules": {"a.test": [{"transform": {"headers": {"Host": "b.test"}}}]}}}`, nil, true},
		// E2B's secrets placeholder is the policy's as it is.
		{`{"network": {"allowOut": ["a.test"], "rules": {"a.test": [{"transform": {"headers": {"X": "${e2b.secrets.gh-token}"}}}]}}}`,
			&policy.Network{Mode: "allowlist", Allow: []string{"a.test"}, Rules: []policy.NetworkRule{
				{Host: "a.test", Transform: &policy.Transform{Headers: map[string]string{"X": "${e2b.secrets.gh-token}"}}}}}, false},
		// E2B's workload tokens become ${identity.token} with their audience.
		{`{"iam": {"tokens": {"aws": {"audience": "sts.amazonaws.com", "tokenType": "JWT-SVID"}, "gcp": {"audience": "//iam.googleapis.com/x", "tokenType": "jwt"}}},
		  "network": {"allowOut": ["sts.test", "g.test"], "rules": {
			"sts.test": [{"transform": {"headers": {"Authorization": "Bearer ${e2b.identity.tokens.aws}", "X-Again": "${e2b.identity.tokens.aws}"}}}],
			"g.test": [{"transform": {"headers": {"Authorization": "Bearer ${e2b.identity.tokens.gcp}"}}}]}}}`,
			&policy.Network{Mode: "allowlist", Allow: []string{"sts.test", "g.test"}, Rules: []policy.NetworkRule{
				{Host: "g.test", Audience: "//iam.googleapis.com/x", Transform: &policy.Transform{Headers: map[string]string{"Authorization": "Bearer ${identity.token}"}}},
				{Host: "sts.test", Audience: "sts.amazonaws.com", Transform: &policy.Transform{Headers: map[string]string{
					"Authorization": "Bearer ${identity.token}", "X-Again": "${identity.token}"}}}}}, false},
		{`{"iam": {"tokens": {"aws": {"audience": "a", "tokenType": "JWT-SVID"}}}, "network": {"allowOut": ["a.test"], "rules": {"a.test": [{"transform": {"headers": {"X": "${e2b.identity.tokens.gcp}"}}}]}}}`, nil, true},
		{`{"iam": {"tokens": {"aws": {"audience": "a", "tokenType": "X509-SVID"}}}, "network": {"allowOut": ["a.test"], "rules": {"a.test": [{"transform": {"headers": {"X": "${e2b.identity.tokens.aws}"}}}]}}}`, nil, true},
		{`{"iam": {"tokens": {"aws": {"tokenType": "JWT"}}}, "network": {"allowOut": ["a.test"], "rules": {"a.test": [{"transform": {"headers": {"X": "${e2b.identity.tokens.aws}"}}}]}}}`, nil, true},
		{`{"iam": {"tokens": {"a": {"audience": "x", "tokenType": "JWT"}, "b": {"audience": "y", "tokenType": "JWT"}}}, "network": {"allowOut": ["a.test"], "rules": {"a.test": [{"transform": {"headers": {"X": "${e2b.identity.tokens.a}", "Y": "${e2b.identity.tokens.b}"}}}]}}}`, nil, true},
		{`{"iam": {"tokens": {"aws": {"audience": "a", "tokenType": "JWT"}}}, "network": {"allowOut": ["a.test"], "rules": {"a.test": [{"transform": {"headers": {"X": "${e2b.identity.tokens.aws"}}}]}}}`, nil, true},
	}
	for _, c := range cases {
		var req newSandbox
		if err := json.Unmarshal([]byte(c.body), &req); err != nil {
			t.Fatal(err)
		}
		got, err := networkOf(req)
		if (err != nil) != c.bad || !reflect.DeepEqual(got, c.want) {
			t.Errorf("networkOf(%s) = %+v, %v; want %+v (error %v)", c.body, got, err, c.want, c.bad)
		}
	}
}
