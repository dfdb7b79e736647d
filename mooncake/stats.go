package mooncake

// Stats is a snapshot of a pool's counters and occupancy. Counters only grow.
type Stats struct {
	CapacityBytes int64 `json:"capacity_bytes"`
	UsedBytes     int64 `json:"used_bytes"`
	Objects       int64 `json:"objects"`
	SoftPinned    int64 `json:"soft_pinned_objects"`
	HardPinned    int64 `json:"hard_pinned_objects"`
	Grouped       int64 `json:"grouped_objects"`

	Hits            int64 `json:"hits"`
	Misses          int64 `json:"misses"`
	Puts            int64 `json:"puts"`
	SkippedExisting int64 `json:"skipped_existing"`
	PutFailures     int64 `json:"put_failures"`
	BytesIn         int64 `json:"bytes_in"`
	BytesOut        int64 `json:"bytes_out"`
	ChecksumErrors  int64 `json:"checksum_errors"`

	EvictionRounds    int64 `json:"eviction_rounds"`
	EvictedPass1      int64 `json:"evicted_pass1"`
	EvictedPass2      int64 `json:"evicted_pass2"`
	EvictedSoftPinned int64 `json:"evicted_soft_pinned"`
	EvictedGrouped    int64 `json:"evicted_grouped"`
	FailedEvictions   int64 `json:"failed_evictions"`
	ExistProbes       int64 `json:"exist_probes"`
}
