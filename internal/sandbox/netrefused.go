package sandbox

import (
	"regexp"
	"strings"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
)

// stderrTailSize is how much of the end of stderr networkRefused reads.
const stderrTailSize = 4096

// netRefusal matches the errors of a program that tried to reach the
// network from a sandbox that has none (network.mode none: only lo, no
// resolver): Node's getaddrinfo and connect errors, curl's, wget's and
// the C library's. Group 1 or 2, when matched, is the host it tried.
var netRefusal = regexp.MustCompile(`(?:getaddrinfo (?:EAI_AGAIN|EAI_NONAME|ENOTFOUND|EAI_FAIL) ([^\s'"]+)|Could not resolve host: ([^\s'"]+)|connect ENETUNREACH ([^\s'"]+)|Temporary failure in name resolution|Network is unreachable|unable to resolve host address)`)

// networkRefused reports whether a failed execution failed because its
// sandbox has no network, for the languages whose drivers have no hook
// of their own (Python's reports a network_denied violation itself): the
// sandbox's network mode is none and the error, its traceback or the end
// of stderr (kept, or streamedStderr) is such a failure. It reports the attempt as a
// security_violation (network_denied) naming the host when the error
// does. The text is the code's: code can print it to label its own
// execution, which gives it nothing.
func (s *Sandbox) networkRefused(execID string, ex *Execution, streamedStderr string) bool {
	if ex.Error == nil || s.Policy().NetworkMode() != policy.NetworkNone {
		return false
	}
	text := ex.Error.Value + "\n" + ex.Error.Traceback + "\n" + ex.Stderr[max(0, len(ex.Stderr)-stderrTailSize):] + streamedStderr
	m := netRefusal.FindStringSubmatch(text)
	if m == nil {
		return false
	}
	target := strings.Join(m[1:], "")
	if target == "" {
		target = "unknown"
	}
	s.emit(events.SecurityViolation, execID, map[string]any{"kind": events.KindNetworkDenied, "target": target})
	return true
}
