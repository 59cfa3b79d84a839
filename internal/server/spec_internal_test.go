package server

import (
	"testing"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/identity"
	"github.com/sheepfold/sheepfold/internal/metering"
	"github.com/sheepfold/sheepfold/internal/metrics"
	"github.com/sheepfold/sheepfold/internal/secrets"
	"github.com/sheepfold/sheepfold/internal/session"
	"github.com/sheepfold/sheepfold/internal/testutil/apispec"
	"github.com/sheepfold/sheepfold/internal/webhooks"
)

// wireTypes is every type the server reads from or writes to the wire,
// and how it reads its schema of the OpenAPI document.
var wireTypes = []apispec.Entry{
	{V: accountJSON{}, Schema: "Account"},
	{V: monthJSON{}, Schema: "MonthUsage"},
	{V: accountKeyJSON{}, Schema: "AccountKey"},
	{V: createAccountRequest{}, Schema: "CreateAccount"},
	{V: creditRequest{}, Schema: "CreditGrant"},
	{V: createKeyRequest{}, Schema: "CreateKey"},
	{V: alertJSON{}, Schema: "Alert"},
	{V: createAlertRequest{}, Schema: "CreateAlert"},
	{V: commandRequest{}, Schema: "CommandRequest"},
	{V: commandJSON{}, Schema: "Command"},
	{V: processJSON{}, Schema: "Process"},
	{V: inputRequest{}, Schema: "Input"},
	{V: signalRequest{}, Schema: "Signal"},
	{V: contextRequest{}, Schema: "ContextRequest"},
	{V: eventListJSON{}, Schema: "EventList"},
	{V: executeRequest{}, Schema: "ExecuteRequest"},
	{V: executionJSON{}, Schema: "Execution"},
	{V: textJSON{}, Schema: "Text"},
	{V: recordedOutput{}, Schema: "RecordedExecution.output"},
	{V: executionHistoryJSON{}, Schema: "RecordedExecution"},
	{V: pathRequest{}, Schema: "PathRequest"},
	{V: moveRequest{}, Schema: "MoveRequest"},
	{V: errorBody{}, Schema: "Error"},
	{V: errorJSON{}, Schema: "Error.error"},
	{V: policyAnswer{}, Schema: "PolicyAnswer"},
	{V: portJSON{}, Schema: "Port"},
	{V: portsJSON{}, Schema: "PortList"},
	{V: creditsJSON{}, Schema: "Credits"},
	{V: resourcesJSON{}, Schema: "Resources"},
	{V: sandboxJSON{}, Schema: "Sandbox"},
	{V: pauseRequest{}, Schema: "PauseRequest"},
	{V: liveUsageJSON{}, Schema: "Sandbox.usage"},
	{V: pressureJSON{}, Schema: "Sandbox.usage.pressure"},
	{V: createRequest{}, Schema: "CreateSandbox"},
	{V: snapshotJSON{}, Schema: "Snapshot"},
	{V: snapshotListJSON{}, Schema: "SnapshotList"},
	{V: snapshotRequest{}, Schema: "SnapshotRequest"},
	{V: forkRequest{}, Schema: "ForkRequest"},
	{V: forkJSON{}, Schema: "ForkResult"},
	{V: diffJSON{}, Schema: "Diff"},
	{V: adoptJSON{}, Schema: "AdoptResult"},
	{V: adoptSkipped{}, Schema: "AdoptSkipped"},
	{V: timeoutRequest{}, Schema: "SetTimeout"},
	{V: secretRequest{}, Schema: "SecretRequest"},
	{V: secretVersionRequest{}, Schema: "SecretVersionRequest"},
	{V: sessionRequest{}, Schema: "CreateSession"},
	{V: sessionJSON{}, Schema: "Session"},
	{V: sessionExecRequest{}, Schema: "SessionExecuteRequest"},
	{V: storedJSON{}, Schema: "StoredAmount"},
	{V: storageJSON{}, Schema: "AccountStorage"},
	{V: metering.Figures{}, Schema: "UsageFigures"},
	{V: metering.StorageFigures{}, Schema: "UsageReport.storage"},
	{V: metering.Group{}, Schema: "UsageGroup"},
	{V: metering.Prices{}, Schema: "Prices"},
	{V: usageReport{}, Schema: "UsageReport"},
	{V: modelUsage{}, Schema: "ModelUsage"},
	{V: sandboxUsageJSON{}, Schema: "SandboxUsage"},
	{V: webhookRequest{}, Schema: "WebhookRequest"},
	// What the server's own packages put on the wire.
	{V: session.File{}, Schema: "AskFile"},
	{V: session.Request{}, Schema: "AskRequest"},
	{V: session.Tokens{}, Schema: "Answer.tokens"},
	{V: session.Answer{}, Schema: "Answer"},
	{V: session.Step{}, Schema: "AskStep"},
	{V: session.ExecError{}, Schema: "SessionExecError"},
	{V: session.Chart{}, Schema: "Chart"},
	{V: session.Execution{}, Schema: "SessionExecution"},
	{V: webhooks.Hook{}, Schema: "Webhook"},
	{V: webhooks.Delivery{}, Schema: "WebhookDelivery"},
	{V: secrets.Info{}, Schema: "Secret"},
	{V: secrets.Use{}, Schema: "SecretUse"},
	{V: identity.JWK{}, Schema: "JWKS.keys[]"},
	{V: events.Event{}, Schema: "Event", Own: map[string]string{"Owner": "for fan-out to the owner's streams; never sent"}},
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

// TestEveryWireTypeChecked: every struct with a JSON tag of the server
// and of the packages whose types it sends is in wireTypes, or exempt
// with why.
func TestEveryWireTypeChecked(t *testing.T) {
	exempt := map[string]string{
		"listCursor":      "the inside of an opaque cursor, not a wire object",
		"recordResources": "a column of the store, not the wire",
		"snapshotRecord":  "a snapshot's record on disk (snapshot.json), not the wire",
		"Report":          "checked inside usageReport, which embeds it with the model tokens",
		"Claims":          "a token's signed payload (internal/identity), not an API object",
	}
	for _, dir := range []string{".", "../session", "../webhooks", "../secrets", "../metrics", "../events", "../metering", "../identity"} {
		apispec.CheckAllListed(t, dir, wireTypes, exempt)
	}
}
