package preview_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sheepfold/sheepfold/internal/preview"
)

// bare is a path form's prefix without its slash.
const bare = "/v1/sandboxes/abc/proxy/8080"

func TestAddSlash(t *testing.T) {
	tg, _ := preview.PathTarget(bare)
	w := httptest.NewRecorder()
	if !preview.AddSlash(w, httptest.NewRequest("GET", bare+"?q=1", nil), tg) ||
		w.Code != http.StatusPermanentRedirect || w.Header().Get("Location") != bare+"/?q=1" {
		t.Fatalf("%d %q", w.Code, w.Header().Get("Location"))
	}
	if preview.AddSlash(httptest.NewRecorder(), httptest.NewRequest("GET", bare+"/", nil), tg) {
		t.Fatal("redirected a path with its slash")
	}
}

func TestTargets(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		host, domain, label string
		ok                  bool
	}{
		{"8080-abc.localhost", "localhost", "8080-abc", true},
		{"8080-abc.LOCALHOST.:9000", "localhost", "8080-abc", true},
		{"localhost:9000", "localhost", "", false}, // the domain itself is the API's
		{"8080-abc.example.com", "localhost", "", false},
	} {
		if label, ok := preview.UnderDomain(c.host, c.domain); ok != c.ok || ok && label != c.label {
			t.Errorf("UnderDomain(%q, %q) = %q, %v", c.host, c.domain, label, ok)
		}
	}
	if tg, ok := preview.HostTarget("8080-abc"); !ok || tg != (preview.Target{Form: preview.FormHost, ID: "abc", Port: 8080}) {
		t.Errorf("HostTarget: %+v %v", tg, ok)
	}
	for _, bad := range []string{"0-abc", "65536-abc", "080-abc", "8080-", "x-abc", "8080-a.b", "8080"} {
		if _, ok := preview.HostTarget(bad); ok {
			t.Errorf("HostTarget(%q) accepted", bad)
		}
	}
	tg, ok := preview.PathTarget("/v1/sandboxes/abc/proxy/3000/x/y")
	if !ok || tg != (preview.Target{Form: preview.FormPath, ID: "abc", Port: 3000, Prefix: "/v1/sandboxes/abc/proxy/3000"}) || !tg.APIOrigin() {
		t.Errorf("PathTarget: %+v %v", tg, ok)
	}
	for _, bad := range []string{"/v1/sandboxes/abc", "/v1/sandboxes//proxy/1/", "/v1/sandboxes/abc/files/1", "/v1/sandboxes/abc/proxy/0/", "/v1/sandboxes/abc/proxy/01/"} {
		if _, ok := preview.PathTarget(bad); ok {
			t.Errorf("PathTarget(%q) accepted", bad)
		}
	}
}

func TestDashboardAllowed(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		domain, host string
		ok           bool
	}{
		{"localhost", "localhost:8080", true},             // a public suffix: every preview a site of its own
		{"preview.example.com", "api.example.com", false}, // same site as the previews
		{"preview.example.com", "api.example.org", true},  // another site
		{"preview.example.com", "127.0.0.1:8080", true},   // an address is no site
		{"preview.example.com", "EXAMPLE.com.", false},    // the registrable domain itself
		{"sheepfold.github.io", "other.github.io", true},  // a public suffix's names are sites of their own
	} {
		if got := preview.DashboardAllowed(c.domain, c.host); got != c.ok {
			t.Errorf("DashboardAllowed(%q, %q) = %v, want %v", c.domain, c.host, got, c.ok)
		}
	}
}

func TestCheckDomain(t *testing.T) {
	t.Parallel()
	for d, ok := range map[string]bool{
		"localhost": true, "preview.example.com": true, "a-b.c1": true,
		"": false, "*.example.com": false, "http://x.com": false, "x.com:8080": false, "-x.com": false, "x..com": false,
	} {
		if err := preview.CheckDomain(d); (err == nil) != ok {
			t.Errorf("%q: %v, want ok %v", d, err, ok)
		}
	}
}
