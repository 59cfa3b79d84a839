package sandbox

import (
	"net"

	"github.com/sheepfold/sheepfold/internal/egress"
	"github.com/sheepfold/sheepfold/internal/policy"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

// proxiesEgress reports whether the runtime's sandboxes reach the
// network through their agent (runtime.EgressProxy).
func (m *Manager) proxiesEgress() bool {
	_, ok := m.cfg.Runtime.(runtime.EgressProxy)
	return ok
}

// serveEgress has the runtime hand each connection the sandbox's code
// makes to its egress listener to its gateway (egress.ServeProxy), until
// the gateway closes (the sandbox stops or is released). Fetching them is
// the runtime's work (runtime.EgressProxy); a connection taken is
// activity, which keeps an idle timeout away.
func (s *Sandbox) serveEgress(inst *runtime.Instance) {
	gw := s.net
	s.m.cfg.Runtime.(runtime.EgressProxy).ServeEgress(gw.Context(), inst, func(c net.Conn) {
		hc, ok := c.(egress.HalfConn)
		if !ok {
			c.Close()
			return
		}
		s.touch()
		gw.ServeProxy(hc)
	}, s.m.log)
}

// adoptEgress gives an adopted sandbox whose policy allows a network the
// gateway its creator gave it, and has its connections served: any
// replica holding it carries its egress, counting network_requests in
// the agent.
func (s *Sandbox) adoptEgress(inst *runtime.Instance, pol *policy.Policy) error {
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
	s.serveEgress(inst)
	return nil
}
