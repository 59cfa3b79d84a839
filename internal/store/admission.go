package store

import (
	"context"
	"errors"
	"time"
)

// ErrLimit reports an admission refused: the account is at its cap.
var ErrLimit = errors.New("store: limit reached")

// ReservationTTL is how long a reservation counts without being confirmed
// or dropped: one older than this belongs to a create whose server died.
const ReservationTTL = 10 * time.Minute

// AdmissionStore keeps the counts that caps are checked against where
// every server sharing the store must see them at once: an account's
// concurrent sandboxes and its monthly executions. Each call is one
// transaction, serialised per account among all of them, so that two
// servers admitting for one account never pass a cap together.
type AdmissionStore interface {
	// ReserveSandbox holds one of owner's max concurrent sandbox slots for
	// a create in progress, named holder, when the owner's running
	// sandboxes and live reservations number fewer than max; ErrLimit
	// otherwise.
	ReserveSandbox(ctx context.Context, owner, holder string, max int64, at time.Time) error
	// ConfirmSandbox records s (as PutSandbox) and drops holder's
	// reservation, in one transaction: the slot passes to the sandbox.
	ConfirmSandbox(ctx context.Context, holder string, s Sandbox) error
	// DropReservation gives holder's slot back (its create failed);
	// dropping an unknown holder is not an error.
	DropReservation(ctx context.Context, holder string) error
	// CountExecution counts one execution of account in the month that
	// starts at month when fewer than max are counted there, and ErrLimit
	// otherwise. A month's count starts from the executions its usage
	// already holds.
	CountExecution(ctx context.Context, account string, month time.Time, max int64) error
}
