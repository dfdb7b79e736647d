package daemon

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/pool"
)

// guardedPool is the pool as the connectors see it: every call carries the daemon's pool
// timeout, and what failed is counted. An existence probe that outlives the timeout is also
// abandoned (it holds no caller buffer), so a lookup answers miss on time even from a pool that
// ignores its context; puts and gets read or fill the caller's buffers and so are only ever cut
// off through their context.
type guardedPool struct {
	pool.Pool
	timeout time.Duration

	timeouts, lookupKeys, droppedPages, loadPages atomic.Int64
	m                                             guardMetrics
}

type guardMetrics struct {
	timeouts *prometheus.CounterVec
	failed   *prometheus.CounterVec
}

// Metric names of the pool guard. They are a contract (pinned in tests).
const (
	metricPoolTimeouts   = "kvctl_pool_call_timeouts_total"
	metricPoolFailedKeys = "kvctl_pool_failed_keys_total"
)

func newGuardedPool(p pool.Pool, timeout time.Duration, reg prometheus.Registerer) *guardedPool {
	g := &guardedPool{Pool: p, timeout: timeout}
	g.m.timeouts = prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricPoolTimeouts,
		Help: "Pool calls cut off at the pool timeout, by operation."}, []string{"op"})
	g.m.failed = prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricPoolFailedKeys,
		Help: "Keys a pool call failed for, by operation: exist answered as a miss, put dropped, get restarted."}, []string{"op"})
	reg.MustRegister(g.m.timeouts, g.m.failed)
	return g
}

func (g *guardedPool) failures() statsapi.PoolFailuresJSON {
	if g == nil {
		return statsapi.PoolFailuresJSON{}
	}
	return statsapi.PoolFailuresJSON{Timeouts: g.timeouts.Load(), LookupKeys: g.lookupKeys.Load(),
		DroppedSavePages: g.droppedPages.Load(), LoadPages: g.loadPages.Load()}
}

func (g *guardedPool) timedOut(ctx context.Context, op string) {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		g.timeouts.Add(1)
		g.m.timeouts.WithLabelValues(op).Inc()
	}
}

func (g *guardedPool) failed(op string, ctr *atomic.Int64, n int) {
	if n > 0 {
		ctr.Add(int64(n))
		g.m.failed.WithLabelValues(op).Add(float64(n))
	}
}

// BatchIsExist probes within the timeout; past it every key answers ErrRPCFail.
func (g *guardedPool) BatchIsExist(ctx context.Context, keys []string) []int {
	return g.probe(ctx, keys, g.Pool.BatchIsExist)
}

// BatchLocate is the lookup's probe (pool.Locate) within the same timeout and accounting as
// BatchIsExist.
func (g *guardedPool) BatchLocate(ctx context.Context, keys []string) []int {
	return g.probe(ctx, keys, func(ctx context.Context, keys []string) []int { return pool.Locate(ctx, g.Pool, keys) })
}

func (g *guardedPool) probe(ctx context.Context, keys []string, call func(context.Context, []string) []int) []int {
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	done := make(chan []int, 1)
	go func() { done <- call(ctx, keys) }()
	var out []int
	select {
	case out = <-done:
	case <-ctx.Done():
		out = make([]int, len(keys))
		for i := range out {
			out[i] = int(pool.ErrRPCFail)
		}
	}
	g.timedOut(ctx, "exist")
	bad := 0
	for _, v := range out {
		if v < 0 {
			bad++
		}
	}
	if len(out) != len(keys) {
		bad = len(keys)
	}
	g.failed("exist", &g.lookupKeys, bad)
	return out
}

// BatchPut stores within the timeout and counts the pages it dropped.
func (g *guardedPool) BatchPut(ctx context.Context, keys []string, bufs [][]byte, cfg pool.ReplicateConfig) []pool.Code {
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	return g.countPut(ctx, g.Pool.BatchPut(ctx, keys, bufs, cfg), len(keys))
}

// countPut counts a put of n keys that answered out: a timeout when ctx's deadline passed, and
// the pages it dropped.
func (g *guardedPool) countPut(ctx context.Context, out []pool.Code, n int) []pool.Code {
	g.timedOut(ctx, "put")
	bad := 0
	for _, c := range out {
		if c < 0 && c != pool.ErrObjectAlreadyExists {
			bad++
		}
	}
	if len(out) != n {
		bad = n
	}
	g.failed("put", &g.droppedPages, bad)
	return out
}

// BatchGet loads within the timeout and counts the pages it did not get.
func (g *guardedPool) BatchGet(ctx context.Context, keys []string, bufs [][]byte) []int64 {
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	return g.countGet(ctx, g.Pool.BatchGet(ctx, keys, bufs), len(keys))
}

// countGet counts a get of n keys that answered out: a timeout when ctx's deadline passed, and
// the pages it did not get.
func (g *guardedPool) countGet(ctx context.Context, out []int64, n int) []int64 {
	g.timedOut(ctx, "get")
	bad := 0
	for _, v := range out {
		if v < 0 {
			bad++
		}
	}
	if len(out) != n {
		bad = n
	}
	g.failed("get", &g.loadPages, bad)
	return out
}

// getPieces is BatchGet into values' pieces through pc (the guarded backend's
// pool.PieceCopier), within the timeout and counted as BatchGet.
func (g *guardedPool) getPieces(ctx context.Context, pc pool.PieceCopier, keys []string, dsts [][][]byte) []int64 {
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	return g.countGet(ctx, pc.BatchGetPieces(ctx, keys, dsts), len(keys))
}

// putPieces is BatchPut of values given as pieces through pc, within the timeout and counted as
// BatchPut.
func (g *guardedPool) putPieces(ctx context.Context, pc pool.PieceCopier, keys []string, srcs [][][]byte, cfg pool.ReplicateConfig) []pool.Code {
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	return g.countPut(ctx, pc.BatchPutPieces(ctx, keys, srcs, cfg), len(keys))
}

// Remove deletes within the timeout.
func (g *guardedPool) Remove(ctx context.Context, key string, force bool) pool.Code {
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	c := g.Pool.Remove(ctx, key, force)
	g.timedOut(ctx, "remove")
	return c
}
