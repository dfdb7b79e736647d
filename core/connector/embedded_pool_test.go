package connector

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/simkv"
	"github.com/kvctl/kvctl/pool/embedded"
)

// TestEmbeddedEvictionBetweenLookupAndLoad lets the embedded pool's own eviction take pages
// between the lookup and the load: the lookup's leases lapse on the pool's clock, one page of
// every block of b is probed again (renewing b's block groups), and one eviction round takes
// every evictable object, which is all of a's pages and none of b's. a is restarted without a
// wrong byte in its pages and recomputes and saves its blocks; b loads its whole offer.
func TestEmbeddedEvictionBetweenLookupAndLoad(t *testing.T) {
	pl := newEmbPool(t, embTestCapacity, func(o *embedded.Options) {
		o.HighWatermark, o.EvictionRatio = 1e-9, 1 // any use triggers a round that takes all it may
	})
	opts := baseOptions()
	opts.GroupBlocks = true
	ta, tb := prompt(21, 0, 33), prompt(22, 0, 33) // 8 offerable blocks each
	cold := newEngine(t, pl, opts, 1, 128)
	cold.add("a", ta)
	cold.add("b", tb)
	cold.mustRun()

	hashes := func(tokens []int64) []keys.Hash {
		c, _ := keys.NewChain(keys.ChainConfig{TokensPerBlock: testT}) // a chain extends its prompt: one per prompt
		hs, _ := c.Extend(tokens)
		return hs
	}
	ha, hb := hashes(ta), hashes(tb)
	if len(ha) != 8 || len(hb) != 8 {
		t.Fatalf("%d and %d block hashes, want 8 each", len(ha), len(hb))
	}
	g, err := newGeometry(testLayout(128), opts.withDefaults())
	if err != nil {
		t.Fatal(err)
	}
	var aKeys, bProbe []string
	for _, h := range ha {
		aKeys = append(aKeys, opts.Namespace.SaveKeys(testT, g.groups, h)...)
	}
	for _, h := range hb {
		bProbe = append(bProbe, opts.Namespace.SaveKeys(testT, g.groups, h)[0])
	}
	if len(aKeys) != 8*3 || len(pl.keys()) != 2*8*3 {
		t.Fatalf("cold run stored %d keys, a has %d", len(pl.keys()), len(aKeys))
	}

	warm := newEngine(t, pl, opts, 1, 128)
	warm.chunk = 64
	var round embedded.EvictionRound
	warm.beforeLoad = func(e *engine, meta Metadata) {
		if e.pass != 0 {
			return
		}
		if len(meta.Loads) != 2 {
			t.Fatalf("pass 0 carries %d loads, want 2", len(meta.Loads))
		}
		pl.clock.Advance(pl.Options().LeaseTTL + time.Second) // the lookup's leases lapse
		for i, v := range pl.BatchIsExist(e.ctx, bProbe) {
			if v != 1 {
				t.Fatalf("%s is not in the pool", bProbe[i])
			}
		}
		var ran bool
		if round, ran = pl.EvictNow(); !ran {
			t.Fatal("no eviction round ran")
		}
	}
	warm.add("a", ta)
	warm.add("b", tb)
	if err := warm.step(); err != nil {
		t.Fatal(err)
	}
	var evicted []string
	for _, ev := range round.Evicted {
		if ev.Group == "" {
			t.Errorf("%s was evicted outside a block group", ev.Key)
		}
		evicted = append(evicted, ev.Key)
	}
	slices.Sort(evicted)
	want := slices.Sorted(slices.Values(aKeys))
	if !slices.Equal(evicted, want) {
		t.Fatalf("the round evicted %d keys %v, want a's %d keys", len(evicted), evicted, len(want))
	}
	a, b := warm.byID["a"], warm.byID["b"]
	if a.Restarts != 1 || b.Restarts != 0 {
		t.Fatalf("restarts a=%d b=%d", a.Restarts, b.Restarts)
	}
	warm.mustRun()
	if a.loaded != 0 || b.loaded != 8 {
		t.Fatalf("loaded a=%d b=%d, want 0 and 8", a.loaded, b.loaded)
	}
	// a's recomputed pages are back in the pool with their KV.
	for blk, h := range ha {
		for gi := range warm.layout.Groups {
			k := opts.Namespace.PageKey(gi, testT, uint64(warm.pageSize(gi, false)), h)
			v, ok := pl.get(k)
			if !ok || !bytes.Equal(v, simkv.KVBytes(ta, blk, testT, 0, 0, gi, false, warm.pageSize(gi, false))) {
				t.Fatalf("block %d group %d: recomputed page not saved with its KV", blk, gi)
			}
		}
	}
	if st := pl.stats(t); st.Detail[embedded.DetailEvictedGrouped] != int64(len(aKeys)) || st.ChecksumErrors != 0 || st.AllocFailures != 0 {
		t.Fatalf("pool stats %+v", st)
	}
}
