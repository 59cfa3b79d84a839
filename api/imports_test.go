package api_test

import (
	"testing"

	"github.com/sheepfold/sheepfold/internal/testutil/apispec"
)

// TestImportsStdlibOnly keeps the package of the standard library only:
// the public Go SDK imports it, and must not pull in the server or a
// third-party module with it.
func TestImportsStdlibOnly(t *testing.T) {
	apispec.CheckImports(t, ".")
}
