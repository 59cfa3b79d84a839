// Package config holds the settings every sheepfold command shares, with
// their defaults, loaded from the environment and then flags.
package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Config is where things live on the host.
type Config struct {
	// DataDir holds templates, runtime state and (for the server) the
	// database. [/var/lib/sheepfold; SHEEPFOLD_DATA_DIR]
	DataDir string
	// Database is the server's database: a postgres:// URL (several
	// servers may share it), or the path of a SQLite file.
	// [DataDir/sheepfold.db; SHEEPFOLD_DATABASE]
	Database string
	// RuntimePath is the OCI runtime binary. Debian's runc 1.1.5 lacks the
	// November 2025 fixes, so the default is the one `make setup` builds.
	// [DataDir/bin/runc; SHEEPFOLD_RUNTIME]
	RuntimePath string
	// RunscPath is gVisor's runsc, which runs the sandboxes that ask for
	// runtime "gvisor"; empty where none is installed: the engine offers
	// runc alone. [DataDir/bin/runsc when `make setup` built it; SHEEPFOLD_RUNSC]
	RunscPath string
	// DefaultRuntime is the runtime of sandboxes that name none: "runc"
	// or "gvisor". [runc; serve --default-runtime, SHEEPFOLD_DEFAULT_RUNTIME]
	DefaultRuntime string
	// AgentPath is the static agent binary mounted into every sandbox.
	// [sheepfold-agent beside this executable, else DataDir/bin/sheepfold-agent; SHEEPFOLD_AGENT]
	AgentPath string
	// CgroupRoot is the cgroup under which sandboxes' cgroups are made
	// ("/" the hierarchy's root). Empty chooses: the service's own
	// delegated cgroup under systemd on cgroup v2, else the root (see
	// oci.Config.CgroupRoot). [auto; serve --cgroup-root]
	CgroupRoot string
	// SecretsKeyFile holds the keys that seal the accounts' secrets
	// (internal/secrets: ID:BASE64 lines, the last one seals). Empty:
	// $SHEEPFOLD_SECRETS_KEYS, else DataDir/secrets.key, made at the
	// first start. [serve --secrets-key-file]
	SecretsKeyFile string
	// PublicURL is the URL at which relying parties reach this server:
	// the issuer of its workload identity tokens, whose
	// /.well-known/openid-configuration and jwks.json it serves
	// (internal/identity). Empty: http://LISTEN (localhost for a wildcard
	// address). [serve --public-url]
	PublicURL string
	// CDISpecDirs are the directories of the host's CDI specs, which
	// describe the devices sandboxes may be given (oci.Config.CDISpecDirs).
	// [/etc/cdi, /var/run/cdi; serve --cdi-spec-dirs]
	CDISpecDirs []string
	// Registries are the image registries (HOST[:PORT]) a template's
	// FROM may pull from over HTTPS, InsecureRegistries those reached
	// over plain HTTP, RegistryAuthFile a Docker config file holding
	// their credentials ("auths"). A FROM naming any other registry is
	// refused (ERR_REGISTRY_NOT_ALLOWED). [none; --registry,
	// --insecure-registry, --registry-auth]
	Registries         []string
	InsecureRegistries []string
	RegistryAuthFile   string
	// BuildAllowHosts are the hosts a Dockerfile build's RUN steps may
	// reach, through an egress gateway of each step's own (network
	// allowlist rules: "host", "*.domain", "host:port"); empty: none, the
	// steps have no network. [DefaultBuildAllowHosts; serve and template
	// build --build-allow-host]
	BuildAllowHosts []string
	// BuildCAFile is a file of CA certificates the TLS clients of RUN
	// steps with a network trust besides the template's own (a host
	// behind a TLS-inspecting proxy); empty: the template's alone.
	// [DefaultBuildCAFile when it exists; serve and template build
	// --build-ca-file]
	BuildCAFile string
}

// DefaultBuildCAFile is the host's own CA bundle (Debian's).
const DefaultBuildCAFile = "/etc/ssl/certs/ca-certificates.crt"

// DefaultBuildCA is DefaultBuildCAFile where the host has it, else "".
func DefaultBuildCA() string {
	if fileExists(DefaultBuildCAFile) {
		return DefaultBuildCAFile
	}
	return ""
}

// DefaultBuildAllowHosts are the package registries the set-up itself
// uses (scripts/setup.sh): Debian's archive and its security archive,
// and npm's registry.
var DefaultBuildAllowHosts = []string{"deb.debian.org", "security.debian.org", "registry.npmjs.org"}

// DefaultCDISpecDirs are where vendors' tools put CDI specs
// (nvidia-ctk cdi generate, for one).
var DefaultCDISpecDirs = []string{"/etc/cdi", "/var/run/cdi"}

// FromEnv returns the defaults overridden by the environment.
func FromEnv() Config {
	c := Config{
		DataDir:     os.Getenv("SHEEPFOLD_DATA_DIR"),
		RuntimePath: os.Getenv("SHEEPFOLD_RUNTIME"),
		AgentPath:   os.Getenv("SHEEPFOLD_AGENT"),
		RunscPath:   os.Getenv("SHEEPFOLD_RUNSC"),

		DefaultRuntime: os.Getenv("SHEEPFOLD_DEFAULT_RUNTIME"),
		Database:       os.Getenv("SHEEPFOLD_DATABASE"),
	}
	return c
}

// ResolveDataDir makes DataDir absolute, defaulting it.
func (c *Config) ResolveDataDir() error {
	if c.DataDir == "" {
		c.DataDir = "/var/lib/sheepfold"
	}
	abs, err := filepath.Abs(c.DataDir)
	if err != nil {
		return err
	}
	c.DataDir = abs
	return nil
}

// Resolve fills defaults for empty fields and checks that the binaries exist.
func (c *Config) Resolve() error {
	if err := c.ResolveDataDir(); err != nil {
		return err
	}
	if c.RuntimePath == "" {
		c.RuntimePath = filepath.Join(c.DataDir, "bin", "runc")
	}
	c.defaultAgentPath()
	if err := checkBinary("runtime", c.RuntimePath); err != nil {
		return err
	}
	if err := c.resolveRunsc(); err != nil {
		return err
	}
	return checkBinary("agent", c.AgentPath)
}

// resolveRunsc finds runsc where `make setup` installs it, unless
// RunscPath names one (which must exist), and checks DefaultRuntime.
func (c *Config) resolveRunsc() error {
	if c.RunscPath == "" {
		if p := filepath.Join(c.DataDir, "bin", "runsc"); fileExists(p) {
			c.RunscPath = p
		}
	} else if err := checkBinary("runsc", c.RunscPath); err != nil {
		return err
	}
	switch c.DefaultRuntime {
	case "", "runc":
	case "gvisor":
		if c.RunscPath == "" {
			return fmt.Errorf("the default runtime gvisor needs gVisor's runsc: run `make setup` (it builds %s) or set SHEEPFOLD_RUNSC", filepath.Join(c.DataDir, "bin", "runsc"))
		}
	default:
		return fmt.Errorf("unknown runtime %q: runc or gvisor", c.DefaultRuntime)
	}
	return nil
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir()
}

// ResolveAgent is Resolve for commands that need the agent binary but no
// runtime (template export): it fills DataDir and AgentPath and checks
// that the agent exists.
func (c *Config) ResolveAgent() error {
	if err := c.ResolveDataDir(); err != nil {
		return err
	}
	c.defaultAgentPath()
	return checkBinary("agent", c.AgentPath)
}

func (c *Config) defaultAgentPath() {
	if c.AgentPath != "" {
		return
	}
	c.AgentPath = filepath.Join(c.DataDir, "bin", "sheepfold-agent")
	if exe, err := os.Executable(); err == nil {
		beside := filepath.Join(filepath.Dir(exe), "sheepfold-agent")
		if _, err := os.Stat(beside); err == nil {
			c.AgentPath = beside
		}
	}
}

func checkBinary(name, p string) error {
	if _, err := os.Stat(p); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			target := "setup" // builds the pinned runc and runsc
			if name == "agent" {
				target = "build"
			}
			return fmt.Errorf("%s binary %s not found: run `make %s` (or set SHEEPFOLD_%s)", name, p, target, envName(name))
		}
		return err
	}
	return nil
}

func envName(name string) string {
	if name == "runtime" {
		return "RUNTIME"
	}
	return "AGENT"
}

// StateDir is where runtimes keep per-instance state.
func (c Config) StateDir() string { return filepath.Join(c.DataDir, "run") }
