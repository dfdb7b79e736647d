package daemon

import (
	"context"
	"testing"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/embedded"
)

// BenchmarkInPlaceViewDeferred is the daemon's pool as a connector reads it in place: one
// deferred view of 190 stored pages of 64 KiB (a warm StartLoad's) through the pool guard, and
// its release; keys as strings, a new View per call (strings), or keys as bytes into a View
// reused from call to call (into).
func BenchmarkInPlaceViewDeferred(b *testing.B) {
	const pages, size = 190, 64 << 10
	o := embedded.DefaultOptions()
	o.Segments = []embedded.SegmentSpec{{Name: "s", Capacity: 2 * pages * size}}
	o.EvictionPeriod = 0
	d, err := New(Config{Pool: o})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = d.closeBackend() })
	p, ok := d.connectorPool().(pool.DeferredViewer)
	if !ok {
		b.Fatal("the embedded backend's connector pool has no deferred views")
	}
	ns := keys.Namespace{ModelKey: "meta-llama/Llama-3.1-8B-Instruct", WorldSize: 1}
	ks := make([]string, pages)
	bufs := make([][]byte, pages)
	for i := range ks {
		var h keys.Hash
		h[0], h[1], h[15] = byte(i), byte(i>>8), 0x5a
		ks[i] = ns.PageKey(0, 32, size, h)
		bufs[i] = make([]byte, size)
		bufs[i][0] = byte(i)
	}
	ctx := context.Background()
	for i, c := range d.pool.BatchPut(ctx, ks, bufs, pool.ReplicateConfig{}) {
		if c != pool.OK {
			b.Fatalf("put %d: %v", i, c)
		}
	}
	check := func(v *pool.View) {
		for i, n := range v.Codes {
			if n != size {
				b.Fatalf("page %d: %d", i, n)
			}
		}
	}
	b.Run("strings", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			v := p.BatchViewDeferred(ctx, ks)
			check(v)
			v.Release()
		}
	})
	b.Run("into", func(b *testing.B) {
		rv, ok := p.(pool.ReusingViewer)
		if !ok {
			b.Fatal("the embedded backend's connector pool has no views into a reused View")
		}
		kb := make([][]byte, len(ks))
		for i, k := range ks {
			kb[i] = []byte(k)
		}
		var v pool.View
		b.ReportAllocs()
		for b.Loop() {
			rv.BatchViewDeferredInto(ctx, kb, &v)
			check(&v)
			v.Release()
		}
	})
}
