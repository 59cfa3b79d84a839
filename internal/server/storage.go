package server

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sheepfold/sheepfold/api"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/store"
)

// Storage per account: every account's records share the server's
// database and its disk, so each account keeps at most Config.Storage of
// each kind (internal/store, storage.go): past a bound it loses its own
// oldest records of that kind, in the write that took it past; an alert,
// which the account raises itself, is refused instead when none of its
// alerts is acknowledged (429 ERR_STORAGE_QUOTA_EXCEEDED). What it keeps
// is shown in GET /v1/account ("storage") and, summed over accounts, in
// the sheepfold_store_records and sheepfold_store_bytes gauges.

// MiB is a mebibyte, in bytes.
const MiB = 1 << 20

// DefaultStorage are the bounds of Config.Storage's zero fields.
var DefaultStorage = store.Bounds{
	Sandboxes:  store.Amount{Records: 10000, Bytes: 64 * MiB},
	Executions: store.Amount{Records: 20000, Bytes: 256 * MiB},
	Events:     store.Amount{Records: 100000, Bytes: 64 * MiB},
	Alerts:     store.Amount{Records: 10000, Bytes: 16 * MiB},
	Deliveries: store.Amount{Records: 50000, Bytes: 32 * MiB},
}

// storageBounds fills b's zero measures with DefaultStorage's and turns
// negative ones (unbounded) into the store's zero.
func storageBounds(b store.Bounds) store.Bounds {
	var out store.Bounds
	for _, k := range store.Kinds {
		a, def := b.Of(k), DefaultStorage.Of(k)
		if a.Records == 0 {
			a.Records = def.Records
		}
		if a.Bytes == 0 {
			a.Bytes = def.Bytes
		}
		a.Records, a.Bytes = max(a.Records, 0), max(a.Bytes, 0)
		out.Set(k, a)
	}
	return out
}

// storageOf reads what an account keeps, with its bounds.
func (s *Server) storageOf(ctx context.Context, account string) (api.AccountStorage, error) {
	// Every execution already answered is counted.
	if err := s.records.wait(ctx, account); err != nil {
		return api.AccountStorage{}, err
	}
	st, err := s.store.Stored(ctx, account)
	if err != nil {
		return api.AccountStorage{}, err
	}
	tot := st.Total()
	out := api.AccountStorage{Records: tot.Records, Bytes: tot.Bytes, Kinds: map[string]api.StoredAmount{}}
	for _, k := range store.Kinds {
		a, b := st.Of(k), s.cfg.Storage.Of(k)
		out.Kinds[k] = api.StoredAmount{Records: a.Records, Bytes: a.Bytes, MaxRecords: b.Records, MaxBytes: b.Bytes}
	}
	return out, nil
}

// alertBoundError is the answer to an alert the account has no room for.
func (s *Server) alertBoundError(err error) error {
	b := s.cfg.Storage.Alerts
	return apierr.Wrap(err, apierr.StorageQuotaExceeded,
		"this account keeps as many alerts as it may (%s), none of them acknowledged: acknowledge some (POST /v1/alerts/{id}/ack) to make room",
		boundText(b))
}

// boundText says a bound in words.
func boundText(b store.Amount) string {
	switch {
	case b.Records > 0 && b.Bytes > 0:
		return fmt.Sprintf("%d records or %d bytes", b.Records, b.Bytes)
	case b.Records > 0:
		return fmt.Sprintf("%d records", b.Records)
	case b.Bytes > 0:
		return fmt.Sprintf("%d bytes", b.Bytes)
	}
	return "no bound"
}

// isStorageBound reports an error of a record its account has no room for.
func isStorageBound(err error) bool { return errors.Is(err, store.ErrStorageBound) }

// storageCollector reads every account's stored records, summed by kind,
// at scrape time.
type storageCollector struct{ s *Server }

var (
	storedRecordsDesc = prometheus.NewDesc("sheepfold_store_records", "Records the accounts keep in the database, by kind (sandboxes, executions, events, alerts, deliveries).", []string{"kind"}, nil)
	storedBytesDesc   = prometheus.NewDesc("sheepfold_store_bytes", "Bytes of the records the accounts keep in the database (text fields plus 128 a record), by kind.", []string{"kind"}, nil)
)

func (c *storageCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- storedRecordsDesc
	ch <- storedBytesDesc
}

func (c *storageCollector) Collect(ch chan<- prometheus.Metric) {
	if c.s.store == nil {
		return
	}
	all, err := c.s.store.StoredAll(context.Background())
	if err != nil {
		c.s.log.Warn("metrics: read stored amounts", "err", err)
		return
	}
	var sum store.Stored
	for _, st := range all {
		for _, k := range store.Kinds {
			a, t := st.Of(k), sum.Of(k)
			sum.Set(k, store.Amount{Records: t.Records + a.Records, Bytes: t.Bytes + a.Bytes})
		}
	}
	for _, k := range store.Kinds {
		a := sum.Of(k)
		ch <- prometheus.MustNewConstMetric(storedRecordsDesc, prometheus.GaugeValue, float64(a.Records), k)
		ch <- prometheus.MustNewConstMetric(storedBytesDesc, prometheus.GaugeValue, float64(a.Bytes), k)
	}
}
