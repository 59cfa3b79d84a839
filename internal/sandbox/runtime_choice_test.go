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
