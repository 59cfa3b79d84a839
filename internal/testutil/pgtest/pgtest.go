// Package pgtest runs a real PostgreSQL for tests: the server binaries of
// Debian's postgresql package (`make setup` installs it, without a default
// cluster), a cluster made by initdb in a temporary directory, listening
// only on a unix socket in that directory, with fsync off (test data need
// not survive a crash).
//
// One shared server is started by the first New of a test binary; every
// New creates a fresh database in it, dropped when its test ends. The
// package's TestMain stops the server and removes its directory:
//
//	func TestMain(m *testing.M) { testutil.Main(m, pgtest.StopShared) }
//
// A missing PostgreSQL fails the test (it never skips): CI runs these
// tests with `make setup` done.
//
// As root the server runs as the postgres system user (initdb refuses
// root); otherwise as the caller.
//
// Imports: github.com/jackc/pgx/v5 (to create and drop databases),
// internal/osthread (the postmaster's Pdeathsig) and the standard library.
package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sheepfold/sheepfold/internal/osthread"
)

// binGlob is where Debian's postgresql-NN packages put the server binaries.
const binGlob = "/usr/lib/postgresql/*/bin"

// superuser is the cluster's superuser, trusted on the socket.
const superuser = "postgres"

// BinDir returns the newest installed PostgreSQL's server binary directory.
func BinDir() (string, error) { return binDir(binGlob) }

func binDir(glob string) (string, error) {
	dirs, _ := filepath.Glob(glob)
	// Newest version first: the directories are named by major version.
	slices.SortFunc(dirs, func(a, b string) int { return version(b) - version(a) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
				return d, nil
			}
		}
	}
	return "", fmt.Errorf("PostgreSQL is not installed (no postgres and initdb in %s): run `make setup`", glob)
}

// version is the major version in a /usr/lib/postgresql/NN/bin path, 0 if
// none.
func version(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// Server is a running PostgreSQL cluster in a temporary directory.
type Server struct {
	dir  string // owns the cluster: data/, the socket and server.log
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
	err  error         // cmd's exit, once done is closed

	seq atomic.Int64 // numbers the databases New makes
}

// Start initialises a cluster in a new temporary directory and starts
// its server. Stop the server to remove both.
func Start(ctx context.Context) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	// A short path: the socket's path is limited to 107 bytes.
	dir, err := os.MkdirTemp("", "sfpg")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, done: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(dir)
		}
	}()
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "--pgdata", data, "--username", superuser,
		"--auth", "trust", "--encoding", "UTF8", "--locale", "C", "--no-sync", "--no-instructions")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Dir = dir
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}

	logf, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	s.cmd = exec.Command(filepath.Join(bin, "postgres"), "-D", data,
		"-c", "listen_addresses=", // the socket only: no TCP at all
		"-c", "unix_socket_directories="+dir,
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200", "-c", "shared_buffers=32MB")
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	s.cmd.Dir = dir
	// Pdeathsig is the backstop should the test binary die without
	// StopShared (a panic, a timeout): the kernel sends the postmaster
	// SIGQUIT, an immediate shutdown. Go sets it after the credential
	// change, which would otherwise clear it.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT}
	if err := osthread.Kept(s.cmd.Start); err != nil { // the Pdeathsig: from a thread that never ends
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	go func() {
		s.err = s.cmd.Wait()
		close(s.done)
	}()
	if err := s.waitReady(ctx); err != nil {
		s.kill()
		return nil, fmt.Errorf("postgres did not start: %w\n%s", err, s.logTail())
	}
	ok = true
	return s, nil
}

// credential is the postgres system user's as root, nil (the caller's
// own) otherwise.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(superuser)
	if err != nil {
		return nil, fmt.Errorf("the postgres system user (from Debian's postgresql package): %w: run `make setup`", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, err
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// waitReady waits until the server accepts connections, for 30s at most.
func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, s.DSN("postgres"))
		if err == nil {
			return conn.Close(ctx)
		}
		select {
		case <-s.done:
			return fmt.Errorf("postgres exited: %v", s.err)
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// DSN returns the URL of database db on the server's socket.
func (s *Server) DSN(db string) string {
	q := url.Values{"host": {s.dir}, "user": {superuser}, "sslmode": {"disable"}}
	return "postgres:///" + url.PathEscape(db) + "?" + q.Encode()
}

// Dir returns the cluster's directory (the socket lives in it).
func (s *Server) Dir() string { return s.dir }

// Pid returns the postmaster's process id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// CreateDatabase creates a new empty database and returns its DSN.
func (s *Server) CreateDatabase(ctx context.Context) (name, dsn string, err error) {
	name = fmt.Sprintf("test_%d", s.seq.Add(1))
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		return "", "", err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", "", fmt.Errorf("create database %s: %w", name, err)
	}
	return name, s.DSN(name), nil
}

// DropDatabase drops a database, ending its sessions.
func (s *Server) DropDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

// Stop shuts the server down (a fast shutdown: sessions end, nothing is
// waited for; after 10s an immediate one, then SIGKILL) and removes its
// directory.
func (s *Server) Stop() error {
	var err error
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGQUIT, syscall.SIGKILL} {
		if s.stopWith(sig, 10*time.Second) {
			break
		}
		err = fmt.Errorf("postgres (pid %d) ignored %v", s.cmd.Process.Pid, sig)
	}
	if rmErr := os.RemoveAll(s.dir); rmErr != nil {
		err = errors.Join(err, rmErr)
	}
	return err
}

// stopWith signals the postmaster and reports whether it exited within
// wait.
func (s *Server) stopWith(sig syscall.Signal, wait time.Duration) bool {
	s.cmd.Process.Signal(sig)
	select {
	case <-s.done:
		return true
	case <-time.After(wait):
		return false
	}
}

// kill ends a server that failed to start.
func (s *Server) kill() {
	s.cmd.Process.Kill()
	<-s.done
}

var shared struct {
	mu  sync.Mutex
	srv *Server
	err error // why the shared server could not start; every New reports it
}

// Shared returns the test binary's shared server, starting it on first
// use.
func Shared() (*Server, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.srv == nil && shared.err == nil {
		shared.srv, shared.err = Start(context.Background())
	}
	return shared.srv, shared.err
}

// New creates a fresh database in the shared server, dropped when t ends,
// and returns its DSN (a postgres:// URL).
func New(t testing.TB) string {
	t.Helper()
	srv, err := Shared()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	ctx := context.Background()
	name, dsn, err := srv.CreateDatabase(ctx)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.DropDatabase(ctx, name); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	return dsn
}

// StopShared stops the shared server, if one started, and removes its
// directory. TestMain calls it after the tests (testutil.Main).
func StopShared() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.srv == nil {
		return
	}
	if err := shared.srv.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: stop the shared server: %v\n", err)
	}
	shared.srv, shared.err = nil, errors.New("the shared server was stopped")
}

// logTail returns the end of a server's log, for failure messages.
func (s *Server) logTail() string {
	log, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	if i := len(log) - 4000; i > 0 {
		log = log[i:]
	}
	return string(bytes.TrimSpace(log))
}
