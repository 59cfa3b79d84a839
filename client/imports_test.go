package client

import (
	"testing"

	"github.com/sheepfold/sheepfold/internal/testutil/apispec"
)

// TestImportsStdlibOnly keeps the SDK free of Sheepfold internals and of
// third-party modules: it imports the standard library and the API's
// types (api, itself of the standard library only: its own test).
func TestImportsStdlibOnly(t *testing.T) {
	apispec.CheckImports(t, ".", "github.com/sheepfold/sheepfold/api")
}
