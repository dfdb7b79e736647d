package connector

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/hostmem"
	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/pool"
)

// The benchmarks in this file run the worker as kvctl serve runs it for an engine whose KV cache
// is shared memory: the real core/hostmem mover over a memfd, and the embedded pool. Each
// alternates, within one loop, the connector's transfer of 256 pages of 64 KiB with the pool's
// raw batch call on the same pages (batches of 64, caller buffers of the same footprint), and
// reports the two throughputs and their ratio (MB = 10^6 bytes). Two layouts: "contiguous", each
// page's value one 64 KiB piece of engine memory (one region per slot, as a TensorRT-LLM pool
// block holding every layer), and "split", each value two 32 KiB regions apart (K and V in
// tensors of their own). "direct" hands the pool the engine's own memory: each value where it
// is one piece (BatchGet, BatchPut), its pieces where it is split (BatchGetPieces,
// BatchPutPieces). "in-place" turns that off (hostDestinationsOff, hostSourcesOff): values are
// checked in pool memory and copied (loads), or gathered into reserved pool memory and checked
// there (saves), as before the pool was handed engine memory.

type hostMemCase struct {
	name    string
	layout  kvmem.Layout
	inPlace bool
}

func hostMemCases() []hostMemCase {
	contiguous := kvmem.Layout{TokensPerBlock: 32, Groups: []kvmem.GroupLayout{{ID: 0, Slots: benchPages, Regions: []kvmem.Region{{Offset: 0, Stride: 64 << 10, Size: 64 << 10}}}}}
	return []hostMemCase{
		{"contiguous/direct", contiguous, false},
		{"contiguous/in-place", contiguous, true},
		{"split/direct", benchLayout(benchPages), false},
		{"split/in-place", benchLayout(benchPages), true},
	}
}

// set makes the benchmark's transfers skip the engine's own pages while it runs.
func (c hostMemCase) set(b *testing.B) {
	oldD, oldS := hostDestinationsOff, hostSourcesOff
	hostDestinationsOff, hostSourcesOff = c.inPlace, c.inPlace
	b.Cleanup(func() { hostDestinationsOff, hostSourcesOff = oldD, oldS })
}

// benchHostMover returns the real shared-memory mover over fresh engine memory for l, filled
// with a pattern.
func benchHostMover(b *testing.B, l kvmem.Layout) kvmem.Mover {
	b.Helper()
	shm, err := hostmem.NewSharedMemory(layoutBytes(l))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = shm.Close() })
	for i := range shm.Data {
		shm.Data[i] = byte(i * 7)
	}
	m, err := hostmem.NewMover(shm.FD, int64(len(shm.Data)), l)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = m.Close() })
	return m
}

// BenchmarkHostMemLoad alternates one synchronous load of 256 pages through the worker into the
// engine's shared memory with the pool's raw BatchGet of the same keys into caller buffers. It
// reports load-MB/s, get-MB/s and load/get-%.
func BenchmarkHostMemLoad(b *testing.B) {
	for _, c := range hostMemCases() {
		b.Run(c.name, func(b *testing.B) {
			c.set(b)
			loadVsGet(b, c.layout, benchHostMover(b, c.layout))
		})
	}
}

// BenchmarkHostMemSave alternates one save of 256 pages from the engine's shared memory through
// the worker into an empty embedded pool (timed until GetFinishedWait reports it) with the pool's
// raw BatchPut of the same keys from caller buffers into another empty pool. It reports
// save-MB/s, put-MB/s and save/put-%.
func BenchmarkHostMemSave(b *testing.B) {
	for _, c := range hostMemCases() {
		b.Run(c.name, func(b *testing.B) {
			c.set(b)
			saveVsPut(b, c.layout, benchHostMover(b, c.layout))
		})
	}
}

// loadVsGet alternates one synchronous load of benchPages pages of l's group 0 through a worker
// over mover and the embedded pool with the pool's raw BatchGet of the same keys in batches of
// DefaultTransferBatchSize, every page into its own buffer (the footprint of the load's engine
// memory), and reports load-MB/s, get-MB/s and load/get-%.
func loadVsGet(b *testing.B, l kvmem.Layout, mover kvmem.Mover) {
	opts := benchOptions()
	pl := benchEmbedded(b)
	ks, hs := benchKeys(opts, l)
	size := int(l.Groups[0].BytesPerPage())
	fillEmbedded(b, pl, ks, size)
	w, meta := benchLoadWorker(b, opts, pl, mover, l, hs)
	bufs := make([][]byte, len(ks))
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	ctx := context.Background()
	var loadT, getT time.Duration
	b.ReportAllocs()
	for b.Loop() {
		t0 := time.Now()
		for s := 0; s < len(ks); s += DefaultTransferBatchSize {
			n := min(DefaultTransferBatchSize, len(ks)-s)
			for j, got := range pl.BatchGet(ctx, ks[s:s+n], bufs[s:s+n]) {
				if got != int64(size) {
					b.Fatalf("get %s = %d", ks[s+j], got)
				}
			}
		}
		t1 := time.Now()
		w.BindMeta(meta)
		if err := w.StartLoad(ctx); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		getT += t1.Sub(t0)
		loadT += t2.Sub(t1)
	}
	if f := w.TakeFailedLoadRequests(); len(f) > 0 {
		b.Fatalf("failed loads %v", f)
	}
	reportRatio(b, "load", int64(benchPages*size), loadT, getT, "get")
}

// saveVsPut alternates one save of benchPages pages of l's group 0 from mover's engine memory
// through a worker into an empty embedded pool, timed until GetFinishedWait reports it, with the
// pool's raw BatchPut of the same bytes from caller buffers in batches of
// DefaultTransferBatchSize into another empty pool. Making the pools and the worker is not
// timed. It reports save-MB/s, put-MB/s and save/put-%.
func saveVsPut(b *testing.B, l kvmem.Layout, mover kvmem.Mover) {
	opts := benchOptions()
	ks, hs := benchKeys(opts, l)
	size := int(l.Groups[0].BytesPerPage())
	t := benchTransfers(hs)
	bufs := make([][]byte, len(ks))
	for i := range bufs {
		bufs[i] = make([]byte, size)
		if err := mover.Gather(context.Background(), []kvmem.PageRef{{Group: 0, Slot: i}}, bufs[i:i+1]); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	var saveT, putT time.Duration
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		raw, err := makeEmbPool(benchEmbCapacity)
		if err != nil {
			b.Fatal(err)
		}
		ep, err := makeEmbPool(benchEmbCapacity)
		if err != nil {
			b.Fatal(err)
		}
		w := benchWorker(b, opts, ep, mover, l)
		runtime.GC()
		b.StartTimer()
		t0 := time.Now()
		for s := 0; s < len(ks); s += DefaultTransferBatchSize {
			n := min(DefaultTransferBatchSize, len(ks)-s)
			for j, c := range raw.BatchPut(ctx, ks[s:s+n], bufs[s:s+n], pool.ReplicateConfig{}) {
				if c != pool.OK {
					b.Fatalf("put %s = %v", ks[s+j], c)
				}
			}
		}
		t1 := time.Now()
		w.BindMeta(Metadata{Saves: []RequestTransfers{t}})
		if err := w.WaitForSave(ctx); err != nil {
			b.Fatal(err)
		}
		// An engine with nothing else to do waits in GetFinished for the save.
		for {
			fs, _, err := w.GetFinishedWait(ctx, []string{"r"}, nil, time.Second)
			if err != nil {
				b.Fatal(err)
			}
			if len(fs) == 1 {
				break
			}
		}
		t2 := time.Now()
		putT += t1.Sub(t0)
		saveT += t2.Sub(t1)
		b.StopTimer()
		if st := ep.stats(b); st.Puts != benchPages || st.PutFailures != 0 {
			b.Fatalf("saved %d pages, %d failures", st.Puts, st.PutFailures)
		}
		_ = w.Close(ctx)
		_ = raw.Close()
		_ = ep.Close()
		b.StartTimer()
	}
	reportRatio(b, "save", int64(benchPages*size), saveT, putT, "put")
}

// benchTransfers is request "r" with page i of group 0 of block hs[i] in slot i.
func benchTransfers(hs []keys.Hash) RequestTransfers {
	t := RequestTransfers{RequestID: "r"}
	for i, h := range hs {
		t.Pages = append(t.Pages, PageTransfer{Hash: keys.PageHashOf(h), Group: 0, Page: i})
	}
	return t
}
