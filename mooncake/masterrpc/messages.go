package masterrpc

import "fmt"

// UUID is Mooncake's UUID, a pair of u64 (client ids and segment ids).
type UUID [2]uint64

// Segment is the memory a client mounts into the pool (Mooncake Segment).
type Segment struct {
	ID   UUID
	Name string
	// Base and Size are the segment's absolute address range in its owner's Transfer Engine.
	Base uint64
	Size uint64
	// TEEndpoint is the Transfer Engine endpoint; a TCP client sets it to the segment name.
	TEEndpoint string
	Protocol   string
	HostID     string
}

// Soft-pin actions of ReplicateConfig.SoftPinAction.
const (
	SoftPinPreserve uint8 = 0
	SoftPinEnable   uint8 = 1
	SoftPinDisable  uint8 = 2
)

// ReplicaTypeAll is the ReplicaType a put ends or revokes: all of the object's replicas.
const ReplicaTypeAll int32 = 4

// ReplicateConfig is the per-put configuration (Mooncake ReplicateConfig), field for field.
type ReplicateConfig struct {
	ReplicaNum    uint64
	NoFReplicaNum uint64
	DFSReplicaNum uint64
	SoftPinAction uint8
	// SoftPinTTLms is sent when HasSoftPinTTL; otherwise the master's default TTL applies.
	HasSoftPinTTL bool
	SoftPinTTLms  uint64
	WithHardPin   bool

	PreferredSegments     []string
	PreferredSegment      string
	PreferredNoFSegments  []string
	PreferAllocInSameNode bool
	DataType              uint8
	HostID                string
	// GroupIDs, when HasGroupIDs, holds one group per key of the batch ("" for none).
	HasGroupIDs bool
	GroupIDs    []string
}

// Replica kinds: the index of Replica::Descriptor's variant.
const (
	ReplicaMemory    uint8 = 0
	ReplicaNoF       uint8 = 1
	ReplicaDisk      uint8 = 2
	ReplicaLocalDisk uint8 = 3
	ReplicaDFS       uint8 = 4
)

// Replica statuses (Mooncake ReplicaStatus).
const (
	ReplicaProcessing int32 = 2
	ReplicaComplete   int32 = 3
)

// Replica is one replica of an object (Mooncake Replica::Descriptor). Only memory replicas
// carry an address; the other kinds are decoded and reported by kind.
type Replica struct {
	ID     uint64
	Kind   uint8
	Status int32
	// Size, Addr, Protocol and Endpoint describe a memory replica: Size bytes at absolute
	// address Addr in the segment Endpoint names, reachable over Protocol.
	Size     uint64
	Addr     uint64
	Protocol string
	Endpoint string
}

// ReplicaList is GetReplicaListResponse: an object's replicas, the read lease the lookup
// granted, and the object's checksum when its writer sent one.
type ReplicaList struct {
	Replicas    []Replica
	LeaseTTLms  uint64
	HasChecksum bool
	Checksum    uint64
}

// ObjectMeta is PutEnd's ObjectMeta: the key and, when the writer computed it, the object's
// checksum (mooncake.ObjectChecksum), which the master keeps and returns with every replica list.
type ObjectMeta struct {
	Key         string
	HasChecksum bool
	Checksum    uint64
}

// PingResponse is the master's answer to a segment owner's heartbeat.
type PingResponse struct {
	ViewVersion  int64
	ClientStatus int32
}

// Client statuses of PingResponse.ClientStatus (Mooncake ClientStatus).
const (
	ClientUndefined   int32 = 0
	ClientOK          int32 = 1
	ClientNeedRemount int32 = 2
)

// StorageConfig is GetStorageConfigResponse.
type StorageConfig struct {
	FSDir              string
	EnableDiskEviction bool
	QuotaBytes         uint64
}

// Type literals of the messages kvctl sends and receives, as the Mooncake release in
// ProtocolVersion declares them (verified against captured traffic; see docs/mooncake.md).
var (
	tSegment = tuple(tUUID, tString, tU64, tU64, tString, tString, tString)
	tConfig  = tuple(tU64, tU64, tU64, tU8, opt(tU64), tBool, vec(tString), tString,
		vec(tString), tBool, tU8, tString, opt(vec(tString)))
	tMemDesc  = tuple(tuple(tU64, tU64, tString, tString))
	tReplica  = tuple(tU64, variant(tMemDesc, tMemDesc, tuple(tString, tU64), tuple(tUUID, tU64, tString), tuple(tString, tU64, tU64, tU64, tI32)), tI32)
	tObjMeta  = tuple(tString, opt(tU64))
	tRepList  = tuple(vec(tReplica), tU64, opt(tU64))
	tPingResp = tuple(prim(litI64), tI32)

	litKeyTenant      = tuple(tString, tString)
	litKeysTenant     = tuple(vec(tString), tString)
	litMount          = tuple(tSegment, tUUID)
	litRemount        = tuple(vec(tSegment), tUUID)
	litUnmount        = tuple(tUUID, tUUID)
	litPing           = tUUID
	litBatchPutStart  = tuple(tUUID, vec(tString), vec(tU64), tConfig, tString)
	litBatchPutEnd    = tuple(tUUID, vec(tObjMeta), tI32, tString)
	litBatchPutRevoke = tuple(tUUID, vec(tString), tI32, tString)
	litRemove         = tuple(tString, tBool, tString)
	respString        = expected(tString)
	respStorageConfig = expected(tuple(tString, tBool, tU64))
	respVoid          = expected(prim(litVoid))
	respPing          = expected(tPingResp)
	respBatchExist    = vec(expected(tBool))
	respBatchPutStart = vec(expected(vec(tReplica)))
	respBatchVoid     = vec(expected(prim(litVoid)))
	respBatchReplicas = vec(expected(tRepList))
)

func encodeKeysTenant(keys []string, tenant string) []byte {
	return pack(litKeysTenant, func(e *encoder) { e.strs(keys); e.str(tenant) })
}

func (e *encoder) segment(s Segment) {
	e.uuid(s.ID)
	e.str(s.Name)
	e.u64(s.Base)
	e.u64(s.Size)
	e.str(s.TEEndpoint)
	e.str(s.Protocol)
	e.str(s.HostID)
}

func encodeMount(s Segment, client UUID) []byte {
	return pack(litMount, func(e *encoder) { e.segment(s); e.uuid(client) })
}

func encodeRemount(segs []Segment, client UUID) []byte {
	return pack(litRemount, func(e *encoder) {
		e.length(len(segs))
		for _, s := range segs {
			e.segment(s)
		}
		e.uuid(client)
	})
}

func encodeUnmount(segment, client UUID) []byte {
	return pack(litUnmount, func(e *encoder) { e.uuid(segment); e.uuid(client) })
}

func encodePing(client UUID) []byte {
	return pack(litPing, func(e *encoder) { e.uuid(client) })
}

func (e *encoder) config(c ReplicateConfig) {
	e.u64(c.ReplicaNum)
	e.u64(c.NoFReplicaNum)
	e.u64(c.DFSReplicaNum)
	e.u8(c.SoftPinAction)
	e.boolean(c.HasSoftPinTTL)
	if c.HasSoftPinTTL {
		e.u64(c.SoftPinTTLms)
	}
	e.boolean(c.WithHardPin)
	e.strs(c.PreferredSegments)
	e.str(c.PreferredSegment)
	e.strs(c.PreferredNoFSegments)
	e.boolean(c.PreferAllocInSameNode)
	e.u8(c.DataType)
	e.str(c.HostID)
	e.boolean(c.HasGroupIDs)
	if c.HasGroupIDs {
		e.strs(c.GroupIDs)
	}
}

func encodeBatchPutStart(client UUID, keys []string, sizes []uint64, c ReplicateConfig, tenant string) []byte {
	return pack(litBatchPutStart, func(e *encoder) {
		e.uuid(client)
		e.strs(keys)
		e.length(len(sizes))
		for _, s := range sizes {
			e.u64(s)
		}
		e.config(c)
		e.str(tenant)
	})
}

func encodeBatchPutEnd(client UUID, keys []string, tenant string) []byte {
	metas := make([]ObjectMeta, len(keys))
	for i, k := range keys {
		metas[i] = ObjectMeta{Key: k}
	}
	return encodeBatchPutEndMeta(client, metas, tenant)
}

func encodeBatchPutEndMeta(client UUID, metas []ObjectMeta, tenant string) []byte {
	return pack(litBatchPutEnd, func(e *encoder) {
		e.uuid(client)
		e.length(len(metas))
		for _, m := range metas {
			e.str(m.Key)
			e.boolean(m.HasChecksum)
			if m.HasChecksum {
				e.u64(m.Checksum)
			}
		}
		e.i32(ReplicaTypeAll)
		e.str(tenant)
	})
}

func encodeBatchPutRevoke(client UUID, keys []string, tenant string) []byte {
	return pack(litBatchPutRevoke, func(e *encoder) {
		e.uuid(client)
		e.strs(keys)
		e.i32(ReplicaTypeAll)
		e.str(tenant)
	})
}

func encodeRemove(key string, force bool, tenant string) []byte {
	return pack(litRemove, func(e *encoder) { e.str(key); e.boolean(force); e.str(tenant) })
}

// Decoders. Each checks the body's type against the expected literal, bounds every length by
// the bytes that remain, and requires the whole body to be consumed.

func decodeString(body []byte) (string, int32, error) {
	d, err := open(body, respString)
	if err != nil {
		return "", 0, err
	}
	var code int32
	var s string
	if d.expect(&code) {
		s = d.str()
	}
	return s, code, d.done()
}

func decodeStorageConfig(body []byte) (StorageConfig, int32, error) {
	d, err := open(body, respStorageConfig)
	if err != nil {
		return StorageConfig{}, 0, err
	}
	var code int32
	var c StorageConfig
	if d.expect(&code) {
		c.FSDir = d.str()
		c.EnableDiskEviction = d.boolean()
		c.QuotaBytes = d.u64()
	}
	return c, code, d.done()
}

func decodeVoid(body []byte) (int32, error) {
	d, err := open(body, respVoid)
	if err != nil {
		return 0, err
	}
	var code int32
	d.expect(&code)
	return code, d.done()
}

func decodePing(body []byte) (PingResponse, int32, error) {
	d, err := open(body, respPing)
	if err != nil {
		return PingResponse{}, 0, err
	}
	var code int32
	var p PingResponse
	if d.expect(&code) {
		p.ViewVersion = int64(d.u64())
		p.ClientStatus = d.i32()
	}
	return p, code, d.done()
}

// decodeBatchExist returns, per key, 1 present, 0 absent or a negative error code.
func decodeBatchExist(body []byte) ([]int, error) {
	d, err := open(body, respBatchExist)
	if err != nil {
		return nil, err
	}
	n := d.length(2)
	out := make([]int, n)
	for i := 0; i < n && d.err == nil; i++ {
		// The common case, a value, inline: has_value 1 and a bool.
		if b := d.b[d.off:]; len(b) >= 2 && b[0] == 1 && b[1] <= 1 {
			out[i] = int(b[1])
			d.off += 2
			continue
		}
		var code int32
		if d.expect(&code) {
			if d.boolean() {
				out[i] = 1
			}
		} else {
			out[i] = int(code)
		}
	}
	return out, d.done()
}

func (d *decoder) replica() Replica {
	r := Replica{ID: d.u64(), Kind: d.u8()}
	switch r.Kind {
	case ReplicaMemory, ReplicaNoF:
		r.Size = d.u64()
		r.Addr = d.u64()
		r.Protocol = d.strAgain(0)
		r.Endpoint = d.strAgain(1)
	case ReplicaDisk:
		r.Endpoint = d.str()
		r.Size = d.u64()
	case ReplicaLocalDisk:
		d.uuid()
		r.Size = d.u64()
		r.Endpoint = d.str()
	case ReplicaDFS:
		r.Endpoint = d.str()
		r.Size = d.u64()
		d.u64()
		d.u64()
		d.i32()
	default:
		d.fail("replica descriptor variant %d is not one of the 5 kvctl knows", r.Kind)
	}
	r.Status = d.i32()
	return r
}

func (d *decoder) replicas() []Replica {
	n := d.length(13)
	if n == 0 {
		return nil
	}
	out := make([]Replica, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		out = append(out, d.replica())
	}
	return out
}

func (d *decoder) replicaList() ReplicaList {
	l := ReplicaList{Replicas: d.replicas(), LeaseTTLms: d.u64()}
	if l.HasChecksum = d.boolean(); l.HasChecksum {
		l.Checksum = d.u64()
	}
	return l
}

// PutStartResult is one key's answer to BatchPutStart: the replicas to write, or a code.
type PutStartResult struct {
	Replicas []Replica
	Code     int32
}

func decodeBatchPutStart(body []byte) ([]PutStartResult, error) {
	d, err := open(body, respBatchPutStart)
	if err != nil {
		return nil, err
	}
	n := d.length(2)
	out := make([]PutStartResult, n)
	for i := 0; i < n && d.err == nil; i++ {
		if d.expect(&out[i].Code) {
			out[i].Replicas = d.replicas()
		}
	}
	return out, d.done()
}

func decodeBatchVoid(body []byte) ([]int32, error) {
	d, err := open(body, respBatchVoid)
	if err != nil {
		return nil, err
	}
	n := d.length(1)
	out := make([]int32, n)
	for i := 0; i < n && d.err == nil; i++ {
		d.expect(&out[i])
	}
	return out, d.done()
}

// ReplicaListResult is one key's answer to BatchGetReplicaList.
type ReplicaListResult struct {
	List ReplicaList
	Code int32
}

func decodeBatchReplicaList(body []byte) ([]ReplicaListResult, error) {
	d, err := open(body, respBatchReplicas)
	if err != nil {
		return nil, err
	}
	n := d.length(2)
	out := make([]ReplicaListResult, n)
	for i := 0; i < n && d.err == nil; i++ {
		if d.expect(&out[i].Code) {
			out[i].List = d.replicaList()
		}
	}
	return out, d.done()
}

func checkCount(method string, got, want int) error {
	if got != want {
		return fmt.Errorf("%w: %s answered %d results for %d keys", ErrDecode, method, got, want)
	}
	return nil
}
