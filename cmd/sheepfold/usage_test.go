package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/client"
)

func TestPrintUsage(t *testing.T) {
	rep := &client.UsageReport{From: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), To: time.Date(2026, 12, 3, 18, 0, 0, 0, time.UTC), GroupBy: "day",
		Groups: []client.UsageGroup{{Key: "2026-12-03", UsageFigures: client.UsageFigures{SandboxSeconds: 12.5, CPUSeconds: 2.25, Executions: 7, Cost: "0.000042"}}},
		Total:  client.UsageFigures{SandboxSeconds: 12.5, CPUSeconds: 2.25, Executions: 7, Cost: "0.000042"}, Prices: client.Prices{CPUSecondMicros: 14}}
	var out bytes.Buffer
	if err := printUsage(&out, rep, false); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"2026-12-03", "2.250", "0.000042", "total", "14 per CPU-second"} {
		if !strings.Contains(out.String(), w) {
			t.Fatalf("table lacks %q:\n%s", w, out.String())
		}
	}
	out.Reset()
	if err := printUsage(&out, rep, true); err != nil {
		t.Fatal(err)
	}
	var back client.UsageReport
	if err := json.Unmarshal(out.Bytes(), &back); err != nil || back.Total.CPUSeconds != 2.25 || len(back.Groups) != 1 {
		t.Fatalf("--json printed %s (%v)", out.String(), err)
	}
}
