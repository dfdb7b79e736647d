package mooncake

import (
	"context"
	"sort"
	"time"
)

// ReplicaDesc is one memory replica as the master's admin API shows it (the C++
// AllocatedBuffer::Descriptor, with its trailing-underscore JSON names).
type ReplicaDesc struct {
	Size              uint64 `json:"size_"`
	BufferAddress     uint64 `json:"buffer_address_"`
	Protocol          string `json:"protocol_"`
	TransportEndpoint string `json:"transport_endpoint_"`
}

// KeyQuery is the read-only answer for one key of a batch query: either OK with its replicas
// or Error with the master's error name (e.g. "OBJECT_NOT_FOUND").
type KeyQuery struct {
	OK       bool
	Error    string
	Replicas []ReplicaDesc
}

// Inspector is the read-only view the admin HTTP handler serves. Implementations are safe for
// concurrent use. Only QueryKey has side effects: like the master's /query_key it grants a read
// lease and counts as a get; BatchQuery never changes a lease.
type Inspector interface {
	QueryKey(ctx context.Context, key string) ([]ReplicaDesc, Code)
	BatchQuery(ctx context.Context, keys []string) map[string]KeyQuery
	// Keys lists the readable keys, in no particular order.
	Keys(ctx context.Context) ([]string, error)
	Segments(ctx context.Context) ([]Segment, error)
	Metrics(ctx context.Context) (MetricsSnapshot, error)
}

// MetricsSnapshot is what /metrics and /metrics/summary render, named after the master's
// metrics it feeds.
type MetricsSnapshot struct {
	Stats    Stats
	Segments []Segment
	// Uptime is how long the pool has run; the summary's per-second rates divide by it.
	Uptime time.Duration

	ActiveClients int64
	ValueSizes    Histogram

	ExistRequests, ExistFailedItems         int64 // batch_exist_key calls and failed items
	PutRequests, PutFailedItems             int64 // batch put calls and failed items
	GetRequests, GetItems, GetFailedItems   int64 // batch get calls, items and failed items
	QueryKeyRequests, QueryKeyFailures      int64 // get_replica_list through /query_key
	RemoveRequests, RemoveFailures          int64
	AllocFailures                           int64
	SuccessfulEvictions, AttemptedEvictions int64
	EvictedKeys, EvictedBytes               int64
}

// Histogram is a cumulative histogram with the master's value-size buckets.
type Histogram struct {
	Bounds []float64 // upper bounds, ascending; +Inf is implied
	Counts []uint64  // cumulative count per bound
	Count  uint64
	Sum    float64
}

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

func (h *valueSizeHistogram) snapshot() Histogram {
	out := Histogram{Bounds: append([]float64(nil), valueSizeBuckets...), Sum: h.sum}
	var cum uint64
	for i := range valueSizeBuckets {
		cum += h.counts[i]
		out.Counts = append(out.Counts, cum)
	}
	out.Count = cum + h.counts[len(valueSizeBuckets)]
	return out
}

func (e *Embedded) replicaLocked(o *object) ReplicaDesc {
	return ReplicaDesc{
		Size:              uint64(o.size),
		BufferAddress:     o.seg.base + uint64(o.off),
		Protocol:          "local",
		TransportEndpoint: o.seg.name,
	}
}

// codeName is the master's name for an error code, as its admin API prints it.
func codeName(c Code) string {
	switch c {
	case OK:
		return "OK"
	case ErrInternal:
		return "INTERNAL_ERROR"
	case ErrNoAvailableHandle:
		return "NO_AVAILABLE_HANDLE"
	case ErrInvalidParams:
		return "INVALID_PARAMS"
	case ErrIllegalClient:
		return "ILLEGAL_CLIENT"
	case ErrReplicaNotReady:
		return "REPLICA_IS_NOT_READY"
	case ErrObjectNotFound:
		return "OBJECT_NOT_FOUND"
	case ErrObjectAlreadyExists:
		return "OBJECT_ALREADY_EXISTS"
	case ErrObjectHasLease:
		return "OBJECT_HAS_LEASE"
	case ErrLeaseExpired:
		return "LEASE_EXPIRED"
	case ErrChecksumMismatch:
		return "CHECKSUM_MISMATCH"
	case ErrRPCFail:
		return "RPC_FAIL"
	case ErrUnavailableInThisMode:
		return "UNAVAILABLE_IN_CURRENT_MODE"
	case ErrNotJoined:
		return "NOT_JOINED"
	}
	if n, ok := masterCodeNames[c]; ok {
		return n
	}
	return "UNKNOWN_ERROR"
}

// String returns the master's name for the code.
func (c Code) String() string { return codeName(c) }

// QueryKey implements Inspector: the master's GetReplicaList, so a hit grants a read lease
// (refreshing the object's group) and counts as a get.
func (e *Embedded) QueryKey(ctx context.Context, key string) ([]ReplicaDesc, Code) {
	e.c.queryKey.Add(1)
	if ctx.Err() != nil {
		e.c.queryKeyFail.Add(1)
		return nil, ErrRPCFail
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	o := e.objs[key]
	if o == nil || !o.complete {
		e.c.queryKeyFail.Add(1)
		e.c.misses.Add(1)
		return nil, ErrObjectNotFound
	}
	now := e.clock.Now()
	e.grantLease(o, now, now.Add(e.opts.LeaseTTL))
	return []ReplicaDesc{e.replicaLocked(o)}, OK
}

// BatchQuery implements Inspector. It grants no lease and changes no counter.
func (e *Embedded) BatchQuery(ctx context.Context, ks []string) map[string]KeyQuery {
	out := make(map[string]KeyQuery, len(ks))
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, k := range ks {
		o := e.objs[k]
		if o == nil || !o.complete {
			out[k] = KeyQuery{Error: codeName(ErrObjectNotFound)}
			continue
		}
		out[k] = KeyQuery{OK: true, Replicas: []ReplicaDesc{e.replicaLocked(o)}}
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
func (e *Embedded) Metrics(ctx context.Context) (MetricsSnapshot, error) {
	st, err := e.Stats(ctx)
	if err != nil {
		return MetricsSnapshot{}, err
	}
	segs, err := e.Segments(ctx)
	if err != nil {
		return MetricsSnapshot{}, err
	}
	e.mu.Lock()
	hist := e.hist.snapshot()
	uptime := e.clock.Now().Sub(e.start)
	e.mu.Unlock()
	c := &e.c
	return MetricsSnapshot{
		Stats:               st,
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
