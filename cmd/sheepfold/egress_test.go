package main

import (
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/egress"
)

// TestEgressFlags: serve's egress flags reach the gateway's options, 0
// meaning none; their defaults are the gateway's.
func TestEgressFlags(t *testing.T) {
	cases := []struct {
		args  []string
		want  egress.Options
		error bool
	}{
		{nil, egress.Options{MaxFlows: egress.DefaultMaxFlows, IdleTimeout: egress.DefaultIdleTimeout, Rate: egress.DefaultRate}, false},
		{[]string{"--egress-max-flows", "16", "--egress-idle-timeout", "30s", "--egress-rate", "1MiB"},
			egress.Options{MaxFlows: 16, IdleTimeout: 30 * time.Second, Rate: 1 << 20}, false},
		{[]string{"--egress-max-flows", "0", "--egress-idle-timeout", "0", "--egress-rate", "0"},
			egress.Options{MaxFlows: -1, IdleTimeout: -1, Rate: -1}, false},
		{[]string{"--egress-rate", "fast"}, egress.Options{}, true},
		{[]string{"--egress-max-flows", "-1"}, egress.Options{}, true},
	}
	for _, c := range cases {
		var cfg config.Config
		cmd := serveCmd(&cfg)
		if err := cmd.ParseFlags(c.args); err != nil {
			t.Fatal(err)
		}
		got, err := egressOptions(cmd.Flags())
		same := got.MaxFlows == c.want.MaxFlows && got.IdleTimeout == c.want.IdleTimeout && got.Rate == c.want.Rate
		if (err != nil) != c.error || err == nil && !same {
			t.Errorf("%v: %+v, %v; want %+v (error %v)", c.args, got, err, c.want, c.error)
		}
	}
}
