package account

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/internal/bound"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Account names: 1 to 63 letters, digits, '_', '.' or '-', starting with
// a letter or digit, and never shaped like an id.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)

// idPrefixes begin the ids the server gives accounts ("acct_" and, for
// accounts a key made for itself, "key_"): no name may begin so, or it
// could be taken for another account's id.
var idPrefixes = []string{"acct_", "key_"}

// CheckName refuses a name an account may not have, naming the field
// "name".
func CheckName(name string) error {
	if !nameRE.MatchString(name) {
		return bound.Error("name", "is required: 1 to 63 letters, digits, '_', '.' or '-', starting with a letter or digit")
	}
	for _, p := range idPrefixes {
		if strings.HasPrefix(strings.ToLower(name), p) {
			return bound.Error("name", "must not begin with %q: names shaped like ids could be taken for another account's id", p)
		}
	}
	return nil
}

// Create stores a new account with its own limits and free credits (a
// first ledger row when positive). A taken name is store.ErrExists; a
// name that is another account's id (one of the ids made before names
// were checked, or given to `sheepfold keys create --owner`) is refused
// as CheckName refuses.
func Create(ctx context.Context, st store.Store, name string, over Overrides, freeMicros int64) (store.Account, error) {
	if err := CheckName(name); err != nil {
		return store.Account{}, err
	}
	if err := over.Validate(); err != nil {
		return store.Account{}, err
	}
	if freeMicros < 0 || freeMicros > bound.MaxAmountMicros {
		return store.Account{}, fmt.Errorf("free credits must be from 0 to %s", FormatMicros(bound.MaxAmountMicros))
	}
	if _, err := st.Account(ctx, name); err == nil {
		return store.Account{}, bound.Error("name", "%q is another account's id", name)
	} else if !errors.Is(err, store.ErrNotFound) {
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

// Find resolves an account by id, then by name. An id comes first so that
// no name can stand for another account's id: names shaped like ids are
// refused (CheckName), and a name stored before that rule, equal to
// another account's id, cannot take that id's place.
func Find(ctx context.Context, st store.Store, ref string) (store.Account, error) {
	a, err := st.Account(ctx, ref)
	if errors.Is(err, store.ErrNotFound) {
		a, err = st.AccountByName(ctx, ref)
	}
	return a, err
}
