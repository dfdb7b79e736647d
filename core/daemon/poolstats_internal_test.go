package daemon

import (
	"testing"

	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/embedded"
)

// TestPoolStatsJSONCarriesDetail: the embedded pool's figures reach /v1/stats's pool object
// unchanged through pool.Stats, the neutral ones as fields and the rest by name from Detail,
// and together they fill every field of the pool object.
func TestPoolStatsJSONCarriesDetail(t *testing.T) {
	ps := pool.Stats{CapacityBytes: 1, UsedBytes: 2, Objects: 3,
		Hits: 7, Misses: 8, Puts: 9, SkippedExisting: 10, PutFailures: 11, BytesIn: 12, BytesOut: 13,
		ChecksumErrors: 14, AllocFailures: 22, Evicted: 16 + 17,
		Detail: map[string]int64{
			embedded.DetailSoftPinned: 4, embedded.DetailHardPinned: 5, embedded.DetailGrouped: 6,
			embedded.DetailEvictionRounds: 15, embedded.DetailEvictedPass1: 16, embedded.DetailEvictedPass2: 17,
			embedded.DetailEvictedSoftPinned: 18, embedded.DetailEvictedGrouped: 19, embedded.DetailFailedEvictions: 20,
			embedded.DetailExistProbes: 21, embedded.DetailPendingObjects: 23, embedded.DetailFreeExtents: 24,
			embedded.DetailLargestFreeBytes: 25, embedded.DetailFragmentedBytes: 26,
			"not_a_pool_field": 99,
		}}
	want := statsapi.PoolStats{CapacityBytes: 1, UsedBytes: 2, Objects: 3, SoftPinned: 4, HardPinned: 5, Grouped: 6,
		Hits: 7, Misses: 8, Puts: 9, SkippedExisting: 10, PutFailures: 11, BytesIn: 12, BytesOut: 13,
		ChecksumErrors: 14, EvictionRounds: 15, EvictedPass1: 16, EvictedPass2: 17, EvictedSoftPinned: 18,
		EvictedGrouped: 19, FailedEvictions: 20, ExistProbes: 21, AllocFailures: 22, PendingObjects: 23,
		FreeExtents: 24, LargestFreeBytes: 25, FragmentedBytes: 26}
	if got := poolStatsJSON(ps); got != want {
		t.Errorf("through pool.Stats: %+v\nwant %+v", got, want)
	}
	if len(embedded.StatsDetail) != len(ps.Detail)-1 {
		t.Errorf("embedded.StatsDetail names %d figures, the test sets %d", len(embedded.StatsDetail), len(ps.Detail)-1)
	}
	for _, n := range embedded.StatsDetail {
		if _, ok := ps.Detail[n]; !ok {
			t.Errorf("embedded.StatsDetail name %q is not set by this test", n)
		}
	}
}
