package replay

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/kvctl/kvctl/core/connector"
)

// Asynchronous loads in virtual time (the scheduler model with async_load). A parked request's
// transfer queues behind its rank's load worker (the replay's connector runs one per rank): it
// starts when the worker is free, max(park time, end of the previous transfer), and takes its
// modelled load time. Its pages are read at that start, not when the request parked: the
// lookup that offered them only found them, and until the transfer starts the pool goes on
// with other ranks' saves, eviction ticks and lease expiries, as Mooncake's does (an existence
// probe grants a read lease only with exist_key_grant_lease, the master's default). A page gone
// by then fails the load: the worker hands the request back (TakeFailedAsyncLoadRequests), the
// replay counts a failed load (FailedLoads) and the request waits again at the head of its
// rank's line, looked up afresh, as the seed's restart does (commit 4).
//
// The replay holds the worker to that start through the load's allocation fence, which the
// worker passes before its first read (connector.Options.Fence): every fence the worker takes
// for an asynchronous load is a gate the replay opens when virtual time reaches the transfer's
// start, in the order the worker queued the loads. It then waits until the worker reports the
// load finished, so what the pool holds at each later tick does not depend on goroutine timing.

// loadGate is the allocation fence of one asynchronous load: it passes once opened.
type loadGate struct {
	open   chan struct{}
	opened bool
}

func newLoadGate() *loadGate { return &loadGate{open: make(chan struct{})} }

// Wait implements connector.Fence.
func (g *loadGate) Wait(ctx context.Context) error {
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *loadGate) release() {
	if !g.opened {
		g.opened = true
		close(g.open)
	}
}

// queuedLoad is a parked request's transfer waiting for its start in virtual time.
type queuedLoad struct {
	q     *schedReq
	start time.Duration
	gate  *loadGate
}

// loadFence is the rank's connector.Options.Fence: the gate armed for the asynchronous load
// being bound, or no fence for anything else (the saves' fence, in virtual time, is the pass).
func (r *rank) loadFence() connector.Fence {
	if len(r.armed) == 0 {
		return nil
	}
	g := r.armed[0]
	r.armed = r.armed[1:]
	return g
}

// releaseLoads opens every gate the rank still holds, so that its worker's load goroutines can
// end (a replay that stops early).
func (r *rank) releaseLoads() {
	for _, g := range r.armed {
		g.release()
	}
	r.armed = nil
	for _, l := range r.queued {
		l.gate.release()
	}
}

// parkLoad binds meta, whose asynchronous transfer is q's (pages pages), behind a gate, and
// queues it on the rank's load worker from now: it returns when the transfer ends in virtual
// time. An empty transfer is done at once and queues nothing.
func (o *offline) parkLoad(r *rank, q *schedReq, meta connector.Metadata, pages int) (end time.Duration, err error) {
	id := q.q.ID
	var gate *loadGate
	if pages > 0 {
		gate = newLoadGate()
		r.armed = append(r.armed, gate)
	}
	err = r.local.BindMeta(o.ctx, meta)
	if gate != nil && len(r.armed) > 0 && r.armed[len(r.armed)-1] == gate {
		r.armed = r.armed[:len(r.armed)-1] // not taken: the worker queued nothing behind it
		gate = nil
	}
	if err != nil {
		return 0, err
	}
	// The engine announces the parked request; its load finishes only once the gate opens.
	_, done, err := r.local.GetFinished(o.ctx, nil, []string{id})
	if err != nil {
		return 0, fmt.Errorf("request %s: asynchronous load: %w", id, err)
	}
	failed, err := r.local.TakeFailedAsyncLoadRequests(o.ctx)
	if err != nil {
		return 0, err
	}
	if len(failed) > 0 {
		return 0, fmt.Errorf("request %s: loads %v failed before their start", id, failed)
	}
	if gate == nil {
		if !slices.Contains(done, id) {
			return 0, fmt.Errorf("request %s: an asynchronous load without pages was not reported done", id)
		}
		return r.sch.clock, nil
	}
	start := max(r.sch.clock, r.loadFree)
	end = start + seconds(q.loadSec)
	r.loadFree = end
	r.queued = append(r.queued, &queuedLoad{q: q, start: start, gate: gate})
	return end, nil
}

// nextLoad returns the rank and the queued transfer that starts first, earliest rank first on a
// tie; nil when none is queued.
func (o *offline) nextLoad() (*rank, *queuedLoad) {
	var br *rank
	var bl *queuedLoad
	for _, r := range o.ranks {
		if len(r.queued) == 0 {
			continue
		}
		if l := r.queued[0]; bl == nil || l.start < bl.start {
			br, bl = r, l
		}
	}
	return br, bl
}

// runLoad starts r's first queued transfer at the current virtual time and waits for the
// worker to report it. A transfer that lost a page restarts its request.
func (o *offline) runLoad(r *rank) error {
	l := r.queued[0]
	r.queued = r.queued[1:]
	// No finished save is left to report, so GetFinished below reports only the load.
	if err := o.drain(); err != nil {
		return err
	}
	began := time.Now()
	id := l.q.q.ID
	l.gate.release()
	var failed []string
	for {
		_, done, err := r.local.GetFinished(o.ctx, nil, nil)
		if err != nil {
			return fmt.Errorf("request %s: asynchronous load: %w", id, err)
		}
		f, err := r.local.TakeFailedAsyncLoadRequests(o.ctx)
		if err != nil {
			return err
		}
		failed = append(failed, f...)
		if slices.Contains(done, id) {
			break
		}
		if err := o.ctx.Err(); err != nil {
			return err
		}
		runtime.Gosched()
	}
	o.wall.load += time.Since(began)
	if !slices.Contains(failed, id) {
		return nil
	}
	o.run.FailedLoads++
	q := l.q
	if err := r.local.RequestReset(o.ctx, id); err != nil {
		return err
	}
	if err := r.mgr.Revert(q.mid); err != nil {
		return err
	}
	r.sch.running = slices.DeleteFunc(r.sch.running, func(x *schedReq) bool { return x == q })
	q.reset()
	r.sch.waiting = slices.Insert(r.sch.waiting, 0, q)
	return nil
}
