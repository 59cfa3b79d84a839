// Package agenttls authenticates the connections between the server and a
// sandbox's agent when they meet over a network (a sandbox in a Kubernetes
// Pod) instead of a unix socket on one host.
//
// One certificate authority, kept by the server (every replica shares it),
// issues two kinds of certificate:
//
//   - one per sandbox for its agent: usable only to serve TLS, and naming
//     only that sandbox (ServerName). The agent gets it with its private
//     key and the authority's certificate, and nothing else.
//   - one for the server: usable only as a TLS client.
//
// The agent accepts a connection only from a client certificate of the
// authority (so another Pod, or code in another sandbox holding its own
// agent's key, cannot talk to it: an agent's certificate is not a client
// certificate), and the server accepts an agent only under the name of
// the sandbox it meant to reach (so a Pod IP reused by another sandbox,
// or a hostile sandbox answering for another, fails the handshake). TLS
// 1.3 alone; the server's session cache makes every connection after the
// first to an agent a resumption, without certificate signatures.
//
// Imports: the standard library only.
package agenttls

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// File names of an agent's credential in its directory (a mounted Secret).
const (
	CertFile = "agent.crt"
	KeyFile  = "agent.key"
	CAFile   = "ca.crt"
)

// nameSuffix ends every agent's TLS name: "<sandbox id>.agent.sheepfold".
const nameSuffix = ".agent.sheepfold"

// ServerName is the name an agent's certificate carries for its sandbox.
func ServerName(sandboxID string) string { return sandboxID + nameSuffix }

// caLifetime is how long the authority is valid; agent certificates live
// as long as their sandboxes may (AgentLifetime), the server's as long as
// the authority.
const caLifetime = 10 * 365 * 24 * time.Hour

// clockSkew backdates every certificate, for nodes whose clocks lag.
const clockSkew = 5 * time.Minute

// CA is the authority: its certificate and key.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// CertPEM and KeyPEM are the same, encoded.
	CertPEM, KeyPEM []byte
}

// NewCA makes a new authority.
func NewCA(now time.Time) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "sheepfold agent authority"},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(caLifetime),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	return caFrom(der, key)
}

func caFrom(der []byte, key *ecdsa.PrivateKey) (*CA, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})}, nil
}

// ParseCA reads an authority saved as CertPEM and KeyPEM.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, errors.New("agenttls: the authority's certificate is not a PEM CERTIFICATE")
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil || kb.Type != "EC PRIVATE KEY" {
		return nil, errors.New("agenttls: the authority's key is not a PEM EC PRIVATE KEY")
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("agenttls: the authority's key: %w", err)
	}
	ca, err := caFrom(cb.Bytes, key)
	if err != nil {
		return nil, fmt.Errorf("agenttls: the authority's certificate: %w", err)
	}
	if !ca.Cert.IsCA || !key.PublicKey.Equal(ca.Cert.PublicKey) {
		return nil, errors.New("agenttls: the authority's certificate and key do not belong together")
	}
	return ca, nil
}

// Credential is a certificate with its key, PEM-encoded.
type Credential struct {
	CertPEM, KeyPEM []byte
}

// IssueAgent makes the credential of one sandbox's agent, valid from now
// until now+lifetime (plus a margin for skewed clocks).
func (ca *CA) IssueAgent(sandboxID string, now time.Time, lifetime time.Duration) (Credential, error) {
	if sandboxID == "" || strings.ContainsAny(sandboxID, "./ ") {
		return Credential{}, fmt.Errorf("agenttls: %q is not a sandbox id", sandboxID)
	}
	return ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: ServerName(sandboxID)},
		DNSNames:    []string{ServerName(sandboxID)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		NotAfter:    now.Add(lifetime + clockSkew),
	}, now)
}

// IssueServer makes the server's client credential, valid as long as the
// authority.
func (ca *CA) IssueServer(now time.Time) (Credential, error) {
	return ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "sheepfold server"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		NotAfter:    ca.Cert.NotAfter,
	}, now)
}

func (ca *CA) issue(tmpl *x509.Certificate, now time.Time) (Credential, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Credential{}, err
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = now.Add(-clockSkew)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return Credential{}, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Credential{}, err
	}
	return Credential{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

// AgentConfig is the agent's TLS configuration: its own credential, and
// client certificates of the authority required.
func AgentConfig(cred Credential, caPEM []byte) (*tls.Config, error) {
	cert, err := tls.X509KeyPair(cred.CertPEM, cred.KeyPEM)
	if err != nil {
		return nil, fmt.Errorf("agenttls: the agent's credential: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("agenttls: no certificate in the authority's PEM")
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		// Verification of a client certificate requires the client-auth
		// usage: an agent's own certificate is refused.
		ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs:  pool,
	}, nil
}

// LoadAgentConfig reads an agent's credential from dir (CertFile, KeyFile,
// CAFile) and returns AgentConfig of it.
func LoadAgentConfig(dir string) (*tls.Config, error) {
	var files [3][]byte
	for i, name := range []string{CertFile, KeyFile, CAFile} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("agenttls: %w", err)
		}
		files[i] = b
	}
	return AgentConfig(Credential{CertPEM: files[0], KeyPEM: files[1]}, files[2])
}

// Client dials agents as the server.
type Client struct {
	cert     tls.Certificate
	roots    *x509.CertPool
	sessions tls.ClientSessionCache
}

// sessionCacheSize bounds the resumption tickets kept, one per agent in
// use (a ticket is a few hundred bytes).
const sessionCacheSize = 4096

// NewClient returns the server's side from its credential and the
// authority's certificate.
func NewClient(cred Credential, caPEM []byte) (*Client, error) {
	cert, err := tls.X509KeyPair(cred.CertPEM, cred.KeyPEM)
	if err != nil {
		return nil, fmt.Errorf("agenttls: the server's credential: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("agenttls: no certificate in the authority's PEM")
	}
	return &Client{cert: cert, roots: pool, sessions: tls.NewLRUClientSessionCache(sessionCacheSize)}, nil
}

// Config is the TLS configuration for a connection to one sandbox's agent:
// only that sandbox's agent certificate is accepted.
func (c *Client) Config(sandboxID string) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		Certificates:       []tls.Certificate{c.cert},
		RootCAs:            c.roots,
		ServerName:         ServerName(sandboxID),
		ClientSessionCache: c.sessions,
	}
}

// DeriveKey returns a 32-byte secret for purpose, the same in every
// replica that holds this authority and known to nothing else (an HMAC
// of purpose under the authority's private key): keys the replicas must
// share, such as the one that signs preview URLs.
func (ca *CA) DeriveKey(purpose string) []byte {
	m := hmac.New(sha256.New, ca.KeyPEM)
	m.Write([]byte("sheepfold derived key: " + purpose))
	return m.Sum(nil)
}
