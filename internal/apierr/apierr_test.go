package apierr

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
)

func TestEveryCodeHasAStatus(t *testing.T) {
	codes := []Code{BadRequest, AuthenticationFailed, SandboxNotFound, NotFound, SandboxState,
		SandboxTimeout, OutOfMemory, OutputLimit, FileTooLarge, DiskFull, PathNotAllowed, Conflict,
		UnsupportedLanguage, TemplateNotFound, ModuleBlocked, NetworkRestricted,
		SessionQuotaExceeded, RateLimited, Capacity, Internal, MethodNotAllowed, StorageUnavailable, ShuttingDown, Forbidden,
		InvalidPolicy, SubprocessDenied, CPUTimeExceeded, ModelNotFound, Provider, ProviderTimeout, SessionNotFound,
		TooManyConnections, StorageQuotaExceeded, ProcessLimit, NotSupported, VolumeNotFound, VolumeInUse, InvalidHandler, RegistryNotAllowed,
		DeviceNotFound, DeviceInUse, TemplateNotReady}
	if len(codes) != len(Status) {
		t.Fatalf("Status has %d codes, the list %d", len(Status), len(codes))
	}
	for _, c := range codes {
		if Status[c] == 0 {
			t.Errorf("%s has no HTTP status", c)
		}
	}
}

func TestFrom(t *testing.T) {
	cause := errors.New("disk on fire")
	coded := Wrap(cause, DiskFull, "the sandbox disk is full")
	tests := []struct {
		name   string
		err    error
		code   Code
		status int
		msg    string
	}{
		{"coded", coded, DiskFull, http.StatusInsufficientStorage, "the sandbox disk is full"},
		{"wrapped coded", fmt.Errorf("write: %w", coded), DiskFull, http.StatusInsufficientStorage, "the sandbox disk is full"},
		{"uncoded", cause, Internal, http.StatusInternalServerError, "internal error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := From(tt.err)
			if e.Code != tt.code || e.HTTPStatus() != tt.status || e.Message != tt.msg {
				t.Fatalf("From = %q %d %q, want %q %d %q", e.Code, e.HTTPStatus(), e.Message, tt.code, tt.status, tt.msg)
			}
			if !errors.Is(e, cause) {
				t.Fatal("the cause is lost")
			}
		})
	}
	if From(nil) != nil || CodeOf(nil) != "" {
		t.Fatal("nil must stay nil")
	}
}
