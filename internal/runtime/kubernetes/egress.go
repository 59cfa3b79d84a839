package kubernetes

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/backoff"
	"github.com/sheepfold/sheepfold/internal/runtime"
)

var _ runtime.EgressProxy = (*Runtime)(nil)

// egressPumps is how many egress.accept requests wait at a proxied
// sandbox's agent: as many connections can be taken at once, and each
// taken one is replaced at once.
const egressPumps = 4

// ServeEgress implements runtime.EgressProxy. A Pod has no interface the
// server could give it: its network is its agent's egress listener
// (runtime.ProxyAddr). egressPumps egress.accept requests wait there, each
// answered when the sandbox's code connects; the stream goes to serve, on
// a goroutine of its own, and another request takes its place, until ctx
// ends. A request that fails (the agent restarting, a dial refused) is
// made again after a jittered, doubling wait.
func (r *Runtime) ServeEgress(ctx context.Context, inst *runtime.Instance, serve func(net.Conn), log *slog.Logger) {
	for range egressPumps {
		r.egress.Go(func() { r.pumpEgress(ctx, inst, serve, log) })
	}
}

// pumpEgress is one of ServeEgress's requests, made again and again.
func (r *Runtime) pumpEgress(ctx context.Context, inst *runtime.Instance, serve func(net.Conn), log *slog.Logger) {
	retry := backoff.Backoff{Base: 50 * time.Millisecond, Max: 2 * time.Second}
	for {
		c, err := acceptEgress(ctx, inst.Dial)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			delay := retry.Next()
			if log != nil {
				log.Warn("egress accept", "sandbox", inst.ID, "err", err, "retry", delay)
			}
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return
			}
			continue
		}
		retry.Reset()
		r.egress.Go(func() { serve(c) })
	}
}

// acceptEgress makes one egress.accept request on a connection of its own
// and returns that connection once the agent hands it the sandbox's
// stream: from then on it carries the stream's bytes.
func acceptEgress(ctx context.Context, dial func(context.Context) (net.Conn, error)) (net.Conn, error) {
	nc, err := dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("dial agent: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	ev, err := agentproto.Connect(nc, agentproto.Request{Op: agentproto.OpEgressAccept})
	if !stop() || err != nil || ev.Type != agentproto.EventConnected {
		nc.Close()
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil:
			return nil, err
		}
		return nil, fmt.Errorf("egress.accept: %s: %s", ev.Code, ev.Message)
	}
	return nc, nil
}
