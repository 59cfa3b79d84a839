package api

// Error is the one error body of the API (schema Error).
type Error struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is an error's code (a stable ERR_*), the message a user
// may see, and the request's ID for the server's log (schema
// Error.error).
type ErrorDetail struct {
	Code      string `json:"code"`
	Message   string `json:"message"`
	RequestID string `json:"request_id"`
}
