package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/template"
)

// Scenarios of the react-ts template: a create (its dev server started
// and ready on 5173) until its first page is served through the preview
// (path form): the HTML, then the modules a browser asks for first, the
// entry (main.tsx, transformed) and the component it renders (App.tsx).
const (
	benchReactMiss = "react-ts create→first page, pool miss"
	benchReactHit  = "react-ts create→first page, pool hit"
)

// reactIterations bounds each react-ts scenario (a miss starts a dev
// server: seconds each).
const reactIterations = 5

var mainModule = regexp.MustCompile(`<script type="module" src="([^"]+main\.tsx)"`)

// reactTS runs the react-ts scenarios on a server of its own whose warm
// pool holds one react-ts sandbox (the miss sets an env var, which no
// pooled member has). Without the template (make template builds it) it
// notes so and measures nothing.
func (b *bencher) reactTS(cfg config.Config) func(context.Context) error {
	return func(ctx context.Context) error {
		if b.o.URL != "" {
			b.res.Notes = append(b.res.Notes, "react-ts: measured on a server the bench starts only")
			return nil
		}
		if _, err := template.Get(cfg.DataDir, "react-ts"); err != nil {
			b.res.Notes = append(b.res.Notes, "react-ts: the template is not built (make template): not measured")
			return nil
		}
		srv, err := startBenchServer(ctx, cfg, 1, "react", "--pool-templates", "react-ts")
		if err != nil {
			return err
		}
		defer srv.stop()
		rb := &bencher{c: client.New(srv.url, srv.key, client.WithUserAgent("sheepfold-bench")), res: b.res, o: b.o, url: srv.url, key: srv.key}
		n := min(max(b.o.Iterations, 1), reactIterations)
		var miss, hit []float64
		for i := 0; i < n; i++ {
			if _, err := rb.waitPool(ctx); err != nil {
				return err
			}
			d, err := rb.reactFirstPage(ctx, missEnv)
			if err != nil {
				return fmt.Errorf("miss: %w", err)
			}
			miss = append(miss, d)
			before, err := rb.waitPool(ctx)
			if err != nil {
				return err
			}
			if d, err = rb.reactFirstPage(ctx, nil); err != nil {
				return fmt.Errorf("hit: %w", err)
			}
			if v, err := rb.c.Version(ctx); err != nil {
				return err
			} else if before == nil || v.Pool == nil || v.Pool.Hits != before.Hits+1 {
				return fmt.Errorf("the react-ts create missed a full pool")
			}
			hit = append(hit, d)
		}
		b.record(benchReactMiss, miss)
		b.record(benchReactHit, hit)
		return nil
	}
}

// reactFirstPage creates a react-ts sandbox and times it until its first
// page and the modules it starts with are served through the preview.
func (b *bencher) reactFirstPage(ctx context.Context, env map[string]string) (float64, error) {
	t := time.Now()
	sb, err := b.c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "react-ts", Env: env})
	if err != nil {
		return 0, err
	}
	defer b.c.Kill(context.WithoutCancel(ctx), sb.ID)
	ps, err := b.c.Ports(ctx, sb.ID, 0)
	if err != nil {
		return 0, err
	}
	get := func(path string) (string, error) {
		req, _ := http.NewRequestWithContext(ctx, "GET", b.url+path, nil)
		req.Header.Set("Sheepfold-Preview-Token", ps.Token)
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", err
		}
		defer r.Body.Close()
		body, err := io.ReadAll(r.Body)
		if err == nil && r.StatusCode != http.StatusOK {
			err = fmt.Errorf("GET %s: %d %.200s", path, r.StatusCode, body)
		}
		return string(body), err
	}
	page, err := get("/v1/sandboxes/" + sb.ID + "/proxy/5173/")
	if err != nil {
		return 0, err
	}
	m := mainModule.FindStringSubmatch(page)
	if m == nil {
		return 0, fmt.Errorf("no main.tsx in the page: %.300s", page)
	}
	main, err := get(m[1])
	if err != nil {
		return 0, err
	}
	if _, err := get(strings.TrimSuffix(m[1], "main.tsx") + "App.tsx"); err != nil {
		return 0, err
	}
	if !strings.Contains(main, "createRoot") {
		return 0, fmt.Errorf("main.tsx: %.300s", main)
	}
	return since(t), nil
}
