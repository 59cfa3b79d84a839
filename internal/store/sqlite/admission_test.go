package sqlite_test

import (
	"path/filepath"
	"testing"

	"github.com/sheepfold/sheepfold/internal/store/storetest"
)

// TestAdmission runs the admission checks over two handles of one
// database: two servers sharing it.
func TestAdmission(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "s.db")
	a, b := open(t, path), open(t, path)
	defer a.Close()
	defer b.Close()
	storetest.Admission(t, a, b)
}

// TestRates runs the rate limit checks over two handles of one database.
func TestRates(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "s.db")
	a, b := open(t, path), open(t, path)
	defer a.Close()
	defer b.Close()
	storetest.Rates(t, a, b)
}
