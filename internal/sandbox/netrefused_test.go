package sandbox

import (
	"strings"
	"testing"
)

// TestNetRefusal: the failures of Node, curl, wget and the C library in a
// sandbox without network are recognised, with the host where the error
// names it; other failures are not.
func TestNetRefusal(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ text, host string }{
		{"Error: getaddrinfo EAI_AGAIN api.example.com", "api.example.com"},
		{"getaddrinfo ENOTFOUND api.example.com\n    at GetAddrInfoReqWrap.onlookup", "api.example.com"},
		{"Error: connect ENETUNREACH 203.0.113.7:443 - Local (0.0.0.0:0)", "203.0.113.7:443"},
		{"curl: (6) Could not resolve host: api.example.com", "api.example.com"},
		{"wget: unable to resolve host address 'api.example.com'", ""},
		{"socket.gaierror: [Errno -3] Temporary failure in name resolution", ""},
		{"curl: (7) Failed to connect to 203.0.113.7 port 80: Network is unreachable", ""},
	} {
		m := netRefusal.FindStringSubmatch(c.text)
		if m == nil {
			t.Errorf("%q is not recognised", c.text)
			continue
		}
		if got := strings.Join(m[1:], ""); got != c.host {
			t.Errorf("%q: host %q, want %q", c.text, got, c.host)
		}
	}
	for _, text := range []string{"ZeroDivisionError: division by zero", "exit status 1", "OSError: disk says no", "ECONNREFUSED 127.0.0.1:8080"} {
		if netRefusal.MatchString(text) {
			t.Errorf("%q taken for a network refusal", text)
		}
	}
}
