package sandbox

import (
	"bytes"
	"context"
	"fmt"

	"github.com/sheepfold/sheepfold/internal/egress"
)

// TrustEgressCA adds the egress gateway's CA (its PEM) to the sandbox's
// trust stores, so that its TLS clients accept the certificates the
// gateway shows for the hosts whose TLS it terminates (internal/egress,
// tls.go): the system bundle (egress.TrustBundlePath, which
// egress.TrustEnv points OpenSSL, Python's requests, curl, pip and git
// at) and the CA alone (egress.TrustCAPath, Node's extra CA). Written as
// root in the sandbox's own writable layer; the sandbox's code may undo
// it, which only breaks its own TLS to those hosts.
func (s *Sandbox) TrustEgressCA(ctx context.Context, caPEM []byte) error {
	var bundle bytes.Buffer
	if _, err := s.ReadFile(ctx, egress.TrustBundlePath, &bundle, 16<<20, AsUser("root")); err != nil {
		return fmt.Errorf("trust the egress CA: read %s: %w", egress.TrustBundlePath, err)
	}
	if !bytes.Contains(bundle.Bytes(), bytes.TrimSpace(caPEM)) {
		if b := bundle.Bytes(); len(b) > 0 && b[len(b)-1] != '\n' {
			bundle.WriteByte('\n')
		}
		bundle.Write(caPEM)
		if _, err := s.WriteFile(ctx, egress.TrustBundlePath, &bundle, 0o644, 0, AsUser("root")); err != nil {
			return fmt.Errorf("trust the egress CA: write %s: %w", egress.TrustBundlePath, err)
		}
	}
	if _, err := s.WriteFile(ctx, egress.TrustCAPath, bytes.NewReader(caPEM), 0o644, 0, AsUser("root")); err != nil {
		return fmt.Errorf("trust the egress CA: write %s: %w", egress.TrustCAPath, err)
	}
	return nil
}
