package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sheepfold/sheepfold/internal/apierr"
)

// TestErrorTables: every apierr code has its Connect code (a new code
// must be given one), and each E2B HTTP renderer answers with the one
// table's status and the error's public message, never its cause.
func TestErrorTables(t *testing.T) {
	t.Parallel()
	for code := range apierr.Status {
		if _, ok := connectCodes[code]; !ok {
			t.Errorf("%s has no Connect code in connectCodes", code)
		}
	}
	for _, tc := range []struct {
		err     error
		connect connect.Code
		status  int
		retry   string
	}{
		{apierr.New(apierr.BadRequest, "bad"), connect.CodeInvalidArgument, http.StatusBadRequest, ""},
		{apierr.New(apierr.UnsupportedLanguage, "cobol"), connect.CodeInvalidArgument, http.StatusBadRequest, ""},
		{apierr.New(apierr.NotFound, "no such file"), connect.CodeNotFound, http.StatusNotFound, ""},
		{apierr.New(apierr.PathNotAllowed, "denied"), connect.CodePermissionDenied, http.StatusForbidden, ""},
		{apierr.New(apierr.FileTooLarge, "big"), connect.CodeResourceExhausted, http.StatusRequestEntityTooLarge, ""},
		{apierr.New(apierr.SandboxState, "stopped"), connect.CodeUnavailable, http.StatusNotFound, ""},
		{apierr.New(apierr.SandboxTimeout, "slow"), connect.CodeDeadlineExceeded, http.StatusRequestTimeout, ""},
		{&apierr.Error{Code: apierr.RateLimited, Message: "later", RetryAfter: 1500 * time.Millisecond},
			connect.CodeResourceExhausted, http.StatusTooManyRequests, "2"},
		{fmt.Errorf("wrapped: %w", apierr.New(apierr.Conflict, "exists")), connect.CodeAlreadyExists, http.StatusConflict, ""},
		{errors.New("secret cause"), connect.CodeInternal, http.StatusInternalServerError, ""},
	} {
		want := apierr.From(tc.err).Message
		t.Run(string(apierr.CodeOf(tc.err)), func(t *testing.T) {
			var ce *connect.Error
			if err := connectError(context.Background(), tc.err); !errors.As(err, &ce) || ce.Code() != tc.connect || ce.Message() != want {
				t.Errorf("connectError = %v, want %v %q", err, tc.connect, want)
			}
			for name, render := range map[string]func(http.ResponseWriter){
				"control":     func(w http.ResponseWriter) { writeControlError(w, tc.err) },
				"files":       func(w http.ResponseWriter) { filesError(w, tc.err) },
				"interpreter": func(w http.ResponseWriter) { interpError(w, httptest.NewRequest("GET", "/", nil), tc.err) },
			} {
				rec := httptest.NewRecorder()
				render(rec)
				if rec.Code != tc.status || rec.Header().Get("Retry-After") != tc.retry {
					t.Errorf("%s: status %d Retry-After %q, want %d %q", name, rec.Code, rec.Header().Get("Retry-After"), tc.status, tc.retry)
				}
				if body := rec.Body.String(); !strings.Contains(body, want) || strings.Contains(body, "secret cause") {
					t.Errorf("%s: body %q, want the message %q and no cause", name, body, want)
				}
			}
		})
	}
	// Explicit statuses pass as they are.
	rec := httptest.NewRecorder()
	writeControlError(rec, &statusError{http.StatusNotImplemented, "no pausing"})
	if rec.Code != http.StatusNotImplemented {
		t.Errorf("statusError: %d", rec.Code)
	}
}
