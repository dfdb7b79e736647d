package daemon

import (
	"context"
	"sync/atomic"

	"google.golang.org/grpc/stats"
)

// A registration lives as long as the engine connection that made it: when an engine process
// dies (or closes its connection) without unregistering, the daemon drains and releases what it
// registered, so a crashed engine neither pins its memory in the daemon nor blocks its name.

type connKey struct{}

// connTracker tags every engine connection with an id and tells the daemon when one ends.
type connTracker struct {
	next  atomic.Uint64
	ended func(id uint64)
}

func (c *connTracker) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, connKey{}, c.next.Add(1))
}

func (c *connTracker) HandleConn(ctx context.Context, s stats.ConnStats) {
	if _, ok := s.(*stats.ConnEnd); ok {
		if id, ok := ctx.Value(connKey{}).(uint64); ok {
			c.ended(id)
		}
	}
}

func (c *connTracker) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (c *connTracker) HandleRPC(context.Context, stats.RPCStats)                       {}

// connOf returns the id of the connection a call came in on (0 when unknown).
func connOf(ctx context.Context) uint64 {
	id, _ := ctx.Value(connKey{}).(uint64)
	return id
}

// connEnded closes connection id's call channels and unregisters every engine registered over
// it, draining its saves within the drain timeout.
func (d *Daemon) connEnded(id uint64) {
	// The connection's call channels go with it, before its engines do.
	d.chans.closeConn(id)
	d.connDetached(id)
	d.mu.Lock()
	var gone []*engine
	for name, e := range d.engines {
		if e.conn == id {
			gone = append(gone, e)
			delete(d.engines, name)
		}
	}
	d.mu.Unlock()
	for _, e := range gone {
		ctx, cancel := context.WithTimeout(context.Background(), d.cfg.DrainTimeout)
		err := e.close(ctx)
		cancel()
		d.retire(e)
		if err != nil {
			d.log.Warn("engine connection closed without unregistering; released it, drain incomplete", "engine", e.name, "err", err)
			continue
		}
		d.log.Warn("engine connection closed without unregistering; released it", "engine", e.name)
	}
}
