package mooncake

import "github.com/kvctl/kvctl/pool"

// Code is the master's ErrorCode: kvctl's pool codes (pool.Code) are the master's values, so
// Native passes the master's codes through unchanged.
type Code = pool.Code

// The master's codes that kvctl's pool vocabulary shares (package pool defines them).
const (
	OK                       = pool.OK
	ErrInternal              = pool.ErrInternal
	ErrNoAvailableHandle     = pool.ErrNoAvailableHandle
	ErrInvalidParams         = pool.ErrInvalidParams
	ErrIllegalClient         = pool.ErrIllegalClient
	ErrReplicaNotReady       = pool.ErrReplicaNotReady
	ErrObjectNotFound        = pool.ErrObjectNotFound
	ErrObjectAlreadyExists   = pool.ErrObjectAlreadyExists
	ErrObjectHasLease        = pool.ErrObjectHasLease
	ErrLeaseExpired          = pool.ErrLeaseExpired
	ErrChecksumMismatch      = pool.ErrChecksumMismatch
	ErrRPCFail               = pool.ErrRPCFail
	ErrUnavailableInThisMode = pool.ErrUnavailableInThisMode
	ErrNotJoined             = pool.ErrNotJoined
)

// More of the master's error codes (Mooncake ErrorCode, release 0.3.13.post1), as Native
// surfaces them from the master. Mooncake's TRANSFER_FAIL is -800, the value kvctl gave
// ErrChecksumMismatch before it spoke to a real master; that value is a contract and stays,
// so Native reports a failed transfer as ErrRPCFail. Mooncake's own CHECKSUM_MISMATCH is -801.
const (
	ErrBufferOverflow       Code = -10
	ErrSegmentNotFoundCode  Code = -101 // SEGMENT_NOT_FOUND: no segment to allocate from
	ErrSegmentAlreadyExists Code = -102
	ErrClientNotFound       Code = -103
	ErrInvalidVersion       Code = -300
	ErrInvalidKey           Code = -400
	ErrWriteFail            Code = -500
	ErrInvalidWrite         Code = -700
	ErrInvalidRead          Code = -701
	ErrInvalidReplica       Code = -702
	ErrReplicaNotFound      Code = -710
	ErrReplicaAlreadyExists Code = -711
	ErrReplicaIsGone        Code = -712
	ErrObjectReplicaBusy    Code = -714
	ErrMooncakeChecksum     Code = -801 // Mooncake's CHECKSUM_MISMATCH
	ErrRPCTimeout           Code = -901
	ErrNotSupported         Code = -1012
	ErrTenantQuotaExceeded  Code = -1700
	ErrTenantNotRegistered  Code = -1701
)

var masterCodeNames = map[Code]string{
	ErrBufferOverflow:       "BUFFER_OVERFLOW",
	ErrSegmentNotFoundCode:  "SEGMENT_NOT_FOUND",
	ErrSegmentAlreadyExists: "SEGMENT_ALREADY_EXISTS",
	ErrClientNotFound:       "CLIENT_NOT_FOUND",
	ErrInvalidVersion:       "INVALID_VERSION",
	ErrInvalidKey:           "INVALID_KEY",
	ErrWriteFail:            "WRITE_FAIL",
	ErrInvalidWrite:         "INVALID_WRITE",
	ErrInvalidRead:          "INVALID_READ",
	ErrInvalidReplica:       "INVALID_REPLICA",
	ErrReplicaNotFound:      "REPLICA_NOT_FOUND",
	ErrReplicaAlreadyExists: "REPLICA_ALREADY_EXISTS",
	ErrReplicaIsGone:        "REPLICA_IS_GONE",
	ErrObjectReplicaBusy:    "OBJECT_REPLICA_BUSY",
	ErrMooncakeChecksum:     "CHECKSUM_MISMATCH",
	ErrRPCTimeout:           "RPC_TIMEOUT",
	ErrNotSupported:         "NOT_SUPPORTED",
	ErrTenantQuotaExceeded:  "TENANT_QUOTA_EXCEEDED",
	ErrTenantNotRegistered:  "TENANT_NOT_REGISTERED",
}
