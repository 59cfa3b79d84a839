package egress

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/internal/ratelimit"
)

// LogLinesPerMinute is how many lines below Warn one sandbox's gateway
// writes to the server's log in a minute (a bucket of as many, refilled
// continuously). Every request the sandbox makes is a line ("egress
// allowed", "egress denied"), so without a cap a loop of refused connects
// writes thousands of lines a second onto the host's disk. Past the cap,
// lines are counted, not written; the next line written (or the gateway's
// close) carries the count as "suppressed". Events are bounded apart
// (repeated, and the sandbox's event coalescing).
const LogLinesPerMinute = 120

// logCap is a slog.Handler passing at most perMinute records below Warn.
// Handlers derived from it (WithAttrs, WithGroup) share its bucket.
type logCap struct {
	next slog.Handler
	c    *lineCount
}

// lineCount is the bucket and the count of lines it refused.
type lineCount struct {
	perMinute int64
	now       func() time.Time

	mu         sync.Mutex
	bucket     ratelimit.Bucket
	suppressed int64
}

func newLogCap(next slog.Handler, perMinute int64, now func() time.Time) *logCap {
	return &logCap{next: next, c: &lineCount{perMinute: perMinute, now: now}}
}

func (h *logCap) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *logCap) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		c := h.c
		c.mu.Lock()
		ok := c.bucket.Take(c.now(), c.perMinute).Allowed
		n := c.suppressed
		if ok {
			c.suppressed = 0
		} else {
			c.suppressed++
		}
		c.mu.Unlock()
		if !ok {
			return nil
		}
		if n > 0 {
			r = r.Clone()
			r.AddAttrs(slog.Int64("suppressed", n))
		}
	}
	return h.next.Handle(ctx, r)
}

func (h *logCap) WithAttrs(as []slog.Attr) slog.Handler {
	return &logCap{next: h.next.WithAttrs(as), c: h.c}
}

func (h *logCap) WithGroup(name string) slog.Handler {
	return &logCap{next: h.next.WithGroup(name), c: h.c}
}

// flush writes the count of lines refused since the last one written, if
// any, past the cap (at a gateway's close).
func (h *logCap) flush() {
	h.c.mu.Lock()
	n := h.c.suppressed
	h.c.suppressed = 0
	h.c.mu.Unlock()
	if n == 0 || !h.next.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	r := slog.NewRecord(h.c.now(), slog.LevelInfo, "egress log lines suppressed", 0)
	r.AddAttrs(slog.Int64("suppressed", n))
	h.next.Handle(context.Background(), r)
}
