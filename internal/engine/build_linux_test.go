package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/egress"
	"github.com/sheepfold/sheepfold/internal/engine"
	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/template"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// buildDataDir is a data dir of the test's own whose python template is
// the shared one (a symbolic link: never written). Its cleanup checks
// that no build left a mount, a runc container, a bundle or a cgroup.
func buildDataDir(t *testing.T) string {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.TemplateRootFS(t, "python")
	data, err := os.MkdirTemp("/var/tmp", "sf-buildnet-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(data, "templates"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(testutil.DataDir(), "templates", "python"), filepath.Join(data, "templates", "python")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		mi, _ := os.ReadFile("/proc/self/mountinfo")
		if bytes.Contains(mi, []byte(data)) {
			t.Errorf("mounts left under %s", data)
		}
		runs := filepath.Join(data, "templates", ".runs")
		for _, d := range []string{filepath.Join(runs, "runc"), filepath.Join(runs, "bundles")} {
			if ents, _ := os.ReadDir(d); len(ents) > 0 {
				t.Errorf("left in %s: %v", d, ents)
			}
		}
		if left, _ := filepath.Glob((oci.StepRunner{Dir: runs}).CgroupGlob()); len(left) > 0 { // this data dir's steps
			t.Errorf("build step cgroups left: %v", left)
		}
		if err := os.RemoveAll(data); err != nil {
			t.Errorf("remove %s: %v", data, err)
		}
	})
	return data
}

// registry is a loopback HTTP server playing a package registry; hits
// counts its requests.
func registry(t *testing.T, body string) (netip.AddrPort, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hits := new(atomic.Int64)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprintf(w, "%s for %s", body, r.Host)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return netip.MustParseAddrPort(ln.Addr().String()), hits
}

// fetch is a RUN step that GETs url and prints what came back, or
// FAILED and why.
func fetch(url string, headers string) string {
	return fmt.Sprintf(`RUN python3 -c "import urllib.request as u; print('GOT', u.urlopen(u.Request('%s', headers={%s}), timeout=5).read().decode())" || { echo FAILED; exit 3; }`+"\n", url, headers)
}

// TestBuildRunAllowedHosts: a RUN step reaches the hosts the operator
// allows (--build-allow-host) through the egress gateway, and nothing
// else. Attacks: a name not on the list (it does not resolve, and its
// server sees nothing), its address dialled directly with an allowed
// Host header, and the test's registry at its real loopback address.
// Controls: the allowed registry answers the step; with no allowed hosts
// the same step has no network at all; the refused host's server answers
// a step once it is on the list.
func TestBuildRunAllowedHosts(t *testing.T) {
	data := buildDataDir(t)
	allowedSrv, allowedHits := registry(t, "allowed-pkg")
	otherSrv, otherHits := registry(t, "other-pkg")
	allowedIP, otherIP := netip.MustParseAddr("203.0.113.20"), netip.MustParseAddr("203.0.113.21")
	test := &egress.TestNet{
		Hosts: map[string][]netip.Addr{"registry.allowed.test": {allowedIP}, "registry.other.test": {otherIP}},
		Routes: map[netip.AddrPort]netip.AddrPort{
			netip.AddrPortFrom(allowedIP, 80): allowedSrv,
			netip.AddrPortFrom(otherIP, 80):   otherSrv,
		},
	}
	runner := func(hosts ...string) template.StepRunner {
		t.Helper()
		r, err := engine.NewStepRunner(config.Config{DataDir: data, RuntimePath: testutil.Runc(t), BuildAllowHosts: hosts},
			egress.Options{Test: test})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	build := func(r template.StepRunner, step string) (string, error) {
		t.Helper()
		var log bytes.Buffer
		_, err := template.BuildDockerfile(context.Background(), []byte("FROM python\n"+step), template.DockerfileOptions{
			DataDir: data, Name: "net", UIDShift: oci.DefaultIDMap.HostID, Runner: r, Log: &log, NoCache: true,
		})
		return log.String(), err
	}
	allowed := runner("registry.allowed.test")

	// Control: the allowed registry answers.
	out, err := build(allowed, fetch("http://registry.allowed.test/pkg", ""))
	if err != nil || !strings.Contains(out, "GOT allowed-pkg for registry.allowed.test") {
		t.Fatalf("the allowed registry: %v\n%s", err, out)
	}
	if allowedHits.Load() == 0 {
		t.Fatal("control: the allowed registry saw no request")
	}

	// Attacks.
	for _, a := range []struct {
		name, step string
		said       bool // the gateway saw it (the step's own lo is not the host's)
	}{
		{"a host not on the list", fetch("http://registry.other.test/pkg", ""), true},
		{"its address with an allowed Host", fetch("http://"+otherIP.String()+"/pkg", "'Host': 'registry.allowed.test'"), true},
		{"the registry's real loopback address", fetch("http://"+allowedSrv.String()+"/pkg", "'Host': 'registry.allowed.test'"), false},
	} {
		before := allowedHits.Load()
		out, err := build(allowed, a.step)
		var be *template.BuildError
		if !errors.As(err, &be) || !strings.Contains(out, "FAILED") || strings.Contains(out, "-pkg for ") {
			t.Errorf("%s: err = %v\n%s", a.name, err, out)
		}
		if a.said && !strings.Contains(out, "sheepfold: the build's network refused") {
			t.Errorf("%s: the refusal is not in the build's log:\n%s", a.name, out)
		}
		if otherHits.Load() != 0 || allowedHits.Load() != before {
			t.Errorf("%s: a registry was reached (other %d, allowed %d → %d)", a.name, otherHits.Load(), before, allowedHits.Load())
		}
	}

	// Control: no allowed hosts, no network at all (the step's only
	// interface is lo).
	out, err = build(runner(), "RUN python3 -c \"import socket; print('IFS', sorted(n for _, n in socket.if_nameindex()))\"\n"+
		fetch("http://registry.allowed.test/pkg", ""))
	if err == nil || !strings.Contains(out, "IFS ['lo']") || !strings.Contains(out, "FAILED") {
		t.Errorf("with no allowed hosts: err = %v\n%s", err, out)
	}

	// Control: the refused host's server does answer once allowed.
	out, err = build(runner("registry.other.test"), fetch("http://registry.other.test/pkg", ""))
	if err != nil || !strings.Contains(out, "GOT other-pkg") {
		t.Errorf("the other registry once allowed: %v\n%s", err, out)
	}
}
