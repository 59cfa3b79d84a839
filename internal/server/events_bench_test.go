package server_test

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/store/sqlite"
)

// BenchmarkBusExecutionEvents is the bus's cost per execution on SQLite:
// execution.started and execution.finished emitted 1 ms apart, as a warm
// round trip does, with the writer writing at once (delay -1, as before
// group commit) or waiting for its batch to fill (the default). It
// reports the process's CPU time per execution (cpu-µs/exec), of which
// the pacing alone (sink=discard: no bus) is a part; the wall time is
// mostly the pacing.
func BenchmarkBusExecutionEvents(b *testing.B) {
	for _, delay := range []time.Duration{1, -1, 0} {
		name := "delay=default"
		switch {
		case delay < 0:
			name = "delay=none"
		case delay > 0:
			name = "sink=discard"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			st, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "sheepfold.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			bus := events.NewBus(server.EventStore(st), events.BusConfig{FlushDelay: delay})
			defer bus.Close()
			var sink events.Sink = bus
			if delay > 0 {
				sink = events.Discard
			}
			details := map[string]any{"status": "success", "duration_ms": 2}
			cpu0 := cpuTime()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				id := fmt.Sprintf("exec_%d", i)
				sink.Emit(events.Event{Type: events.ExecutionStarted, SandboxID: "sb_1", Owner: "key_1", ExecutionID: id})
				time.Sleep(time.Millisecond)
				sink.Emit(events.Event{Type: events.ExecutionFinished, SandboxID: "sb_1", Owner: "key_1", ExecutionID: id, Details: details})
				time.Sleep(time.Millisecond)
			}
			if err := bus.Sync(ctx); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/exec")
		})
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
