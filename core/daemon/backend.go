package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/pool"
)

// Backend is the pool a Daemon serves from and what the operator configured it with. A nil
// Config.Backend makes the daemon build an embedded pool from Config.Pool.
//
// Pool may implement these optional interfaces, which the daemon discovers at run time:
//   - Mounter: the host's segment joins the pool only once Mount succeeds (a remote master may
//     be down when serve starts); the daemon is not ready until then, retries, and calls Mount
//     again after the master was unreachable, since a restarted master has forgotten it.
//   - Pinger: the daemon pings it every HealthInterval and is unready while it fails.
//   - mooncake.Inspector: the admin API serves the master's read endpoints and metrics for it.
//   - SegmentServed() statsapi.SegmentServedJSON: what peers read from and wrote to this host's
//     segment, the "backend" object's segment_served.
//   - io.Closer-like Close() error: called last on shutdown.
type Backend struct {
	Pool pool.Pool
	Info statsapi.BackendInfo
}

// Mounter is a backend whose host segment must be registered with a master before the daemon
// is ready. Mount must succeed when the segment is already mounted, and remount it after the
// master lost it (restarted). Unmount removes the segment and this host's metadata. Both are
// safe for concurrent use with the pool's data calls.
type Mounter interface {
	Mount(ctx context.Context) error
	Unmount(ctx context.Context) error
}

// Pinger is a backend that can tell whether its master answers.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Defaults of the backend supervision.
const (
	DefaultPoolTimeout    = 5 * time.Second
	DefaultHealthInterval = 2 * time.Second
	DefaultMountRetry     = time.Second
	maxMountRetry         = 10 * time.Second
)

// backendState is what the supervisor knows of the backend.
type backendState struct {
	mu        sync.Mutex
	mounted   bool
	reachable bool
	reason    string
	mounts    int64
}

func (s *backendState) set(mounted, reachable bool, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mounted, s.reachable, s.reason = mounted, reachable, reason
}

func (s *backendState) get() (mounted, reachable bool, reason string, mounts int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mounted, s.reachable, s.reason, s.mounts
}

// supervise mounts the backend's segment, retrying while the master is away, keeps the
// daemon's readiness in step with the master's reachability, and remounts after an outage.
// It returns when ctx is done.
func (d *Daemon) supervise(ctx context.Context) {
	m, _ := d.backend.Pool.(Mounter)
	p, _ := d.backend.Pool.(Pinger)
	if m == nil && p == nil {
		d.bstate.set(true, true, "")
		d.ready.Store(!d.draining.Load())
		return
	}
	where := d.backend.Info.Master
	if !d.mountUntilDone(ctx, m, where) {
		return
	}
	if p == nil {
		return
	}
	t := time.NewTicker(d.cfg.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, d.cfg.PoolTimeout)
		err := p.Ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			continue
		}
		reason := fmt.Sprintf("master %s unreachable: %v", where, err)
		d.log.Warn("the Mooncake master does not answer; lookups answer miss and saves are dropped until it is back", "master", where, "err", err)
		d.ready.Store(false)
		d.bstate.set(false, false, reason)
		if !d.mountUntilDone(ctx, m, where) {
			return
		}
	}
}

// mountUntilDone pings (when it can) and mounts until both succeed, backing off between tries;
// it reports false when ctx ended first.
func (d *Daemon) mountUntilDone(ctx context.Context, m Mounter, where string) bool {
	p, _ := d.backend.Pool.(Pinger)
	wait := d.cfg.MountRetry
	for attempt := 1; ; attempt++ {
		err := d.tryMount(ctx, m, p)
		if err == nil {
			d.bstate.mu.Lock()
			d.bstate.mounts++
			n := d.bstate.mounts
			d.bstate.mu.Unlock()
			d.bstate.set(true, true, "")
			d.ready.Store(!d.draining.Load())
			if n == 1 {
				d.log.Info("segment mounted; ready", "master", where, "segment", d.segmentName(), "bytes", d.backend.Info.SegmentBytes)
			} else {
				d.log.Info("master answers again and lists the segment; ready", "master", where, "segment", d.segmentName(), "mounts", n)
			}
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if errors.Is(err, mooncake.ErrTransferListen) {
			// The master answered; this host cannot take its transfer address.
			d.bstate.set(false, true, fmt.Sprintf("cannot mount the segment: %v", err))
			d.log.Warn("cannot serve the segment to peers on the transfer address (is --transfer-port taken?); retrying", "master", where, "attempt", attempt, "retry_in", wait, "err", err)
		} else {
			d.bstate.set(false, false, fmt.Sprintf("waiting for the Mooncake master %s: %v", where, err))
			d.log.Warn("waiting for the Mooncake master; retrying", "master", where, "attempt", attempt, "retry_in", wait, "err", err)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
		wait = min(2*wait, maxMountRetry)
	}
}

func (d *Daemon) tryMount(ctx context.Context, m Mounter, p Pinger) error {
	cctx, cancel := context.WithTimeout(ctx, d.cfg.PoolTimeout)
	defer cancel()
	if p != nil {
		if err := p.Ping(cctx); err != nil {
			return err
		}
	}
	if m != nil {
		return m.Mount(cctx)
	}
	return nil
}

// segmentName is the segment's name as the backend reports it once mounted (a Mooncake
// client's "host:port"), else the configured one.
func (d *Daemon) segmentName() string {
	if n, ok := d.backend.Pool.(interface{ SegmentName() string }); ok {
		if name := n.SegmentName(); name != "" {
			return name
		}
	}
	return d.backend.Info.Segment
}

// unmount removes this host's segment from the pool on shutdown.
func (d *Daemon) unmount(ctx context.Context) error {
	m, ok := d.backend.Pool.(Mounter)
	if !ok {
		return nil
	}
	mounted, _, _, _ := d.bstate.get()
	if !mounted {
		return nil
	}
	name := d.segmentName()
	if err := m.Unmount(ctx); err != nil {
		return fmt.Errorf("unmount segment %s: %w", name, err)
	}
	d.bstate.set(false, false, "shut down")
	d.log.Info("segment unmounted", "segment", name)
	return nil
}

func (d *Daemon) closeBackend() error {
	if c, ok := d.backend.Pool.(interface{ Close() error }); ok {
		return c.Close()
	}
	return nil
}

// BackendStatus returns the "backend" object of /v1/stats.
func (d *Daemon) BackendStatus(ctx context.Context) statsapi.BackendStatusJSON {
	mounted, reachable, reason, mounts := d.bstate.get()
	out := statsapi.BackendStatusJSON{BackendInfo: d.backend.Info, SegmentMounted: mounted, MasterReachable: reachable,
		UnreadyReason: reason, Mounts: mounts, PoolCallFailures: d.guard.failures()}
	out.Segment = d.segmentName()
	if s, ok := d.backend.Pool.(interface {
		SegmentServed() statsapi.SegmentServedJSON
	}); ok {
		served := s.SegmentServed()
		out.SegmentServed = &served
	}
	if r, ok := d.backend.Pool.(interface{ Remounts() int64 }); ok {
		out.SegmentRemounts = r.Remounts()
	}
	if k, ok := d.backend.Pool.(interface{ KeptAnswers() int64 }); ok {
		out.LookupKeysFromKept = k.KeptAnswers()
	}
	if reason == "" && !d.ready.Load() {
		out.UnreadyReason = "not serving"
		if d.draining.Load() {
			out.UnreadyReason = "shutting down"
		}
	}
	if reachable {
		cctx, cancel := context.WithTimeout(ctx, d.cfg.PoolTimeout)
		defer cancel()
		if segs, err := d.pool.Segments(cctx); err == nil {
			out.ClusterSegments = len(segs)
			for _, s := range segs {
				out.ClusterCapacityBytes += s.Capacity
				out.ClusterUsedBytes += s.Used
			}
		} else if !errors.Is(err, context.Canceled) {
			d.log.Debug("segments", "err", err)
		}
	}
	return out
}
