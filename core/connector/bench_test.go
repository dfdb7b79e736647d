package connector

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/pool"
)

// benchLayout is one layer group with K and V regions of 32 KiB each: 64 KiB pages.
func benchLayout(slots int) kvmem.Layout {
	const region = 32 << 10
	s := uint64(slots)
	return kvmem.Layout{TokensPerBlock: 32, Groups: []kvmem.GroupLayout{{ID: 0, Slots: slots, Regions: []kvmem.Region{
		{Offset: 0, Stride: region, Size: region},
		{Offset: region * s, Stride: region, Size: region},
	}}}}
}

func benchOptions() Options {
	o := baseOptions()
	o.TokensPerBlock = 32
	return o
}

// BenchmarkLookup32k measures one lookup of a 32k-token prompt whose 1023 offerable blocks are
// all in the pool: hashing the whole prompt plus one existence call over 2 layer groups' keys.
func BenchmarkLookup32k(b *testing.B) {
	const T = 32
	tokens := prompt(1, 0, 32<<10)
	l := kvmem.Layout{TokensPerBlock: T, Groups: []kvmem.GroupLayout{
		{ID: 0, Slots: 2048, Regions: []kvmem.Region{{Stride: 1, Size: 1}}},
		{ID: 1, Slots: 2048, Regions: []kvmem.Region{{Stride: 1, Size: 1}}, ReplicatedRegions: []kvmem.Region{{Stride: 1, Size: 1}}},
	}}
	opts := benchOptions()
	pl := newMemPool()
	c, _ := keys.NewChain(keys.ChainConfig{TokensPerBlock: T})
	hs, _ := c.Extend(tokens)
	g, _ := newGeometry(l, opts.withDefaults())
	for _, h := range hs {
		for _, k := range opts.Namespace.BlockKeys(T, g.groups, h) {
			pl.objs[k] = nil
		}
	}
	s, err := NewScheduler(opts, pl)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.RegisterLayout(l); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprint(i)
		m, _, err := s.Lookup(ctx, Request{ID: id, Tokens: tokens}, 0)
		if err != nil || m != (len(tokens)-1)/T*T {
			b.Fatalf("lookup = %d, %v", m, err)
		}
		s.RequestReset(id, false)
	}
}

const benchPages = 256 // 16 MiB of 64 KiB pages per operation

func benchKeys(opts Options, l kvmem.Layout) ([]string, []keys.Hash) {
	c, _ := keys.NewChain(keys.ChainConfig{TokensPerBlock: 32})
	hs, _ := c.Extend(prompt(2, 0, benchPages*32))
	var ks []string
	for _, h := range hs {
		ks = append(ks, opts.Namespace.PageKey(0, 32, l.Groups[0].BytesPerPage(), h))
	}
	return ks, hs
}

func fillPool(pl *memPool, ks []string, size int) {
	for i, k := range ks {
		v := make([]byte, size)
		v[0], v[size-1] = byte(i), byte(i>>8)
		pl.objs[k] = v
	}
}

// BenchmarkPoolGetRaw is the pool's own get throughput for the pages BenchmarkLoadThroughput
// loads: batches of 64 into caller buffers.
func BenchmarkPoolGetRaw(b *testing.B) {
	l := benchLayout(benchPages)
	opts := benchOptions()
	pl := newMemPool()
	ks, _ := benchKeys(opts, l)
	size := int(l.Groups[0].BytesPerPage())
	fillPool(pl, ks, size)
	bufs := make([][]byte, DefaultTransferBatchSize)
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	ctx := context.Background()
	b.SetBytes(int64(benchPages * size))
	for b.Loop() {
		for s := 0; s < len(ks); s += len(bufs) {
			n := min(len(bufs), len(ks)-s)
			pl.BatchGet(ctx, ks[s:s+n], bufs[:n])
		}
	}
}

// BenchmarkPoolGetRawDistinct is BenchmarkPoolGetRaw landing every page in its own buffer, so
// the destination footprint (16 MiB) is that of a load's engine memory rather than 64 reused,
// cache-resident buffers.
func BenchmarkPoolGetRawDistinct(b *testing.B) {
	l := benchLayout(benchPages)
	opts := benchOptions()
	pl := newMemPool()
	ks, _ := benchKeys(opts, l)
	size := int(l.Groups[0].BytesPerPage())
	fillPool(pl, ks, size)
	bufs := make([][]byte, len(ks))
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	ctx := context.Background()
	b.SetBytes(int64(benchPages * size))
	for b.Loop() {
		for s := 0; s < len(ks); s += DefaultTransferBatchSize {
			n := min(DefaultTransferBatchSize, len(ks)-s)
			pl.BatchGet(ctx, ks[s:s+n], bufs[s:s+n])
		}
	}
}

// BenchmarkLoadThroughput is one synchronous load of 256 pages through the worker: pool get
// into staging slots, then a scatter into engine memory by the host mover.
func BenchmarkLoadThroughput(b *testing.B) {
	l := benchLayout(benchPages)
	opts := benchOptions()
	pl := newMemPool()
	ks, hs := benchKeys(opts, l)
	size := int(l.Groups[0].BytesPerPage())
	fillPool(pl, ks, size)
	w, meta := benchLoadWorker(b, opts, pl, newHostMover(l), l, hs)
	ctx := context.Background()
	b.SetBytes(int64(benchPages * size))
	for b.Loop() {
		w.BindMeta(meta)
		if err := w.StartLoad(ctx); err != nil {
			b.Fatal(err)
		}
	}
	if f := w.TakeFailedLoadRequests(); len(f) > 0 {
		b.Fatalf("failed loads %v", f)
	}
}

// BenchmarkPoolPutRaw is the pool's own put throughput for the pages BenchmarkSaveThroughput
// saves: batches of 64 from caller buffers into an empty pool.
func BenchmarkPoolPutRaw(b *testing.B) {
	l := benchLayout(benchPages)
	opts := benchOptions()
	ks, _ := benchKeys(opts, l)
	size := int(l.Groups[0].BytesPerPage())
	bufs := make([][]byte, DefaultTransferBatchSize)
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	ctx := context.Background()
	b.SetBytes(int64(benchPages * size))
	for b.Loop() {
		b.StopTimer()
		pl := newMemPool()
		runtime.GC()
		b.StartTimer()
		for s := 0; s < len(ks); s += len(bufs) {
			n := min(len(bufs), len(ks)-s)
			pl.BatchPut(ctx, ks[s:s+n], bufs[:n], mooncakeConfig())
		}
	}
}

// BenchmarkSaveThroughput is one save of 256 pages through the worker into an empty pool:
// existence filter, gather into staging slots by the host mover, pool put, measured until
// GetFinished reports the request's saves done.
func BenchmarkSaveThroughput(b *testing.B) {
	l := benchLayout(benchPages)
	opts := benchOptions()
	_, hs := benchKeys(opts, l)
	size := int(l.Groups[0].BytesPerPage())
	t := RequestTransfers{RequestID: "r"}
	for i, h := range hs {
		t.Pages = append(t.Pages, PageTransfer{Hash: keys.PageHashOf(h), Group: 0, Page: i})
	}
	mover := newHostMover(l)
	ctx := context.Background()
	b.SetBytes(int64(benchPages * size))
	for b.Loop() {
		b.StopTimer()
		pl := newMemPool()
		w := benchWorker(b, opts, pl, mover, l)
		runtime.GC()
		b.StartTimer()
		w.BindMeta(Metadata{Saves: []RequestTransfers{t}})
		if err := w.WaitForSave(ctx); err != nil {
			b.Fatal(err)
		}
		for {
			fs, _, err := w.GetFinished([]string{"r"}, nil)
			if err != nil {
				b.Fatal(err)
			}
			if len(fs) == 1 {
				break
			}
			time.Sleep(20 * time.Microsecond)
		}
		b.StopTimer()
		if got := len(pl.objs); got != benchPages {
			b.Fatalf("saved %d pages", got)
		}
		_ = w.Close(ctx)
		b.StartTimer()
	}
}

// benchLoadWorker returns a worker over pool and mover, closed when the benchmark ends, and the
// metadata of one request loading every page hs names, page i into slot i (benchTransfers).
func benchLoadWorker(b *testing.B, opts Options, pl pool.Pool, mover kvmem.Mover, l kvmem.Layout, hs []keys.Hash) (*Worker, Metadata) {
	b.Helper()
	w := benchWorker(b, opts, pl, mover, l)
	b.Cleanup(func() { _ = w.Close(context.Background()) })
	return w, Metadata{Loads: []RequestTransfers{benchTransfers(hs)}}
}

// benchWorker returns a worker over pool and mover with layout l registered; the caller closes
// it.
func benchWorker(b *testing.B, opts Options, pl pool.Pool, mover kvmem.Mover, l kvmem.Layout) *Worker {
	b.Helper()
	w, err := NewWorker(opts, pl, mover)
	if err != nil {
		b.Fatal(err)
	}
	if err := w.RegisterLayout(l); err != nil {
		b.Fatal(err)
	}
	return w
}
