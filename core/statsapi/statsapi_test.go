package statsapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
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

// TestPoolFieldNames pins the JSON names, in order, of /v1/stats's "pool" object: kvctl stats,
// dashboards and scripts read them, whichever backend fills them.
func TestPoolFieldNames(t *testing.T) {
	b, err := json.Marshal(PoolStats{})
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	var got []string
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		// Every value of the object is a number, so its strings are its keys.
		if s, ok := tok.(string); ok {
			got = append(got, s)
		}
	}
	want := []string{"capacity_bytes", "used_bytes", "objects", "soft_pinned_objects", "hard_pinned_objects",
		"grouped_objects", "hits", "misses", "puts", "skipped_existing", "put_failures", "bytes_in", "bytes_out",
		"checksum_errors", "eviction_rounds", "evicted_pass1", "evicted_pass2", "evicted_soft_pinned",
		"evicted_grouped", "failed_evictions", "exist_probes", "alloc_failures", "pending_objects", "free_extents",
		"largest_free_bytes", "fragmented_bytes"}
	if !slices.Equal(got, want) {
		t.Errorf("pool fields\n%q\nwant\n%q", got, want)
	}
}
