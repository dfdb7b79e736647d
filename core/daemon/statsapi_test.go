package daemon_test

import (
	"reflect"
	"testing"

	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/mooncake"
)

// TestPoolStatsWireMatchesPool: /v1/stats serves the pool's counters as statsapi.PoolStats, by
// a plain conversion from mooncake.Stats. The conversion compiles only while the fields match;
// this checks the JSON names too, which the conversion ignores.
func TestPoolStatsWireMatchesPool(t *testing.T) {
	pool, wire := reflect.TypeFor[mooncake.Stats](), reflect.TypeFor[statsapi.PoolStats]()
	if pool.NumField() != wire.NumField() {
		t.Fatalf("mooncake.Stats has %d fields, statsapi.PoolStats %d", pool.NumField(), wire.NumField())
	}
	for i := range pool.NumField() {
		p, w := pool.Field(i), wire.Field(i)
		if p.Name != w.Name || p.Tag.Get("json") != w.Tag.Get("json") {
			t.Errorf("field %d: mooncake.Stats %s %q, statsapi.PoolStats %s %q", i, p.Name, p.Tag.Get("json"), w.Name, w.Tag.Get("json"))
		}
	}
}
