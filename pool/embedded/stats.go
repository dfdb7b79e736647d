package embedded

import "github.com/kvctl/kvctl/pool"

// Stats is a snapshot of the embedded pool's counters and occupancy (Embedded.Snapshot).
// Counters only grow. Its JSON names are those of /v1/stats's pool object.
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

// StatsDetail lists the figures of Stats that are not pool.Stats fields, by the JSON names
// Stats.Pool files them under in pool.Stats.Detail.
var StatsDetail = []string{"soft_pinned_objects", "hard_pinned_objects", "grouped_objects",
	"eviction_rounds", "evicted_pass1", "evicted_pass2", "evicted_soft_pinned", "evicted_grouped",
	"failed_evictions", "exist_probes", "pending_objects", "free_extents", "largest_free_bytes",
	"fragmented_bytes"}

// Pool returns the figures as every backend reports them, this pool's own in Detail.
func (s Stats) Pool() pool.Stats {
	return pool.Stats{
		CapacityBytes: s.CapacityBytes, UsedBytes: s.UsedBytes, Objects: s.Objects,
		Hits: s.Hits, Misses: s.Misses, Puts: s.Puts, SkippedExisting: s.SkippedExisting,
		PutFailures: s.PutFailures, BytesIn: s.BytesIn, BytesOut: s.BytesOut,
		ChecksumErrors: s.ChecksumErrors, AllocFailures: s.AllocFailures,
		Evicted: s.EvictedPass1 + s.EvictedPass2,
		Detail: map[string]int64{
			"soft_pinned_objects": s.SoftPinned, "hard_pinned_objects": s.HardPinned,
			"grouped_objects": s.Grouped, "eviction_rounds": s.EvictionRounds,
			"evicted_pass1": s.EvictedPass1, "evicted_pass2": s.EvictedPass2,
			"evicted_soft_pinned": s.EvictedSoftPinned, "evicted_grouped": s.EvictedGrouped,
			"failed_evictions": s.FailedEvictions, "exist_probes": s.ExistProbes,
			"pending_objects": s.PendingObjects, "free_extents": s.FreeExtents,
			"largest_free_bytes": s.LargestFreeBytes, "fragmented_bytes": s.FragmentedBytes,
		},
	}
}
