package sandbox_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/sandbox"
)

// runtimeTemplates are templates "python" (no runtime of its own) and
// "hardened" (runtime gvisor), as template.Info.Runtime names them.
type runtimeTemplates struct{}

func (runtimeTemplates) RootFS(name string) (string, error) {
	if name != "python" && name != "hardened" {
		return "", os.ErrNotExist
	}
	return "/", nil
}

func (runtimeTemplates) Runtime(name string) string {
	if name == "hardened" {
		return "gvisor"
	}
	return ""
}

// TestTemplateRuntime: a template that names a runtime gives it to its
// sandboxes that name none (here gvisor, which the fake runtime does not
// offer: refused as not installed); a create's own runtime comes first;
// the control, a template naming none, starts.
func TestTemplateRuntime(t *testing.T) {
	t.Parallel()
	m, _ := fakeEngine(t, sandbox.Config{Templates: runtimeTemplates{}})
	ctx := context.Background()
	_, err := m.Create(ctx, sandbox.CreateOptions{Template: "hardened"})
	wantCode(t, err, apierr.NotSupported)
	if !strings.Contains(err.Error(), `"gvisor" is not installed`) {
		t.Fatalf("message: %v", err)
	}
	if _, err := m.Create(ctx, sandbox.CreateOptions{Template: "hardened", Runtime: "fake"}); err != nil {
		t.Fatalf("a create's own runtime over the template's: %v", err)
	}
	if _, err := m.Create(ctx, sandbox.CreateOptions{Template: "python"}); err != nil {
		t.Fatalf("control: %v", err)
	}
}

// TestAccountRuntime: the runtime of a sandbox is the request's, else
// its template's, else its account's, else the server's default ("");
// an account whose runtime is locked refuses a request or a template
// naming another (ERR_FORBIDDEN), and still takes its own named.
func TestAccountRuntime(t *testing.T) {
	t.Parallel()
	m, rt := fakeEngine(t, sandbox.Config{Templates: runtimeTemplates{}})
	rt.Choices = []string{"fake", "gvisor", "runc"}
	ctx := context.Background()
	for _, c := range []struct {
		name string
		opt  sandbox.CreateOptions
		want string // the runtime chosen; "" the default
		code apierr.Code
	}{
		{"server default", sandbox.CreateOptions{Template: "python"}, "", ""},
		{"account", sandbox.CreateOptions{Template: "python", AccountRuntime: "runc"}, "runc", ""},
		{"template over account", sandbox.CreateOptions{Template: "hardened", AccountRuntime: "runc"}, "gvisor", ""},
		{"request over all", sandbox.CreateOptions{Template: "hardened", Runtime: "fake", AccountRuntime: "runc"}, "fake", ""},
		{"locked: the account's", sandbox.CreateOptions{Template: "python", AccountRuntime: "gvisor", RuntimeLocked: true}, "gvisor", ""},
		{"locked: named the same", sandbox.CreateOptions{Template: "python", Runtime: "gvisor", AccountRuntime: "gvisor", RuntimeLocked: true}, "gvisor", ""},
		{"locked: template agrees", sandbox.CreateOptions{Template: "hardened", AccountRuntime: "gvisor", RuntimeLocked: true}, "gvisor", ""},
		{"locked: request escapes", sandbox.CreateOptions{Template: "python", Runtime: "runc", AccountRuntime: "gvisor", RuntimeLocked: true}, "", apierr.Forbidden},
		{"locked: template escapes", sandbox.CreateOptions{Template: "hardened", AccountRuntime: "runc", RuntimeLocked: true}, "", apierr.Forbidden},
		{"unlocked: request leaves", sandbox.CreateOptions{Template: "python", Runtime: "runc", AccountRuntime: "gvisor"}, "runc", ""},
	} {
		sb, err := m.Create(ctx, c.opt)
		if c.code != "" {
			if apierr.CodeOf(err) != c.code || !strings.Contains(err.Error(), "set by the operator") {
				t.Errorf("%s: %v, want %s", c.name, err, c.code)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got := rt.Chosen(sb.ID); got != c.want {
			t.Errorf("%s: runtime %q, want %q", c.name, got, c.want)
		}
		if err := m.Kill(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
}
