package embedded

import (
	"context"
	"sort"

	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/pool"
)

// valueSizeBuckets are the master's master_value_size_bytes bucket bounds.
var valueSizeBuckets = []float64{4096, 65536, 262144, 1048576, 4194304, 16777216, 67108864}

type valueSizeHistogram struct {
	counts [8]uint64 // per bucket, not cumulative; the last is +Inf
	sum    float64
}

func (h *valueSizeHistogram) observe(size int64) {
	i := sort.SearchFloat64s(valueSizeBuckets, float64(size))
	h.counts[i]++
	h.sum += float64(size)
}

func (h *valueSizeHistogram) snapshot() mooncake.Histogram {
	out := mooncake.Histogram{Bounds: append([]float64(nil), valueSizeBuckets...), Sum: h.sum}
	var cum uint64
	for i := range valueSizeBuckets {
		cum += h.counts[i]
		out.Counts = append(out.Counts, cum)
	}
	out.Count = cum + h.counts[len(valueSizeBuckets)]
	return out
}

func (e *Embedded) replicaLocked(o *object) mooncake.ReplicaDesc {
	return mooncake.ReplicaDesc{
		Size:              uint64(o.size),
		BufferAddress:     o.seg.base + uint64(o.off),
		Protocol:          "local",
		TransportEndpoint: o.seg.name,
	}
}

// QueryKey implements Inspector: the master's GetReplicaList, so a hit grants a read lease
// (refreshing the object's group) and counts as a get.
func (e *Embedded) QueryKey(ctx context.Context, key string) ([]mooncake.ReplicaDesc, pool.Code) {
	e.c.queryKey.Add(1)
	if ctx.Err() != nil {
		e.c.queryKeyFail.Add(1)
		return nil, pool.ErrRPCFail
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	o := e.objs[key]
	if o == nil || !o.complete {
		e.c.queryKeyFail.Add(1)
		e.c.misses.Add(1)
		return nil, pool.ErrObjectNotFound
	}
	now := e.clock.Now()
	e.grantLease(o, now, now.Add(e.opts.LeaseTTL))
	return []mooncake.ReplicaDesc{e.replicaLocked(o)}, pool.OK
}

// BatchQuery implements Inspector. It grants no lease and changes no counter.
func (e *Embedded) BatchQuery(_ context.Context, ks []string) map[string]mooncake.KeyQuery {
	out := make(map[string]mooncake.KeyQuery, len(ks))
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, k := range ks {
		o := e.objs[k]
		if o == nil || !o.complete {
			out[k] = mooncake.KeyQuery{Error: pool.ErrObjectNotFound.String()}
			continue
		}
		out[k] = mooncake.KeyQuery{OK: true, Replicas: []mooncake.ReplicaDesc{e.replicaLocked(o)}}
	}
	return out
}

// Keys implements Inspector.
func (e *Embedded) Keys(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]string, 0, len(e.objs))
	for k, o := range e.objs {
		if o.complete {
			out = append(out, k)
		}
	}
	return out, nil
}

// Metrics implements Inspector.
func (e *Embedded) Metrics(ctx context.Context) (mooncake.MetricsSnapshot, error) {
	st, err := e.Stats(ctx)
	if err != nil {
		return mooncake.MetricsSnapshot{}, err
	}
	segs, err := e.Segments(ctx)
	if err != nil {
		return mooncake.MetricsSnapshot{}, err
	}
	e.mu.Lock()
	hist := e.hist.snapshot()
	uptime := e.clock.Now().Sub(e.start)
	e.mu.Unlock()
	c := &e.c
	return mooncake.MetricsSnapshot{
		Stats:               st,
		SoftPinned:          st.Detail[DetailSoftPinned],
		ExistProbes:         st.Detail[DetailExistProbes],
		Segments:            segs,
		Uptime:              uptime,
		ActiveClients:       1,
		ValueSizes:          hist,
		ExistRequests:       c.existCalls.Load(),
		ExistFailedItems:    c.existFailedItems.Load(),
		PutRequests:         c.putCalls.Load(),
		PutFailedItems:      c.putFailedItems.Load(),
		GetRequests:         c.getCalls.Load(),
		GetItems:            c.getItems.Load(),
		GetFailedItems:      c.getFailedItems.Load(),
		QueryKeyRequests:    c.queryKey.Load(),
		QueryKeyFailures:    c.queryKeyFail.Load(),
		RemoveRequests:      c.removeCalls.Load(),
		RemoveFailures:      c.removeFailures.Load(),
		AllocFailures:       c.allocFailures.Load(),
		SuccessfulEvictions: c.successfulRounds.Load(),
		AttemptedEvictions:  c.rounds.Load(),
		EvictedKeys:         c.evictedPass1.Load() + c.evictedPass2.Load(),
		EvictedBytes:        c.evictedBytes.Load(),
	}, nil
}
