package statsapi

// Backend kinds, as /v1/stats and the banner name them.
const (
	BackendEmbedded = "embedded"
	BackendMooncake = "mooncake"
)

// BackendInfo describes the backend for the banner, /v1/stats and `kvctl stats`. Field names
// are a compatibility contract.
type BackendInfo struct {
	// Kind is BackendEmbedded or BackendMooncake.
	Kind string `json:"kind"`
	// Master is the Mooncake master's host:port; empty for the embedded pool.
	Master string `json:"master,omitempty"`
	// Metadata is the Transfer Engine metadata server URL (or P2PHANDSHAKE).
	Metadata string `json:"metadata,omitempty"`
	// HostAddress is the address peers reach this host's segment at.
	HostAddress string `json:"host_address,omitempty"`
	// Protocol is the transfer protocol ("tcp").
	Protocol string `json:"protocol,omitempty"`
	// Segment names the memory this host donates to the pool.
	Segment string `json:"segment"`
	// SegmentBytes is that memory's size.
	SegmentBytes int64 `json:"segment_bytes"`
	// LocalBufferBytes is the client's registered transfer buffer; 0 for the embedded pool.
	LocalBufferBytes int64 `json:"local_buffer_bytes,omitempty"`
}

// BackendStatusJSON is the "backend" object of /v1/stats. Field names are a compatibility
// contract.
type BackendStatusJSON struct {
	BackendInfo
	// SegmentMounted is true once this host's segment is part of the pool.
	SegmentMounted bool `json:"segment_mounted"`
	// MasterReachable is false while pings to the master fail (always true when embedded).
	MasterReachable bool `json:"master_reachable"`
	// UnreadyReason says why /readyz answers 503; empty when ready.
	UnreadyReason string `json:"unready_reason,omitempty"`
	// ClusterSegments and ClusterCapacityBytes sum every segment of the pool, this host's and
	// its peers'; ClusterUsedBytes is what they hold.
	ClusterSegments      int   `json:"cluster_segments"`
	ClusterCapacityBytes int64 `json:"cluster_capacity_bytes"`
	ClusterUsedBytes     int64 `json:"cluster_used_bytes"`
	// Mounts counts successful Mount calls: more than one means the daemon waited for the
	// segment again after the master was unreachable.
	Mounts int64 `json:"mounts"`
	// SegmentRemounts counts the times the client mounted the segment again on a master that
	// had lost it (restarted); 0 for the embedded pool.
	SegmentRemounts int64 `json:"segment_remounts"`
	// LookupKeysFromKept counts keys that lookups answered from the replica lists an earlier
	// lookup kept (inside the first half of --locate-window), without asking the master; 0 for
	// the embedded pool.
	LookupKeysFromKept int64 `json:"lookup_keys_from_kept"`
	// PoolCallFailures counts calls that failed or timed out, and pages that a save dropped.
	PoolCallFailures PoolFailuresJSON `json:"pool_call_failures"`
	// SegmentServed counts what peers read from and wrote to this host's segment; absent for
	// the embedded pool.
	SegmentServed *SegmentServedJSON `json:"segment_served,omitempty"`
}

// SegmentServedJSON counts peer transfers of this host's segment. Field names are a
// compatibility contract.
type SegmentServedJSON struct {
	PeerReads    uint64 `json:"peer_reads"`
	PeerWrites   uint64 `json:"peer_writes"`
	BytesRead    uint64 `json:"bytes_read_by_peers"`
	BytesWritten uint64 `json:"bytes_written_by_peers"`
}

// PoolFailuresJSON counts what the pool did not do for the engines. Field names are a
// compatibility contract.
type PoolFailuresJSON struct {
	// Timeouts are pool calls cut off at the daemon's pool timeout.
	Timeouts int64 `json:"timeouts"`
	// LookupKeys are keys whose existence probe failed (answered as a miss).
	LookupKeys int64 `json:"lookup_keys"`
	// DroppedSavePages are pages a save did not store (the engine goes on; the page is missing).
	DroppedSavePages int64 `json:"dropped_save_pages"`
	// LoadPages are pages a load did not get; their requests are restarted.
	LoadPages int64 `json:"load_pages"`
}
