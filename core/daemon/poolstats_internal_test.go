package daemon

import (
	"testing"

	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/pool/embedded"
)

// TestPoolStatsJSONCarriesDetail: the embedded pool's figures reach /v1/stats's pool object
// unchanged through pool.Stats, the neutral ones as fields and the rest by name from Detail.
func TestPoolStatsJSONCarriesDetail(t *testing.T) {
	st := embedded.Stats{CapacityBytes: 1, UsedBytes: 2, Objects: 3, SoftPinned: 4, HardPinned: 5, Grouped: 6,
		Hits: 7, Misses: 8, Puts: 9, SkippedExisting: 10, PutFailures: 11, BytesIn: 12, BytesOut: 13,
		ChecksumErrors: 14, EvictionRounds: 15, EvictedPass1: 16, EvictedPass2: 17, EvictedSoftPinned: 18,
		EvictedGrouped: 19, FailedEvictions: 20, ExistProbes: 21, AllocFailures: 22, PendingObjects: 23,
		FreeExtents: 24, LargestFreeBytes: 25, FragmentedBytes: 26}
	ps := st.Pool()
	if got, want := poolStatsJSON(ps), statsapi.PoolStats(st); got != want {
		t.Errorf("through pool.Stats: %+v\nwant %+v", got, want)
	}
	if ps.Evicted != 16+17 {
		t.Errorf("Evicted = %d, want pass 1 + pass 2 = 33", ps.Evicted)
	}
}
