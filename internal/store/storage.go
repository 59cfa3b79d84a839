package store

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// Storage per account. Every account's records share one database (and
// one disk) with every other account's, so each account's records of
// each kind are bounded, by number and by bytes (Bounds), and counted as
// they are written: the stores keep a count of each account's records
// and their bytes, updated by the database itself (triggers) on every
// insert, update and delete, so that the count is exact whatever writes
// or deletes (retention, a webhook's deletion, a copy).
//
// An account at a bound loses only its own oldest records of that kind:
// the write that takes it past deletes them, in the same transaction.
// Records that are not the account's to lose are never deleted to make
// room: running sandboxes and executions still running stay (so those
// kinds may stay above their bound until they end), and alerts, which
// the account reads and acknowledges, make room by deleting its oldest
// acknowledged ones only; when every one is unacknowledged, a new one is
// refused (ErrStorageBound).

// Kinds of stored records (Bounds, Stored).
const (
	KindSandboxes  = "sandboxes"  // sandbox records; only stopped ones are deleted to make room
	KindExecutions = "executions" // execution records with their code and output
	KindEvents     = "events"
	KindAlerts     = "alerts"
	KindDeliveries = "deliveries" // webhook delivery attempts
)

// Kinds lists the kinds of stored records, in the order reports show them.
var Kinds = []string{KindSandboxes, KindExecutions, KindEvents, KindAlerts, KindDeliveries}

// RecordOverhead is what each record counts beyond the bytes of its text
// fields: its numbers, times and the entries of its indexes, roughly. An
// account's stored bytes are the sum, over its records, of their text
// fields' lengths in bytes plus RecordOverhead.
const RecordOverhead = 128

// The bytes of one record of each kind, as the stores count them (their
// triggers sum the same fields).

// SandboxSize is a sandbox record's stored bytes; its Metadata and
// Resources are stored as "{}" when empty, its Policy as "null".
func SandboxSize(s Sandbox) int64 {
	return int64(len(s.ID)+len(s.Owner)+len(s.Template)+len(s.State)+len(s.StopReason)+
		len(orText(s.Metadata, "{}"))+len(orText(s.Resources, "{}"))+len(orText(s.Policy, "null"))) + RecordOverhead
}

// ExecutionSize is an execution record's stored bytes.
func ExecutionSize(e Execution) int64 {
	return int64(len(e.ID)+len(e.SandboxID)+len(e.Owner)+len(e.Language)+len(e.Status)+len(e.ErrorCode)+
		len(e.Error)+len(e.Code)+len(e.Output)+len(e.Replica)) + RecordOverhead
}

// EventSize is an event's stored bytes; its Details are stored as "{}"
// when empty.
func EventSize(e Event) int64 {
	return int64(len(e.Type)+len(e.SandboxID)+len(e.Owner)+len(e.ExecutionID)+len(orText(e.Details, "{}"))+
		len(e.Source)) + RecordOverhead
}

// AlertSize is an alert's stored bytes.
func AlertSize(a Alert) int64 {
	return int64(len(a.ID)+len(a.Account)+len(a.Severity)+len(a.Kind)+len(a.Message)+len(a.SandboxID)+
		len(a.SessionID)+len(a.DedupeKey)) + RecordOverhead
}

// DeliverySize is the stored bytes of a delivery of a webhook of owner.
func DeliverySize(d WebhookDelivery, owner string) int64 {
	return int64(len(d.WebhookID)+len(d.EventType)+len(d.Error)+len(owner)) + RecordOverhead
}

func orText(b []byte, empty string) string {
	if len(b) == 0 {
		return empty
	}
	return string(b)
}

// ErrStorageBound reports a record refused because its account is at its
// bound of that kind and nothing of its own may go to make room.
var ErrStorageBound = errors.New("store: the account's storage bound is reached")

// Amount is a number of records and their bytes (RecordOverhead
// included).
type Amount struct {
	Records int64
	Bytes   int64
}

// Stored is what one account keeps, by kind.
type Stored struct {
	Sandboxes, Executions, Events, Alerts, Deliveries Amount
}

// Of returns the amount of a kind (Kind*); zero for an unknown kind.
func (s Stored) Of(kind string) Amount {
	switch kind {
	case KindSandboxes:
		return s.Sandboxes
	case KindExecutions:
		return s.Executions
	case KindEvents:
		return s.Events
	case KindAlerts:
		return s.Alerts
	case KindDeliveries:
		return s.Deliveries
	}
	return Amount{}
}

// Set sets the amount of a kind (Kind*); an unknown kind is ignored.
func (s *Stored) Set(kind string, a Amount) {
	switch kind {
	case KindSandboxes:
		s.Sandboxes = a
	case KindExecutions:
		s.Executions = a
	case KindEvents:
		s.Events = a
	case KindAlerts:
		s.Alerts = a
	case KindDeliveries:
		s.Deliveries = a
	}
}

// Total is the sum over every kind.
func (s Stored) Total() Amount {
	var t Amount
	for _, k := range Kinds {
		a := s.Of(k)
		t.Records += a.Records
		t.Bytes += a.Bytes
	}
	return t
}

// Bounds are the most each account may keep of each kind: Records and
// Bytes each bound when positive; zero leaves that measure unbounded.
type Bounds = Stored

// Excess returns how many of its oldest records an account that keeps
// have must lose to be within bound: past Records, the surplus; past
// Bytes, as many records of the average size as the surplus bytes make
// (at least one). 0 when within both. The caller deletes that many,
// reads the new amount and asks again until it is 0: records are not
// all of one size.
func Excess(have, bound Amount) int64 {
	var n int64
	if bound.Records > 0 && have.Records > bound.Records {
		n = have.Records - bound.Records
	}
	if bound.Bytes > 0 && have.Bytes > bound.Bytes && have.Records > 0 {
		avg := max(have.Bytes/have.Records, 1)
		n = max(n, (have.Bytes-bound.Bytes+avg-1)/avg)
	}
	return n
}

// Fits reports whether an account that keeps have stays within bound
// after adding one record of size bytes.
func Fits(have, bound Amount, size int64) bool {
	return (bound.Records <= 0 || have.Records+1 <= bound.Records) && (bound.Bytes <= 0 || have.Bytes+size <= bound.Bytes)
}

// MaxTrimRounds bounds the rounds of Excess and delete one write makes
// to bring an account within a bound.
const MaxTrimRounds = 8

// StorageStore counts and bounds what each account keeps.
type StorageStore interface {
	// SetBounds sets the bounds every later write keeps each account
	// within (the zero Bounds: none). AddEvents, AddExecution,
	// AddDelivery, PutSandbox and ConfirmSandbox delete the account's
	// oldest records of that kind past its bound, in their transaction;
	// CreateAlert refuses with ErrStorageBound (see the package's
	// "Storage per account").
	SetBounds(b Bounds)
	// Stored returns what an account keeps.
	Stored(ctx context.Context, account string) (Stored, error)
	// StoredAll returns what every account that keeps anything keeps, by
	// account id.
	StoredAll(ctx context.Context) (map[string]Stored, error)
	// ClearStoppedBefore clears the code and output of the executions of
	// sandboxes stopped before t (their records stay, at their small
	// size) and returns how many it cleared.
	ClearStoppedBefore(ctx context.Context, t time.Time) (int, error)
	// MeterStorage charges every account that keeps anything for the
	// time since it was last metered, at most MaxStorageSpan, at what it
	// keeps now (its records' bytes and its volumes' sizes): the GB-seconds go to the hour of now, and each
	// account's point moves to now, in one transaction. An account seen
	// for the first time is charged from now. Servers sharing the store
	// charge each second once: the first to move a point takes the span.
	MeterStorage(ctx context.Context, now time.Time) ([]StorageCharge, error)
	// SetSnapshotBytes records what an account's snapshots hold on disk
	// (a server's snapshot dir; 0 bytes: none), for MeterStorage;
	// ClearSnapshotBytes forgets every account's of disk.
	SetSnapshotBytes(ctx context.Context, disk, account string, bytes int64) error
	ClearSnapshotBytes(ctx context.Context, disk string) error
	// StorageUsage returns an account's storage GB-seconds per hour in
	// [from, to) (either zero: unbounded), in hour order.
	StorageUsage(ctx context.Context, account string, from, to time.Time) ([]StorageHour, error)
}

// MaxStorageSpan is the most one metering of storage charges: after a
// longer pause (every server down) the span before it is not charged.
const MaxStorageSpan = time.Hour

// StorageCharge is what one metering of storage charged an account.
type StorageCharge struct {
	Account   string
	Bytes     int64   // what the account keeps now, its volumes' sizes included
	Seconds   float64 // the span charged
	GBSeconds float64 // Bytes (in GB of 2^30 bytes) × Seconds
	// VolumeBytes are the sizes of the account's volumes (VolumeStore),
	// within Bytes, and VolumeGBSeconds their share of GBSeconds.
	VolumeBytes     int64
	VolumeGBSeconds float64
	// SnapshotBytes are what the account's snapshots hold on every
	// server's disk (SetSnapshotBytes), within Bytes, and
	// SnapshotGBSeconds their share of GBSeconds.
	SnapshotBytes     int64
	SnapshotGBSeconds float64
}

// Charge is what keeping bytes over span charges account.
func Charge(account string, bytes int64, span time.Duration) StorageCharge {
	return StorageCharge{Account: account, Bytes: bytes, Seconds: span.Seconds(), GBSeconds: float64(bytes) / (1 << 30) * span.Seconds()}
}

// ChargeWithVolumes is what keeping records of bytes, volumes of
// volumeBytes and snapshots of snapshotBytes over span charges account.
func ChargeWithVolumes(account string, bytes, volumeBytes, snapshotBytes int64, span time.Duration) StorageCharge {
	c := Charge(account, bytes+volumeBytes+snapshotBytes, span)
	c.VolumeBytes, c.VolumeGBSeconds = volumeBytes, float64(volumeBytes)/(1<<30)*span.Seconds()
	c.SnapshotBytes, c.SnapshotGBSeconds = snapshotBytes, float64(snapshotBytes)/(1<<30)*span.Seconds()
	return c
}

// StorageHour is an account's storage GB-seconds in one hour, and the
// shares of its volumes and its snapshots in them.
type StorageHour struct {
	Hour              time.Time
	GBSeconds         float64
	VolumeGBSeconds   float64
	SnapshotGBSeconds float64
}

// StorageSpan is the span a metering at now charges for an account last
// metered at last (the zero time: never): none the first time, at most
// MaxStorageSpan.
func StorageSpan(last, now time.Time) time.Duration {
	if last.IsZero() || !now.After(last) {
		return 0
	}
	return min(now.Sub(last), MaxStorageSpan)
}

// BoundsKeeper keeps the bounds a store's writes trim to; both stores
// embed it for StorageStore.SetBounds. The zero value has none.
type BoundsKeeper struct{ p atomic.Pointer[Bounds] }

// SetBounds implements StorageStore.
func (k *BoundsKeeper) SetBounds(b Bounds) { k.p.Store(&b) }

// BoundOf is the bound of kind now (none before SetBounds).
func (k *BoundsKeeper) BoundOf(kind string) Amount {
	if b := k.p.Load(); b != nil {
		return b.Of(kind)
	}
	return Amount{}
}
