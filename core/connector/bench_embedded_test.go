package connector

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/pool"
)

// The benchmarks in this file run the worker against the embedded pool (embedded.Embedded),
// which copies and checksums (keys.CopyChecksum) every page on put and get. Each one alternates, within one
// benchmark loop, the connector's transfer and the pool's raw batch call on the same 256 pages
// of 64 KiB, so that both see the same machine load; they report the two throughputs and their
// ratio as custom metrics (MB = 10^6 bytes).

const benchEmbCapacity = 2 * benchPages * (64 << 10)

func benchEmbedded(b *testing.B) *embPool {
	return newEmbPool(b, benchEmbCapacity)
}

func fillEmbedded(b *testing.B, p pool.Pool, ks []string, size int) {
	bufs := make([][]byte, len(ks))
	for i := range bufs {
		bufs[i] = make([]byte, size)
		for j := range bufs[i] {
			bufs[i][j] = byte(i + j*7)
		}
	}
	for i, c := range p.BatchPut(context.Background(), ks, bufs, pool.ReplicateConfig{}) {
		if c != pool.OK {
			b.Fatalf("put %s = %v", ks[i], c)
		}
	}
}

func reportRatio(b *testing.B, name string, bytes int64, conn, raw time.Duration, rawName string) {
	mbps := func(d time.Duration) float64 { return float64(bytes) * float64(b.N) / d.Seconds() / 1e6 }
	b.ReportMetric(mbps(conn), name+"-MB/s")
	b.ReportMetric(mbps(raw), rawName+"-MB/s")
	b.ReportMetric(100*raw.Seconds()/conn.Seconds(), name+"/"+rawName+"-%")
}

// BenchmarkEmbeddedLoad alternates one synchronous load of 256 pages through the worker (pool
// get into staging, scatter into engine memory by the host mover) with the pool's raw BatchGet
// of the same keys in batches of 64, every page into its own buffer (16 MiB, the footprint of
// the load's engine memory). It reports load-MB/s, get-MB/s and load/get-%.
func BenchmarkEmbeddedLoad(b *testing.B) {
	l := benchLayout(benchPages)
	opts := benchOptions()
	pl := benchEmbedded(b)
	ks, hs := benchKeys(opts, l)
	size := int(l.Groups[0].BytesPerPage())
	fillEmbedded(b, pl, ks, size)
	w, meta := benchLoadWorker(b, opts, pl, l, hs)
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

// BenchmarkEmbeddedSave alternates one save of 256 pages through the worker into an empty
// embedded pool (existence filter, gather into staging by the host mover, pool put, timed until
// GetFinished reports the save) with the pool's raw BatchPut of the same keys from caller
// buffers, in batches of 64, into another empty pool. Making the pools and the worker is not
// timed. It reports save-MB/s, put-MB/s and save/put-%.
func BenchmarkEmbeddedSave(b *testing.B) {
	l := benchLayout(benchPages)
	opts := benchOptions()
	ks, hs := benchKeys(opts, l)
	size := int(l.Groups[0].BytesPerPage())
	t := RequestTransfers{RequestID: "r"}
	for i, h := range hs {
		t.Pages = append(t.Pages, PageTransfer{Hash: keys.PageHashOf(h), Group: 0, Page: i})
	}
	mover := newHostMover(l)
	for i := range mover.mem {
		mover.mem[i] = byte(i * 7)
	}
	bufs := make([][]byte, len(ks))
	for i := range bufs {
		bufs[i] = make([]byte, size)
		copy(bufs[i], mover.mem[i*size:])
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
		w, err := NewWorker(opts, ep, mover)
		if err != nil {
			b.Fatal(err)
		}
		if err := w.RegisterLayout(l); err != nil {
			b.Fatal(err)
		}
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
