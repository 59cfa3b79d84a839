package server

import (
	"testing"

	"github.com/sheepfold/sheepfold/internal/identity"
	"github.com/sheepfold/sheepfold/internal/metering"
	"github.com/sheepfold/sheepfold/internal/metrics"
	"github.com/sheepfold/sheepfold/internal/testutil/apispec"
)

// wireTypes is every type the server reads from or writes to the wire,
// and how it reads its schema of the OpenAPI document.
var wireTypes = []apispec.Entry{
	{V: createAccountRequest{}, Schema: "CreateAccount"},
	{V: eventListJSON{}, Schema: "EventList"},
	{V: textJSON{}, Schema: "Text"},
	{V: recordedOutput{}, Schema: "RecordedExecution.output"},
	{V: executionHistoryJSON{}, Schema: "RecordedExecution"},
	{V: metering.Prices{}, Schema: "Prices"},
	// What the server's own packages put on the wire.
	{V: identity.JWK{}, Schema: "JWKS.keys[]"},
	{V: metrics.Summary{}, Schema: "MetricsSummary"},
	{V: metrics.AccountFigures{}, Schema: "MetricsSummary.account"},
	{V: metrics.ServerFigures{}, Schema: "MetricsSummary.server"},
	{V: metrics.AdminFigures{}, Schema: "MetricsSummary.admin"},
	{V: metrics.Latency{}, Schema: "MetricsSummary.server.preview_connect_seconds"},
}

// TestWireTypesMatchSpec checks the server's wire types against the
// API's OpenAPI document field for field (as client's
// TestTypesMatchSpec does the Go SDK's).
func TestWireTypesMatchSpec(t *testing.T) {
	apispec.Check(t, wireTypes)
}

// TestWireTypesNotShared: the server declares no wire type that api
// holds, but for those that carry more than the wire.
func TestWireTypesNotShared(t *testing.T) {
	apispec.CheckNotShared(t, wireTypes, map[string]string{
		"Prices": "metering's price table, read from the operator's TOML; reports show api.Prices",
	})
}

// TestEveryWireTypeChecked: every struct with a JSON tag of the server
// and of the packages whose types it sends is in wireTypes, or exempt
// with why.
func TestEveryWireTypeChecked(t *testing.T) {
	exempt := map[string]string{
		"listCursor":      "the inside of an opaque cursor, not a wire object",
		"recordResources": "a column of the store, not the wire",
		"snapshotRecord":  "a snapshot's record on disk (snapshot.json), not the wire",
		"snapshotPool":    "a snapshot pool's size on disk (pool.json), not the wire",
		"Claims":          "a token's signed payload (internal/identity), not an API object",
	}
	for _, dir := range []string{".", "../metrics", "../metering", "../identity"} {
		apispec.CheckAllListed(t, dir, wireTypes, exempt)
	}
}
