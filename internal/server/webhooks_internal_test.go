package server

import (
	"context"
	"net/netip"
	"strings"
	"testing"
)

// A name that resolved to an allowed address when registered and to the
// metadata service when delivering (DNS rebinding) is not dialled.
func TestWebhookDialRefusesRebinding(t *testing.T) {
	t.Parallel()
	w := newWebhooks(&Server{}, nil)
	answer := "127.0.0.1"
	w.lookup = func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr(answer)}, nil
	}
	if _, err := w.checkURL(context.Background(), "http://hooks.test:9/x"); err != nil {
		t.Fatalf("registration refused: %v", err)
	}
	for _, a := range []string{"169.254.169.254", "::ffff:169.254.169.254", "fe80::1", "0.0.0.0"} {
		answer = a
		_, err := w.dial(context.Background(), "tcp", "hooks.test:80")
		if err == nil || !strings.Contains(err.Error(), "link-local") {
			t.Fatalf("dial to %s: %v", a, err)
		}
	}
	// With an allowlist, an address outside it is not dialled either.
	w.rules, _ = parseHostRules([]string{"10.0.0.0/8"})
	answer = "127.0.0.1"
	if _, err := w.dial(context.Background(), "tcp", "hooks.test:80"); err == nil || !strings.Contains(err.Error(), "not among") {
		t.Fatalf("dial outside the allowlist: %v", err)
	}
}
