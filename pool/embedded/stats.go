package embedded

// The embedded pool's own figures, beyond what every backend reports in pool.Stats: the keys
// of its pool.Stats.Detail, which are the JSON names /v1/stats's pool object gives them.
const (
	// DetailSoftPinned counts stored objects whose soft pin has not expired.
	DetailSoftPinned = "soft_pinned_objects"
	// DetailHardPinned counts stored hard-pinned objects.
	DetailHardPinned = "hard_pinned_objects"
	// DetailGrouped counts stored objects that belong to a group.
	DetailGrouped = "grouped_objects"
	// DetailEvictionRounds counts eviction rounds run.
	DetailEvictionRounds = "eviction_rounds"
	// DetailEvictedPass1 and DetailEvictedPass2 count objects evicted by each pass; their sum
	// is pool.Stats.Evicted.
	DetailEvictedPass1 = "evicted_pass1"
	DetailEvictedPass2 = "evicted_pass2"
	// DetailEvictedSoftPinned counts soft-pinned objects evicted (by pass 2).
	DetailEvictedSoftPinned = "evicted_soft_pinned"
	// DetailEvictedGrouped counts objects evicted along with their group.
	DetailEvictedGrouped = "evicted_grouped"
	// DetailFailedEvictions counts eviction rounds that freed nothing.
	DetailFailedEvictions = "failed_evictions"
	// DetailExistProbes counts keys asked about by existence probes.
	DetailExistProbes = "exist_probes"
	// DetailPendingObjects counts objects whose put has allocated memory but not finished
	// copying.
	DetailPendingObjects = "pending_objects"
	// DetailFreeExtents, DetailLargestFreeBytes and DetailFragmentedBytes describe free
	// space: the free ranges, the largest of them, and the free bytes the largest range of
	// each segment does not cover, summed over segments (free bytes an object of the largest
	// free size could not use).
	DetailFreeExtents      = "free_extents"
	DetailLargestFreeBytes = "largest_free_bytes"
	DetailFragmentedBytes  = "fragmented_bytes"
)

// StatsDetail lists the keys of the embedded pool's pool.Stats.Detail (its registry entry's
// Backend.StatsDetail).
var StatsDetail = []string{DetailSoftPinned, DetailHardPinned, DetailGrouped,
	DetailEvictionRounds, DetailEvictedPass1, DetailEvictedPass2, DetailEvictedSoftPinned, DetailEvictedGrouped,
	DetailFailedEvictions, DetailExistProbes, DetailPendingObjects, DetailFreeExtents, DetailLargestFreeBytes,
	DetailFragmentedBytes}
