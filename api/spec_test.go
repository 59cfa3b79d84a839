package api_test

import (
	"testing"

	"github.com/sheepfold/sheepfold/internal/testutil/apispec"
)

// TestTypesMatchSpec checks the package's types against the OpenAPI
// document field for field: a field added on either side fails here
// until the other follows, or the table says why not. The server and
// the Go SDK use these types, so this one check holds both.
func TestTypesMatchSpec(t *testing.T) {
	apispec.Check(t, apispec.Shared)
}

// TestEveryWireTypeChecked: every struct of the package with a JSON tag
// is in apispec.Shared, so a new type cannot skip TestTypesMatchSpec.
func TestEveryWireTypeChecked(t *testing.T) {
	apispec.CheckAllListed(t, ".", apispec.Shared, nil)
}
