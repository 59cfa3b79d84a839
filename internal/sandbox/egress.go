package sandbox

import (
	"time"

	"github.com/sheepfold/sheepfold/internal/backoff"
	"github.com/sheepfold/sheepfold/internal/egress"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

// egressPumps is how many egress.accept requests a proxied sandbox's
// engine keeps waiting: as many connections can be taken at once, and
// each taken one is replaced at once.
const egressPumps = 4

// proxiesEgress reports whether the runtime's sandboxes reach the
// network through their agent (runtime.EgressProxy).
func (m *Manager) proxiesEgress() bool {
	p, ok := m.cfg.Runtime.(runtime.EgressProxy)
	return ok && p.ProxiesEgress()
}

// pumpEgress fetches the connections the sandbox's code makes to its
// egress listener and hands each to its gateway (egress.ServeProxy),
// until the gateway closes (the sandbox stops or is released).
func (s *Sandbox) pumpEgress() {
	gw := s.net
	ctx := gw.Context()
	for range egressPumps {
		go func() {
			retry := backoff.Backoff{Base: 50 * time.Millisecond, Max: 2 * time.Second}
			for {
				c, err := s.AcceptEgress(ctx)
				if err != nil {
					if ctx.Err() != nil || order(s.State()) >= order(StateStopping) {
						return
					}
					delay := retry.Next()
					s.m.log.Warn("egress accept", "sandbox", s.ID, "err", err, "retry", delay)
					select {
					case <-time.After(delay):
					case <-ctx.Done():
						return
					}
					continue
				}
				retry.Reset()
				hc, ok := c.(egress.HalfConn)
				if !ok {
					c.Close()
					continue
				}
				go gw.ServeProxy(hc)
			}
		}()
	}
}

// adoptEgress gives an adopted sandbox whose policy allows a network the
// gateway its creator gave it, and fetches its connections: any replica
// holding it carries its egress, counting network_requests in the agent.
func (s *Sandbox) adoptEgress(pol *policy.Policy) error {
	egressPolicy, err := policy.CompileEgress(pol.NetworkPolicy())
	if err != nil || !egressPolicy.Enabled() || !s.m.proxiesEgress() {
		return err
	}
	gw, err := egress.New(s.m.cfg.Egress, s.ID, egressPolicy, pol.NetworkRequests())
	if err != nil {
		return err
	}
	s.net = gw
	s.shareEgressBudget()
	s.pumpEgress()
	return nil
}
