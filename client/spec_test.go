package client

import (
	"testing"

	"github.com/sheepfold/sheepfold/internal/testutil/apispec"
)

// specTable is every SDK type with a JSON shape on the wire declared
// here, and how it reads its schema of the OpenAPI document; the types
// the SDK takes from api (aliases) are checked there.
var specTable = []apispec.Entry{
	{V: sandboxConfigJSON{}, Schema: "SandboxConfig", Own: map[string]string{"MaxExecutionTime": "sent as max_execution_time in seconds by sandboxConfigJSON"}},
	{V: FileListPage{}, Schema: "FileList", Renamed: map[string]string{"Entries": "entries", "NextCursor": "next_cursor"},
		Unmodelled: map[string]string{"truncated": "a listing past its bound pages on with next_cursor"}},
	{V: EventPage{}, Schema: "EventList", Renamed: map[string]string{"Events": "events", "NextCursor": "next_cursor"}},
	{V: SessionRequest{}, Schema: "CreateSession"},
	{V: SessionExecuteRequest{}, Schema: "SessionExecuteRequest"},
}

// TestTypesMatchSpec checks the SDK's types against the API's OpenAPI
// document field for field: a field added on either side fails here
// until the other follows, or the table says why not.
func TestTypesMatchSpec(t *testing.T) {
	apispec.Check(t, specTable)
}

// TestTypesNotShared: the SDK declares no wire type that api holds, but
// for the requests it encodes from Go values.
func TestTypesNotShared(t *testing.T) {
	apispec.CheckNotShared(t, specTable, map[string]string{
		"CreateSession":         "its policy and shorthand any Go value (the server reads them raw)",
		"SessionExecuteRequest": "its timeout an int64, 0 for the default (the server reads a pointer: 0 is refused)",
	})
}

// TestEveryWireTypeChecked: every struct of the SDK with a JSON tag is
// in specTable, or exempt with why, so a new type cannot skip
// TestTypesMatchSpec.
func TestEveryWireTypeChecked(t *testing.T) {
	apispec.CheckAllListed(t, ".", specTable, map[string]string{
		"SandboxConfig": "checked inside sandboxConfigJSON, which embeds it",
	})
}
