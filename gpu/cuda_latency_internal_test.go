//go:build cgo && linux

package gpu

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
)

// BenchmarkCUDAThreadHop is the cost of one call on the device's CUDA thread with nothing to
// do: the hand-off every driver call of a mover pays.
func BenchmarkCUDAThreadHop(b *testing.B) {
	d, err := OpenCUDA(0)
	if err != nil {
		b.Skip(err)
	}
	defer d.Close()
	for b.Loop() {
		d.t.do(func() {})
	}
}

// BenchmarkCUDACheckSteps shows where a checked scatter's time goes on the GPU: events recorded
// at each step of the check (checkTimer) give the microseconds from the first copy to the end of
// the copies (copied), of the descriptors' copy (descriptors), of the check kernel (checked)
// and of the digests (digests); host-us is the wall time of ScatterChecked and
// its wait, returned-us the wall time until ScatterChecked returned (its copies done).
// "chunked" is the default (a batch of 16 MiB or more copied by the copy engines, or of
// kernelChunkMin or more by the copy kernel, is checked chunk by chunk behind its copies);
// "one-chunk" checks the whole batch after its copies. Batches the copy kernel moves take the
// check's deltas on the way (kvCopyCheck) in both; "separate" checks them with kernels of their
// own, as chunked.
func BenchmarkCUDACheckSteps(b *testing.B) {
	d, err := OpenCUDA(0)
	if err != nil {
		b.Skip(err)
	}
	defer d.Close()
	for _, c := range []struct{ batchMiB, pageKiB int }{{4, 64}, {4, 1024}, {12, 64}, {12, 1024}, {16, 64}, {48, 256}, {48, 1024}, {64, 64}, {256, 64}, {64, 1024}, {180, 1024}} {
		m, src, refs, sums, done := checkBatch(b, d, c.batchMiB, c.pageKiB)
		for _, mode := range []string{"chunked", "one-chunk", "separate"} {
			b.Run(fmt.Sprintf("batch=%dMiB/page=%dKiB/%s", c.batchMiB, c.pageKiB, mode), func(b *testing.B) {
				defer func(old bool) { fuseChecks = old }(fuseChecks)
				fuseChecks = mode != "separate"
				if mode == "one-chunk" {
					defer func(old int) { checkChunkMin = old }(checkChunkMin)
					checkChunkMin = 1 << 40
				}
				t, err := m.newCheckTimer()
				if err != nil {
					b.Fatal(err)
				}
				defer t.close()
				checkTrace = t.record
				defer func() { checkTrace = nil }()
				var total [checkSteps]float64
				var host, returned time.Duration
				ctx := context.Background()
				for b.Loop() {
					t0 := time.Now()
					wait, err := m.ScatterChecked(ctx, src, refs, sums)
					if err != nil {
						b.Fatal(err)
					}
					returned += time.Since(t0)
					bad, err := wait()
					host += time.Since(t0)
					if err != nil {
						b.Fatal(err)
					}
					if slices.Contains(bad, true) {
						b.Fatal("a page failed its check")
					}
					ms, err := t.since()
					if err != nil {
						b.Fatal(err)
					}
					for i := range ms {
						total[i] += ms[i]
					}
				}
				us := func(ms float64) float64 { return ms * 1e3 / float64(b.N) }
				for i, name := range []string{"", "copied", "descriptors", "checked", "digests"} {
					if i > 0 {
						b.ReportMetric(us(total[i]), name+"-us")
					}
				}
				b.ReportMetric(float64(host.Microseconds())/float64(b.N), "host-us")
				b.ReportMetric(float64(returned.Microseconds())/float64(b.N), "returned-us")
			})
		}
		done()
	}
}

// BenchmarkCUDAScatterOrChecked compares, on one mover and the same batch, a plain Scatter with
// a checked one (ScatterChecked, then its wait), at the sizes a StartLoad moves: returned-us is
// when the call returned (its copies done), host-us when the check had been read too. "checked"
// is the default (batches the copy kernel moves, and batches under fusedKernelBelow, are checked
// on the way by kvCopyCheck); "checked-engines" leaves pieces of 128 KiB and more to the copy
// engines whatever the batch's size, checked after them; "checked-separate" checks every batch
// with kernels of their own after the copies.
func BenchmarkCUDAScatterOrChecked(b *testing.B) {
	d, err := OpenCUDA(0)
	if err != nil {
		b.Skip(err)
	}
	defer d.Close()
	for _, c := range []struct{ batchMiB, pageKiB int }{{12, 64}, {12, 256}, {48, 64}, {48, 256}, {12, 1024}, {48, 1024}} {
		m, src, refs, sums, done := checkBatch(b, d, c.batchMiB, c.pageKiB)
		for _, mode := range []string{"scatter", "checked", "checked-engines", "checked-separate", "checked-chunk2", "checked-chunk4"} {
			b.Run(fmt.Sprintf("batch=%dMiB/page=%dKiB/%s", c.batchMiB, c.pageKiB, mode), func(b *testing.B) {
				defer func(old bool, below uint64, chunk int) {
					fuseChecks, fusedKernelBelow, checkChunkMin = old, below, chunk
				}(fuseChecks, fusedKernelBelow, checkChunkMin)
				fuseChecks = mode != "checked-separate"
				if mode == "checked-engines" {
					fusedKernelBelow = 0
				}
				switch mode {
				case "checked-chunk2":
					checkChunkMin = 2 << 20
				case "checked-chunk4":
					checkChunkMin = 4 << 20
				}
				var returned, host time.Duration
				ctx := context.Background()
				for b.Loop() {
					t0 := time.Now()
					if mode == "scatter" {
						if err := m.Scatter(ctx, src, refs); err != nil {
							b.Fatal(err)
						}
						returned += time.Since(t0)
						host += time.Since(t0)
						continue
					}
					wait, err := m.ScatterChecked(ctx, src, refs, sums)
					if err != nil {
						b.Fatal(err)
					}
					returned += time.Since(t0)
					bad, err := wait()
					host += time.Since(t0)
					if err != nil || slices.Contains(bad, true) {
						b.Fatal("check failed", err)
					}
				}
				b.ReportMetric(float64(returned.Microseconds())/float64(b.N), "returned-us")
				b.ReportMetric(float64(host.Microseconds())/float64(b.N), "host-us")
			})
		}
		done()
	}
}

// BenchmarkCUDAFirstCopy is how long after the call a batch's first copy is issued (…-first-us:
// the host's work before it, untraced), on one mover and the same 12 MiB batch of 1 MiB pages,
// for a plain Scatter ("scatter"), a checked one waited for as ScatterChecked does ("checked":
// its copies, then the check) and one issued without waiting for its copies ("issued":
// IssueChecked, then the check's wait, as the connector loads), rotated within the loop;
// …-host-us is each call's whole wall time.
func BenchmarkCUDAFirstCopy(b *testing.B) {
	d, err := OpenCUDA(0)
	if err != nil {
		b.Skip(err)
	}
	defer d.Close()
	m, src, refs, sums, done := checkBatch(b, d, 12, 1024)
	defer done()
	var t0, first time.Time
	issueHook = func() {
		if first.IsZero() {
			first = time.Now()
		}
	}
	defer func() { issueHook = nil }()
	kinds := []string{"scatter", "checked", "issued"}
	var firstT, hostT [3]time.Duration
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		for k := range kinds {
			j := (i + k) % len(kinds)
			first, t0 = time.Time{}, time.Now()
			var wait func() ([]bool, error)
			var err error
			switch kinds[j] {
			case "scatter":
				err = m.Scatter(ctx, src, refs)
			case "checked":
				wait, err = m.ScatterChecked(ctx, src, refs, sums)
			default:
				wait, err = m.IssueChecked(ctx, src, refs, sums)
			}
			if err != nil {
				b.Fatal(err)
			}
			if wait != nil {
				if bad, err := wait(); err != nil || slices.Contains(bad, true) {
					b.Fatal("check failed", err)
				}
			}
			firstT[j] += first.Sub(t0)
			hostT[j] += time.Since(t0)
		}
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(b.N) }
	for j, k := range kinds {
		b.ReportMetric(us(firstT[j]), k+"-first-us")
		b.ReportMetric(us(hostT[j]), k+"-host-us")
	}
}

// checkBatch makes a mover over new device memory of batchMiB of pageKiB pages in two regions,
// and a batch to scatter into all of it: pages from pinned staging in a scrambled slot order,
// with their checksums. done releases it all.
func checkBatch(b *testing.B, d *CUDADevice, batchMiB, pageKiB int) (m *cudaMover, src [][]byte, refs []kvmem.PageRef, sums []uint64, done func()) {
	b.Helper()
	size := pageKiB << 10
	n := (batchMiB << 20) / size
	half := uint64(size / 2)
	l := kvmem.Layout{TokensPerBlock: 32, Groups: []kvmem.GroupLayout{{ID: 0, Slots: n, Regions: []kvmem.Region{
		{Offset: 0, Stride: half, Size: half}, {Offset: half * uint64(n), Stride: half, Size: half}}}}}
	mem, err := d.AllocDeviceMemory(uint64(n * size))
	if err != nil {
		b.Fatal(err)
	}
	mv, err := d.NewMover(mem, l, CUDAMoverOptions{})
	if err != nil {
		b.Fatal(err)
	}
	m = mv.(*cudaMover)
	st, err := m.NewStaging(n, size)
	if err != nil {
		b.Fatal(err)
	}
	refs = make([]kvmem.PageRef, n)
	src = make([][]byte, n)
	sums = make([]uint64, n)
	for i := range refs {
		refs[i] = kvmem.PageRef{Slot: (i * 7919) % n}
		src[i] = st.Slot(i)
		for j := range src[i] {
			src[i][j] = byte(i*31 + j)
		}
		sums[i] = uint64(keys.PageChecksum(src[i]))
	}
	return m, src, refs, sums, func() {
		st.Close()
		mv.Close()
		mem.Close()
	}
}
