package main

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/spf13/pflag"

	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/egress"
)

// addEgressFlags adds serve's bounds on each networked sandbox's
// connections through the egress gateway.
func addEgressFlags(fs *pflag.FlagSet) {
	fs.Int("egress-max-flows", egress.DefaultMaxFlows,
		"connections one sandbox may have open at once through the egress gateway; past it new ones are refused (0: no cap)")
	fs.Duration("egress-idle-timeout", egress.DefaultIdleTimeout,
		"close a sandbox's connection on which no byte moved either way for this long (0: never)")
	fs.String("egress-rate", strconv.Itoa(egress.DefaultRate>>20)+"MiB",
		"bytes a second one sandbox's connections may carry each way, all together, e.g. 25MiB (0: no limit)")
}

// egressOptions returns the gateway's bounds from the flags (whose 0 is
// the options' "none").
func egressOptions(fs *pflag.FlagSet) (egress.Options, error) {
	var o egress.Options
	flows, err1 := fs.GetInt("egress-max-flows")
	idle, err2 := fs.GetDuration("egress-idle-timeout")
	rate, err3 := fs.GetString("egress-rate")
	if err := errors.Join(err1, err2, err3); err != nil {
		return o, err
	}
	if flows < 0 || idle < 0 {
		return o, errors.New("--egress-max-flows and --egress-idle-timeout must not be negative (0: none)")
	}
	r, err := config.ParseSize(rate)
	if err != nil {
		return o, fmt.Errorf("--egress-rate: %w", err)
	}
	o.MaxFlows, o.IdleTimeout, o.Rate = flows, idle, r
	if o.MaxFlows == 0 {
		o.MaxFlows = -1
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = -1
	}
	if o.Rate == 0 {
		o.Rate = -1
	}
	return o, nil
}
