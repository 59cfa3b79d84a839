package e2b

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/abort"
	"github.com/sheepfold/sheepfold/internal/runtime/fake"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// overtakenBackend finds a sandbox running and kills it before the
// lookup returns: a kill that overtook the request.
type overtakenBackend struct {
	Backend
	m *sandbox.Manager
}

func (b overtakenBackend) Sandbox(ctx context.Context, _, id string) (*sandbox.Sandbox, error) {
	sb, err := b.m.Get(id)
	if err != nil {
		return nil, err
	}
	if err := b.m.Kill(ctx, id); err != nil {
		return nil, err
	}
	return sb, nil
}

// TestTargetKilledInFlight: a data-plane request whose sandbox is killed
// while it is looked up has its connection dropped (the SDK then reports
// the kill), where one for a sandbox not found gets E2B's 502.
func TestTargetKilledInFlight(t *testing.T) {
	t.Parallel()
	rt := &fake.Runtime{AgentBin: testutil.AgentBin(t), Dir: testutil.ShortTempDir(t)}
	m, err := sandbox.New(context.Background(), sandbox.Config{Runtime: rt,
		Templates: sandbox.TemplatesFunc(func(string) (string, error) { return "/", nil })})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(context.Background()) })
	sb, err := m.Create(context.Background(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h := New(Config{}, overtakenBackend{m: m})
	srv := httptest.NewServer(abort.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.target(w, r, "owner", r.URL.Query().Get("id"))
	})))
	defer srv.Close()

	if res, err := http.Get(srv.URL + "/?id=" + sb.ID); err == nil {
		res.Body.Close()
		t.Fatalf("a request the kill overtook got an answer: %s", res.Status)
	} else if !strings.Contains(err.Error(), "EOF") {
		t.Fatalf("a request the kill overtook: %v, want its connection dropped", err)
	}
	res, err := http.Get(srv.URL + "/?id=nosuch")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusBadGateway {
		t.Fatalf("a sandbox not found: %s, want 502", res.Status)
	}
}
