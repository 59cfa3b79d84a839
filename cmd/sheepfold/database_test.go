package main

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/store/postgres"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
	"github.com/sheepfold/sheepfold/internal/store/transfer"
	"github.com/sheepfold/sheepfold/internal/testutil/pgtest"
)

// TestDatabaseCopyCLI runs `sheepfold database copy` from the default
// SQLite file into --database, then reads a key back from PostgreSQL.
func TestDatabaseCopyCLI(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	lite, err := openStore(ctx, &config.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := lite.CreateAccountKey(ctx, store.Account{ID: "a", Name: "a", CreatedAt: time.Now()},
		store.Key{ID: "key-1", Hash: "h1", CreatedAt: time.Now()}, 0); err != nil {
		t.Fatal(err)
	}
	lite.Close()

	dsn := pgtest.New(t)
	cfg := config.Config{DataDir: dir, Database: dsn}
	var out bytes.Buffer
	cmd := databaseCmd(&cfg)
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"copy"})
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^keys\s+1$`).MatchString(out.String()) ||
		!strings.Contains(out.String(), "copied 2 rows of "+filepath.Join(dir, "sheepfold.db")) || strings.Contains(out.String(), dsn) {
		t.Fatalf("copy printed:\n%s", out.String())
	}
	pg, err := postgres.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	if k, err := pg.KeyByHash(ctx, "h1"); err != nil || k.ID != "key-1" || k.Owner != "a" {
		t.Fatalf("the copied key: %+v, %v", k, err)
	}

	// Again, with the flags: the target is no longer empty.
	cmd = databaseCmd(&config.Config{})
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"copy", "--from", filepath.Join(dir, "sheepfold.db"), "--to", dsn})
	if err := cmd.ExecuteContext(ctx); !errors.Is(err, transfer.ErrNotEmpty) {
		t.Fatalf("a second copy: %v, want ErrNotEmpty", err)
	}
	// While a server has the source open.
	st, err := sqlite.Open(ctx, filepath.Join(dir, "sheepfold.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cmd.SetArgs([]string{"copy", "--from", filepath.Join(dir, "sheepfold.db"), "--to", pgtest.New(t)})
	if err := cmd.ExecuteContext(ctx); !errors.Is(err, sqlite.ErrInUse) {
		t.Fatalf("a copy of a database in use: %v, want ErrInUse", err)
	}
}

func TestCopyEnds(t *testing.T) {
	const url = "postgres://u@h/db"
	for _, tc := range []struct {
		name             string
		cfg              config.Config
		from, to         string
		wantSrc, wantErr string
	}{
		{name: "defaults", cfg: config.Config{DataDir: "/d", Database: url}, wantSrc: "/d/sheepfold.db"},
		{name: "flags", cfg: config.Config{DataDir: "/d"}, from: "/x.db", to: url, wantSrc: "/x.db"},
		{name: "sqlite --database", cfg: config.Config{DataDir: "/d", Database: "/y.db"}, to: url, wantSrc: "/y.db"},
		{name: "no target", cfg: config.Config{DataDir: "/d"}, wantErr: "give the target database"},
		{name: "target not postgres", cfg: config.Config{DataDir: "/d"}, to: "/z.db", wantErr: "--to must be"},
		{name: "source postgres", cfg: config.Config{DataDir: "/d"}, from: url, to: url, wantErr: "--from must be"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, dst, err := copyEnds(&tc.cfg, tc.from, tc.to)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || src != tc.wantSrc || dst != url {
				t.Fatalf("src %q dst %q (%v), want %q %q", src, dst, err, tc.wantSrc, url)
			}
		})
	}
}
