package sandbox

import (
	"context"

	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

// The network of a sandbox across a dump (a pause, a snapshot, a fork).
//
// A sandbox's network is a TUN device in its network namespace whose
// other end, a host descriptor, is its egress gateway (internal/egress):
// CRIU can neither dump nor recreate it. A dump therefore detaches the
// gateway first (egress.Gateway.Detach: the device goes, every
// connection the sandbox had open through it is closed, the namespace
// keeps its loopback alone), and the runtime refuses to dump a sandbox
// whose namespace still holds another interface. After the dump:
//   - a snapshot's sandbox, which ran on, gets the same gateway attached
//     to its namespace again (reattachNet);
//   - a resumed sandbox gets the same gateway attached to its restored
//     init's new namespace (attachNet), before its agent is reached:
//     policy, resolved names, network_requests counted and bytes carried
//     go on, in this engine or, for a sandbox paused across a restart,
//     from its record (keep.go: policy and request count);
//   - a clone (a fork, a sandbox started from a snapshot) gets a new
//     gateway of its own with the snapshot's policy, attached by the
//     runtime's Clone (Create, startFrom).
//
// The restored processes run, between the restore and the attach, with
// their loopback alone: no route out, never another one. What a dump
// loses: the connections open through the gateway at that moment (the
// sandbox's code sees them reset or failing; its loopback connections are
// kept). A proxied network (runtime.EgressProxy: Kubernetes) is never
// dumped: its runtime cannot checkpoint.

// dumpableNet fails if the sandbox's network cannot be detached for a
// dump (a proxied one).
func (s *Sandbox) dumpableNet() error {
	if s.net != nil && s.m.proxiesEgress() {
		return apierr.New(apierr.NotSupported, "sandbox %s's network goes through its runtime's proxy, which cannot be dumped", s.ID)
	}
	return nil
}

// detachNet takes the sandbox's gateway off its namespace for a dump;
// lifeMu is held.
func (s *Sandbox) detachNet() {
	if s.net != nil {
		s.net.Detach()
	}
}

// attachNet attaches the sandbox's gateway to the namespace of inst's
// init (a restored one); lifeMu is held.
func (s *Sandbox) attachNet(ctx context.Context, inst *runtime.Instance) error {
	if s.net == nil {
		return nil
	}
	return s.net.Attach(ctx, inst.PID)
}

// reattachNet attaches the sandbox's gateway again after a dump that
// left it running (a snapshot, a failed checkpoint). If that fails the
// sandbox runs on with its loopback alone (no route out), which the log
// says; lifeMu is held.
func (s *Sandbox) reattachNet(inst *runtime.Instance) {
	if s.net == nil || inst == nil || s.net.Attached() {
		return // a freeze's undo: never detached
	}
	if err := s.net.Attach(context.Background(), inst.PID); err != nil {
		s.m.log.Error("attach a sandbox's network again after a dump; it runs on without one", "sandbox", s.ID, "err", err)
	}
}
