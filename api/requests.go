package api

import "encoding/json"

// Small request bodies the server reads and the Go SDK sends. Fields the
// server must tell absent from zero are pointers.

// PathRequest names a path (schema PathRequest: POST .../files/mkdir).
type PathRequest struct {
	Path string `json:"path"`
}

// MoveRequest renames a path (schema MoveRequest: POST .../files/move).
type MoveRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// PauseRequest is the optional body of POST .../pause (schema
// PauseRequest): Memory "disk" (the default: a checkpoint, memory freed)
// or "keep" (the freezer).
type PauseRequest struct {
	Memory string `json:"memory,omitempty"`
}

// SetTimeout is the body of POST .../timeout (schema SetTimeout): the
// sandbox's lifetime from now, in seconds.
type SetTimeout struct {
	Timeout *float64 `json:"timeout"`
}

// CreditGrant is the body of POST /v1/admin/accounts/{account}/credits
// (schema CreditGrant): a decimal amount ("25.00"; negative takes credits
// back) and why.
type CreditGrant struct {
	Amount *string `json:"amount"`
	Reason string  `json:"reason"`
}

// AccountRuntime is the body of POST /v1/admin/accounts/{account}/runtime
// (schema AccountRuntime): the default runtime of the account's
// sandboxes whose request and template name none ("" the server's), and
// whether it is the only one they may run under.
type AccountRuntime struct {
	Runtime *string `json:"runtime"`
	Locked  bool    `json:"locked,omitempty"`
}

// Input is the body of POST .../commands/{pid}/input (schema Input): one
// of Data and DataBase64, and EOF to close stdin after it.
type Input struct {
	Data       *string `json:"data,omitempty"`
	DataBase64 *string `json:"data_base64,omitempty"`
	EOF        bool    `json:"eof,omitempty"`
}

// Signal is the body of POST .../commands/{pid}/signal (schema Signal): a
// signal's name ("SIGTERM", "term") or number, as a string or a number.
type Signal struct {
	Signal json.RawMessage `json:"signal"`
}
