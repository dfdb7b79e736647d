package replay

import (
	"context"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/kvctl/kvctl/core/stats"
	"github.com/kvctl/kvctl/pool"
)

// countingPool counts what the connector's workers write and read, and folds the existence
// answer of each scheduler lookup into prefix-hole stats exactly as the connector's own stats
// do (stats.FoldLookup over the same answer; the offline layout has one key per block), which
// spares the connector's stats reporter and its per-load thread-time syscalls.
type countingPool struct {
	pool.Pool
	putOK, putFailed, gotPages atomic.Int64
	saveNanos                  atomic.Int64

	// lookup is set by the replay loop around Scheduler.Lookup, when no save is in flight, so
	// the existence call it sees is the lookup's.
	lookup bool
	T      int
	holes  stats.HoleStats
}

func (c *countingPool) BatchIsExist(ctx context.Context, ks []string) []int {
	out := c.Pool.BatchIsExist(ctx, ks)
	if c.lookup {
		complete := make([]bool, len(ks))
		if len(out) == len(ks) {
			for i, v := range out {
				complete[i] = v == 1
			}
		}
		_, h := stats.FoldLookup(complete, c.T)
		c.holes.Add(h)
	}
	return out
}

func (c *countingPool) BatchPut(ctx context.Context, ks []string, bufs [][]byte, cfg pool.ReplicateConfig) []pool.Code {
	began := time.Now()
	codes := c.Pool.BatchPut(ctx, ks, bufs, cfg)
	c.saveNanos.Add(int64(time.Since(began)))
	for _, code := range codes {
		if code == pool.OK {
			c.putOK.Add(1)
		} else if code != pool.ErrObjectAlreadyExists {
			c.putFailed.Add(1)
		}
	}
	return codes
}

func (c *countingPool) BatchGet(ctx context.Context, ks []string, bufs [][]byte) []int64 {
	out := c.Pool.BatchGet(ctx, ks, bufs)
	for _, n := range out {
		if n > 0 {
			c.gotPages.Add(1)
		}
	}
	return out
}

// advance moves the pool clock to at, running on the way, in virtual-time order, the eviction
// thread's ticks and the starts of the asynchronous transfers queued on the ranks' load workers
// (asyncload.go). A tick that does not fire means none will until the next put, so the later
// ticks are skipped (a transfer only reads).
func (o *offline) advance(at time.Duration) error {
	began := time.Now()
	defer func() { o.wall.evict += time.Since(began) }()
	ticking := true
	for {
		r, l := o.nextLoad()
		due := l != nil && l.start <= at
		if due && (!ticking || o.tick > at || l.start <= o.tick) {
			o.moveClock(l.start)
			if err := o.runLoad(r); err != nil {
				return err
			}
			continue
		}
		if !ticking || o.tick > at {
			break
		}
		o.moveClock(o.tick)
		o.tick += o.p.TickInterval
		if _, ran := o.emb.EvictNow(); !ran {
			ticking = false
			o.tick = (at/o.p.TickInterval + 1) * o.p.TickInterval
		}
	}
	o.moveClock(at)
	return nil
}

// moveClock moves the pool clock forward to at.
func (o *offline) moveClock(at time.Duration) {
	if at > o.now {
		o.clock.Advance(at - o.now)
		o.now = at
	}
}

func (o *offline) usedBytes() int64 {
	segs, err := o.emb.Segments(context.Background())
	if err != nil {
		return 0
	}
	var used int64
	for _, s := range segs {
		used += s.Used
	}
	return used
}

func (o *offline) occupancy() float64 {
	capBytes := int64(0)
	segs, err := o.emb.Segments(context.Background())
	if err != nil {
		return 0
	}
	var used int64
	for _, s := range segs {
		capBytes += s.Capacity
		used += s.Used
	}
	if capBytes == 0 {
		return 0
	}
	return float64(used) / float64(capBytes)
}

// settleSaves waits until every save queued on any rank has been written, so that the eviction
// ticks the next pass runs see the same pool whatever the save goroutines' timing: in virtual
// time a pass's saves are done before time moves on.
func (o *offline) settleSaves() error {
	began := time.Now()
	for _, r := range o.ranks {
		if r.w == nil {
			continue
		}
		if err := r.w.WaitSaves(o.ctx); err != nil {
			return err
		}
	}
	o.wall.save += time.Since(began)
	return nil
}

// drain waits until every rank's finished requests have their saves done, so that the pool
// state the next lookup or eviction tick sees follows arrival order, whatever the save
// goroutines' timing. Saves overlap the replay's own work until then.
func (o *offline) drain() error {
	began := time.Now()
	waited := false
	for _, r := range o.ranks {
		if len(r.saving) == 0 {
			continue
		}
		waited = true
		if !o.c.Scheduler {
			if err := r.eng.drain(o.ctx); err != nil {
				return err
			}
			r.saving = r.saving[:0]
			continue
		}
		gen := r.saving
		left := len(r.saving)
		for left > 0 {
			fs, _, err := r.local.GetFinished(o.ctx, gen, nil)
			if err != nil {
				return err
			}
			gen = nil
			left -= len(fs)
			if left > 0 {
				runtime.Gosched()
			}
		}
		r.saving = r.saving[:0]
	}
	if waited {
		if u := o.usedBytes(); u > o.peakUsed {
			o.peakUsed = u
		}
	}
	o.wall.save += time.Since(began)
	return nil
}
