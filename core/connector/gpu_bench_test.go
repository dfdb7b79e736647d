//go:build cgo && linux

package connector

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/core/stats"
	"github.com/kvctl/kvctl/gpu"
	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/embedded"
)

// The benchmarks in this file need a CUDA device (they skip without one) and measure the
// connector's data path on it: the worker with a CUDA mover over device memory and the embedded
// pool, against the same run's pinned 64 MiB copy over the link. Each loop alternates one
// transfer of gpuBenchBytes through the worker with the same bytes as one pinned copy, so both
// see the same machine; they report the two throughputs (GB/s = 10^9 bytes/s) and the ratio.

const (
	gpuBenchBytes  = 256 << 20 // bytes one load or save moves
	gpuAnchorChunk = 64 << 20  // the anchor copies in 64 MiB pieces
)

type gpuBench struct {
	d      *gpu.CUDADevice
	mem    *gpu.EngineMemory
	layout kvmem.Layout
	stream *gpu.Stream
	pinned *gpu.PinnedBuffer
	hs     []keys.Hash
	meta   RequestTransfers
}

func newGPUBench(b *testing.B, page int) *gpuBench {
	b.Helper()
	d, err := gpu.OpenCUDA(0)
	if errors.Is(err, gpu.ErrNoCUDA) {
		b.Skip("no CUDA device")
	}
	if err != nil {
		b.Fatal(err)
	}
	g := &gpuBench{d: d}
	b.Cleanup(func() { _ = d.Close() })
	pages := gpuBenchBytes / page
	// Two regions per page, as a K and a V layer would be, so each page is two copies.
	half := uint64(page / 2)
	g.layout = kvmem.Layout{TokensPerBlock: 32, Groups: []kvmem.GroupLayout{{ID: 0, Slots: pages, Regions: []kvmem.Region{
		{Offset: 0, Stride: half, Size: half}, {Offset: half * uint64(pages), Stride: half, Size: half}}}}}
	if g.mem, err = d.AllocDeviceMemory(uint64(gpuBenchBytes)); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = g.mem.Close() })
	if g.stream, err = d.NewStream(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = g.stream.Close() })
	if g.pinned, err = d.AllocPinned(gpuBenchBytes, false); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = g.pinned.Close() })
	c, _ := keys.NewChain(keys.ChainConfig{TokensPerBlock: 32})
	g.hs, _ = c.Extend(prompt(7, 0, pages*32))
	g.meta = RequestTransfers{RequestID: "r"}
	// Slots in a shuffled order, so no two pages merge into one copy.
	for i, h := range g.hs {
		g.meta.Pages = append(g.meta.Pages, PageTransfer{Hash: keys.PageHashOf(h), Group: 0, Page: (i * 7919) % pages})
	}
	return g
}

// timedMover records how long Scatter calls take and when they start, to see whether a load's
// scatters overlap its pool checks; and, since the last mark, when the first call came (called)
// and when the last scatter or check was done (done).
type timedMover struct {
	kvmem.Mover
	mu       sync.Mutex
	scatters int
	checked  int // scatters checked on the GPU
	busy     time.Duration
	called   time.Time
	done     time.Time
}

// mark forgets called and done.
func (m *timedMover) mark() {
	m.mu.Lock()
	m.called, m.done = time.Time{}, time.Time{}
	m.mu.Unlock()
}

// times returns called and done.
func (m *timedMover) times() (called, done time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.called, m.done
}

// call notes a call that started at t0.
func (m *timedMover) call(t0 time.Time) {
	m.mu.Lock()
	if m.called.IsZero() {
		m.called = t0
	}
	m.mu.Unlock()
}

func (m *timedMover) Scatter(ctx context.Context, src [][]byte, pages []kvmem.PageRef) error {
	t0 := time.Now()
	m.call(t0)
	err := m.Mover.Scatter(ctx, src, pages)
	m.mu.Lock()
	m.scatters++
	m.busy += time.Since(t0)
	m.done = time.Now()
	m.mu.Unlock()
	return err
}

func (m *timedMover) PageCheckError() error {
	pc, ok := m.Mover.(kvmem.PageChecker)
	if !ok {
		return errors.New("the mover does not check pages")
	}
	return pc.PageCheckError()
}

// ScatterChecked times the copies and the launch of the check (what the loading goroutine
// waits for), as Scatter is timed.
func (m *timedMover) ScatterChecked(ctx context.Context, src [][]byte, pages []kvmem.PageRef, sums []uint64) (func() ([]bool, error), error) {
	t0 := time.Now()
	m.call(t0)
	defer m.countChecked(t0)
	return m.doneWhenRead(m.Mover.(kvmem.PageChecker).ScatterChecked(ctx, src, pages, sums))
}

// doneWhenRead wraps a checked scatter's wait so that it notes when the check was read.
func (m *timedMover) doneWhenRead(wait func() ([]bool, error), err error) (func() ([]bool, error), error) {
	if err != nil {
		return wait, err
	}
	return func() ([]bool, error) {
		bad, err := wait()
		m.mu.Lock()
		m.done = time.Now()
		m.mu.Unlock()
		return bad, err
	}, nil
}

// countChecked counts a checked scatter that started at t0.
func (m *timedMover) countChecked(t0 time.Time) {
	m.mu.Lock()
	m.scatters++
	m.checked++
	m.busy += time.Since(t0)
	m.mu.Unlock()
}

// IssueChecked times the issue of a checked scatter that is not waited for.
func (m *timedMover) IssueChecked(ctx context.Context, src [][]byte, pages []kvmem.PageRef, sums []uint64) (func() ([]bool, error), error) {
	t0 := time.Now()
	m.call(t0)
	defer m.countChecked(t0)
	return m.doneWhenRead(m.Mover.(kvmem.AsyncPageChecker).IssueChecked(ctx, src, pages, sums))
}

func (m *timedMover) GPUTime() kvmem.GPUTime { return m.Mover.(kvmem.GPUTimer).GPUTime() }

func (m *timedMover) WakeDevice() error {
	if w, ok := m.Mover.(kvmem.DeviceWaker); ok {
		return w.WakeDevice()
	}
	return nil
}

func (m *timedMover) RegisterHost(mem []byte) (io.Closer, error) {
	return m.Mover.(kvmem.HostRegistrar).RegisterHost(mem)
}

func (g *gpuBench) worker(b *testing.B, pl pool.Pool, staged bool) *Worker {
	w, _, _ := g.timedWorker(b, pl, staged)
	return w
}

// timedWorker is worker with its mover timed and a stats reporter that keeps phase totals.
func (g *gpuBench) timedWorker(b *testing.B, pl pool.Pool, staged bool) (*Worker, *timedMover, *stats.Reporter) {
	b.Helper()
	cm, err := g.d.NewMover(g.mem, g.layout, gpu.CUDAMoverOptions{Scatter: benchScatter()})
	if err != nil {
		b.Fatal(err)
	}
	m := &timedMover{Mover: cm}
	rep, err := stats.NewReporter(stats.ReporterOptions{Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	o := benchOptions()
	o.Stats = rep
	o.StagedTransfers = staged
	o.StagingBufferBytes = 256 << 20
	w, err := NewWorker(o, pl, m)
	if err != nil {
		b.Fatal(err)
	}
	if err := w.RegisterLayout(g.layout); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = w.Close(context.Background()); _ = m.Close() })
	return w, m, rep
}

func (g *gpuBench) anchor(b *testing.B, toDevice bool) time.Duration {
	t0 := time.Now()
	if err := g.stream.CopyChunks(toDevice, g.mem.Pointer(), g.pinned.Bytes(), gpuAnchorChunk); err != nil {
		b.Fatal(err)
	}
	return time.Since(t0)
}

// gpuPool makes the embedded pool of a GPU benchmark; mode may ask for "workers=N" in-place
// checkers (embedded.Options.InPlaceWorkers).
func gpuPool(b *testing.B, mode string) *embedded.Embedded {
	o := embedded.DefaultOptions()
	o.Segments = []embedded.SegmentSpec{{Name: "gpu-bench", Capacity: 2 * gpuBenchBytes}}
	o.EvictionPeriod = 0
	if i := strings.Index(mode, "workers="); i >= 0 {
		_, _ = fmt.Sscanf(mode[i:], "workers=%d", &o.InPlaceWorkers)
	}
	p, err := embedded.NewEmbedded(o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Close() })
	return p
}

// uncheckedPool is the embedded pool with BatchView answered from views taken once at set-up
// and never checked again: the in-place load with its checks taken out, to measure what they
// cost. Benchmarks only.
type uncheckedPool struct {
	*embedded.Embedded
	views map[string][]byte
}

func newUncheckedPool(b *testing.B, p *embedded.Embedded, ks []string) *uncheckedPool {
	v := p.BatchView(context.Background(), ks) // held for the pool's life
	u := &uncheckedPool{Embedded: p, views: map[string][]byte{}}
	for i, k := range ks {
		if v.Codes[i] < 0 {
			b.Fatalf("view %s = %d", k, v.Codes[i])
		}
		u.views[k] = v.Bufs[i]
	}
	return u
}

// BatchViewDeferred answers as BatchView does: a view without Sums, which no one checks.
func (u *uncheckedPool) BatchViewDeferred(ctx context.Context, ks []string) *pool.View {
	return u.BatchView(ctx, ks)
}

// BatchViewDeferredInto answers as BatchView does, into v (it hides the embedded pool's, which
// would hand out the checksums to check).
func (u *uncheckedPool) BatchViewDeferredInto(ctx context.Context, ks [][]byte, v *pool.View) {
	strs := make([]string, len(ks))
	for i, k := range ks {
		strs[i] = string(k)
	}
	nv := u.BatchView(ctx, strs)
	v.Bufs, v.Codes, v.Sums = nv.Bufs, nv.Codes, nil
}

func (u *uncheckedPool) BatchView(_ context.Context, ks []string) *pool.View {
	v := &pool.View{Bufs: make([][]byte, len(ks)), Codes: make([]int64, len(ks))}
	for i, k := range ks {
		if buf, ok := u.views[k]; ok {
			v.Bufs[i], v.Codes[i] = buf, int64(len(buf))
		} else {
			v.Codes[i] = int64(pool.ErrObjectNotFound)
		}
	}
	return v
}

func reportGPU(b *testing.B, name string, conn, anchor time.Duration, anchorName string) {
	reportGPUBytes(b, name, gpuBenchBytes, conn, anchor, anchorName)
}

// reportGPUBytes is reportGPU for operations that move n bytes each; the anchor always copies
// gpuBenchBytes.
func reportGPUBytes(b *testing.B, name string, n int, conn, anchor time.Duration, anchorName string) {
	rate := func(bytes int, d time.Duration) float64 { return float64(bytes) * float64(b.N) / d.Seconds() / 1e9 }
	r, a := rate(n, conn), rate(gpuBenchBytes, anchor)
	b.ReportMetric(r, name+"-GB/s")
	b.ReportMetric(a, anchorName+"-GB/s")
	b.ReportMetric(100*r/a, name+"/"+anchorName+"-%")
	b.ReportMetric(conn.Seconds()*1e3/float64(b.N), name+"-ms/op")
}

// loadOf is the request one load of a benchmark moves: every page of g, or with "load=NMiB" in
// mode only the first N MiB of them (a small load, to see a load's fixed cost), and its bytes.
func (g *gpuBench) loadOf(mode string, page int) (RequestTransfers, int) {
	meta := g.meta
	var mib int
	if i := strings.Index(mode, "load="); i >= 0 {
		if _, err := fmt.Sscanf(mode[i:], "load=%dMiB", &mib); err == nil && mib > 0 {
			meta.Pages = meta.Pages[:min(len(meta.Pages), max(1, (mib<<20)/page))]
		}
	}
	return meta, len(meta.Pages) * page
}

var gpuBenchPages = []int{64 << 10, 256 << 10, 1 << 20}

// benchScatterPath is how the benchmark's mover scatters: the default choice (gpu.ScatterAuto),
// or in the "kernel" and "engines" modes always the copy kernel or the copy engines.
var benchScatterPath gpu.ScatterPath

func benchScatter() gpu.ScatterPath { return benchScatterPath }

func scatterMode(mode string) gpu.ScatterPath {
	switch {
	case strings.Contains(mode, "kernel"):
		return gpu.ScatterKernel
	case strings.Contains(mode, "engines"):
		return gpu.ScatterCopyEngines
	}
	return gpu.ScatterAuto
}

// BenchmarkGPULoad loads 256 MiB of pages stored in the embedded pool into device memory through
// a worker (one synchronous StartLoad), alternating with the pinned H2D 64 MiB copy. "direct"
// is the default path (pool memory registered, one DMA per region, pages checked on the GPU
// where they land); "hostcheck" checks them on the host before the copy instead (the pool's
// BatchView); "nocheck" is the in-place load with no check at all (uncheckedPool); "staged"
// copies through pinned staging (StagedTransfers). "load=NMiB" loads only the first N MiB of
// pages; "idle=D" leaves the GPU idle for D before each load; "oneissue" issues a checked load's
// pages in one batch instead of a quarter first and the rest queued behind it; "nowake" leaves
// the GPU alone until the load's first copy (wakeDeviceOff).
func BenchmarkGPULoad(b *testing.B) {
	for _, page := range gpuBenchPages {
		for _, mode := range []string{"direct", "direct,engines", "direct,kernel", "direct,hostcheck", "direct,nocheck", "direct,nocheck,engines", "direct,batch=8MiB", "direct,batch=16MiB", "direct,batch=32MiB", "direct,batch=64MiB",
			"direct,workers=4", "direct,workers=8", "staged",
			"direct,load=4MiB", "direct,load=16MiB", "direct,load=64MiB", "direct,load=180MiB",
			"direct,load=12MiB", "direct,load=12MiB,idle=30ms", "direct,load=48MiB", "direct,load=48MiB,idle=30ms",
			"direct,engines,load=12MiB", "direct,engines,load=12MiB,idle=30ms",
			"direct,nocheck,load=12MiB", "direct,hostcheck,load=12MiB", "direct,nocheck,load=48MiB",
			"direct,oneissue,load=12MiB", "direct,oneissue,load=48MiB", "direct,oneissue,load=12MiB,idle=30ms", "direct,oneissue,load=48MiB,idle=30ms",
			"direct,nocheck,load=12MiB,idle=30ms", "direct,nocheck,load=48MiB,idle=30ms",
			"direct,nowake,load=12MiB", "direct,nowake,load=12MiB,idle=30ms", "direct,nowake,load=48MiB", "direct,nowake,load=48MiB,idle=30ms",
			"direct,nocheck,nowake,load=12MiB", "direct,nocheck,nowake,load=12MiB,idle=30ms"} {
			b.Run(fmt.Sprintf("%dKiB/%s", page>>10, mode), func(b *testing.B) {
				defer setDirectBatch(mode)()
				gpuPageChecksOff = strings.Contains(mode, "hostcheck")
				issuedFirstBatchOff = strings.Contains(mode, "oneissue")
				wakeDeviceOff = strings.Contains(mode, "nowake")
				benchScatterPath = scatterMode(mode)
				defer func() {
					gpuPageChecksOff, issuedFirstBatchOff, wakeDeviceOff, benchScatterPath = false, false, false, gpu.ScatterAuto
				}()
				g := newGPUBench(b, page)
				pl := gpuPool(b, mode)
				opts := benchOptions()
				ks := make([]string, len(g.hs))
				for i, h := range g.hs {
					ks[i] = opts.Namespace.PageKey(0, 32, uint64(page), h)
				}
				fillEmbedded(b, pl, ks, page)
				var lp pool.Pool = pl
				if strings.Contains(mode, "nocheck") {
					lp = newUncheckedPool(b, pl, ks)
				}
				w, tm, rep := g.timedWorker(b, lp, mode == "staged")
				meta, loadBytes := g.loadOf(mode, page)
				b.ResetTimer()
				ctx := context.Background()
				var loadT, anchorT time.Duration
				var each []time.Duration // every load's time, for the median
				// idle=D leaves the GPU idle for D before each load, as an engine's GPU is between
				// two StartLoads when it does little else (the test engine through kvctl serve).
				var idle time.Duration
				if i := strings.Index(mode, "idle="); i >= 0 {
					var err error
					if idle, err = time.ParseDuration(mode[i+len("idle="):]); err != nil {
						b.Fatal(err)
					}
				}
				for b.Loop() {
					anchorT += g.anchor(b, true)
					time.Sleep(idle)
					t0 := time.Now()
					w.BindMeta(Metadata{Loads: []RequestTransfers{meta}})
					if err := w.StartLoad(ctx); err != nil {
						b.Fatal(err)
					}
					d := time.Since(t0)
					loadT += d
					each = append(each, d)
				}
				if f := w.TakeFailedLoadRequests(); len(f) > 0 {
					b.Fatalf("failed loads %v", f)
				}
				reportGPUBytes(b, "load", loadBytes, loadT, anchorT, "h2d")
				// The median load: small loads' means move with a few slow ones (a GC, a late
				// wake-up), which the median leaves out.
				slices.Sort(each)
				b.ReportMetric(each[len(each)/2].Seconds()*1e3, "load-p50-ms")
				// Where a load's time goes, per operation: the pool calls (get: checks or
				// copies), the wait for the last scatter (sync), and the scatters' own time.
				ph := rep.LoadTotals().Phases
				perOp := func(d time.Duration) float64 { return d.Seconds() * 1e3 / float64(b.N) }
				b.ReportMetric(perOp(ph[stats.PhaseGet].Wall), "get-ms/op")
				b.ReportMetric(perOp(ph[stats.PhaseSync].Wall), "sync-ms/op")
				b.ReportMetric(perOp(tm.busy), "scatter-ms/op")
				// The GPU's own time (CUDA events) on the copies and on the check after them.
				if lt := rep.LoadTotals(); lt.GPUCopySum > 0 {
					b.ReportMetric(perOp(lt.GPUCopySum), "gpu-copy-ms/op")
					b.ReportMetric(perOp(lt.GPUCheckSum), "gpu-check-ms/op")
				}
			})
		}
	}
}

// BenchmarkGPUCheckCost measures what the GPU page check adds to a small load: a checked load
// ("direct") and an unchecked one of the same first N MiB of pages, from the same pool into the
// same device memory, each after the pinned H2D 64 MiB copy as in BenchmarkGPULoad, alternate
// within one loop (the order swapped every iteration). Separate benchmarks of the two moved by
// up to 10 % between rounds and processes on the H200 host, more than the check costs; pairs
// within one process cancel that drift. The unchecked load's pool is "leased" (the pool's own
// deferred views with their checksums dropped: the same lookups, leases and releases as the
// checked load, with nothing to check; its one allocation a load, the dropped checksums' list,
// weighs nothing here) or "held" ("nocheck" of BenchmarkGPULoad: views taken once at set-up,
// neither looked up nor released per load). It reports both loads' means and medians and the
// check's cost over the unchecked load: check-% (means), check-p50-% (medians), and the GPU's
// time on the check after the copies (gpu-check-us); and, medians, how long after each load's
// start its first mover call came (checked-call-us, unchecked-call-us) and how long before its
// end its last scatter or check was done (…-tail-us).
func BenchmarkGPUCheckCost(b *testing.B) {
	for _, page := range gpuBenchPages {
		for _, c := range []struct {
			mib  int
			base string
		}{{12, "leased"}, {48, "leased"}, {12, "held"}, {48, "held"}} {
			b.Run(fmt.Sprintf("%dKiB/load=%dMiB/%s", page>>10, c.mib, c.base), func(b *testing.B) {
				g := newGPUBench(b, page)
				pl := gpuPool(b, "direct")
				opts := benchOptions()
				ks := make([]string, len(g.hs))
				for i, h := range g.hs {
					ks[i] = opts.Namespace.PageKey(0, 32, uint64(page), h)
				}
				fillEmbedded(b, pl, ks, page)
				checked, cm0, rep := g.timedWorker(b, pl, false)
				var base pool.Pool = leasedPool{pl}
				if c.base == "held" {
					base = newUncheckedPool(b, pl, ks)
				}
				unchecked, um0, _ := g.timedWorker(b, base, false)
				meta, _ := g.loadOf(fmt.Sprintf("load=%dMiB", c.mib), page)
				ctx := context.Background()
				// Each load's time, and from its start to its first mover call and from its last
				// scatter or check done to its end.
				var ct, ut, cCall, uCall, cTail, uTail []time.Duration
				load := func(w *Worker, tm *timedMover, all, call, tail *[]time.Duration) {
					g.anchor(b, true)
					tm.mark()
					t0 := time.Now()
					w.BindMeta(Metadata{Loads: []RequestTransfers{meta}})
					if err := w.StartLoad(ctx); err != nil {
						b.Fatal(err)
					}
					end := time.Now()
					called, done := tm.times()
					*all = append(*all, end.Sub(t0))
					*call = append(*call, called.Sub(t0))
					*tail = append(*tail, end.Sub(done))
				}
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					if i%2 == 0 {
						load(checked, cm0, &ct, &cCall, &cTail)
						load(unchecked, um0, &ut, &uCall, &uTail)
					} else {
						load(unchecked, um0, &ut, &uCall, &uTail)
						load(checked, cm0, &ct, &cCall, &cTail)
					}
				}
				b.StopTimer()
				for _, w := range []*Worker{checked, unchecked} {
					if f := w.TakeFailedLoadRequests(); len(f) > 0 {
						b.Fatalf("failed loads %v", f)
					}
				}
				cm, um := meanDuration(ct), meanDuration(ut)
				cp, up := medianDuration(ct), medianDuration(ut)
				b.ReportMetric(cm.Seconds()*1e3, "checked-ms")
				b.ReportMetric(um.Seconds()*1e3, "unchecked-ms")
				b.ReportMetric(cp.Seconds()*1e3, "checked-p50-ms")
				b.ReportMetric(up.Seconds()*1e3, "unchecked-p50-ms")
				b.ReportMetric(100*(cm.Seconds()/um.Seconds()-1), "check-%")
				b.ReportMetric(100*(cp.Seconds()/up.Seconds()-1), "check-p50-%")
				us := func(ds []time.Duration) float64 { return float64(medianDuration(ds).Nanoseconds()) / 1e3 }
				b.ReportMetric(us(cCall), "checked-call-us")
				b.ReportMetric(us(uCall), "unchecked-call-us")
				b.ReportMetric(us(cTail), "checked-tail-us")
				b.ReportMetric(us(uTail), "unchecked-tail-us")
				if lt := rep.LoadTotals(); lt.GPUCheckSum > 0 {
					b.ReportMetric(lt.GPUCheckSum.Seconds()*1e6/float64(len(ct)), "gpu-check-us")
				}
			})
		}
	}
}

// leasedPool is the embedded pool with its deferred views' checksums dropped, so a load through
// it leases, copies and releases its pages as a checked load does and checks nothing.
type leasedPool struct{ *embedded.Embedded }

func (p leasedPool) BatchViewDeferred(ctx context.Context, ks []string) *pool.View {
	v := p.Embedded.BatchViewDeferred(ctx, ks)
	v.Sums = nil
	return v
}

func (p leasedPool) BatchViewDeferredInto(ctx context.Context, ks [][]byte, v *pool.View) {
	p.Embedded.BatchViewDeferredInto(ctx, ks, v)
	v.Sums = nil
}

// meanDuration is the mean of ds (which is not empty).
func meanDuration(ds []time.Duration) time.Duration {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}

// medianDuration is the median of ds (which is not empty), leaving ds as it was.
func medianDuration(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkGPUSave saves 256 MiB of device pages into an empty embedded pool through a worker
// (WaitForSave until GetFinished reports the request), alternating with the pinned D2H 64 MiB
// copy. Each iteration makes a fresh pool and worker outside the timed part; the worker (role
// both) registers the pool's memory with the device, which also faults it in.
func BenchmarkGPUSave(b *testing.B) {
	for _, page := range gpuBenchPages {
		for _, mode := range []string{"direct", "direct,batch=8MiB", "direct,batch=64MiB", "direct,workers=8", "staged"} {
			b.Run(fmt.Sprintf("%dKiB/%s", page>>10, mode), func(b *testing.B) {
				defer setDirectBatch(mode)()
				g := newGPUBench(b, page)
				ctx := context.Background()
				var saveT, anchorT time.Duration
				for b.Loop() {
					b.StopTimer()
					pl := gpuPool(b, mode)
					w := g.worker(b, pl, mode == "staged")
					b.StartTimer()
					anchorT += g.anchor(b, false)
					t0 := time.Now()
					w.BindMeta(Metadata{Saves: []RequestTransfers{g.meta}})
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
					saveT += time.Since(t0)
					b.StopTimer()
					if st, _ := pl.Stats(ctx); st.Puts != int64(len(g.hs)) || st.PutFailures != 0 {
						b.Fatalf("saved %d pages, %d failures", st.Puts, st.PutFailures)
					}
					_ = w.Close(ctx)
					_ = pl.Close()
					b.StartTimer()
				}
				reportGPU(b, "save", saveT, anchorT, "d2h")
			})
		}
	}
}

// setDirectBatch sets directBatchBytes and directSaveBatchBytes from a mode's "batch=NMiB" and
// returns the restore.
func setDirectBatch(mode string) func() {
	oldLoad, oldChecked, oldSave := directBatchBytes, directCheckedBatchBytes, directSaveBatchBytes
	var mib int
	if i := strings.Index(mode, "batch="); i >= 0 {
		if _, err := fmt.Sscanf(mode[i:], "batch=%dMiB", &mib); err == nil && mib > 0 {
			directBatchBytes, directCheckedBatchBytes, directSaveBatchBytes = mib<<20, mib<<20, mib<<20
		}
	}
	return func() { directBatchBytes, directCheckedBatchBytes, directSaveBatchBytes = oldLoad, oldChecked, oldSave }
}

// BenchmarkGPUVerify is a diagnostic of the in-place load's pool side: BatchView over 256 MiB of
// stored 1 MiB pages in 64 MiB batches, with the pool's memory "plain" (not registered),
// "registered" with the device, and "registered+dma" (a goroutine copying 256 MiB of other
// pinned memory to the device in a loop meanwhile, as a load's scatters do, whose rate it
// reports as dma-GB/s); "workers=N" sets the pool's in-place checkers.
func BenchmarkGPUVerify(b *testing.B) {
	const page = 1 << 20
	for _, mode := range []string{"plain", "registered", "registered+dma", "registered+dma,workers=8", "registered+dma,workers=4"} {
		b.Run(mode, func(b *testing.B) {
			g := newGPUBench(b, page)
			pl := gpuPool(b, mode)
			opts := benchOptions()
			ks := make([]string, len(g.hs))
			for i, h := range g.hs {
				ks[i] = opts.Namespace.PageKey(0, 32, page, h)
			}
			fillEmbedded(b, pl, ks, page)
			if mode != "plain" {
				for _, mem := range pl.MemoryRegions() {
					r, err := g.d.RegisterHost(mem)
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { _ = r.Close() })
				}
			}
			stop := make(chan struct{})
			done := make(chan struct{})
			var dmaBytes int64
			var dmaTime time.Duration
			if strings.Contains(mode, "+dma") {
				go func() {
					defer close(done)
					for {
						select {
						case <-stop:
							return
						default:
						}
						t0 := time.Now()
						_ = g.stream.CopyChunks(true, g.mem.Pointer(), g.pinned.Bytes(), gpuAnchorChunk)
						dmaTime += time.Since(t0)
						dmaBytes += gpuBenchBytes
					}
				}()
			} else {
				close(done)
			}
			ctx := context.Background()
			b.SetBytes(int64(len(ks)) * page)
			b.ResetTimer()
			for b.Loop() {
				for s := 0; s < len(ks); s += 64 {
					v := pl.BatchView(ctx, ks[s:min(s+64, len(ks))])
					if v.Codes[0] != page {
						b.Fatalf("view = %d", v.Codes[0])
					}
					v.Release()
				}
			}
			b.StopTimer()
			close(stop)
			<-done
			if dmaTime > 0 {
				// The copy engines' rate while the checks ran (the last copy may end after them).
				b.ReportMetric(float64(dmaBytes)/dmaTime.Seconds()/1e9, "dma-GB/s")
			}
		})
	}
}
