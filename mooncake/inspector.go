package mooncake

import (
	"context"
	"time"

	"github.com/kvctl/kvctl/pool"
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
	Segments(ctx context.Context) ([]pool.Segment, error)
	Metrics(ctx context.Context) (MetricsSnapshot, error)
}

// MetricsSnapshot is what /metrics and /metrics/summary render, named after the master's
// metrics it feeds.
type MetricsSnapshot struct {
	// Stats holds the pool's counters; SoftPinned and ExistProbes are the master's figures
	// that are not every backend's.
	Stats       pool.Stats
	SoftPinned  int64
	ExistProbes int64
	Segments    []pool.Segment
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

// codeName is the master's name for an error code, as its admin API prints it.
func codeName(c Code) string { return c.String() }

func init() { pool.RegisterCodeNames(masterCodeNames) }
