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

	// AllocFailures counts puts refused because no segment had a free range large enough.
	AllocFailures int64 `json:"alloc_failures"`
	// PendingObjects are objects whose put has allocated memory but not finished copying.
	PendingObjects int64 `json:"pending_objects"`
	// FreeExtents, LargestFreeBytes and FragmentedBytes describe free space: FragmentedBytes is
	// free space that the largest free range does not cover, summed over segments (free bytes
	// an object of the largest free size could not use).
	FreeExtents      int64 `json:"free_extents"`
	LargestFreeBytes int64 `json:"largest_free_bytes"`
	FragmentedBytes  int64 `json:"fragmented_bytes"`
}
