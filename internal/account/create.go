package account

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"time"

	"github.com/sheepfold/sheepfold/internal/store"
)

// Create stores a new account with its own limits and free credits (a
// first ledger row when positive). A taken name is store.ErrExists.
func Create(ctx context.Context, st store.Store, name string, over Overrides, freeMicros int64) (store.Account, error) {
	if err := over.Validate(); err != nil {
		return store.Account{}, err
	}
	limits, err := json.Marshal(over)
	if err != nil {
		return store.Account{}, err
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	a := store.Account{ID: "acct_" + hex.EncodeToString(b[:]), Name: name, CreatedAt: time.Now().UTC(), Limits: limits}
	if err := st.CreateAccount(ctx, a); err != nil {
		return store.Account{}, err
	}
	if freeMicros > 0 {
		if err := st.AddLedger(ctx, store.LedgerEntry{Account: a.ID, CreatedAt: a.CreatedAt, Kind: store.LedgerFree,
			AmountMicros: freeMicros, Reason: "free credits of a new account"}); err != nil {
			return a, err
		}
	}
	return a, nil
}
