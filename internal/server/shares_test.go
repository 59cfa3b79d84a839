package server_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// newKey makes a key of account owner.
func (e *env) newKey(owner string) string {
	e.t.Helper()
	_, secret, err := auth.Create(context.Background(), e.store, auth.CreateOptions{Owner: owner})
	if err != nil {
		e.t.Fatal(err)
	}
	return secret
}

// tryStream opens the account's event stream with key: the response
// when refused, or nil and the stream, kept open until the test ends.
func (e *env) tryStream(key string) *resp {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", e.url+"/v1/events", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Accept", "text/event-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		e.t.Fatal(err)
	}
	if res.StatusCode == http.StatusOK {
		e.t.Cleanup(func() { cancel(); res.Body.Close() })
		return nil
	}
	defer cancel()
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return &resp{status: res.StatusCode, header: res.Header, body: b}
}

// openStreams opens n event streams with key, each of which must be
// admitted, and returns what closes them.
func (e *env) openStreams(key string, n int) (closeAll func()) {
	e.t.Helper()
	var closers []func()
	for i := range n {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", e.url+"/v1/events", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Accept", "text/event-stream")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			e.t.Fatal(err)
		}
		if res.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(res.Body)
			cancel()
			e.t.Fatalf("stream %d of %d: %d %s", i+1, n, res.StatusCode, b)
		}
		closers = append(closers, func() { cancel(); res.Body.Close() })
	}
	closeAll = func() {
		for _, c := range closers {
			c()
		}
	}
	e.t.Cleanup(closeAll)
	return closeAll
}

// wantRefused fails unless r is the refusal of a stream past a share:
// the status and code, and a Retry-After.
func wantRefused(t *testing.T, what string, r *resp, status int, code string) {
	t.Helper()
	if r == nil {
		t.Fatalf("%s: admitted", what)
	}
	if r.status != status || r.errCode(t) != code || r.header.Get("Retry-After") == "" {
		t.Fatalf("%s: %d %s (Retry-After %q), want %d %s", what, r.status, r.body, r.header.Get("Retry-After"), status, code)
	}
}

// TestStreamShares: streams (event streams, executions, MCP calls, E2B
// streams, previews) count against their key's share, their account's
// and the server's. One key's flood is refused at its share with 429
// ERR_TOO_MANY_CONNECTIONS, a second key of the same account at the
// account's, while another account's streams are admitted; past the
// server's share (which leaves descriptors for the rest) every stream is
// 503 ERR_CAPACITY, and /healthz and /readyz still answer. Closing a
// stream gives its place back.
func TestStreamShares(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{MaxStreamsPerKey: 3, MaxStreamsPerAccount: 5, MaxStreams: 9})
	a1, a2, b, c := e.newKey("acct-a"), e.newKey("acct-a"), e.newKey("acct-b"), e.newKey("acct-c")
	sb := e.e2bCreate(a1, map[string]any{"templateID": "base"})
	r := e.do("GET", "/v1/sandboxes/"+sb.ID+"/ports", a1, nil)
	want(t, r, http.StatusOK, "")
	previewToken := r.json(t)["token"].(string)

	closeA1 := e.openStreams(a1, 3)
	wantRefused(t, "a key's stream past its share", e.tryStream(a1), http.StatusTooManyRequests, "ERR_TOO_MANY_CONNECTIONS")
	// Every kind of stream of that key is refused too.
	r = e.do("POST", "/v1/sandboxes/"+sb.ID+"/execute", a1, map[string]any{"code": "1"})
	wantRefused(t, "an execution past the key's share", &r, http.StatusTooManyRequests, "ERR_TOO_MANY_CONNECTIONS")
	r = e.do("POST", "/mcp", a1, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
		"Content-Type", "application/json", "Accept", "application/json, text/event-stream")
	wantRefused(t, "an MCP call past the key's share", &r, http.StatusTooManyRequests, "ERR_TOO_MANY_CONNECTIONS")
	r = e.do("POST", "/execute", "", `{"code":"1"}`, "E2b-Sandbox-Id", sb.ID, "E2b-Sandbox-Port", "49999", "X-Access-Token", sb.Token)
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" {
		t.Fatalf("an E2B execution past the key's share: %d %s", r.status, r.body)
	}
	r = e.do("POST", "/process.Process/Start", "", `{"process":{"cmd":"true"}}`, "E2b-Sandbox-Id", sb.ID,
		"E2b-Sandbox-Port", "49983", "X-Access-Token", sb.Token, "Content-Type", "application/connect+json", "Connect-Protocol-Version", "1")
	if r.status != http.StatusOK || !strings.Contains(string(r.body), "resource_exhausted") {
		t.Fatalf("an envd stream past the key's share: %d %q", r.status, r.body)
	}
	// Requests that are not streams are not counted.
	want(t, e.do("GET", "/v1/sandboxes/"+sb.ID, a1, nil), http.StatusOK, "")

	// The account's share: its second key gets what is left of it.
	e.openStreams(a2, 2)
	wantRefused(t, "a stream past the account's share", e.tryStream(a2), http.StatusTooManyRequests, "ERR_TOO_MANY_CONNECTIONS")
	r = e.do("GET", "/v1/sandboxes/"+sb.ID+"/proxy/"+strconv.Itoa(closedPort(t))+"/", "", nil, "Sheepfold-Preview-Token", previewToken)
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" {
		t.Fatalf("a preview past the account's share: %d %s", r.status, r.body)
	}

	// Another account is not affected, up to the server's share.
	e.openStreams(b, 3)
	e.openStreams(c, 1)
	wantRefused(t, "a stream past the server's share", e.tryStream(c), http.StatusServiceUnavailable, "ERR_CAPACITY")
	want(t, e.do("GET", "/healthz", "", nil), http.StatusOK, "")
	want(t, e.do("GET", "/readyz", "", nil), http.StatusOK, "")

	// Closed streams give their places back (once the server sees them go).
	closeA1()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if e.tryStream(a1) == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a closed stream's place was not given back")
		}
	}
}

// TestStreamFloodUnbounded is TestStreamShares' control: with no shares,
// one key holds as many streams as it opens (the report: 20,000 of them
// took every file descriptor of the server).
func TestStreamFloodUnbounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{MaxStreamsPerKey: -1, MaxStreamsPerAccount: -1, MaxStreams: -1})
	e.openStreams(e.keyA, 40)
}

// TestStreamsFromLimit: the server's share of streams leaves a quarter of
// the descriptor limit (at least 256) to the rest, and counts two
// descriptors a stream.
func TestStreamsFromLimit(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		nofile uint64
		want   int
	}{{1024, 384}, {20000, 7500}, {1 << 20, 393216}, {256, 16}, {100, 16}} {
		if got := server.StreamsFromLimit(tt.nofile); got != tt.want {
			t.Errorf("StreamsFromLimit(%d) = %d, want %d", tt.nofile, got, tt.want)
		}
	}
}

// login logs key in to the dashboard and returns the response and the
// session's Cookie header ("" when refused).
func (e *env) login(key string) (resp, string) {
	e.t.Helper()
	r := e.do("POST", "/ui/login", "", map[string]string{"key": key}, "X-Sheepfold-UI", "1")
	for _, c := range (&http.Response{Header: r.header}).Cookies() {
		if c.Name == "sheepfold_ui" && c.Value != "" {
			return r, c.Name + "=" + c.Value
		}
	}
	return r, ""
}

// sessionWorks reports whether a dashboard session authenticates.
func (e *env) sessionWorks(cookie string) bool {
	e.t.Helper()
	return e.do("GET", "/v1/account", "", nil, "X-Sheepfold-UI", "1", "Cookie", cookie).status == http.StatusOK
}

// TestDashboardSessionsPerAccount: each account has a share of dashboard
// sessions; a login past it ends the account's oldest session, so that
// one tenant logging in without end costs no other tenant a login. When
// all accounts' sessions together reach the server's bound (which takes
// bound/share accounts), an account at its share still logs in (its
// oldest ends) while others get 503. Before, the sessions were one pool: one key's 10,000
// logins in 1.8 s left everyone else 503 for 12 hours.
func TestDashboardSessionsPerAccount(t *testing.T) {
	defer server.SetMaxUISessions(20)()
	e := newEnv(t, server.Config{UISessionsPerAccount: 5})
	var cookies []string
	for range 50 {
		r, c := e.login(e.keyA)
		want(t, r, http.StatusNoContent, "")
		cookies = append(cookies, c)
	}
	for i, c := range cookies {
		if works := e.sessionWorks(c); works != (i >= 45) {
			t.Fatalf("session %d of 50 works: %v; want only the newest 5", i+1, works)
		}
	}
	r, other := e.login(e.keyB)
	want(t, r, http.StatusNoContent, "")
	if !e.sessionWorks(other) {
		t.Fatal("another account's session does not work")
	}
	// The server's bound: A's 5, B's 1 and 14 more fill it.
	for i, n := range []int{5, 5, 4} {
		k := e.newKey(fmt.Sprintf("acct-%d", i))
		for range n {
			r, _ := e.login(k)
			want(t, r, http.StatusNoContent, "")
		}
	}
	r, _ = e.login(e.keyB)
	want(t, r, http.StatusServiceUnavailable, "ERR_CAPACITY")
	r, _ = e.login(e.newKey("acct-late"))
	want(t, r, http.StatusServiceUnavailable, "ERR_CAPACITY")
	r, c := e.login(e.keyA) // at its share: its oldest ends
	want(t, r, http.StatusNoContent, "")
	if !e.sessionWorks(c) || e.sessionWorks(cookies[45]) {
		t.Fatal("a login at the account's share did not replace its oldest session")
	}
}

// TestDashboardSessionsUnbounded is TestDashboardSessionsPerAccount's
// control: with no share per account, one key's logins fill the server's
// bound and every other account's login is refused.
func TestDashboardSessionsUnbounded(t *testing.T) {
	defer server.SetMaxUISessions(20)()
	e := newEnv(t, server.Config{UISessionsPerAccount: 1 << 30})
	for range 20 {
		r, _ := e.login(e.keyA)
		want(t, r, http.StatusNoContent, "")
	}
	r, _ := e.login(e.keyB)
	want(t, r, http.StatusServiceUnavailable, "ERR_CAPACITY")
}

// p99 returns the 99th percentile of ds.
func p99(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)*99+99)/100-1]
}

// TestFloodLeavesOthersAlone: while one tenant floods the server with
// dashboard logins and streams (floodOthers), another tenant's logins,
// requests and executions are all served. Their latency under the flood
// is logged here and measured by BenchmarkFloodLeavesOthersAlone.
func TestFloodLeavesOthersAlone(t *testing.T) {
	t.Parallel()
	rounds := 3
	if testutil.Race {
		rounds = 1
	}
	for what, p := range floodOthers(t, rounds) {
		t.Logf("%s p99 %v without the flood, %v with it", what, p[0], p[1])
	}
}

// BenchmarkFloodLeavesOthersAlone reports, for another tenant's logins,
// reads and `1+1` executions, the ratio of their p99 under one tenant's
// flood of logins and streams to their p99 without it (floodOthers, ten
// rounds). Run it with -benchtime 1x (make bench-isolation); the target
// is a ratio under 2.
func BenchmarkFloodLeavesOthersAlone(b *testing.B) {
	for range b.N {
		for what, p := range floodOthers(b, 10) {
			b.ReportMetric(float64(p[1])/float64(p[0]), strings.ReplaceAll(what, " ", "-")+"-p99-x")
		}
	}
}

// floodOthers: one tenant floods the server with dashboard logins and
// streams (its whole share of streams held open, and 100 logins and 100
// more streams a second past it) in rounds that alternate with phases
// without the flood, so that both meet the same load of the host; it
// checks that the other tenant's logins, reads and executions are all
// served and the flood's streams past the share refused, and returns
// their p99s, [0] without the flood and [1] with it. The flood is paced
// by its clients; an unpaced one is BenchmarkUnpacedFlood's.
func floodOthers(t testing.TB, rounds int) map[string][2]time.Duration {
	e := newEnv(t, server.Config{})
	id := e.create(e.keyB, nil)
	if _, err := e.executeWithin(e.keyB, id, "1+1", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	type samples [2][]time.Duration // [0] without the flood, [1] with it
	measure := func(logins, reads, execs *samples, phase, n int) {
		for range n {
			start := time.Now()
			r, c := e.login(e.keyB)
			want(t, r, http.StatusNoContent, "")
			logins[phase] = append(logins[phase], time.Since(start))
			start = time.Now()
			want(t, e.do("GET", "/v1/sandboxes/"+id, "", nil, "X-Sheepfold-UI", "1", "Cookie", c), http.StatusOK, "")
			reads[phase] = append(reads[phase], time.Since(start))
			d, err := e.executeWithin(e.keyB, id, "1+1", 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			execs[phase] = append(execs[phase], d)
		}
	}
	const floodRate = 100 // logins, and streams past the share, a second
	var floodLogins, floodStreams, refused atomic.Int64
	flood := func() (stop func()) {
		closeStreams := e.openStreams(e.keyA, server.DefaultMaxStreamsPerKey)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for _, f := range []func(){
			func() {
				if r, _ := e.login(e.keyA); r.status == http.StatusNoContent {
					floodLogins.Add(1)
				}
			},
			func() {
				floodStreams.Add(1)
				if r := e.tryStream(e.keyA); r != nil && r.status == http.StatusTooManyRequests {
					refused.Add(1)
				}
			},
		} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(time.Second / floodRate)
				defer tick.Stop()
				for {
					select {
					case <-ctx.Done():
						return
					case <-tick.C:
						f()
					}
				}
			}()
		}
		return func() { cancel(); wg.Wait(); closeStreams() }
	}
	var logins, reads, execs samples
	for range rounds {
		measure(&logins, &reads, &execs, 0, 40)
		stop := flood()
		measure(&logins, &reads, &execs, 1, 40)
		stop()
	}
	t.Logf("the flood made %d logins and %d streams past the share (%d refused) beside the %d streams held",
		floodLogins.Load(), floodStreams.Load(), refused.Load(), server.DefaultMaxStreamsPerKey)
	if refused.Load() != floodStreams.Load() || floodLogins.Load() == 0 {
		t.Fatal("the flood did not run as meant")
	}
	out := map[string][2]time.Duration{}
	for what, d := range map[string]samples{"login": logins, "read": reads, "execute 1+1": execs} {
		out[what] = [2]time.Duration{p99(d[0]), p99(d[1])}
	}
	return out
}

// TestLoadWithinShares: the shares' defaults leave a tenant's ordinary
// load alone: one key's 100 concurrent creates, then 100 concurrent
// executions (each a stream held while it runs) are all served.
func TestLoadWithinShares(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{}, func(c *sandbox.Config) { c.MaxSandboxes = 100 })
	ids := make([]string, 100)
	errs := make(chan error, 100)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := e.do("POST", "/v1/sandboxes", e.keyA, nil)
			if r.status != http.StatusCreated {
				errs <- fmt.Errorf("create %d: %d %s", i, r.status, r.body)
				return
			}
			ids[i], _ = r.json(t)["id"].(string)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	// 100 executions at once, ten in each of ten sandboxes (each
	// sandbox's context runs one at a time).
	errs = make(chan error, 100)
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := e.executeWithin(e.keyA, ids[i%10], "import time; time.sleep(0.2); 1+1", 60*time.Second); err != nil {
				errs <- fmt.Errorf("execution %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// quietConns opens n connections to url's host that send nothing (as a
// flood of them would), closed when the test ends.
func quietConns(t *testing.T, url string, n int) []net.Conn {
	t.Helper()
	var out []net.Conn
	for range n {
		c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		out = append(out, c)
	}
	return out
}

// closedByServer reports whether the server closed c: a read sees its
// end (EOF or reset) within a second, rather than waiting.
func closedByServer(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// TestQuietConnectionsShed: past the bound of open connections, new ones
// close the oldest that serve no request (here, 60 connections that
// never send one), so that a health check and a tenant's request on new
// connections are served, and a stream in progress is not touched.
// Before, such connections held their descriptors until the header
// timeout, and a flood of them took every descriptor.
func TestQuietConnectionsShed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{MaxConnections: 20})
	url := e.served()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"/v1/events", nil)
	req.Header.Set("Authorization", "Bearer "+e.keyA)
	req.Header.Set("Accept", "text/event-stream")
	stream, err := http.DefaultClient.Do(req)
	if err != nil || stream.StatusCode != http.StatusOK {
		t.Fatalf("the stream: %v %v", stream, err)
	}
	defer stream.Body.Close()
	quiet := quietConns(t, url, 60)
	if probe(t, url, "/healthz") != http.StatusOK {
		t.Fatal("/healthz on a new connection")
	}
	r, err := fresh.Get(url + "/v1/sandboxes")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a request on a new connection: %d", r.StatusCode)
	}
	if !closedByServer(quiet[0]) || closedByServer(quiet[59]) {
		t.Fatal("the oldest quiet connection was not closed, or the newest was")
	}
	var closed atomic.Int64
	var wg sync.WaitGroup
	for _, c := range quiet {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if closedByServer(c) {
				closed.Add(1)
			}
		}()
	}
	wg.Wait()
	if n := closed.Load(); n < 40 {
		t.Fatalf("%d of 60 quiet connections closed past a bound of 20", n)
	}
	// The stream serving a request is left alone: it carries the next
	// event.
	e.create(e.keyA, nil)
	timer := time.AfterFunc(10*time.Second, cancel)
	defer timer.Stop()
	sc := bufio.NewScanner(stream.Body)
	for sc.Scan() && sc.Text() != "event: sandbox.created" {
	}
	if sc.Text() != "event: sandbox.created" {
		t.Fatalf("the stream after the shedding: %v", sc.Err())
	}
}

// TestQuietConnectionsUnbounded is TestQuietConnectionsShed's control:
// with no bound, quiet connections stay open (until the header timeout).
func TestQuietConnectionsUnbounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, server.Config{MaxConnections: -1})
	url := e.served()
	quiet := quietConns(t, url, 60)
	if probe(t, url, "/healthz") != http.StatusOK {
		t.Fatal("/healthz on a new connection")
	}
	if closedByServer(quiet[0]) {
		t.Fatal("a quiet connection was closed with no bound")
	}
}

// TestConnectionsFromLimit: the default bound of open connections leaves
// the reserve and the streams' other descriptors.
func TestConnectionsFromLimit(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		nofile uint64
		want   int
	}{{1024, 384}, {20000, 7500}, {256, 64}} {
		if got := server.ConnectionsFromLimit(tt.nofile); got != tt.want {
			t.Errorf("ConnectionsFromLimit(%d) = %d, want %d", tt.nofile, got, tt.want)
		}
	}
}

// BenchmarkUnpacedFlood reports, for another tenant's reads and `1+1`
// executions, the ratio of their p99 while one tenant floods the API as
// fast as it is answered (unpacedFlood) to their p99 without the flood.
// Run it with -benchtime 1x (make bench-isolation); the target is a
// ratio under 2.
func BenchmarkUnpacedFlood(b *testing.B) {
	for _, c := range []struct {
		name string
		n    int
	}{{"paced", 0}, {"unpaced", -1}} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				for what, p := range unpacedFlood(b, server.Config{PacePerAccount: c.n}, benchRounds(10)) {
					name := strings.ReplaceAll(what, " ", "-")
					b.ReportMetric(float64(p[1])/float64(p[0]), name+"-p99-x")
					b.ReportMetric(float64(p[1])/1e6, name+"-p99-ms")
				}
			}
		})
	}
}

// unpacedFlood: one tenant's 16 clients each send their next request
// (a list of the tenant's sandboxes, a dashboard login) as soon as the
// last is answered, from another process on a CPU of their own
// (floodFromAfar), in rounds that alternate with phases without the
// flood; another tenant's reads and executions are measured meanwhile.
// It returns their p99s, [0] without the flood and [1] with it.
func unpacedFlood(t testing.TB, cfg server.Config, rounds int) map[string][2]time.Duration {
	e := newEnv(t, cfg)
	defer pinAwayFromLast(t)()
	id := e.create(e.keyB, nil)
	if _, err := e.executeWithin(e.keyB, id, "1+1", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	type samples [2][]time.Duration
	var reads, execs samples
	measure := func(phase, n int) {
		for range n {
			start := time.Now()
			want(t, e.do("GET", "/v1/sandboxes/"+id, e.keyB, nil), http.StatusOK, "")
			reads[phase] = append(reads[phase], time.Since(start))
			d, err := e.executeWithin(e.keyB, id, "1+1", 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			execs[phase] = append(execs[phase], d)
		}
	}
	var served int64
	flood := func() (stop func()) {
		end := floodFromAfar(t, e.url, e.keyA)
		return func() { served += end() }
	}
	start := time.Now()
	for range rounds {
		measure(0, 40)
		stop := flood()
		measure(1, 40)
		stop()
	}
	t.Logf("the flood's requests answered: %d in %v", served, time.Since(start).Round(time.Millisecond))
	out := map[string][2]time.Duration{}
	for what, d := range map[string]samples{"read": reads, "execute 1+1": execs} {
		out[what] = [2]time.Duration{p99(d[0]), p99(d[1])}
	}
	return out
}

// benchRounds is n, or $SHEEPFOLD_BENCH_ROUNDS when set (a quick look).
func benchRounds(n int) int {
	if v, err := strconv.Atoi(os.Getenv("SHEEPFOLD_BENCH_ROUNDS")); err == nil && v > 0 {
		return v
	}
	return n
}
