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
