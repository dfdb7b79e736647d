package statsapi

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/kvctl/kvctl/core/stats"
)

// TestPrefixHolesFieldNames pins the JSON names of the prefix-hole stats /v1/stats serves:
// kvctl stats and dashboards read them.
func TestPrefixHolesFieldNames(t *testing.T) {
	b, err := json.Marshal(StatsJSON{PrefixHoles: stats.HoleStats{Lookups: 1, LookedUpBlocks: 2, HitBlocks: 3, Holes: 4, HoleBlocks: 5, RecomputedStoredTokens: 6}})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		PrefixHoles map[string]int64 `json:"prefix_holes"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"lookups": 1, "looked_up_blocks": 2, "hit_blocks": 3, "holes": 4, "hole_blocks": 5, "recomputed_stored_tokens": 6}
	if len(got.PrefixHoles) != len(want) {
		t.Fatalf("prefix_holes %v, want %v", got.PrefixHoles, want)
	}
	for k, v := range want {
		if got.PrefixHoles[k] != v {
			t.Errorf("prefix_holes.%s = %d, want %d (all: %v)", k, got.PrefixHoles[k], v, got.PrefixHoles)
		}
	}
	var keys []string
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	for k := range top {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	wantTop := []string{"backend", "engines", "hit_rates", "loads", "pool", "prefix_holes", "ready", "saves", "uptime_seconds", "version"}
	if !slices.Equal(keys, wantTop) {
		t.Errorf("top-level fields %q, want %q", keys, wantTop)
	}
}
