package agenttls

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// world is an authority, the server's client and agents of two sandboxes.
type world struct {
	ca     *CA
	client *Client
	agentA Credential
	agentB Credential
}

func newWorld(t *testing.T) *world {
	t.Helper()
	now := time.Now()
	ca, err := NewCA(now)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := ca.IssueServer(now)
	if err != nil {
		t.Fatal(err)
	}
	client, err := NewClient(sc, ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	a, err := ca.IssueAgent("sbx-a", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ca.IssueAgent("sbx-b", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &world{ca: ca, client: client, agentA: a, agentB: b}
}

// serveAgent listens as an agent with cred and answers each connection
// with "ok" after the handshake; it returns the address.
func serveAgent(t *testing.T, cred Credential, caPEM []byte) string {
	t.Helper()
	cfg, err := AgentConfig(cred, caPEM)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				if c.(*tls.Conn).Handshake() == nil {
					io.WriteString(c, "ok")
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// talk dials addr with cfg and reads the agent's answer.
func talk(addr string, cfg *tls.Config) (tls.ConnectionState, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return tls.ConnectionState{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		return tls.ConnectionState{}, err
	}
	if string(b) != "ok" {
		return tls.ConnectionState{}, io.ErrUnexpectedEOF // the agent refused us after the handshake
	}
	return c.ConnectionState(), nil
}

func TestServerReachesItsAgentAndResumes(t *testing.T) {
	w := newWorld(t)
	addr := serveAgent(t, w.agentA, w.ca.CertPEM)
	st, err := talk(addr, w.client.Config("sbx-a"))
	if err != nil {
		t.Fatalf("first connection: %v", err)
	}
	if st.Version != tls.VersionTLS13 || st.DidResume {
		t.Fatalf("first connection: version %x, resumed %v", st.Version, st.DidResume)
	}
	st, err = talk(addr, w.client.Config("sbx-a"))
	if err != nil {
		t.Fatalf("second connection: %v", err)
	}
	if !st.DidResume {
		t.Error("the second connection to the same agent did not resume its session")
	}
}

func TestServerRefusesAnotherSandboxsAgent(t *testing.T) {
	w := newWorld(t)
	// Sandbox B's agent answers at the address the server holds for A
	// (a reused Pod IP, or a hostile sandbox).
	addr := serveAgent(t, w.agentB, w.ca.CertPEM)
	if _, err := talk(addr, w.client.Config("sbx-a")); err == nil || !strings.Contains(err.Error(), "sbx-a.agent.sheepfold") {
		t.Fatalf("the server accepted sandbox B's agent as A's: %v", err)
	}
}

func TestAgentRefusesClientsOtherThanTheServer(t *testing.T) {
	w := newWorld(t)
	addr := serveAgent(t, w.agentA, w.ca.CertPEM)
	agentB, err := tls.X509KeyPair(w.agentB.CertPEM, w.agentB.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewCA(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := other.IssueServer(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	foreignCert, err := tls.X509KeyPair(foreign.CertPEM, foreign.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	for name, certs := range map[string][]tls.Certificate{
		"no certificate":                     nil,
		"another sandbox's agent credential": {agentB},
		"a server credential of another CA":  {foreignCert},
	} {
		cfg := w.client.Config("sbx-a")
		cfg.Certificates = certs
		cfg.ClientSessionCache = nil
		if _, err := talk(addr, cfg); err == nil {
			t.Errorf("%s: the agent answered", name)
		}
	}
}

func TestExpiredAgentCertificateRefused(t *testing.T) {
	w := newWorld(t)
	old, err := w.ca.IssueAgent("sbx-a", time.Now().Add(-2*time.Hour), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveAgent(t, old, w.ca.CertPEM)
	if _, err := talk(addr, w.client.Config("sbx-a")); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("an expired agent certificate: %v", err)
	}
}

func TestParseCA(t *testing.T) {
	w := newWorld(t)
	ca, err := ParseCA(w.ca.CertPEM, w.ca.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	// A credential issued by the parsed authority is trusted by a client
	// of the original one.
	cred, err := ca.IssueAgent("sbx-c", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := talk(serveAgent(t, cred, w.ca.CertPEM), w.client.Config("sbx-c")); err != nil {
		t.Fatalf("agent of the parsed authority: %v", err)
	}
	other, err := NewCA(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for name, pair := range map[string][2][]byte{
		"key of another CA": {w.ca.CertPEM, other.KeyPEM},
		"not PEM":           {[]byte("nope"), w.ca.KeyPEM},
		"key as cert":       {w.ca.KeyPEM, w.ca.KeyPEM},
		"leaf as CA":        {w.agentA.CertPEM, w.agentA.KeyPEM},
	} {
		if _, err := ParseCA(pair[0], pair[1]); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

func TestIssueAgentRefusesBadIDs(t *testing.T) {
	w := newWorld(t)
	for _, id := range []string{"", "a.b", "a b", "x.agent.sheepfold"} {
		if _, err := w.ca.IssueAgent(id, time.Now(), time.Hour); err == nil {
			t.Errorf("IssueAgent(%q) succeeded", id)
		}
	}
}

func TestLoadAgentConfig(t *testing.T) {
	w := newWorld(t)
	dir := t.TempDir()
	if _, err := LoadAgentConfig(dir); err == nil || !os.IsNotExist(unwrapAll(err)) {
		t.Fatalf("empty dir: %v", err)
	}
	for name, b := range map[string][]byte{CertFile: w.agentA.CertPEM, KeyFile: w.agentA.KeyPEM, CAFile: w.ca.CertPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := LoadAgentConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ClientAuth != tls.RequireAndVerifyClientCert || cfg.MinVersion != tls.VersionTLS13 {
		t.Fatalf("config: %+v", cfg)
	}
}

func unwrapAll(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return err
		}
		err = u.Unwrap()
	}
}

// TestDeriveKey: replicas holding one authority derive the same key per
// purpose; another authority or purpose gives another.
func TestDeriveKey(t *testing.T) {
	now := time.Now()
	a, err := NewCA(now)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewCA(now)
	if err != nil {
		t.Fatal(err)
	}
	again, err := ParseCA(a.CertPEM, a.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	k := a.DeriveKey("preview")
	if len(k) != 32 || !bytes.Equal(k, again.DeriveKey("preview")) {
		t.Fatalf("the same authority read back derives another key")
	}
	if bytes.Equal(k, b.DeriveKey("preview")) || bytes.Equal(k, a.DeriveKey("other")) {
		t.Fatal("another authority or purpose derives the same key")
	}
}
