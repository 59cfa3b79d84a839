package webhooks_test

import (
	"testing"

	"github.com/sheepfold/sheepfold/internal/webhooks"
)

// The operator's rules are checked before the server starts (serve
// --webhook-allow-hosts, --webhook-allow-cidr): a host list takes names
// and CIDRs, a range list CIDRs and addresses only.
func TestCheckRules(t *testing.T) {
	t.Parallel()
	if webhooks.CheckHosts([]string{"a.example.com", "10.0.0.0/8", "::1"}) != nil ||
		webhooks.CheckHosts([]string{"http://x/"}) == nil {
		t.Fatal("CheckHosts")
	}
	if webhooks.CheckCIDRs([]string{"127.0.0.0/8", "::1", "10.1.2.3"}) != nil ||
		webhooks.CheckCIDRs([]string{"hooks.example.com"}) == nil || webhooks.CheckCIDRs([]string{"10.0.0.0/33"}) == nil {
		t.Fatal("CheckCIDRs")
	}
}
