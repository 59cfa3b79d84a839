package api

import (
	"encoding/json"
	"time"
)

// BatchRequest is the body of POST /v1/batches (schema BatchRequest):
// Code defines handler(item), which runs once per input, each in a fresh
// sandbox of Template (or, with Reuse "worker", in its worker's),
// Concurrency at a time. The inputs are Inputs or InputsFile, not both.
type BatchRequest struct {
	Template string            `json:"template,omitempty"` // "python" when empty
	Language string            `json:"language,omitempty"` // "python" (the only one now)
	Code     string            `json:"code"`
	Inputs   []json.RawMessage `json:"inputs,omitempty"`
	// InputsFile is a JSON Lines file (one input a line) in one of the
	// caller's volumes, read once when the batch is made.
	InputsFile *BatchInputsFile `json:"inputs_file,omitempty"`
	// Reuse is "" (each item in a fresh sandbox) or "worker": each of
	// the Concurrency workers keeps one sandbox, runs the code once in
	// it and then each of its items' handler(item) calls in the same
	// Python process (what the code and earlier items left carries
	// over; a run that fails other than by the handler's exception
	// gets the worker a fresh sandbox).
	Reuse       string `json:"reuse,omitempty"`
	Concurrency int    `json:"concurrency,omitempty"` // 1 when 0
	TimeoutMS   int64  `json:"timeout_ms,omitempty"`  // each run's execution timeout; the engine's when 0
	Retries     int    `json:"retries,omitempty"`     // more runs of an item that failed
	// Resources of every item's sandbox, within the account's ceiling
	// (the server's defaults when nil).
	Resources *Resources `json:"resources,omitempty"`
}

// BatchInputsFile names a batch's inputs file (schema BatchInputsFile):
// a path in a volume of the caller's, as the volume file API names it.
type BatchInputsFile struct {
	Volume string `json:"volume"`
	Path   string `json:"path"`
}

// BatchUsage is what a batch's sandboxes used, its handler check's (where it
// took one) included, summed as each ends, and its cost at the operator's prices
// (schema BatchUsage). The account is charged the same, through the
// sandboxes' own metering.
type BatchUsage struct {
	Sandboxes         int64   `json:"sandboxes"`
	SandboxSeconds    float64 `json:"sandbox_seconds"`
	CPUSeconds        float64 `json:"cpu_seconds"`
	GBSecondsReserved float64 `json:"gb_seconds_reserved"`
	GBSecondsUsed     float64 `json:"gb_seconds_used"`
	Executions        int64   `json:"executions"`
	CostMicros        int64   `json:"cost_micros"`
	Cost              string  `json:"cost"`
}

// Batch is a batch job as the API shows it (schema Batch). Status is
// running, done, canceled or failed (Error says why).
type Batch struct {
	ID          string      `json:"id"`
	Status      string      `json:"status"`
	Template    string      `json:"template"`
	Language    string      `json:"language"`
	Concurrency int         `json:"concurrency"`
	TimeoutMS   int64       `json:"timeout_ms"`
	Retries     int         `json:"retries"`
	Reuse       string      `json:"reuse"`
	Resources   *Resources  `json:"resources"`
	Total       int         `json:"total"`
	Done        int         `json:"done"`
	Failed      int         `json:"failed"`
	Pending     int         `json:"pending"`
	CreatedAt   time.Time   `json:"created_at"`
	EndedAt     *time.Time  `json:"ended_at"`
	Error       *BatchError `json:"error"`
	Usage       BatchUsage  `json:"usage"`
}

// BatchError is why a batch failed as a whole (schema BatchError): a
// stable ERR_* code and its message.
type BatchError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// BatchItemError is how an item failed (schema BatchItemError): the
// handler's exception (name, value, traceback), or the run's (code).
type BatchItemError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback,omitempty"`
	Code      string `json:"code,omitempty"`
}

// BatchResult is one line of GET /v1/batches/{id}/results (schema
// BatchResult): an ended item, by its index in the inputs, with its
// result (the handler's return value) or its error.
type BatchResult struct {
	Index    int             `json:"index"`
	Status   string          `json:"status"` // done or failed
	Attempts int             `json:"attempts"`
	Result   json.RawMessage `json:"result,omitempty"`
	Error    *BatchItemError `json:"error,omitempty"`
	EndedAt  *time.Time      `json:"ended_at"`
}
