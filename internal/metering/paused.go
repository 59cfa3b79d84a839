package metering

import (
	"context"
	"time"

	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Paused storage: while a sandbox is paused to its checkpoint, each
// sample reads what it holds on the server's disk (its images and its
// kept disk: sandbox.PausedBytes) and adds bytes × time since the last
// sample as the sandbox's PausedGBSeconds, charged at the storage price
// (Prices.StorageGBSecond) like the account's stored records. Its wall,
// CPU and memory stand still. The stretch from the last sample to a
// resume or a kill is not counted (one sample interval at most).

// samplePaused is sample's part for a paused tracker; t.sampling is
// held, m.mu is not.
func (m *Meter) samplePaused(t *tracker, stop bool) {
	var n int64
	if read := !m.leased() || t.holder; read {
		ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
		n = t.sb.PausedBytes(ctx)
		cancel()
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	dt := max(now.Sub(t.last), 0)
	t.last = now
	t.stopped = t.stopped || stop
	if n <= 0 || !t.paused {
		return
	}
	d := store.UsageDelta{PausedGBSeconds: float64(n) / gib * dt.Seconds()}
	t.add(now, d)
	t.account.Accrue(account.Usage{}, d.PausedGBSeconds*m.cfg.Prices.StorageGBSecond)
}
