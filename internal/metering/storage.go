package metering

import (
	"context"
	"time"

	"github.com/sheepfold/sheepfold/internal/account"
)

// Storage: what each account keeps in the store (its records, counted by
// the store as it writes them) is metered in GB-seconds at each flush, by
// the store itself (store.StorageStore.MeterStorage), so that replicas
// sharing it charge every second once; the cost is accrued to the
// account and reaches the ledger with the flush that follows. A server
// down for a while charges at most store.MaxStorageSpan for the time
// before its first flush.

// meterStorage meters every account's storage up to now and accrues its
// cost.
func (m *Meter) meterStorage(ctx context.Context, now time.Time) {
	if m.ss == nil {
		return
	}
	charges, err := m.ss.MeterStorage(ctx, now)
	if err != nil {
		m.cfg.Logger.Error("meter storage", "err", err)
		return
	}
	price := m.cfg.Prices.StorageGBSecond
	for _, c := range charges {
		a, err := m.accounts.Get(ctx, c.Account)
		if err != nil {
			m.cfg.Logger.Warn("meter storage: the account", "account", c.Account, "err", err)
			continue
		}
		a.Accrue(account.Usage{}, c.GBSeconds*price) // the figures are the store's (storage_hours)
	}
}
