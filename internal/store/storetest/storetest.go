// Package storetest is the conformance suite of store.Store: the
// behaviour every implementation (sqlite/, postgres/) must show, run by
// each implementation's tests against a real database:
//
//	func TestStore(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store { return open(t) })
//	}
//
// What only one implementation has (SQLite's file modes and busy
// handling, PostgreSQL's migration lock) stays in its own package.
//
// Times: the suite writes times truncated to the microsecond where it
// compares them, the precision the store contract promises (PostgreSQL's
// timestamptz keeps no more), and expects them back in UTC.
//
// Imports: internal/store and the standard library.
package storetest

import (
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
)

// Open returns a new, empty store for one test. Run closes it when the
// test ends.
type Open func(t *testing.T) store.Store

// Run runs every conformance test in parallel, each against a store of
// its own.
func Run(t *testing.T, open Open) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"Keys", testKeys},
		{"Times", testTimes},
		{"SandboxesAndRestartMarking", testSandboxesAndRestartMarking},
		{"SandboxPolicy", testSandboxPolicy},
		{"SandboxPaused", testSandboxPaused},
		{"PagesAndRetention", testPagesAndRetention},
		{"Executions", testExecutions},
		{"ExecutionsCutByRestart", testExecutionsCutByRestart},
		{"PageExecutions", testPageExecutions},
		{"Events", testEvents},
		{"EventsVisibleInIDOrder", testEventsVisibleInIDOrder},
		{"Webhooks", testWebhooks},
		{"Accounts", testAccounts},
		{"UsageLedgerAlerts", testUsageLedgerAlerts},
		{"LedgerSumsSaturate", testLedgerSumsSaturate},
		{"UsageGroups", testUsageGroups},
		{"TokensAndSessions", testTokensAndSessions},
		{"ReplicaHeartbeats", testReplicaHeartbeats},
		{"MeterLeases", testMeterLeases},
		{"MeterPoints", testMeterPoints},
		{"StoredCounts", testStoredCounts},
		{"StorageBounds", testStorageBounds},
		{"ClearStopped", testClearStopped},
		{"StorageMeter", testStorageMeter},
		{"Secrets", testSecrets},
		{"Volumes", testVolumes},
		{"VolumeMeter", testVolumeMeter},
		{"Batches", testBatches},
		{"SnapshotMeter", testSnapshotMeter},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := open(t)
			t.Cleanup(func() {
				if err := s.Close(); err != nil {
					t.Errorf("close: %v", err)
				}
			})
			tc.fn(t, s)
		})
	}
}

// now is the present to the microsecond, in the local zone (stores give
// UTC back; Equal compares instants).
func now() time.Time { return time.Now().Truncate(time.Microsecond) }
