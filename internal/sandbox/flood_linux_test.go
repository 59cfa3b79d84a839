package sandbox_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/testutil"
)

// floodSeconds is how long each flood runs.
const floodSeconds = 4

// floods are the loops of TestEventFloods: each runs floodSeconds and
// prints how many times it tried.
var floods = []struct {
	name   string
	policy *policy.Policy
	kind   string // the security_violation kind it makes
	code   string
}{
	{"refused connect, no network", &policy.Policy{Network: &policy.Network{Mode: policy.NetworkNone}}, events.KindNetworkDenied, `
import random, socket, time
n, end = 0, time.time() + %d
while time.time() < end:
    s = socket.socket()
    s.settimeout(0.2)
    try: s.connect(("10.%%d.%%d.%%d" %% (random.randrange(256), random.randrange(256), random.randrange(1, 255)), random.randrange(1, 65536)))
    except Exception: pass
    s.close(); n += 1
print(n)
`},
	{"random names through the gateway", allowlist("api.test"), events.KindDNSDenied, `
import random, socket, time
n, end = 0, time.time() + %d
while time.time() < end:
    try: socket.getaddrinfo("x%%d.example.org" %% random.getrandbits(48), 80)
    except Exception: pass
    n += 1
print(n)
`},
	{"random addresses through the gateway", allowlist("api.test"), events.KindNetworkDenied, `
import random, socket, time
n, end = 0, time.time() + %d
while time.time() < end:
    s = socket.socket()
    s.settimeout(0.05)
    try: s.connect(("203.0.%%d.%%d" %% (random.randrange(256), random.randrange(1, 255)), random.randrange(1, 65536)))
    except Exception: pass
    s.close(); n += 1
print(n)
`},
	{"fork under allow_subprocess false", &policy.Policy{AccessControl: &policy.AccessControl{AllowSubprocess: new(bool)}}, events.KindSubprocessDenied, `
import os, time
n, end = 0, time.time() + %d
while time.time() < end:
    try: os.fork()
    except Exception: pass
    n += 1
print(n)
`},
}

// TestEventFloods: code in a runc sandbox floods the events every tenant
// shares, as a tenant would: a refused-connect loop without a network
// (the driver's reports), loops over random host names and addresses
// through the egress gateway with an allowlist (the gateway's refusals),
// a fork loop under allow_subprocess false (the driver's and the agent's
// seccomp reports). Without the engine's bounds (the control: report
// limits and event rate far above the flood) each makes hundreds to
// thousands of events in a few seconds (at least three times the bound). With the defaults, each kind of
// each source makes at most its burst, then about one event a second,
// until the sandbox stops; and the events of the gateway, which sees
// every attempt, stand for all of them (their "count").
func TestEventFloods(t *testing.T) {
	t.Parallel()
	unbounded := func(c *sandbox.Config) {
		c.Reports = sandbox.ReportLimits{PerExecution: 1 << 30, PerMinute: 1 << 30}
		c.EventRate = sandbox.EventRate{Burst: 1 << 30, PerMinute: 1 << 30}
	}
	for _, f := range floods {
		t.Run(f.name, func(t *testing.T) {
			if f.policy.DenySubprocess() {
				testutil.SkipUnderGVisor(t, "allow_subprocess: false is refused under gVisor (TestGVisorSandbox)")
			}
			t.Parallel()
			for _, bounded := range []bool{false, true} {
				log := &eventLog{}
				m := runcEngine(t, func(c *sandbox.Config) {
					c.Events = log
					if !bounded {
						unbounded(c)
					}
				})
				s := newSandbox(t, m, sandbox.CreateOptions{Policy: f.policy})
				ex := runReq(t, s, sandbox.ExecuteRequest{Code: fmt.Sprintf(f.code, floodSeconds), Timeout: (floodSeconds + 30) * time.Second})
				attempts, err := strconv.Atoi(strings.TrimSpace(ex.Stdout))
				if err != nil || ex.Status != sandbox.ExecSuccess {
					t.Fatalf("the flood: %+v", ex)
				}
				if err := m.Kill(context.Background(), s.ID); err != nil { // what is held is sent
					t.Fatal(err)
				}
				bySource := map[string][]events.Event{}
				for _, e := range log.find(s.ID, events.SecurityViolation, "kind", f.kind) {
					bySource[e.Source] = append(bySource[e.Source], e)
				}
				total := 0
				for src, evs := range bySource {
					total += len(evs)
					t.Logf("bounded %v: %d attempts, %d events from %s standing for %d", bounded, attempts, len(evs), src, sumCounts(t, evs))
				}
				// The burst, then one a second (a token at 60 a minute)
				// while the flood lasts, and the last at the stop.
				most := sandbox.DefaultEventBurst + floodSeconds + 5
				if !bounded {
					// The control floods past the bound, by a margin,
					// however fast the host lets the loop go (under
					// -race on a loaded host, a few hundred attempts).
					if total < 3*most {
						t.Fatalf("unbounded, %d attempts made only %d events, not 3× the bound of %d: the flood does not flood", attempts, total, most)
					}
					continue
				}
				for src, evs := range bySource {
					if len(evs) > most {
						t.Errorf("%d events from %s of %d attempts, want at most %d", len(evs), src, attempts, most)
					}
				}
				if gw := bySource[events.SourceGateway]; len(gw) > 0 {
					if n := sumCounts(t, gw); n < int64(attempts) {
						t.Errorf("the gateway's events stand for %d refusals of %d attempts", n, attempts)
					}
				}
			}
		})
	}
}
