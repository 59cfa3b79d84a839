package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sheepfold/sheepfold/client"
)

// previewResult compares small GETs to a Node HTTP server inside a
// sandbox, sent from inside the sandbox (direct) and from the host
// through the preview proxy (path form, keep-alive), one at a time for
// latency and from previewClients clients at once for throughput.
type previewResult struct {
	Clients    int     `json:"clients"`
	Direct     stat    `json:"direct_latency"`
	Proxied    stat    `json:"proxied_latency"`
	DirectRPS  float64 `json:"direct_requests_per_second"`
	ProxiedRPS float64 `json:"proxied_requests_per_second"`
	Errors     int     `json:"proxied_errors"`
}

const previewClients = 8

// previewApp answers every request with "ok"; previewLoad is the load
// generator run inside the sandbox: `node load.js seq N` prints the
// latency of N sequential requests (ms), `node load.js par C MS` the
// requests C keep-alive clients completed in MS milliseconds.
const (
	previewApp  = `require("http").createServer((q, s) => s.end("ok")).listen(8000, "127.0.0.1")`
	previewLoad = `
const http = require("http");
const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });
const get = () => new Promise((ok, bad) => http.get({ host: "127.0.0.1", port: 8000, path: "/", agent }, (r) => { r.resume(); r.on("end", ok); }).on("error", bad));
(async () => {
  const [mode, a, b] = process.argv.slice(2);
  if (mode === "seq") {
    const out = [];
    for (let i = -50; i < +a; i++) { const t = process.hrtime.bigint(); await get(); if (i >= 0) out.push(Number(process.hrtime.bigint() - t) / 1e6); }
    console.log(JSON.stringify(out));
  } else {
    let n = 0; const end = Date.now() + +b;
    await Promise.all(Array.from({ length: +a }, async () => { while (Date.now() < end) { await get(); n++; } }));
    console.log(JSON.stringify([n]));
  }
})();
`
)

func (b *bencher) preview(ctx context.Context) error {
	sb, err := b.c.CreateSandbox(ctx, client.CreateSandboxRequest{Timeout: 10 * time.Minute})
	if err != nil {
		return err
	}
	defer b.c.Kill(context.WithoutCancel(ctx), sb.ID)
	if _, err := b.c.WriteFile(ctx, sb.ID, "/home/user/load.js", strings.NewReader(previewLoad)); err != nil {
		return err
	}
	if _, err := b.c.StartCommand(ctx, sb.ID, client.CommandRequest{Cmd: "node", Args: []string{"-e", previewApp}}); err != nil {
		return err
	}
	var token string
	for deadline := time.Now().Add(30 * time.Second); ; {
		ps, err := b.c.Ports(ctx, sb.ID, 0)
		if err != nil {
			return err
		}
		up := false
		for _, p := range ps.Ports {
			up = up || p.Port == 8000 && p.Listening
		}
		if up {
			token = ps.Token
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the app did not listen on 8000 within 30 s")
		}
		time.Sleep(50 * time.Millisecond) // polling /proc/net/tcp until the app is up
	}
	n := max(b.o.Iterations, 1000)
	dur := b.o.Duration
	if dur <= 0 {
		dur = 3 * time.Second
	}
	res := &previewResult{Clients: previewClients}

	// Direct, inside the sandbox.
	inside := func(args ...string) ([]float64, error) {
		r, err := b.c.RunCommand(ctx, sb.ID, client.CommandRequest{Cmd: "node", Args: append([]string{"/home/user/load.js"}, args...), Timeout: 5 * time.Minute})
		if err != nil {
			return nil, err
		}
		var v []float64
		if err := json.Unmarshal([]byte(r.Stdout), &v); err != nil {
			return nil, fmt.Errorf("load generator: %v: %q %q", err, r.Stdout, r.Stderr)
		}
		return v, nil
	}
	ms, err := inside("seq", strconv.Itoa(n))
	if err != nil {
		return err
	}
	res.Direct = summarize(ms)
	cnt, err := inside("par", strconv.Itoa(previewClients), strconv.FormatInt(dur.Milliseconds(), 10))
	if err != nil {
		return err
	}
	res.DirectRPS = cnt[0] / dur.Seconds()

	// Through the preview, from the host.
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute}}
	defer hc.CloseIdleConnections()
	url := b.url + "/v1/sandboxes/" + sb.ID + "/proxy/8000/"
	get := func() error {
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		req.Header.Set("Sheepfold-Preview-Token", token)
		r, err := hc.Do(req)
		if err != nil {
			return err
		}
		body, err := io.ReadAll(r.Body)
		r.Body.Close()
		if err != nil || r.StatusCode != http.StatusOK || string(body) != "ok" {
			return fmt.Errorf("preview GET: %d %q %v", r.StatusCode, body, err)
		}
		return nil
	}
	ms = ms[:0]
	for i := -50; i < n; i++ {
		t := time.Now()
		if err := get(); err != nil {
			return err
		}
		if i >= 0 {
			ms = append(ms, since(t))
		}
	}
	res.Proxied = summarize(ms)
	var done, errs atomic.Int64
	end := time.Now().Add(dur)
	var wg sync.WaitGroup
	for range previewClients {
		wg.Go(func() {
			for time.Now().Before(end) {
				if err := get(); err != nil {
					errs.Add(1)
					continue
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	res.ProxiedRPS = float64(done.Load()) / dur.Seconds()
	res.Errors = int(errs.Load())
	b.res.Preview = res
	for name, st := range map[string]stat{benchPreviewDirect: res.Direct, benchPreviewProxied: res.Proxied} {
		b.res.Scenarios[name] = st
	}
	b.res.order = append(b.res.order, benchPreviewDirect, benchPreviewProxied)
	return nil
}

// Names of the preview scenario's two latency series.
const (
	benchPreviewDirect  = "small GET, direct inside the sandbox"
	benchPreviewProxied = "small GET through the preview (path form)"
)
