package mooncake_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/pool"
)

// TestRealMasterHonoursPinsAndGroups puts pages with the ReplicateConfig options kvctl sends
// and checks what the real master does with them: the soft-pin count in its metrics, and
// under memory pressure a soft pin with a long TTL and a hard pin survive, a soft pin whose
// TTL ran out does not, and a group is evicted whole.
func TestRealMasterHonoursPinsAndGroups(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{LeaseTTL: 50 * time.Millisecond, HighWatermark: 0.7, EvictionRatio: 0.2})
	n := newNative(t, m, 8<<20)
	ctx := context.Background()
	const size = 128 << 10
	put := func(key string, cfg pool.ReplicateConfig) pool.Code {
		return n.BatchPut(ctx, []string{key}, [][]byte{interopPage(key, size)}, cfg)[0]
	}
	must := func(key string, cfg pool.ReplicateConfig) {
		t.Helper()
		if c := put(key, cfg); c != pool.OK {
			t.Fatalf("put %s = %v", key, c)
		}
	}
	must("pin/short", pool.ReplicateConfig{SoftPinAction: pool.SoftPinEnable, SoftPinTTL: 500 * time.Millisecond})
	must("pin/long", pool.ReplicateConfig{SoftPinAction: pool.SoftPinEnable, SoftPinTTL: time.Hour})
	must("pin/hard", pool.ReplicateConfig{HardPin: true})
	group := []string{"grp/0", "grp/1", "grp/2", "grp/3"}
	bufs := make([][]byte, len(group))
	for i, k := range group {
		bufs[i] = interopPage(k, size)
	}
	for i, c := range n.BatchPut(ctx, group, bufs, pool.ReplicateConfig{GroupIDs: []string{"g", "g", "g", "g"}}) {
		if c != pool.OK {
			t.Fatalf("grouped put %s = %v", group[i], c)
		}
	}
	if v, ok, err := m.Metric(ctx, "master_soft_pin_key_count"); err != nil || !ok || v != 2 {
		t.Fatalf("master_soft_pin_key_count = %v (%v, %v), want the 2 soft-pinned puts", v, ok, err)
	}
	time.Sleep(700 * time.Millisecond) // pin/short's TTL runs out
	admin, err := mooncake.NewAdminClient(m.AdminURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	var filler []string
	for i := 0; i < 400; i++ {
		k := fmt.Sprintf("fill/%d", i)
		if put(k, pool.ReplicateConfig{}) == pool.OK {
			filler = append(filler, k)
		}
		// A group leaves whole: never some members present and others gone. The admin API's
		// batch query is read-only; an existence probe would renew the group's lease.
		if g := fmt.Sprint(readOnlyExist(t, admin, group)); g != "[0 0 0 0]" && g != "[1 1 1 1]" {
			t.Fatalf("after %d filler puts the group is %s: evicted in part", i+1, g)
		}
		time.Sleep(5 * time.Millisecond)
	}
	exist := func(keys ...string) []int { return n.BatchIsExist(ctx, keys) }
	got := exist("pin/short", "pin/long", "pin/hard")
	t.Logf("after %d filler puts: pins %v, group %v", len(filler), got, readOnlyExist(t, admin, group))
	if got[1] != 1 || got[2] != 1 {
		t.Fatalf("pinned pages evicted: long soft pin %d, hard pin %d", got[1], got[2])
	}
	if got[0] != 0 {
		t.Fatalf("the soft pin whose TTL ran out survived the pressure")
	}
	if g := fmt.Sprint(readOnlyExist(t, admin, group)); g != "[0 0 0 0]" {
		t.Fatalf("group after eviction = %s, want all four evicted together", g)
	}
	var present int
	for _, v := range exist(filler...) {
		present += v
	}
	if present == len(filler) {
		t.Fatal("nothing was evicted: the test did not put the pool under pressure")
	}
}

func readOnlyExist(t *testing.T, admin *mooncake.AdminClient, keys []string) []int {
	t.Helper()
	res, err := admin.BatchQueryKeys(context.Background(), keys)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]int, len(keys))
	for i, k := range keys {
		if res[k].OK {
			out[i] = 1
		}
	}
	return out
}
