package daemon_test

import (
	"reflect"
	"testing"

	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/pool/embedded"
)

// TestPoolStatsWireMatchesPool: /v1/stats serves the embedded pool's figures as
// statsapi.PoolStats, the neutral ones from pool.Stats and the rest from pool.Stats.Detail by
// JSON name. The embedded pool's own Stats has every field of the wire type under the same
// JSON name, and every Detail name a backend reports is a field of the wire type.
func TestPoolStatsWireMatchesPool(t *testing.T) {
	emb, wire := reflect.TypeFor[embedded.Stats](), reflect.TypeFor[statsapi.PoolStats]()
	if emb.NumField() != wire.NumField() {
		t.Fatalf("embedded.Stats has %d fields, statsapi.PoolStats %d", emb.NumField(), wire.NumField())
	}
	for i := range emb.NumField() {
		p, w := emb.Field(i), wire.Field(i)
		if p.Name != w.Name || p.Tag.Get("json") != w.Tag.Get("json") {
			t.Errorf("field %d: embedded.Stats %s %q, statsapi.PoolStats %s %q", i, p.Name, p.Tag.Get("json"), w.Name, w.Tag.Get("json"))
		}
	}
	for backend, names := range map[string][]string{"embedded": embedded.StatsDetail, "mooncake": mooncake.NativeStatsDetail} {
		for _, n := range names {
			if !(statsapi.PoolStats{}).HasField(n) {
				t.Errorf("%s reports Detail %q, which /v1/stats's pool object does not have", backend, n)
			}
		}
	}
}
