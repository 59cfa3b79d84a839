package agent

import (
	"bytes"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// identity is the sandbox user a request acts as (ProcessSpec.User,
// Request.User).
type identity struct {
	name   string
	uid    uint32
	gid    uint32
	groups []uint32 // supplementary groups: the primary group
	home   string   // sandbox path
}

// The two users every sandbox has. Their ids are fixed, never read from
// the sandbox's /etc/passwd, which root code inside may rewrite: a request
// for "user" always runs as uid 1000 with no capabilities.
const (
	defaultUID = 1000
	defaultGID = 1000
	rootHome   = "/root"
)

// canSwitchUsers reports whether the agent runs processes and file
// operations as the requested user: only when it is uid 0 of a user
// namespace other than the host's, or of gVisor's kernel (a sandbox of
// the runtime gvisor: its uid 0 is the sentry's, not the host's, and runsc
// cannot run a Pod in a user namespace), and its Root is "/", which is how it
// runs as a sandbox's init (an unprivileged uid outside). Run any other way (the
// fake runtime and tests, as any uid, root included) it does everything as
// itself and only validates the names.
// A variable so that root tests can make an agent on the host switch.
var canSwitchUsers = func(root string) bool {
	return os.Geteuid() == 0 && filepath.Clean(root) == "/" && (inUserNamespace() || underGVisor())
}

// underGVisor reports whether the agent's kernel is gVisor's.
func underGVisor() bool {
	b, err := os.ReadFile("/proc/version")
	return err == nil && gvisorVersion(string(b))
}

// gvisorVersion reports whether a /proc/version is gVisor's: its release
// ends in "-gvisor" ("Linux version 4.19.0-gvisor #1 SMP ...").
func gvisorVersion(v string) bool {
	f := strings.Fields(v)
	return len(f) >= 3 && f[0] == "Linux" && f[1] == "version" && strings.HasSuffix(f[2], "-gvisor")
}

// inUserNamespace reports whether the process is in a user namespace other
// than the initial one, whose uid_map is the identity "0 0 4294967295".
func inUserNamespace() bool {
	b, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	return len(f) > 0 && !(len(f) == 3 && f[0] == "0" && f[1] == "0" && f[2] == "4294967295")
}

// validUserName accepts what passwd(5) can hold as a name.
func validUserName(name string) bool {
	return name != "" && len(name) <= 32 && name[0] != '-' && !strings.ContainsAny(name, ":/\n\x00 ")
}

// lookupUser finds name in passwd(5) text: its uid, gid and home. A
// number is a uid (a Dockerfile's USER may name one): the first entry
// with that uid, under its name.
func lookupUser(passwd []byte, name string) (identity, bool) {
	_, nerr := strconv.ParseUint(name, 10, 32)
	for line := range bytes.SplitSeq(passwd, []byte("\n")) {
		f := strings.Split(string(line), ":")
		if len(f) < 7 || (f[0] != name && (nerr != nil || f[2] != name)) || strings.HasPrefix(f[0], "#") {
			continue
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		home := f[5]
		if !path.IsAbs(home) {
			home = "/"
		}
		return identity{name: f[0], uid: uint32(uid), gid: uint32(gid), groups: []uint32{uint32(gid)}, home: path.Clean(home)}, true
	}
	return identity{}, false
}

// user resolves a requested user name. "" is Config.User when that is
// set. "" and "user" are uid 1000 with
// home Config.Home, "root" is uid 0 with home /root, and any other name
// comes from the sandbox's /etc/passwd (passwd is read only for those).
// When the agent does not switch users, every identity has home
// Config.Home: the agent acts as itself.
func (s *server) user(name string, passwd func() []byte) (identity, *agentproto.Event) {
	if name == "" {
		name = s.cfg.User // the template's USER; "" stays "user"
	}
	var id identity
	switch name {
	case "", agentproto.UserDefault:
		id = identity{name: agentproto.UserDefault, uid: defaultUID, gid: defaultGID, groups: []uint32{defaultGID}, home: s.cfg.Home}
	case agentproto.UserRoot:
		id = identity{name: agentproto.UserRoot, uid: 0, gid: 0, groups: []uint32{0}, home: rootHome}
	default:
		var found bool
		if validUserName(name) {
			id, found = lookupUser(passwd(), name)
		}
		if !found {
			ev := fail(agentproto.CodeBadRequest, "unknown user %q", name)
			return identity{}, &ev
		}
	}
	if !s.switchUsers {
		id.home = s.cfg.Home
	}
	return id, nil
}

// userEnv is the identity's part of a process's environment.
func (id identity) env() map[string]string {
	return map[string]string{"HOME": id.home, "USER": id.name, "LOGNAME": id.name}
}

// inHome makes a relative request path (or one starting with "~")
// absolute under home; absolute and empty paths are returned as they are.
func inHome(p, home string) string {
	switch {
	case p == "" || path.IsAbs(p):
		return p
	case p == "~" || strings.HasPrefix(p, "~/"):
		return home + p[1:]
	}
	return home + "/" + p
}
