package server

import (
	"context"
	"time"
)

// SetStreamWriteTimeout shortens the write deadline of streams for one
// test (not a parallel one) and returns what restores it.
func SetStreamWriteTimeout(d time.Duration) (restore func()) {
	old := streamWriteTimeout
	streamWriteTimeout = d
	return func() { streamWriteTimeout = old }
}

// SetCollectGrace shortens the collector's grace for one test (not a
// parallel one) and returns what restores it.
func SetCollectGrace(d time.Duration) (restore func()) {
	old := collectGrace
	collectGrace = d
	return func() { collectGrace = old }
}

// MeterFlushes counts the metering flushes the server finished, the
// alert rules and the credits' checks that follow each included.
func (s *Server) MeterFlushes() int64 { return s.flushes.Load() }

// Collect runs the replicas' collector once.
func (s *Server) Collect() { s.collect(context.Background()) }

// Replica is the server's name among replicas ("" when not shared).
func (s *Server) Replica() string { return s.replica }

// E2BRoutes lists the endpoints of the E2B surface (e2b.Handler.Routes).
func (s *Server) E2BRoutes() []string { return s.e2b.Routes() }

// SetE2BLearnInterval sets how often at most the E2B surface learns the
// tokens other replicas issued, for one test (not a parallel one), and
// returns what restores it.
func SetE2BLearnInterval(d time.Duration) (restore func()) {
	old := e2bLearnInterval
	e2bLearnInterval = d
	return func() { e2bLearnInterval = old }
}

// SetMaxUISessions sets the bound of all dashboard sessions together for
// one test (not a parallel one) and returns what restores it.
func SetMaxUISessions(n int) (restore func()) {
	old := maxUISessions
	maxUISessions = n
	return func() { maxUISessions = old }
}

// SetCommitDelay sets how long streams wait for their first event
// before they send their headers, for one test (not a parallel one), and
// returns what restores it.
func SetCommitDelay(d time.Duration) (restore func()) {
	old := commitDelay
	commitDelay = d
	return func() { commitDelay = old }
}

// SetMaxPaceWait sets the longest a request waits for its place in its
// account's pace, for one test (not a parallel one), and returns what
// restores it.
func SetMaxPaceWait(d time.Duration) (restore func()) {
	old := maxPaceWait
	maxPaceWait = d
	return func() { maxPaceWait = old }
}

// HoldSnapshotFor marks the snapshot name of the account owning sandbox
// id in use, as a create from it does while it starts, until the
// returned func is called.
func (s *Server) HoldSnapshotFor(id, name string) func() {
	s.mu.Lock()
	own := s.boxes[id].owner
	s.mu.Unlock()
	return s.useSnapshot(own, name)
}

// SetRunningRecordAfter sets how long an execution runs before its
// record is written with status running, for one test (not a parallel
// one), and returns what restores it.
func SetRunningRecordAfter(d time.Duration) (restore func()) {
	old := runningRecordAfter
	runningRecordAfter = d
	return func() { runningRecordAfter = old }
}

// SyncRecords waits until the execution records being written after
// their replies are in the store.
func (s *Server) SyncRecords(ctx context.Context) error { return s.records.wait(ctx, "") }
