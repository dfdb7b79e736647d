package pool

import (
	"context"
	"strconv"
	"sync"
	"time"
)

// Code is a per-key result of a pool call: 0 is success and every failure is negative. The
// values are kvctl's contract (logs, the engine API's per-page results, exit codes); they are
// those of the Mooncake master's ErrorCode, where the master has the condition, so a Mooncake
// backend passes its codes through unchanged. A backend may return other negative codes of its
// own; RegisterCodeNames gives them names.
type Code int32

// Error codes every backend uses for these conditions.
const (
	OK                       Code = 0
	ErrInternal              Code = -1
	ErrNoAvailableHandle     Code = -200 // allocation failed: the pool is full
	ErrInvalidParams         Code = -600
	ErrIllegalClient         Code = -601
	ErrReplicaNotReady       Code = -703 // the object exists but is not readable yet
	ErrObjectNotFound        Code = -704
	ErrObjectAlreadyExists   Code = -705
	ErrObjectHasLease        Code = -706
	ErrLeaseExpired          Code = -707
	ErrChecksumMismatch      Code = -800 // a stored page failed its checksum (keys.PageChecksum)
	ErrRPCFail               Code = -900 // the backend could not be reached or answered badly
	ErrUnavailableInThisMode Code = -1011
	// ErrNotJoined: this host has not joined the pool yet (its memory is not mounted), so the
	// pool was not asked. A save page that gets it is not a failed put: whether another host
	// already stored the page is unknown.
	ErrNotJoined Code = -1900
)

var codeNames = map[Code]string{
	OK:                       "OK",
	ErrInternal:              "INTERNAL_ERROR",
	ErrNoAvailableHandle:     "NO_AVAILABLE_HANDLE",
	ErrInvalidParams:         "INVALID_PARAMS",
	ErrIllegalClient:         "ILLEGAL_CLIENT",
	ErrReplicaNotReady:       "REPLICA_IS_NOT_READY",
	ErrObjectNotFound:        "OBJECT_NOT_FOUND",
	ErrObjectAlreadyExists:   "OBJECT_ALREADY_EXISTS",
	ErrObjectHasLease:        "OBJECT_HAS_LEASE",
	ErrLeaseExpired:          "LEASE_EXPIRED",
	ErrChecksumMismatch:      "CHECKSUM_MISMATCH",
	ErrRPCFail:               "RPC_FAIL",
	ErrUnavailableInThisMode: "UNAVAILABLE_IN_CURRENT_MODE",
	ErrNotJoined:             "NOT_JOINED",
}

var (
	extraMu    sync.RWMutex
	extraNames = map[Code]string{}
)

// RegisterCodeNames names a backend's own codes for Code.String. A code of this package keeps
// its name. It is meant for a backend package's init.
func RegisterCodeNames(names map[Code]string) {
	extraMu.Lock()
	defer extraMu.Unlock()
	for c, n := range names {
		if _, ok := codeNames[c]; !ok {
			extraNames[c] = n
		}
	}
}

// String returns the code's name, as the Mooncake master's admin API prints it for the codes
// the master shares, or UNKNOWN_ERROR.
func (c Code) String() string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	extraMu.RLock()
	n, ok := extraNames[c]
	extraMu.RUnlock()
	if ok {
		return n
	}
	return "UNKNOWN_ERROR"
}

// GoString prints the code with its value, for test failures.
func (c Code) GoString() string { return c.String() + "(" + strconv.Itoa(int(c)) + ")" }

// SoftPinAction tells a put what to do with an object's soft pin.
type SoftPinAction uint8

// Soft-pin actions.
const (
	SoftPinPreserve SoftPinAction = 0 // keep whatever pin the object has (the default)
	SoftPinEnable   SoftPinAction = 1 // pin for SoftPinTTL, or the pool's default TTL when zero
	SoftPinDisable  SoftPinAction = 2 // clear the pin
)

// ReplicateConfig carries the per-put options the connector sets (after Mooncake's
// ReplicateConfig, the subset a KV connector uses). A backend without pins or groups accepts
// them and may ignore them; it must still refuse what is invalid (a TTL without SoftPinEnable,
// GroupIDs of the wrong length) with ErrInvalidParams.
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

// PieceCopier is implemented by pools that move a value into, or out of, several pieces of the
// caller's memory as BatchGet and BatchPut move one buffer: a value whose bytes lie apart in
// engine memory (K and V in tensors of their own) is then moved once, with no gather or scatter
// through a buffer of its own. The embedded pool copies each piece in the pass that checks the
// value (keys.ScatterChecksum, keys.GatherChecksum); the Mooncake client reads or writes the
// value in one Transfer Engine request straight into or from the pieces (readv, writev).
type PieceCopier interface {
	// BatchGetPieces is BatchGet with each value's destination given as pieces, filled in
	// order; a key whose pieces hold fewer bytes than its value is ErrInvalidParams.
	BatchGetPieces(ctx context.Context, keys []string, dsts [][][]byte) []int64
	// BatchPutPieces is BatchPut with each value given as pieces, in order.
	BatchPutPieces(ctx context.Context, keys []string, srcs [][][]byte, cfg ReplicateConfig) []Code
}

// Locator is implemented by a pool where finding an object costs a round trip of its own (a
// cluster's master): BatchLocate answers as BatchIsExist does and keeps, for a short while,
// where each present object lives, so that a BatchGet of it soon after does not ask again. A
// probe that is followed by a load of what it found (the connector's lookup) uses it, through
// Locate; a probe whose answer is only counted or shown uses BatchIsExist.
type Locator interface {
	BatchLocate(ctx context.Context, keys []string) []int
}

// Locate probes keys with p's BatchLocate when p is a Locator, else with its BatchIsExist.
func Locate(ctx context.Context, p Pool, keys []string) []int {
	if l, ok := p.(Locator); ok {
		return l.BatchLocate(ctx, keys)
	}
	return p.BatchIsExist(ctx, keys)
}

// Segment is one region of memory (or storage) the pool stores objects in.
type Segment struct {
	Name     string `json:"name"`
	Capacity int64  `json:"capacity_bytes"`
	Used     int64  `json:"used_bytes"`
}
