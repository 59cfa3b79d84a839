package api_test

import (
	"testing"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/testutil/apispec"
)

// wireTypes is every type of the package, and how it reads its schema
// of the OpenAPI document.
var wireTypes = []apispec.Entry{
	{V: api.Resources{}, Schema: "Resources"},
	{V: api.Sandbox{}, Schema: "Sandbox"},
	{V: api.LiveUsage{}, Schema: "Sandbox.usage"},
	{V: api.Pressure{}, Schema: "Sandbox.usage.pressure"},
	{V: api.CreateSandbox{}, Schema: "CreateSandbox"},
	{V: api.PolicyAnswer{}, Schema: "PolicyAnswer"},
	{V: api.Port{}, Schema: "Port"},
	{V: api.PortList{}, Schema: "PortList"},
	{V: api.ExecuteRequest{}, Schema: "ExecuteRequest"},
	{V: api.Result{}, Schema: "Result"},
	{V: api.ExecError{}, Schema: "ExecError"},
	{V: api.Execution{}, Schema: "Execution"},
	{V: api.Dropped{}, Schema: "Execution.dropped"},
	{V: api.Context{}, Schema: "Context"},
	{V: api.ContextRequest{}, Schema: "ContextRequest"},
	{V: api.CommandRequest{}, Schema: "CommandRequest"},
	{V: api.Command{}, Schema: "Command"},
	{V: api.Process{}, Schema: "Process"},
	{V: api.Error{}, Schema: "Error"},
	{V: api.ErrorDetail{}, Schema: "Error.error"},
	{V: api.UsageFigures{}, Schema: "UsageFigures"},
	{V: api.StorageFigures{}, Schema: "UsageReport.storage"},
	{V: api.UsageGroup{}, Schema: "UsageGroup"},
	{V: api.Prices{}, Schema: "Prices"},
	{V: api.UsageReport{}, Schema: "UsageReport"},
	{V: api.ModelUsage{}, Schema: "ModelUsage"},
	{V: api.SandboxUsage{}, Schema: "SandboxUsage"},
	{V: api.Credits{}, Schema: "Credits"},
	{V: api.AccountStorage{}, Schema: "AccountStorage"},
	{V: api.StoredAmount{}, Schema: "StoredAmount"},
	{V: api.AccountKey{}, Schema: "AccountKey"},
	{V: api.Alert{}, Schema: "Alert"},
	{V: api.MonthUsage{}, Schema: "MonthUsage"},
	{V: api.AccountLimits{}, Schema: "AccountLimits"},
	{V: api.Account{}, Schema: "Account"},
	{V: api.CreateAlert{}, Schema: "CreateAlert"},
	{V: api.CreateKey{}, Schema: "CreateKey"},
	{V: api.NewKey{}, Schema: "NewKey"},
	{V: api.MonthFigures{}, Schema: "MonthUsage.usage"},
	{V: api.Version{}, Schema: "Version"},
	{V: api.PoolStats{}, Schema: "PoolStats"},
	{V: api.Webhook{}, Schema: "Webhook"},
	{V: api.WebhookRequest{}, Schema: "WebhookRequest"},
	{V: api.WebhookDelivery{}, Schema: "WebhookDelivery"},
	{V: api.Secret{}, Schema: "Secret"},
	{V: api.SecretUse{}, Schema: "SecretUse"},
	{V: api.SecretRequest{}, Schema: "SecretRequest"},
	{V: api.SecretVersionRequest{}, Schema: "SecretVersionRequest"},
	{V: api.CreateSession{}, Schema: "CreateSession"},
	{V: api.Session{}, Schema: "Session"},
	{V: api.SessionExecuteRequest{}, Schema: "SessionExecuteRequest"},
	{V: api.SessionExecError{}, Schema: "SessionExecError"},
	{V: api.Chart{}, Schema: "Chart"},
	{V: api.SessionExecution{}, Schema: "SessionExecution"},
	{V: api.AskFile{}, Schema: "AskFile"},
	{V: api.AskRequest{}, Schema: "AskRequest"},
	{V: api.Tokens{}, Schema: "Answer.tokens"},
	{V: api.Answer{}, Schema: "Answer"},
	{V: api.AskStep{}, Schema: "AskStep"},
	{V: api.Model{}, Schema: "Model"},
}

// TestTypesMatchSpec checks the package's types against the OpenAPI
// document field for field: a field added on either side fails here
// until the other follows, or the table says why not. The server and
// the Go SDK use these types, so this one check holds both.
func TestTypesMatchSpec(t *testing.T) {
	apispec.Check(t, wireTypes)
}

// TestEveryWireTypeChecked: every struct of the package with a JSON tag
// is in wireTypes, so a new type cannot skip TestTypesMatchSpec.
func TestEveryWireTypeChecked(t *testing.T) {
	apispec.CheckAllListed(t, ".", wireTypes, nil)
}
