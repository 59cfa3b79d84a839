package template

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	goruntime "runtime"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	ggcrv1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// FROM an image in a registry: "HOST[:PORT]/REPO[:TAG|@DIGEST]" (any FROM
// that is neither a template name nor oci:/oci-archive:). Only the
// registries the operator lists (Registries) are contacted: a reference
// to any other (Docker Hub's short names included) fails with
// ErrRegistryNotAllowed before any request is made. Registries are spoken
// to over HTTPS; plain HTTP only to the ones listed as insecure (the
// transport refuses an http:// request to any other host, redirects
// included, whatever go-containerregistry would fall back to for a
// loopback or private address). Credentials come from a Docker config
// file's "auths" (credential helpers are not run).
//
// The image of this machine's platform is pulled with
// go-containerregistry (every blob checked against its digest) into a
// temporary OCI layout, whose import is the one of FROM oci:DIR: the same
// unpacking through an os.Root, the same cache keyed by the manifest's
// digest. A cached image costs its manifest and config, no layer.

// ErrRegistryNotAllowed: a FROM names a registry the operator did not
// list.
var ErrRegistryNotAllowed = errors.New("registry not allowed")

// Registries is the operator's list of the registries a FROM may pull
// from.
type Registries struct {
	// Allow are HOST[:PORT] reached over HTTPS.
	Allow []string
	// Insecure are HOST[:PORT] reached over plain HTTP (allowed too).
	Insecure []string
	// AuthFile is a Docker config file (config.json) whose "auths" hold
	// the credentials; "" pulls anonymously.
	AuthFile string
}

func (r Registries) allowed(host string) bool {
	return slices.Contains(r.Allow, host) || r.insecure(host)
}

func (r Registries) insecure(host string) bool { return slices.Contains(r.Insecure, host) }

// IsRegistryRef reports whether a FROM (after expansion) names an image in
// a registry rather than a template or an OCI layout.
func IsRegistryRef(from string) bool {
	return !isImageRef(from) && ValidName(from) != nil && strings.ContainsAny(from, "/:@")
}

// CheckFrom parses a Dockerfile and, when its FROM (build args
// expanded) names an image in a registry, checks that the registry is
// listed: the error wraps ErrRegistryNotAllowed (or ErrDockerfile).
func CheckFrom(dockerfile []byte, buildArgs map[string]string, regs Registries) error {
	df, err := ParseDockerfile(strings.NewReader(string(dockerfile)))
	if err != nil {
		return err
	}
	b := &dfBuilder{df: df, opt: DockerfileOptions{BuildArgs: buildArgs}, args: map[string]string{}}
	for _, a := range df.MetaArgs {
		for _, kv := range a.Args {
			b.args[kv.Key] = b.buildArg(kv)
		}
	}
	from, err := b.expand(df.From)
	if err != nil {
		return fmt.Errorf("%w: line %d: %v", ErrDockerfile, df.FromLine, err)
	}
	if !IsRegistryRef(from) {
		return nil
	}
	_, err = parseRegistryRef(from, regs)
	return err
}

// parseRegistryRef parses ref and checks its registry against regs.
func parseRegistryRef(ref string, regs Registries) (name.Reference, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("FROM %s: not a template, oci-archive:FILE, oci:DIR or image reference: %v", ref, err)
	}
	host := r.Context().RegistryStr()
	if !regs.allowed(host) {
		return nil, fmt.Errorf("%w: FROM %s: registry %s is not one the operator allows (--registry, --insecure-registry)",
			ErrRegistryNotAllowed, ref, host)
	}
	if regs.insecure(host) {
		if r, err = name.ParseReference(ref, name.Insecure); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// remoteImage resolves ref to the image of this machine's platform,
// fetching its manifest only.
func remoteImage(ctx context.Context, ref string, regs Registries) (ggcrv1.Image, error) {
	r, err := parseRegistryRef(ref, regs)
	if err != nil {
		return nil, err
	}
	kc, err := loadAuthFile(regs.AuthFile)
	if err != nil {
		return nil, err
	}
	tr := &registryTransport{base: http.DefaultTransport.(*http.Transport).Clone(), regs: regs}
	img, err := remote.Image(r, remote.WithContext(ctx), remote.WithAuthFromKeychain(kc), remote.WithTransport(tr),
		remote.WithPlatform(ggcrv1.Platform{OS: "linux", Architecture: goruntime.GOARCH}))
	if err != nil {
		return nil, fmt.Errorf("FROM %s: %w", ref, err)
	}
	return img, nil
}

// pullLayout writes img as an OCI layout in dir.
func pullLayout(img ggcrv1.Image, dir string) error {
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendImage(img)
}

// registryTransport refuses plain HTTP to every host not listed as
// insecure.
type registryTransport struct {
	base http.RoundTripper
	regs Registries
}

func (t *registryTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "https" && !t.regs.insecure(req.URL.Host) {
		return nil, fmt.Errorf("%s://%s: plain HTTP only to a registry listed as insecure", req.URL.Scheme, req.URL.Host)
	}
	return t.base.RoundTrip(req)
}

// authFile is what a Docker config file holds that we read.
type authFile struct {
	Auths map[string]struct {
		Auth          string `json:"auth"`
		Username      string `json:"username"`
		Password      string `json:"password"`
		IdentityToken string `json:"identitytoken"`
		RegistryToken string `json:"registrytoken"`
	} `json:"auths"`
}

// fileKeychain answers the credentials of a Docker config file's auths.
type fileKeychain map[string]authn.AuthConfig

func (k fileKeychain) Resolve(res authn.Resource) (authn.Authenticator, error) {
	host := res.RegistryStr()
	keys := []string{host}
	if host == name.DefaultRegistry {
		keys = append(keys, "https://index.docker.io/v1/", "docker.io")
	}
	for _, key := range keys {
		if c, ok := k[key]; ok {
			return authn.FromConfig(c), nil
		}
	}
	return authn.Anonymous, nil
}

func loadAuthFile(p string) (authn.Keychain, error) {
	if p == "" {
		return fileKeychain{}, nil
	}
	raw, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("registry credentials: %w", err)
	}
	var f authFile
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("registry credentials %s: %w", p, err)
	}
	k := fileKeychain{}
	for key, a := range f.Auths {
		c := authn.AuthConfig{Username: a.Username, Password: a.Password, IdentityToken: a.IdentityToken, RegistryToken: a.RegistryToken}
		if a.Auth != "" {
			dec, err := base64.StdEncoding.DecodeString(a.Auth)
			if err != nil {
				return nil, fmt.Errorf("registry credentials %s: %s: auth is not base64", p, key)
			}
			c.Username, c.Password, _ = strings.Cut(string(dec), ":")
		}
		// Keys may be URLs (https://host/v1/); the host is what is looked up.
		host := strings.TrimPrefix(strings.TrimPrefix(key, "https://"), "http://")
		host, _, _ = strings.Cut(host, "/")
		k[key], k[host] = c, c
	}
	return k, nil
}
