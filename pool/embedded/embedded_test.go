package embedded_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/embedded"
	"github.com/kvctl/kvctl/pool/pooltest"
)

const mib = 1 << 20

// unit is the object size of the eviction rule tests: 64 units fill the test pool, as 64 x 1 MiB
// fill the recorded master's segment. Eviction works on object counts, so the size only
// changes how long the tests take.
const unit = 4096

var bg = context.Background()

var epoch = time.Date(2026, 11, 30, 6, 0, 0, 0, time.UTC)

// newPool returns an embedded pool of one 64-unit segment on a manual clock, with no eviction
// goroutine: rounds run only through EvictNow.
func newPool(t testing.TB, mod func(*embedded.Options)) (*embedded.Embedded, *embedded.ManualClock) {
	t.Helper()
	clk := embedded.NewManualClock(epoch)
	o := embedded.DefaultOptions()
	o.Segments = []embedded.SegmentSpec{{Name: "seg0", Capacity: 64 * unit}}
	o.EvictionPeriod = 0
	o.Clock = clk
	if mod != nil {
		mod(&o)
	}
	p, err := embedded.NewEmbedded(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, clk
}

// suite is the shared conformance suite on the embedded pool: two 48 MiB segments.
func suite() *pooltest.Suite {
	newPool := func(t testing.TB) pool.Pool {
		o := embedded.DefaultOptions()
		o.Segments = []embedded.SegmentSpec{{Name: "a", Capacity: 48 * mib}, {Name: "b", Capacity: 48 * mib}}
		p, err := embedded.NewEmbedded(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	return &pooltest.Suite{
		NewPool:      func(t *testing.T) pool.Pool { return newPool(t) },
		NewBenchPool: func(b *testing.B) pool.Pool { return newPool(b) },
	}
}

func TestConformanceEmbedded(t *testing.T) { suite().RunTests(t) }

// BenchmarkSuite runs the shared pool benchmarks on the embedded pool.
func BenchmarkSuite(b *testing.B) { suite().RunBenchmarks(b) }

func mustPut(t testing.TB, p *embedded.Embedded, key string, size int, cfg pool.ReplicateConfig) {
	t.Helper()
	if c := p.BatchPut(bg, []string{key}, [][]byte{make([]byte, size)}, cfg); c[0] != pool.OK {
		t.Fatalf("put %s = %v", key, c[0])
	}
}

// fill puts n one-unit objects named prefix000.., advancing the clock 20 ms before each.
func fill(t testing.TB, p *embedded.Embedded, clk *embedded.ManualClock, prefix string, from, n int, cfg func(i int) pool.ReplicateConfig) []string {
	var ks []string
	for i := from; i < from+n; i++ {
		clk.Advance(20 * time.Millisecond)
		k := fmt.Sprintf("%s%03d", prefix, i)
		c := pool.ReplicateConfig{}
		if cfg != nil {
			c = cfg(i)
		}
		mustPut(t, p, k, unit, c)
		ks = append(ks, k)
	}
	return ks
}

func evictedKeys(r embedded.EvictionRound) []string {
	var out []string
	for _, e := range r.Evicted {
		out = append(out, e.Key)
	}
	sort.Strings(out)
	return out
}

func present(p *embedded.Embedded, ks ...string) []int {
	// BatchQuery grants no lease, so checking presence does not disturb the next round.
	res := p.BatchQuery(bg, ks)
	out := make([]int, len(ks))
	for i, k := range ks {
		if res[k].OK {
			out[i] = 1
		}
	}
	return out
}

func TestOptionsValidate(t *testing.T) {
	if err := embedded.DefaultOptions().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	o := embedded.DefaultOptions()
	o.Segments = nil
	o.LeaseTTL = 0
	o.HighWatermark = 1.5
	o.EvictionRatio = -1
	err := o.Validate()
	if err == nil {
		t.Fatal("want an error")
	}
	for _, field := range []string{"segments", "lease_ttl", "high_watermark", "eviction_ratio"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("error %q does not name %s", err, field)
		}
	}
	d := embedded.DefaultOptions()
	if d.LeaseTTL != 10*time.Second || d.SoftPinTTL != 30*time.Minute || d.MaxSoftPinTTL != 24*time.Hour ||
		!d.AllowEvictSoftPinned || d.EvictionRatio != 0.05 || d.HighWatermark != 0.90 ||
		d.EvictionPeriod != 10*time.Millisecond || !d.ExistRenewsLease {
		t.Errorf("defaults differ from the master's: %+v", d)
	}
}

func TestWatermarkTrigger(t *testing.T) {
	p, clk := newPool(t, nil)
	fill(t, p, clk, "k", 0, 57, nil) // 57/64 = 0.890625: at or below the watermark
	if _, ran := p.EvictNow(); ran {
		t.Fatal("eviction ran at 57 units of 64 (0.89 <= 0.90)")
	}
	fill(t, p, clk, "k", 57, 1, nil) // 58/64 = 0.90625
	r, ran := p.EvictNow()
	if !ran {
		t.Fatal("eviction did not run above the watermark")
	}
	// base 58, target max(0.05, 0.90625-0.9+0.05) = 0.05625, ceil(58*0.05625) = 4
	if r.Base != 58 || len(r.Evicted) != 4 {
		t.Fatalf("round base %d evicted %d, want 58 and 4", r.Base, len(r.Evicted))
	}
	if got := evictedKeys(r); strings.Join(got, ",") != "k000,k001,k002,k003" {
		t.Fatalf("evicted %v, want the 4 oldest", got)
	}
	if _, ran := p.EvictNow(); ran {
		t.Fatal("eviction ran again below the watermark")
	}
}

func TestLeaseOrderVictims(t *testing.T) {
	p, clk := newPool(t, nil)
	fill(t, p, clk, "k", 0, 10, nil)
	// Reading k000 and k001 pushes their lease deadline past every later put.
	if got := p.BatchGet(bg, []string{"k000", "k001"}, [][]byte{make([]byte, unit), make([]byte, unit)}); got[0] != unit || got[1] != unit {
		t.Fatalf("get = %v", got)
	}
	fill(t, p, clk, "k", 10, 48, nil)
	r, _ := p.EvictNow()
	if got := strings.Join(evictedKeys(r), ","); got != "k002,k003,k004,k005" {
		t.Fatalf("evicted %s, want k002-k005 (k000/k001 are leased)", got)
	}
	// After the lease runs out, k000/k001 rank at read time + TTL, so they still outlive
	// objects written before then.
	clk.Advance(11 * time.Second)
	fill(t, p, clk, "n", 0, 4, nil)
	r, _ = p.EvictNow()
	if got := strings.Join(evictedKeys(r), ","); got != "k006,k007,k008,k009" {
		t.Fatalf("evicted %s, want k006-k009", got)
	}
	if got := present(p, "k000", "k001"); got[0] != 1 || got[1] != 1 {
		t.Fatalf("k000/k001 present = %v, want both", got)
	}
}

func TestPass1SkipsSoftPins(t *testing.T) {
	p, clk := newPool(t, nil)
	soft := func(i int) pool.ReplicateConfig {
		if i < 4 {
			return pool.ReplicateConfig{SoftPinAction: pool.SoftPinEnable}
		}
		return pool.ReplicateConfig{}
	}
	fill(t, p, clk, "k", 0, 58, soft)
	r, _ := p.EvictNow()
	if got := strings.Join(evictedKeys(r), ","); got != "k004,k005,k006,k007" {
		t.Fatalf("evicted %s, want k004-k007 (k000-k003 soft-pinned)", got)
	}
	for _, e := range r.Evicted {
		if e.Pass != 1 || e.SoftPinned {
			t.Fatalf("evicted %+v, want pass 1 and not soft-pinned", e)
		}
	}
	// Once the pin's fixed deadline passes, the objects are ordinary cache again.
	clk.Advance(31 * time.Minute)
	fill(t, p, clk, "n", 0, 4, nil)
	r, _ = p.EvictNow()
	if got := strings.Join(evictedKeys(r), ","); got != "k000,k001,k002,k003" {
		t.Fatalf("after the pin expired evicted %s, want k000-k003", got)
	}
}

func TestSoftPinNotExtendedByReads(t *testing.T) {
	p, clk := newPool(t, nil)
	mustPut(t, p, "s", unit, pool.ReplicateConfig{SoftPinAction: pool.SoftPinEnable, SoftPinTTL: time.Minute})
	for i := 0; i < 5; i++ {
		clk.Advance(20 * time.Second)
		p.BatchIsExist(bg, []string{"s"})
	}
	st, _ := p.Stats(bg)
	if st.Detail[embedded.DetailSoftPinned] != 0 {
		t.Fatalf("soft pin still active 100 s after a 60 s pin despite reads: %d pinned", st.Detail[embedded.DetailSoftPinned])
	}
}

func TestPass2TakesSoftPinsWhenAllowed(t *testing.T) {
	for _, allow := range []bool{true, false} {
		t.Run(fmt.Sprintf("allow=%v", allow), func(t *testing.T) {
			p, clk := newPool(t, func(o *embedded.Options) { o.AllowEvictSoftPinned = allow })
			// 1 plain object and 57 soft-pinned: pass 1 can take only the plain one, below the
			// lower bound ceil(58*0.028125) = 2, so pass 2 needs 1 more.
			cfg := func(i int) pool.ReplicateConfig {
				if i == 0 {
					return pool.ReplicateConfig{}
				}
				return pool.ReplicateConfig{SoftPinAction: pool.SoftPinEnable}
			}
			fill(t, p, clk, "k", 0, 58, cfg)
			r, ran := p.EvictNow()
			if !ran {
				t.Fatal("no round")
			}
			var passes []string
			for _, e := range r.Evicted {
				passes = append(passes, fmt.Sprintf("%s/p%d/soft=%v", e.Key, e.Pass, e.SoftPinned))
			}
			want := "k000/p1/soft=false"
			if allow {
				want += ",k001/p2/soft=true"
			}
			if got := strings.Join(passes, ","); got != want {
				t.Fatalf("evicted %s, want %s", got, want)
			}
			st, _ := p.Stats(bg)
			if allow && (st.Detail[embedded.DetailEvictedPass2] != 1 || st.Detail[embedded.DetailEvictedSoftPinned] != 1) {
				t.Fatalf("stats pass2 %d soft %d, want 1 and 1", st.Detail[embedded.DetailEvictedPass2], st.Detail[embedded.DetailEvictedSoftPinned])
			}
		})
	}
}

func TestHardPinsKept(t *testing.T) {
	p, clk := newPool(t, nil)
	hard := pool.ReplicateConfig{HardPin: true}
	fill(t, p, clk, "h", 0, 58, func(int) pool.ReplicateConfig { return hard })
	r, ran := p.EvictNow()
	if !ran || len(r.Evicted) != 0 || r.Base != 0 {
		t.Fatalf("round ran=%v base=%d evicted=%v; want a round with base 0 that evicts nothing", ran, r.Base, evictedKeys(r))
	}
	// As on the real master, a hard pin keeps an object from eviction, not from Remove.
	if c := p.Remove(bg, "h001", false); c != pool.OK {
		t.Fatalf("plain Remove of a hard-pinned object whose lease ran out = %v, want OK", c)
	}
	if c := p.Remove(bg, "h000", true); c != pool.OK {
		t.Fatalf("forced Remove of a hard-pinned object = %v", c)
	}
}

func TestGroupSkipAndRefresh(t *testing.T) {
	p, clk := newPool(t, nil)
	group := func(i int) pool.ReplicateConfig {
		switch {
		case i < 3:
			return pool.ReplicateConfig{GroupIDs: []string{"gA"}}
		case i < 6:
			return pool.ReplicateConfig{GroupIDs: []string{"gB"}}
		}
		return pool.ReplicateConfig{}
	}
	fill(t, p, clk, "k", 0, 57, group)
	// A hit on one member of gA refreshes every member: the whole group is skipped.
	if got := p.BatchIsExist(bg, []string{"k001"}); got[0] != 1 {
		t.Fatal("k001 missing")
	}
	for _, k := range []string{"k000", "k002"} {
		d, _ := p.LeaseDeadline(k)
		if want := clk.Now().Add(10 * time.Second); !d.Equal(want) {
			t.Fatalf("%s lease %v, want %v (group refresh)", k, d, want)
		}
	}
	fill(t, p, clk, "k", 57, 1, nil)
	r, _ := p.EvictNow()
	// gB (k003-k005) is next in lease order: a chosen member pulls the whole group, and the
	// group's members count toward the round, so 3 + k006 = 4.
	if got := strings.Join(evictedKeys(r), ","); got != "k003,k004,k005,k006" {
		t.Fatalf("evicted %s, want k003-k006", got)
	}
	for _, e := range r.Evicted[:3] {
		if e.Group != "gB" {
			t.Fatalf("evicted %+v, want group gB", e)
		}
	}
	if got := present(p, "k000", "k001", "k002"); got[0]+got[1]+got[2] != 3 {
		t.Fatalf("gA present %v, want all kept", got)
	}
	st, _ := p.Stats(bg)
	if st.Detail[embedded.DetailEvictedGrouped] != 3 {
		t.Fatalf("evicted_grouped = %d, want 3", st.Detail[embedded.DetailEvictedGrouped])
	}
}

func TestGroupWithOneLeasedMemberSkipped(t *testing.T) {
	p, clk := newPool(t, nil)
	fill(t, p, clk, "k", 0, 3, func(int) pool.ReplicateConfig { return pool.ReplicateConfig{GroupIDs: []string{"g"}} })
	p.BatchIsExist(bg, []string{"k000"}) // refreshes all of g to now+10 s
	clk.Advance(4 * time.Second)
	// k001 has 6 s left, more than half the TTL: the master renews it alone.
	p.BatchIsExist(bg, []string{"k001"})
	clk.Advance(7 * time.Second) // k000 and k002 expired, k001 leased for 3 s more
	fill(t, p, clk, "n", 0, 55, nil)
	r, _ := p.EvictNow()
	for _, e := range r.Evicted {
		if e.Group == "g" {
			t.Fatalf("evicted %s of a group with a leased member", e.Key)
		}
	}
	// The frontier is the 4 oldest: k000 and k002 (skipped with their group), n000 and n001.
	// As on the master, the shortfall of 2 is made up from the rest in shard order, not by age.
	var frontier, refill []string
	for _, e := range r.Evicted {
		if e.Refill {
			refill = append(refill, e.Key)
		} else {
			frontier = append(frontier, e.Key)
		}
	}
	if got := strings.Join(frontier, ","); got != "n000,n001" {
		t.Fatalf("pass 1 frontier evicted %s, want n000,n001", got)
	}
	if len(refill) != 2 {
		t.Fatalf("pass 1 made up the shortfall with %v, want 2 objects", refill)
	}
	if strings.Join(refill, ",") == "n002,n003" {
		t.Fatalf("pass 1 made up the shortfall by age (%v), want shard order", refill)
	}
}

func TestProbeRenewal(t *testing.T) {
	for _, renew := range []bool{true, false} {
		t.Run(fmt.Sprintf("renew=%v", renew), func(t *testing.T) {
			p, clk := newPool(t, func(o *embedded.Options) { o.ExistRenewsLease = renew })
			fill(t, p, clk, "k", 0, 57, nil)
			// A prefix lookup probes the oldest objects (vLLM's batch_is_exist over candidates).
			if got := p.BatchIsExist(bg, []string{"k000", "k001", "k002", "k003"}); got[0] != 1 {
				t.Fatalf("probe = %v", got)
			}
			fill(t, p, clk, "k", 57, 1, nil)
			r, _ := p.EvictNow()
			want := "k000,k001,k002,k003"
			if renew {
				want = "k004,k005,k006,k007" // the probes leased the oldest, the hole of #2187
			}
			if got := strings.Join(evictedKeys(r), ","); got != want {
				t.Fatalf("evicted %s, want %s", got, want)
			}
		})
	}
}

func TestAllocationFailureFlagsEviction(t *testing.T) {
	p, clk := newPool(t, func(o *embedded.Options) { o.HighWatermark = 1.0 })
	fill(t, p, clk, "k", 0, 64, nil)
	if _, ran := p.EvictNow(); ran {
		t.Fatal("eviction ran with a watermark of 1.0 before any allocation failure")
	}
	if c := p.BatchPut(bg, []string{"x"}, [][]byte{make([]byte, unit)}, pool.ReplicateConfig{}); c[0] != pool.ErrNoAvailableHandle {
		t.Fatalf("put into a full pool = %v, want NO_AVAILABLE_HANDLE", c[0])
	}
	r, ran := p.EvictNow()
	if !ran || !r.NeedMemEviction || len(r.Evicted) != 4 {
		t.Fatalf("after an allocation failure round ran=%v need=%v evicted=%d, want a round of 4", ran, r.NeedMemEviction, len(r.Evicted))
	}
	if _, ran := p.EvictNow(); ran {
		t.Fatal("the flag stayed set after a successful round")
	}
	st, _ := p.Stats(bg)
	if st.AllocFailures != 1 {
		t.Fatalf("alloc failures %d, want 1", st.AllocFailures)
	}
}

func TestSyncEvictOnAllocFailure(t *testing.T) {
	p, clk := newPool(t, func(o *embedded.Options) { o.HighWatermark = 1.0; o.SyncEvictOnAllocFailure = true })
	fill(t, p, clk, "k", 0, 64, nil)
	if c := p.BatchPut(bg, []string{"x"}, [][]byte{make([]byte, unit)}, pool.ReplicateConfig{}); c[0] != pool.OK {
		t.Fatalf("put with synchronous eviction = %v, want OK", c[0])
	}
}

func TestFragmentationAccounted(t *testing.T) {
	p, clk := newPool(t, nil)
	fill(t, p, clk, "k", 0, 8, nil)
	for _, k := range []string{"k001", "k003", "k005"} {
		if c := p.Remove(bg, k, true); c != pool.OK {
			t.Fatal(c)
		}
	}
	st, _ := p.Stats(bg)
	if st.Detail[embedded.DetailFreeExtents] != 4 || st.Detail[embedded.DetailLargestFreeBytes] != 56*unit || st.Detail[embedded.DetailFragmentedBytes] != 3*unit {
		t.Fatalf("free extents %d largest %d fragmented %d, want 4, 56 units, 3 units", st.Detail[embedded.DetailFreeExtents], st.Detail[embedded.DetailLargestFreeBytes], st.Detail[embedded.DetailFragmentedBytes])
	}
	// Removing the neighbours coalesces the holes.
	for _, k := range []string{"k000", "k002", "k004", "k006", "k007"} {
		p.Remove(bg, k, true)
	}
	st, _ = p.Stats(bg)
	if st.Detail[embedded.DetailFreeExtents] != 1 || st.Detail[embedded.DetailFragmentedBytes] != 0 || st.UsedBytes != 0 {
		t.Fatalf("after removing all: extents %d fragmented %d used %d", st.Detail[embedded.DetailFreeExtents], st.Detail[embedded.DetailFragmentedBytes], st.UsedBytes)
	}
	// Mixed page sizes reuse holes first fit.
	mustPut(t, p, "a", 3*unit, pool.ReplicateConfig{})
	mustPut(t, p, "b", 64*1024, pool.ReplicateConfig{})
	st, _ = p.Stats(bg)
	if st.UsedBytes != 3*unit+64*1024 {
		t.Fatalf("used %d, want exactly the value sizes (no padding)", st.UsedBytes)
	}
}

func TestChecksumMismatchIsAnError(t *testing.T) {
	p, _ := newPool(t, nil)
	mustPut(t, p, "c", 4096, pool.ReplicateConfig{})
	if !p.CorruptForTest("c") {
		t.Fatal("corrupt hook found no object")
	}
	got := p.BatchGet(bg, []string{"c"}, [][]byte{make([]byte, 4096)})
	if got[0] != int64(pool.ErrChecksumMismatch) {
		t.Fatalf("get of a corrupted page = %d, want %d", got[0], pool.ErrChecksumMismatch)
	}
	st, _ := p.Stats(bg)
	if st.ChecksumErrors != 1 || st.Hits != 0 {
		t.Fatalf("checksum errors %d hits %d, want 1 and 0", st.ChecksumErrors, st.Hits)
	}
}

func TestSoftPinTTLRules(t *testing.T) {
	p, _ := newPool(t, nil)
	cases := []struct {
		cfg  pool.ReplicateConfig
		want pool.Code
	}{
		{pool.ReplicateConfig{SoftPinAction: pool.SoftPinEnable, SoftPinTTL: 24 * time.Hour}, pool.OK},
		{pool.ReplicateConfig{SoftPinAction: pool.SoftPinEnable, SoftPinTTL: 24*time.Hour + time.Millisecond}, pool.ErrInvalidParams},
		{pool.ReplicateConfig{SoftPinAction: pool.SoftPinDisable, SoftPinTTL: time.Second}, pool.ErrInvalidParams},
		{pool.ReplicateConfig{SoftPinAction: 7}, pool.ErrInvalidParams},
	}
	for i, c := range cases {
		if got := p.BatchPut(bg, []string{fmt.Sprint("t", i)}, [][]byte{{1}}, c.cfg); got[0] != c.want {
			t.Errorf("case %d: %v, want %v", i, got[0], c.want)
		}
	}
}

func TestEvictionHookAndGoroutine(t *testing.T) {
	o := embedded.DefaultOptions()
	o.Segments = []embedded.SegmentSpec{{Name: "s", Capacity: 10 * unit}}
	o.EvictionPeriod = time.Millisecond
	p, err := embedded.NewEmbedded(o)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rounds := make(chan embedded.EvictionRound, 16)
	p.SetEvictionHook(func(r embedded.EvictionRound) {
		select {
		case rounds <- r:
		default:
		}
	})
	for i := 0; i < 10; i++ {
		mustPut(t, p, fmt.Sprint("g", i), unit, pool.ReplicateConfig{})
	}
	// The goroutine must bring the pool back under the watermark; wait for its report.
	select {
	case r := <-rounds:
		if len(r.Evicted) == 0 {
			t.Fatalf("round evicted nothing: %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the eviction goroutine reported no round")
	}
}
