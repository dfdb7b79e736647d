package mooncake

import (
	"context"
	"time"
)

// Code is a Mooncake error code as the master and its clients report it: 0 is success and every
// failure is negative. Per-key results of the batch calls use these values.
type Code int32

// Error codes, with the master's values (Mooncake ErrorCode).
const (
	OK                       Code = 0
	ErrInternal              Code = -1
	ErrNoAvailableHandle     Code = -200 // allocation failed: the pool is full
	ErrInvalidParams         Code = -600
	ErrIllegalClient         Code = -601
	ErrReplicaNotReady       Code = -703
	ErrObjectNotFound        Code = -704
	ErrObjectAlreadyExists   Code = -705
	ErrObjectHasLease        Code = -706
	ErrLeaseExpired          Code = -707
	ErrChecksumMismatch      Code = -800 // kvctl only: a stored page failed its checksum (keys.PageChecksum)
	ErrRPCFail               Code = -900
	ErrUnavailableInThisMode Code = -1011
	// ErrNotJoined is kvctl's: this host has not joined the pool yet (its segment is not
	// mounted with the master), so the pool was not asked. A save page that gets it is not a
	// failed put: whether another host already stored the page is unknown.
	ErrNotJoined Code = -1900
)

// SoftPinAction tells a put what to do with an object's soft pin (Mooncake SoftPinAction).
type SoftPinAction uint8

// Soft-pin actions.
const (
	SoftPinPreserve SoftPinAction = 0 // keep whatever pin the object has (the default)
	SoftPinEnable   SoftPinAction = 1 // pin for SoftPinTTL, or the pool's default TTL when zero
	SoftPinDisable  SoftPinAction = 2 // clear the pin
)

// ReplicateConfig carries the per-put options the connector sets (Mooncake ReplicateConfig,
// the subset a KV connector uses).
type ReplicateConfig struct {
	// SoftPinAction and SoftPinTTL set a fixed-deadline soft pin. A TTL is only valid with
	// SoftPinEnable; a TTL above the pool's ceiling refuses the put with ErrInvalidParams.
	SoftPinAction SoftPinAction
	SoftPinTTL    time.Duration
	// HardPin keeps the object out of eviction entirely.
	HardPin bool
	// GroupIDs, when non-nil, has one entry per key of the batch ("" for ungrouped). A group's
	// members are evicted together and a hit on one refreshes the lease of all.
	GroupIDs []string
}

// Pool is the KV page pool the connector, probe and replay use. Implementations are safe for
// concurrent use by many goroutines.
//
// Buffers are owned by the caller: BatchPut copies each buffer into pool memory before it
// returns and BatchGet copies into the caller's buffers; neither keeps a reference afterwards.
type Pool interface {
	// BatchIsExist reports, per key, 1 when the object is present and readable, 0 when it is
	// absent, and a negative Code when the probe failed.
	BatchIsExist(ctx context.Context, keys []string) []int
	// BatchPut stores bufs[i] under keys[i] and returns a Code per key. A put never overwrites:
	// a key that already holds a complete object is OK without a write.
	BatchPut(ctx context.Context, keys []string, bufs [][]byte, cfg ReplicateConfig) []Code
	// BatchGet copies each object into bufs[i] and returns, per key, the number of bytes copied
	// or a negative Code (ErrObjectNotFound, ErrInvalidParams when the buffer is too small,
	// ErrChecksumMismatch when the stored bytes no longer match their checksum).
	BatchGet(ctx context.Context, keys []string, bufs [][]byte) []int64
	// Remove deletes one object. Without force an object under a read lease is kept and
	// ErrObjectHasLease is returned.
	Remove(ctx context.Context, key string, force bool) Code
	// Segments lists the memory segments that make up the pool.
	Segments(ctx context.Context) ([]Segment, error)
	// Stats returns a snapshot of the pool's counters.
	Stats(ctx context.Context) (Stats, error)
}

// Segment is one mounted memory segment.
type Segment struct {
	Name     string `json:"name"`
	Capacity int64  `json:"capacity_bytes"`
	Used     int64  `json:"used_bytes"`
}
