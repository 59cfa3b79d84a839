package runtime

import "context"

// DiskMeter is implemented by runtimes that can say how many bytes a
// sandbox's writable layer holds while none of its processes runs (a
// paused sandbox's kept disk, metered as storage: internal/metering).
// A sandbox it does not hold is ErrNotFound.
type DiskMeter interface {
	DiskUsed(ctx context.Context, id string) (int64, error)
}
