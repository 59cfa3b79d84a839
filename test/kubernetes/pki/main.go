// Command pki writes the certificates of the test cluster that
// test/kubernetes/cluster.sh starts, in one process: a CA, the service
// account signing key and one certificate per argument, each signed by the
// CA, all ECDSA P-256, valid 30 days. (openssl does the same in some forty
// processes, which took seconds of the cluster's start on a loaded machine.)
//
//	pki DIR 'NAME|CN|O|SANS|USAGE' ...
//
// writes DIR/ca.{crt,key}, DIR/sa.{key,pub} and DIR/NAME.{crt,key} for each
// argument: CN and O are the subject's common name and organization (O may
// be empty), SANS a comma-separated list of IP:addr and DNS:name (may be
// empty), USAGE "server" or "client".
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: pki DIR 'NAME|CN|O|SANS|server|client' ...")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "pki:", err)
		os.Exit(1)
	}
}

func run(dir string, specs []string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	now := time.Now().Add(-time.Hour) // tolerate a little clock skew
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "sheepfold-kube-ca"},
		NotBefore:             now,
		NotAfter:              now.Add(30 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	if err := writePair(dir, "ca", caDER, caKey); err != nil {
		return err
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	if err := writeKey(filepath.Join(dir, "sa.key"), saKey); err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, "sa.pub"), "PUBLIC KEY", pub, 0o644); err != nil {
		return err
	}

	for i, spec := range specs {
		f := strings.Split(spec, "|")
		if len(f) != 5 || f[0] == "" || f[1] == "" {
			return fmt.Errorf("certificate %q: want NAME|CN|O|SANS|USAGE", spec)
		}
		tmpl := &x509.Certificate{
			SerialNumber:          big.NewInt(int64(i + 2)),
			Subject:               pkix.Name{CommonName: f[1]},
			NotBefore:             now,
			NotAfter:              now.Add(30 * 24 * time.Hour),
			KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
			BasicConstraintsValid: true,
		}
		if f[2] != "" {
			tmpl.Subject.Organization = []string{f[2]}
		}
		switch f[4] {
		case "server":
			tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		case "client":
			tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		default:
			return fmt.Errorf("certificate %s: usage %q is neither server nor client", f[0], f[4])
		}
		for _, san := range strings.Split(f[3], ",") {
			switch {
			case san == "":
			case strings.HasPrefix(san, "IP:"):
				ip := net.ParseIP(san[3:])
				if ip == nil {
					return fmt.Errorf("certificate %s: bad IP %q", f[0], san[3:])
				}
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			case strings.HasPrefix(san, "DNS:"):
				tmpl.DNSNames = append(tmpl.DNSNames, san[4:])
			default:
				return fmt.Errorf("certificate %s: SAN %q has neither the IP: nor the DNS: prefix", f[0], san)
			}
		}
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return fmt.Errorf("certificate %s: %w", f[0], err)
		}
		if err := writePair(dir, f[0], der, key); err != nil {
			return err
		}
	}
	return nil
}

func writePair(dir, name string, der []byte, key *ecdsa.PrivateKey) error {
	if err := writePEM(filepath.Join(dir, name+".crt"), "CERTIFICATE", der, 0o644); err != nil {
		return err
	}
	return writeKey(filepath.Join(dir, name+".key"), key)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "EC PRIVATE KEY", der, 0o600)
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode)
}
