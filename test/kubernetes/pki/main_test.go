package main

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
)

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		t.Fatalf("%s: no certificate", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestRun(t *testing.T) {
	dir := t.TempDir()
	err := run(dir, []string{
		"apiserver|kube-apiserver||IP:127.0.0.1,DNS:kubernetes|server",
		"kubelet|system:node:n1|system:nodes||client",
	})
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(readCert(t, filepath.Join(dir, "ca.crt")))

	server := readCert(t, filepath.Join(dir, "apiserver.crt"))
	if _, err := server.Verify(x509.VerifyOptions{Roots: roots, DNSName: "kubernetes", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("apiserver certificate for kubernetes: %v", err)
	}
	if err := server.VerifyHostname("127.0.0.1"); err != nil {
		t.Errorf("apiserver certificate for 127.0.0.1: %v", err)
	}
	if _, err := server.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("a server certificate verified as a client's")
	}

	client := readCert(t, filepath.Join(dir, "kubelet.crt"))
	if _, err := client.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("kubelet client certificate: %v", err)
	}
	if client.Subject.CommonName != "system:node:n1" || len(client.Subject.Organization) != 1 || client.Subject.Organization[0] != "system:nodes" {
		t.Errorf("kubelet subject %v", client.Subject)
	}

	for _, f := range []string{"ca.key", "apiserver.key", "kubelet.key", "sa.key"} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", f, fi.Mode().Perm())
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "sa.pub"))
	if err != nil {
		t.Fatal(err)
	}
	if block, _ := pem.Decode(b); block == nil || block.Type != "PUBLIC KEY" {
		t.Error("sa.pub is not a PEM public key")
	} else if _, err := x509.ParsePKIXPublicKey(block.Bytes); err != nil {
		t.Errorf("sa.pub: %v", err)
	}
}

func TestRunBadSpec(t *testing.T) {
	for _, spec := range []string{
		"x|cn|o|", // too few fields
		"|cn|||client",
		"x|cn|||both",
		"x|cn||IP:not-an-ip|server",
		"x|cn||URI:x|server",
	} {
		if err := run(t.TempDir(), []string{spec}); err == nil {
			t.Errorf("spec %q was accepted", spec)
		}
	}
}
