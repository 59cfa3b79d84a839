package server

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/auth"
	"github.com/sheepfold/sheepfold/internal/preview"
)

// Streams: the requests that may stay open for long (an event stream, an
// execution or a command and its output, a download or an upload, an MCP
// call, a model completion, a preview connection, an E2B process stream,
// watch or code-interpreter execution, a polling watcher) each hold a
// file descriptor, a few goroutines and buffers for as long as they last.
// Each is counted, while it runs, against three shares:
//
//   - its API key's (Config.MaxStreamsPerKey; a preview's "key" is its
//     sandbox, since a preview's caller may hold no key);
//   - its account's (Config.MaxStreamsPerAccount), so that one tenant with
//     many keys cannot take what others need;
//   - the server's (Config.MaxStreams), below the process's file
//     descriptor limit with a reserve left over, so that health checks,
//     the store, sandbox teardown and the warm pool always have the
//     descriptors and goroutines they need, whatever all tenants do.
//
// A stream past its key's or account's share is refused at once with 429
// ERR_TOO_MANY_CONNECTIONS; one past the server's with 503 ERR_CAPACITY;
// neither waits. /healthz and /readyz are never streams, so never refused.
// The counts are this process's: replicas sharing a store each keep their
// own, as each has its own descriptors.

// Connections: the requests that are not streams end quickly, but a
// client may also hold connections open without a request (one kept
// alive between requests, one not yet sending its request); the header
// and idle timeouts end those in time, but not before a flood of them
// takes the descriptors. Past Config.MaxConnections open connections,
// every new one closes the oldest that is serving no request (shedConns),
// so that a health check, or any client's new request, always gets a
// descriptor; connections serving a request are never closed here.

// Defaults of the stream shares.
const (
	DefaultMaxStreamsPerKey     = 256
	DefaultMaxStreamsPerAccount = 1024
	// streamReserveMin is the least number of descriptors the server's
	// share leaves aside; it leaves a quarter of the limit when that is
	// more.
	streamReserveMin = 256
	// streamRetry is the Retry-After of a refused stream.
	streamRetry = time.Second
)

// streamFDs is how many descriptors a stream may hold: its client's
// connection, and the one to the sandbox's agent or a preview's app.
const streamFDs = 2

// StreamsFromLimit returns the server's share of streams under a file
// descriptor limit of nofile: what is left after the reserve
// (max(streamReserveMin, nofile/4)), divided among streamFDs descriptors
// each; at least 16.
func StreamsFromLimit(nofile uint64) int {
	reserve := max(uint64(streamReserveMin), nofile/4)
	if nofile <= reserve {
		return 16
	}
	return max(16, int((nofile-reserve)/streamFDs))
}

// ConnectionsFromLimit returns the default bound of open connections
// under a file descriptor limit of nofile: what the reserve and the
// streams' other descriptors leave; at least 64.
func ConnectionsFromLimit(nofile uint64) int {
	reserve := max(uint64(streamReserveMin), nofile/4)
	if nofile <= reserve {
		return 64
	}
	return max(64, int(nofile-reserve)-StreamsFromLimit(nofile)*(streamFDs-1))
}

// nofile is the process's RLIMIT_NOFILE (Go raises the soft limit to the
// hard one at start).
func nofile() uint64 {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == unix.RLIM_INFINITY {
		return 1 << 20
	}
	return rl.Cur
}

// defaultMaxStreams reads the process's RLIMIT_NOFILE (Go raises the soft
// limit to the hard one at start) and returns StreamsFromLimit of it.
func defaultMaxStreams() int { return StreamsFromLimit(nofile()) }

// shedConns bounds the connections open (http.Server.ConnState): past
// max, a new connection closes the oldest ones that serve no request.
type shedConns struct {
	max int // 0: no bound

	// mu guards the fields below.
	mu    sync.Mutex
	open  int
	quiet map[net.Conn]time.Time // serving no request (new or idle), since when
	// closing are the connections closed here that net/http has not yet
	// reported closed: they count as open, but not against the bound, so
	// that the next new connection does not close them again in others.
	closing map[net.Conn]struct{}
	shed    int // connections closed here, for tests and logs
}

func newShedConns(max int) *shedConns {
	return &shedConns{max: max, quiet: map[net.Conn]time.Time{}, closing: map[net.Conn]struct{}{}}
}

// state is the http.Server's ConnState hook.
func (c *shedConns) state(conn net.Conn, st http.ConnState) {
	var victims []net.Conn
	c.mu.Lock()
	switch st {
	case http.StateNew:
		c.open++
		if excess := c.open - len(c.closing) - c.max; c.max > 0 && excess > 0 {
			victims = c.oldestQuiet(excess)
			for _, v := range victims {
				c.closing[v] = struct{}{}
			}
			c.shed += len(victims)
		}
		c.quiet[conn] = time.Now()
	case http.StateActive:
		delete(c.quiet, conn)
	case http.StateIdle:
		c.quiet[conn] = time.Now()
	case http.StateHijacked, http.StateClosed:
		delete(c.quiet, conn)
		delete(c.closing, conn)
		c.open--
	}
	c.mu.Unlock()
	for _, v := range victims {
		v.Close()
	}
}

// oldestQuiet takes up to n of the oldest quiet connections out of the
// quiet set (they are closed: they count as open until net/http says
// they are closed). c.mu is held.
func (c *shedConns) oldestQuiet(n int) []net.Conn {
	var out []net.Conn
	for range n {
		var oldest net.Conn
		var at time.Time
		for conn, t := range c.quiet {
			if oldest == nil || t.Before(at) {
				oldest, at = conn, t
			}
		}
		if oldest == nil {
			break
		}
		delete(c.quiet, oldest)
		out = append(out, oldest)
	}
	return out
}

// shedCount returns how many connections were closed here.
func (c *shedConns) shedCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.shed
}

// streams counts the streams open against each share. The zero value
// has no caps; a cap of 0 means none.
type streams struct {
	perKey, perAccount, total int

	refused func(scope string) // counts a refusal (metrics); may be nil

	// mu guards the counts.
	mu       sync.Mutex
	keys     map[string]int
	accounts map[string]int
	n        int
}

func newStreams(perKey, perAccount, total int) *streams {
	return &streams{perKey: perKey, perAccount: perAccount, total: total,
		keys: map[string]int{}, accounts: map[string]int{}}
}

// acquire counts a stream of key and account, or refuses it: past the
// key's share, the account's or the server's. release gives it back
// (once; later calls do nothing).
func (st *streams) acquire(key, account string) (release func(), err error) {
	st.mu.Lock()
	switch {
	case st.perKey > 0 && st.keys[key] >= st.perKey:
		st.mu.Unlock()
		st.refuse("key")
		return nil, &apierr.Error{Code: apierr.TooManyConnections, RetryAfter: streamRetry,
			Message: fmt.Sprintf("this key has %d streams open (executions, event streams, downloads, previews, MCP calls), its share; close one or retry later", st.perKey)}
	case st.perAccount > 0 && st.accounts[account] >= st.perAccount:
		st.mu.Unlock()
		st.refuse("account")
		return nil, &apierr.Error{Code: apierr.TooManyConnections, RetryAfter: streamRetry,
			Message: fmt.Sprintf("this account has %d streams open (executions, event streams, downloads, previews, MCP calls), its share; close one or retry later", st.perAccount)}
	case st.total > 0 && st.n >= st.total:
		st.mu.Unlock()
		st.refuse("server")
		return nil, &apierr.Error{Code: apierr.Capacity, RetryAfter: streamRetry,
			Message: "the server has as many streams open as it can hold; retry later"}
	}
	st.keys[key]++
	st.accounts[account]++
	st.n++
	st.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			st.mu.Lock()
			defer st.mu.Unlock()
			if st.keys[key]--; st.keys[key] <= 0 {
				delete(st.keys, key)
			}
			if st.accounts[account]--; st.accounts[account] <= 0 {
				delete(st.accounts, account)
			}
			st.n--
		})
	}, nil
}

func (st *streams) refuse(scope string) {
	if st.refused != nil {
		st.refused(scope)
	}
}

// open returns how many streams are open.
func (st *streams) open() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.n
}

// streamRoutes are the /v1 routes whose requests are streams, and when.
var streamRoutes = map[string]func(*http.Request) bool{
	"POST /v1/sandboxes/{id}/execute":              always,
	"POST /v1/sandboxes/{id}/commands":             always, // a foreground command runs for up to its timeout
	"GET /v1/sandboxes/{id}/commands/{pid}/stream": always,
	"GET /v1/sandboxes/{id}/events":                isSSE,
	"GET /v1/events":                               isSSE,
	"GET /v1/sandboxes/{id}/files":                 always, // downloads
	"PUT /v1/sandboxes/{id}/files":                 always, // uploads
	"POST /v1/sandboxes/{id}/files":                always,
	"GET /v1/volumes/{name}/files":                 always, // downloads
	"PUT /v1/volumes/{name}/files":                 always, // uploads
	"POST /mcp":                                    always,
	"POST /v1/sessions/{id}/execute":               always,
	"POST /v1/sessions/{id}/ask":                   always,
	"POST /v1/chat/completions":                    always,
}

func always(*http.Request) bool { return true }

func isSSE(r *http.Request) bool { return wantStream(r, streamNone) == streamSSE }

// streamed wraps the handler of route pattern, when it is a stream route,
// so that each of its requests holds a stream of its caller's key and
// account while it runs. Requests the server makes to itself in process
// (the tools of /mcp) are not counted again: their MCP call is.
func (s *Server) streamed(pattern string, h handlerFunc) handlerFunc {
	when, ok := streamRoutes[pattern]
	if !ok {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) error {
		if inProcess(r.Context()) || !when(r) {
			return h(w, r)
		}
		p, _ := auth.PrincipalFrom(r.Context())
		release, err := s.streams.acquire(p.KeyID, p.Owner)
		if err != nil {
			return err
		}
		defer release()
		return h(w, r)
	}
}

// holdStream is the E2B surface's hook (e2b.Config.Hold): a stream of
// the key keyID, acting for owner.
func (s *Server) holdStream(_ context.Context, owner, keyID string) (func(), error) {
	return s.streams.acquire(keyID, owner)
}

// holdPreview holds a stream for a preview connection to sandbox id of
// owner: the sandbox stands for the key (a preview may carry none).
func (s *Server) holdPreview(owner, id string) (func(), error) {
	return s.streams.acquire("preview:"+id, owner)
}

// previewBusy answers a preview request refused its stream: in E2B's
// shape for E2B's form, else as a page.
func (s *Server) previewBusy(w http.ResponseWriter, t preview.Target, err error) {
	e := apierr.From(err)
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", fmt.Sprint(int((e.RetryAfter+time.Second-1)/time.Second)))
	}
	if t.Form == preview.FormE2B {
		writeJSON(w, e.HTTPStatus(), map[string]any{"sandboxId": t.ID, "message": e.Message, "code": e.HTTPStatus()})
		return
	}
	preview.Page(w, e.HTTPStatus(), "Too many connections", fmt.Sprintf("Sandbox %s's previews have too many connections open: %s.", t.ID, e.Message))
}

type inProcessKey struct{}

// withInProcess marks a request the server makes to itself in process.
func withInProcess(ctx context.Context) context.Context {
	return context.WithValue(ctx, inProcessKey{}, true)
}

func inProcess(ctx context.Context) bool {
	v, _ := ctx.Value(inProcessKey{}).(bool)
	return v
}
