package agent

import (
	"sync"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// Usage history. Where several servers serve one sandbox (replicas of
// the Kubernetes backend), a history each kept of its own would differ
// by when each began to hold the sandbox; so the agent, which they all
// reach, samples its own usage (Config.UsageHistory) every
// HistoryInterval and keeps HistoryKept samples, which usage.history
// returns (E2B's getMetrics is built from them).
const (
	HistoryInterval = 5 * time.Second
	HistoryKept     = 720 // an hour
)

// history is the agent's usage samples, oldest first.
type history struct {
	mu      sync.Mutex
	samples []agentproto.UsageSample
}

func (h *history) add(s agentproto.UsageSample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.samples) == HistoryKept {
		h.samples = append(h.samples[:0], h.samples[1:]...)
	}
	h.samples = append(h.samples, s)
}

func (h *history) all() []agentproto.UsageSample {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]agentproto.UsageSample(nil), h.samples...)
}

// sampleUsage samples the usage at once and then every HistoryInterval
// until the agent stops; a sample that cannot be read is skipped.
func (s *server) sampleUsage() {
	t := time.NewTicker(HistoryInterval)
	defer t.Stop()
	for {
		now := time.Now()
		if ev := s.usage(); ev.Usage != nil {
			s.history.add(agentproto.UsageSample{UnixMS: now.UnixMilli(), Usage: *ev.Usage})
		}
		select {
		case <-t.C:
		case <-s.ctx.Done():
			return
		}
	}
}

// usageHistory answers usage.history.
func (s *server) usageHistory() agentproto.Event {
	if !s.cfg.UsageHistory {
		return fail(agentproto.CodeUnsupported, "this agent keeps no usage history")
	}
	ev := ok()
	ev.History = s.history.all()
	return ev
}
