package client

import (
	"testing"

	"github.com/sheepfold/sheepfold/internal/testutil/apispec"
)

// specTable is every SDK type with a JSON shape on the wire, and how it
// reads its schema of the OpenAPI document.
var specTable = []apispec.Entry{
	{V: Resources{}, Schema: "Resources"},
	{V: sandboxConfigJSON{}, Schema: "SandboxConfig", Own: map[string]string{"MaxExecutionTime": "sent as max_execution_time in seconds by sandboxConfigJSON"}},
	{V: createJSON{}, Schema: "CreateSandbox"},
	{V: Sandbox{}, Schema: "Sandbox"},
	{V: Snapshot{}, Schema: "Snapshot"},
	{V: snapshotListJSON{}, Schema: "SnapshotList"},
	{V: snapshotRequestJSON{}, Schema: "SnapshotRequest"},
	{V: forkRequestJSON{}, Schema: "ForkRequest"},
	{V: forkResultJSON{}, Schema: "ForkResult"},
	{V: Diff{}, Schema: "Diff"},
	{V: Adopted{}, Schema: "AdoptResult"},
	{V: AdoptSkipped{}, Schema: "AdoptSkipped"},
	{V: LiveUsage{}, Schema: "Sandbox.usage"},
	{V: Pressure{}, Schema: "Sandbox.usage.pressure"},
	{V: errorBody{}, Schema: "Error"},
	{V: Port{}, Schema: "Port"},
	{V: Ports{}, Schema: "PortList"},
	{V: executeJSON{}, Schema: "ExecuteRequest"},
	{V: Result{}, Schema: "Result"},
	{V: ExecError{}, Schema: "ExecError"},
	{V: Execution{}, Schema: "Execution"},
	{V: Dropped{}, Schema: "Execution.dropped"},
	{V: Context{}, Schema: "Context"},
	{V: ContextRequest{}, Schema: "ContextRequest"},
	{V: commandJSON{}, Schema: "CommandRequest"},
	{V: CommandResult{}, Schema: "Command"},
	{V: Process{}, Schema: "Process"},
	{V: FileInfo{}, Schema: "FileInfo"},
	{V: FileListPage{}, Schema: "FileList", Renamed: map[string]string{"Entries": "entries", "NextCursor": "next_cursor"},
		Unmodelled: map[string]string{"truncated": "a listing past its bound pages on with next_cursor"}},
	{V: Version{}, Schema: "Version"},
	{V: PoolStats{}, Schema: "PoolStats"},
	{V: Event{}, Schema: "Event"},
	{V: EventPage{}, Schema: "EventList", Renamed: map[string]string{"Events": "events", "NextCursor": "next_cursor"}},
	{V: Webhook{}, Schema: "Webhook"},
	{V: WebhookDelivery{}, Schema: "WebhookDelivery"},
	{V: AccountLimits{}, Schema: "AccountLimits"},
	{V: MonthUsage{}, Schema: "MonthUsage"},
	{V: Credits{}, Schema: "Credits"},
	{V: AccountKey{}, Schema: "AccountKey"},
	{V: Account{}, Schema: "Account"},
	{V: Storage{}, Schema: "AccountStorage"},
	{V: StoredAmount{}, Schema: "StoredAmount"},
	{V: UsageFigures{}, Schema: "UsageFigures"},
	{V: StorageFigures{}, Schema: "UsageReport.storage"},
	{V: UsageGroup{}, Schema: "UsageGroup"},
	{V: Prices{}, Schema: "Prices"},
	{V: UsageReport{}, Schema: "UsageReport"},
	{V: ModelUsage{}, Schema: "ModelUsage"},
	{V: SandboxUsage{}, Schema: "SandboxUsage"},
	{V: Alert{}, Schema: "Alert"},
	{V: AlertRequest{}, Schema: "CreateAlert"},
	{V: KeyRequest{}, Schema: "CreateKey"},
	{V: NewKey{}, Schema: "NewKey"},
	{V: PolicyAnswer{}, Schema: "PolicyAnswer"},
	{V: Secret{}, Schema: "Secret"},
	{V: SecretUse{}, Schema: "SecretUse"},
	{V: SessionRequest{}, Schema: "CreateSession"},
	{V: Session{}, Schema: "Session"},
	{V: SessionExecuteRequest{}, Schema: "SessionExecuteRequest"},
	{V: ExecutionError{}, Schema: "SessionExecError"},
	{V: Chart{}, Schema: "Chart"},
	{V: SessionExecution{}, Schema: "SessionExecution"},
	{V: AskFile{}, Schema: "AskFile"},
	{V: AskRequest{}, Schema: "AskRequest"},
	{V: Tokens{}, Schema: "Answer.tokens"},
	{V: Answer{}, Schema: "Answer"},
	{V: AskStep{}, Schema: "AskStep"},
	{V: Model{}, Schema: "Model"},
}

// TestTypesMatchSpec checks the SDK's types against the API's OpenAPI
// document field for field: a field added on either side fails here
// until the other follows, or the table says why not.
func TestTypesMatchSpec(t *testing.T) {
	apispec.Check(t, specTable)
}

// TestEveryWireTypeChecked: every struct of the SDK with a JSON tag is
// in specTable, or exempt with why, so a new type cannot skip
// TestTypesMatchSpec.
func TestEveryWireTypeChecked(t *testing.T) {
	apispec.CheckAllListed(t, ".", specTable, map[string]string{
		"SandboxConfig": "checked inside sandboxConfigJSON, which embeds it",
	})
}
