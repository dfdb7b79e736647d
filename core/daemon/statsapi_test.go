package daemon_test

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"testing"

	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/embedded"
)

// TestPoolStatsWireMatchesPool: /v1/stats serves a pool's figures as statsapi.PoolStats, the
// neutral ones from pool.Stats and the rest from pool.Stats.Detail by JSON name. Every Detail
// name a backend reports is a field of the wire type, and the embedded pool, the default
// backend, fills every field: its Detail and pool.Stats's neutral fields cover the pool object
// exactly.
func TestPoolStatsWireMatchesPool(t *testing.T) {
	for backend, names := range map[string][]string{"embedded": embedded.StatsDetail, "mooncake": mooncake.NativeStatsDetail} {
		for _, n := range names {
			if !(statsapi.PoolStats{}).HasField(n) {
				t.Errorf("%s reports Detail %q, which /v1/stats's pool object does not have", backend, n)
			}
		}
	}
	o := embedded.DefaultOptions()
	o.Segments = []embedded.SegmentSpec{{Name: "s", Capacity: 1 << 20}}
	e, err := embedded.NewEmbedded(o)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	st, err := e.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := slices.Sorted(func(yield func(string) bool) {
		for n := range st.Detail {
			if !yield(n) {
				return
			}
		}
	})
	if want := slices.Sorted(slices.Values(embedded.StatsDetail)); !slices.Equal(got, want) {
		t.Errorf("the embedded pool's Detail has %q, its StatsDetail lists %q", got, want)
	}
	// The neutral names: the wire fields named like pool.Stats's.
	neutral := map[string]bool{}
	pt := reflect.TypeFor[pool.Stats]()
	wt := reflect.TypeFor[statsapi.PoolStats]()
	for i := range wt.NumField() {
		f := wt.Field(i)
		if _, ok := pt.FieldByName(f.Name); ok {
			neutral[f.Tag.Get("json")] = true
		}
	}
	var wire map[string]json.RawMessage
	b, err := json.Marshal(statsapi.PoolStats{})
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &wire); err != nil {
		t.Fatal(err)
	}
	for n := range wire {
		if _, inDetail := st.Detail[n]; neutral[n] == inDetail {
			t.Errorf("pool field %q: a pool.Stats field %v, in the embedded pool's Detail %v; want exactly one", n, neutral[n], inDetail)
		}
	}
}
