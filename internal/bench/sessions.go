package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/client"
	"github.com/sheepfold/sheepfold/internal/llm/llmtest"
)

// Model sessions: the bench's own server gets the scripted model
// (llmtest.Brain, answering at once) as its provider, so that what is
// measured is Sheepfold's part: the relay's overhead on a completion, and
// the Black-Friday tickets of examples/black_friday.py through sessions.

// Names of the session scenarios.
const (
	benchChatDirect  = "chat completion, direct to the provider"
	benchChatRelayed = "chat completion, through Sheepfold"
	benchSessionBF   = "Black-Friday ticket via a session, Sheepfold's own time"
	benchSessionWall = "Black-Friday ticket via a session, whole ask"
	scriptedModel    = "scripted"
)

// sessionWarmUp is what examples/black_friday.py runs first in a session:
// the tickets' libraries and a first figure (matplotlib's font cache).
const sessionWarmUp = "import pandas, matplotlib\nmatplotlib.use(\"Agg\")\nimport matplotlib.pyplot as plt\n" +
	"fig = plt.figure()\nfig.gca().plot([1, 2])\nfig.canvas.draw()\nplt.close(fig)"

// sessionTickets are examples/black_friday.py's tickets.
var sessionTickets = []string{
	"Total revenue per country in orders.csv, counting each order_id once.",
	"Make a stock chart per SKU from orders.csv as a PNG and name the SKUs low in stock.",
	"Find the duplicate orders in orders.csv (the same order_id twice).",
	"Draft an e-mail to the customer of the first duplicate order in orders.csv: we refunded the double charge.",
}

// sessionOrders is a small orders export with duplicates, in the shape
// examples/black_friday.py writes.
func sessionOrders() string {
	var b strings.Builder
	b.WriteString("order_id,customer,email,country,sku,qty,price,stock\n")
	countries := []string{"DE", "FR", "US", "NL", "ES"}
	skus := []string{"TV-55", "HEADSET", "LAPTOP", "PHONE", "CABLE"}
	for i := 1; i <= 40; i++ {
		fmt.Fprintf(&b, "%d,Customer %d,customer%d@example.com,%s,%s,%d,%.2f,%d\n",
			1000+i, i, i, countries[i%5], skus[i%5], 1+i%3, 10+float64(i%7)*45.5, 3+i%9*6)
	}
	for _, i := range []int{4, 17, 31} {
		fmt.Fprintf(&b, "%d,Customer %d,customer%d@example.com,%s,%s,%d,%.2f,%d\n",
			1000+i, i, i, countries[i%5], skus[i%5], 1+i%3, 10+float64(i%7)*45.5, 3+i%9*6)
	}
	return b.String()
}

// modelProvider starts the scripted model and writes the config file that
// makes it the bench server's provider; stop ends it.
func modelProvider() (prov *llmtest.Server, config string, stop func(), err error) {
	prov = llmtest.New(llmtest.Brain)
	dir, err := os.MkdirTemp("", "sheepfold-bench-model-")
	if err != nil {
		prov.Close()
		return nil, "", nil, err
	}
	config = filepath.Join(dir, "config.toml")
	body := fmt.Sprintf("[[providers]]\nname = \"scripted\"\nbase_url = %q\nmodels = [%q]\nprice_input_per_mtok = 0.27\nprice_output_per_mtok = 1.10\n",
		prov.URL, scriptedModel)
	if err := os.WriteFile(config, []byte(body), 0o600); err != nil {
		prov.Close()
		os.RemoveAll(dir)
		return nil, "", nil, err
	}
	var once sync.Once
	stop = func() { once.Do(func() { prov.Close(); os.RemoveAll(dir) }) }
	unregister := onInterrupt(stop)
	return prov, config, func() { unregister(); stop() }, nil
}

// relayOverhead alternates a non-streamed completion sent to the scripted
// provider directly and through the server's /v1/chat/completions.
func (b *bencher) relayOverhead(ctx context.Context) error {
	if b.model == nil {
		fmt.Fprintln(os.Stderr, "bench: skipped (the server was not started by the bench, so it has no scripted model)")
		return nil
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	body := []byte(`{"model":"scripted","messages":[{"role":"user","content":"SAY: ok"}]}`)
	post := func(url, key string) (float64, error) {
		req, err := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(body))
		if err != nil {
			return 0, err
		}
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		t := time.Now()
		res, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		ms := since(t)
		if res.StatusCode != 200 || !bytes.Contains(b, []byte(`"content":"ok"`)) {
			return 0, fmt.Errorf("%s: %d %s", url, res.StatusCode, b)
		}
		return ms, nil
	}
	n := max(b.o.Iterations*10, 300)
	var direct, relayed []float64
	for i := 0; i < n+20; i++ {
		d, err := post(b.model.URL+"/chat/completions", "")
		if err != nil {
			return err
		}
		r, err := post(b.url+"/v1/chat/completions", b.key)
		if err != nil {
			return err
		}
		if i >= 20 { // warm-up: connections, the account's first read
			direct, relayed = append(direct, d), append(relayed, r)
		}
	}
	b.record(benchChatDirect, direct)
	b.record(benchChatRelayed, relayed)
	return nil
}

// sessionTicketsRun sends b.o.SessionTickets Black-Friday tickets through
// sessions from b.o.SessionClients clients at once, each with its own
// session, as examples/black_friday.py --concurrency does. Every ticket
// must be answered by executions that succeeded.
func (b *bencher) sessionTicketsRun(ctx context.Context) error {
	if b.model == nil {
		fmt.Fprintln(os.Stderr, "bench: skipped (the server was not started by the bench, so it has no scripted model)")
		return nil
	}
	total, clients := b.o.SessionTickets, b.o.SessionClients
	if total <= 0 {
		total = 200
	}
	if clients <= 0 {
		clients = 8
	}
	orders := sessionOrders()
	var (
		mu          sync.Mutex
		next        int
		own, wall   []float64
		failed      []string
		wg          sync.WaitGroup
		firstErr    error
		sessionsErr error
	)
	take := func() (string, bool) {
		mu.Lock()
		defer mu.Unlock()
		if next >= total || firstErr != nil {
			return "", false
		}
		next++
		return sessionTickets[(next-1)%len(sessionTickets)], true
	}
	for w := 0; w < clients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := b.c.CreateSession(ctx, client.SessionRequest{Model: scriptedModel, SandboxConfig: map[string]any{
				"allowed_modules": []string{"pandas", "numpy", "matplotlib", "csv", "math", "json"}, "network_restricted": true}})
			if err != nil {
				mu.Lock()
				sessionsErr = err
				mu.Unlock()
				return
			}
			defer b.c.DeleteSession(context.WithoutCancel(ctx), s.ID)
			// The session's start (the libraries imported, as
			// examples/black_friday.py does) is not a ticket's time.
			if ex, err := b.c.SessionExecute(ctx, s.ID, client.SessionExecuteRequest{Code: sessionWarmUp,
				TimeoutMS: 180000}); err != nil || ex.Err() != nil {
				mu.Lock()
				if err == nil {
					err = ex.Err()
				}
				sessionsErr = err
				mu.Unlock()
				return
			}
			first := true
			for {
				ticket, ok := take()
				if !ok {
					return
				}
				req := client.AskRequest{Prompt: ticket}
				if first {
					req.Files = []client.AskFile{client.TextFile("orders.csv", orders)}
				}
				ans, err := b.c.Ask(ctx, s.ID, req)
				mu.Lock()
				switch {
				case err != nil:
					failed = append(failed, fmt.Sprintf("%s: %v", ticket, err))
					if firstErr == nil && ctx.Err() != nil {
						firstErr = ctx.Err()
					}
				case ans.StopReason != "answered" || len(ans.Executions) == 0 || ans.Executions[0].Status != "success":
					failed = append(failed, fmt.Sprintf("%s: %s %+v", ticket, ans.StopReason, ans.Executions))
				default:
					own = append(own, ans.SheepfoldTimeMS)
					wall = append(wall, ans.TimeMS)
				}
				mu.Unlock()
				first = false
			}
		}()
	}
	wg.Wait()
	if sessionsErr != nil {
		return fmt.Errorf("create a session: %w", sessionsErr)
	}
	if firstErr != nil {
		return firstErr
	}
	b.record(benchSessionBF, own)
	b.record(benchSessionWall, wall)
	if len(failed) > 0 {
		b.res.print(os.Stdout) // the figures so far, with the failures below
	}
	b.res.Notes = append(b.res.Notes, fmt.Sprintf("Black-Friday via sessions: %d tickets by %d clients, %d failed", total, clients, len(failed)))
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d tickets failed; the first: %s", len(failed), total, failed[0])
	}
	return nil
}
