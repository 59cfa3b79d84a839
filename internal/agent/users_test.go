package agent

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/testutil"
)

func TestLookupUser(t *testing.T) {
	t.Parallel()
	passwd := []byte("root:x:0:0:root:/root:/bin/bash\n#guest:x:5:5::/x:/bin/sh\nbad:x:nope:1::/b:/bin/sh\n" +
		"guest:x:1001:1002:Guest:/home/guest:/bin/sh\nrel:x:7:7::home:/bin/sh\nshort:x:8:8\n")
	for _, tc := range []struct {
		name     string
		ok       bool
		uid, gid uint32
		home     string
	}{
		{"guest", true, 1001, 1002, "/home/guest"},
		{"root", true, 0, 0, "/root"},
		{"rel", true, 7, 7, "/"},
		{"bad", false, 0, 0, ""},
		{"short", false, 0, 0, ""},
		{"#guest", false, 0, 0, ""},
		{"nobody", false, 0, 0, ""},
		// A uid (a Dockerfile's USER 1001): the first entry with it.
		{"1001", true, 1001, 1002, "/home/guest"},
		{"5", false, 0, 0, ""}, // only a comment has it
		{"99", false, 0, 0, ""},
	} {
		id, ok := lookupUser(passwd, tc.name)
		if ok != tc.ok || ok && (id.uid != tc.uid || id.gid != tc.gid || id.home != tc.home || len(id.groups) != 1 || id.groups[0] != tc.gid) {
			t.Errorf("lookupUser(%q) = %+v, %v", tc.name, id, ok)
		}
		if ok && tc.name == "1001" && id.name != "guest" {
			t.Errorf("lookupUser(1001) is named %q, want its entry's name", id.name)
		}
	}
}

func TestValidUserName(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]bool{"user": true, "www-data": true, "_apt": true, "": false, "-x": false,
		"a:b": false, "a/b": false, "a\nb": false, "a b": false, "012345678901234567890123456789012": false} {
		if validUserName(name) != want {
			t.Errorf("validUserName(%q) = %v", name, !want)
		}
	}
}

func TestInHome(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"": "", "/etc/x": "/etc/x", "a/b": "/root/a/b", "~": "/root",
		"~/x": "/root/x", "~x": "/root/~x"} {
		if got := inHome(in, "/root"); got != want {
			t.Errorf("inHome(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestSwitchUsersFailsClosed: an agent required to run every request as
// its own user refuses to serve at all when it cannot switch users (here:
// not uid 0 of a user namespace), instead of running everything as itself.
func TestSwitchUsersFailsClosed(t *testing.T) {
	t.Parallel()
	if canSwitchUsers("/") {
		t.Fatal("the test process can switch users: it proves nothing here")
	}
	ln, err := net.Listen("unix", filepath.Join(testutil.ShortTempDir(t), "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = Serve(ctx, ln, Config{Root: "/", SwitchUsers: true})
	if !errors.Is(err, errCannotSwitchUsers) {
		t.Fatalf("Serve = %v, want %v", err, errCannotSwitchUsers)
	}
	if c, err := net.Dial("unix", ln.Addr().String()); err == nil {
		c.Close()
		t.Fatal("the agent still accepts connections")
	}
}

func TestGVisorVersion(t *testing.T) {
	for v, want := range map[string]bool{
		"Linux version 4.19.0-gvisor #1 SMP Sun Jan 10 15:06:54 PST 2016\n":                                   true,
		"Linux version 6.18.44-fc-v1272 (root@host) (gcc (Debian 14.2.0-19) 14.2.0) #1 SMP PREEMPT_DYNAMIC\n": false,
		"Linux version 6.1.0-gvisor-like-name-but-not #1\n":                                                   false,
		"":                       false,
		"gvisor -gvisor -gvisor": false,
	} {
		if got := gvisorVersion(v); got != want {
			t.Errorf("gvisorVersion(%q) = %v, want %v", v, got, want)
		}
	}
}
