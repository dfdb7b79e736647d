//go:build cgo && linux

package gpu

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
)

// stagedPages fills the first n slots of st with bytes from rng and returns them as a batch:
// page i from slot i into engine slot slot(i), with its XXH3 digest.
func stagedPages(st kvmem.Staging, n int, rng *rand.Rand, slot func(i int) int) (src [][]byte, sums []uint64, refs []kvmem.PageRef) {
	src, sums, refs = make([][]byte, n), make([]uint64, n), make([]kvmem.PageRef, n)
	for i := range src {
		src[i] = st.Slot(i)
		for j := 0; j+8 <= len(src[i]); j += 8 {
			binary.LittleEndian.PutUint64(src[i][j:], rng.Uint64())
		}
		sums[i] = uint64(keys.PageChecksum(src[i]))
		refs[i] = kvmem.PageRef{Slot: slot(i)}
	}
	return src, sums, refs
}

// stagedMover opens a mover over mem with layout l and opts, and a staging area of slots pages
// of page bytes, both closed when the test ends, and fills it with stagedPages.
func stagedMover(t *testing.T, d *CUDADevice, mem *EngineMemory, l kvmem.Layout, opts CUDAMoverOptions, slots, page int, rng *rand.Rand, slot func(i int) int) (m *cudaMover, src [][]byte, sums []uint64, refs []kvmem.PageRef) {
	t.Helper()
	mv, err := d.NewMover(mem, l, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mv.Close() })
	m = mv.(*cudaMover)
	st, err := m.NewStaging(slots, page)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	src, sums, refs = stagedPages(st, slots, rng, slot)
	return m, src, sums, refs
}

// fusedLayout has pages of four regions whose sizes are multiples of 64 bytes but not of 1024,
// so the pieces after the first start inside a 1024-byte block, and one piece is longer than a
// copy block.
func fusedLayout(slots int) (kvmem.Layout, uint64) {
	sizes := []uint64{64 * 37, 64 * 1000, 64 * 5, 64 * 3125}
	var rs []kvmem.Region
	var off uint64
	for _, s := range sizes {
		rs = append(rs, kvmem.Region{Offset: off, Stride: s, Size: s})
		off += s * uint64(slots)
	}
	return kvmem.Layout{TokensPerBlock: 32, Groups: []kvmem.GroupLayout{{ID: 0, Slots: slots, Regions: rs}}}, off
}

// TestCUDAFusedCheck: a checked batch from pinned memory through the copy kernel is copied by
// kvCopyCheck, which takes the check's deltas on the way. Every page lands and passes; a byte
// flipped anywhere in a page (in a full block, where a piece starts inside a block, in the last
// partial block, the last byte) fails exactly that page; batches that reuse the check sets one
// after another keep passing (the deltas are left zero); and the results equal those of the
// separate check kernels on the same batches.
func TestCUDAFusedCheck(t *testing.T) {
	d, err := OpenCUDA(0)
	if err != nil {
		t.Skip(err)
	}
	defer d.Close()
	const slots = 48
	l, memBytes := fusedLayout(slots)
	mem, err := d.AllocDeviceMemory(memBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	pageBytes := int(l.Groups[0].BytesPerPage())
	for _, fuse := range []bool{true, false} {
		t.Run(fmt.Sprintf("fused=%v", fuse), func(t *testing.T) {
			defer func(old bool) { fuseChecks = old }(fuseChecks)
			fuseChecks = fuse
			rng := rand.New(rand.NewPCG(13, 14))
			m, src, sums, refs := stagedMover(t, d, mem, l, CUDAMoverOptions{Scatter: ScatterKernel}, slots, pageBytes, rng, func(i int) int { return (i * 5) % slots })
			if err := m.PageCheckError(); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			check := func(refs []kvmem.PageRef, src [][]byte, sums []uint64) []bool {
				t.Helper()
				wait, err := m.ScatterChecked(ctx, src, refs, sums)
				if err != nil {
					t.Fatal(err)
				}
				if got := len(m.fused) > 0; got != fuse {
					t.Fatalf("copied by kvCopyCheck: %v, want %v", got, fuse)
				}
				bad, err := wait()
				if err != nil {
					t.Fatal(err)
				}
				return bad
			}
			g0, began := m.GPUTime(), time.Now()
			if bad := check(refs, src, sums); slices.Contains(bad, true) {
				t.Fatalf("pages reported bad %v; their digests are XXH3's", bad)
			}
			// The batch's device time: the kernel's own clock when it checks on the way (no
			// check time after the copies), the events around the copies otherwise.
			wall, g := time.Since(began), m.GPUTime()
			if c := g.Copy - g0.Copy; c <= 0 || c > wall || (fuse && g.Check != g0.Check) || (!fuse && g.Check <= g0.Check) {
				t.Fatalf("GPU time of one batch %+v (before %+v) in %v", g, g0, wall)
			}
			got := make([][]byte, slots)
			for i := range got {
				got[i] = make([]byte, pageBytes)
			}
			if err := m.Gather(ctx, refs, got); err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if !bytes.Equal(got[i], src[i]) {
					t.Fatalf("page %d landed with other bytes", i)
				}
			}
			// One flipped byte, in one page of the batch at a time.
			for _, at := range []int{0, 1023, 1024, 64 * 37, 64*37 + 700, 64*1037 - 1, 64 * 1037, 64*1042 + 65536 + 17, pageBytes - 1000, pageBytes - 65, pageBytes - 1} {
				p := rng.IntN(slots)
				src[p][at] ^= 0x10
				bad := check(refs, src, sums)
				src[p][at] ^= 0x10
				for i := range bad {
					if bad[i] != (i == p) {
						t.Fatalf("byte %d of page %d flipped: page %d bad=%v", at, p, i, bad[i])
					}
				}
			}
			// Batches queued back to back on both check sets, waited for out of order, each with
			// its own wrong digests.
			type batch struct {
				wait func() ([]bool, error)
				want []bool
			}
			var bs []batch
			for k := range 6 {
				lo, hi := (k*8)%slots, (k*8)%slots+8
				want := make([]bool, hi-lo)
				s := slices.Clone(sums[lo:hi])
				for i := range s {
					if rng.IntN(3) == 0 {
						s[i] ^= 1 << rng.IntN(64)
						want[i] = true
					}
				}
				wait, err := m.IssueChecked(ctx, src[lo:hi], refs[lo:hi], s)
				if err != nil {
					t.Fatal(err)
				}
				bs = append(bs, batch{wait, want})
				if k%2 == 1 {
					// The older batch's wait after the newer one's.
					for _, b := range []batch{bs[k], bs[k-1]} {
						bad, err := b.wait()
						if err != nil {
							t.Fatal(err)
						}
						if !slices.Equal(bad, b.want) {
							t.Fatalf("batch %d: check says %v, want %v", k, bad, b.want)
						}
					}
				}
			}
			// A batch from memory that is not pinned (through the bounce buffer, checked on the
			// checks' stream, its deltas written into the sums a fused check adds to) between
			// fused ones: each keeps its own result, and the fused check that next uses those
			// sums clears them first.
			plain := make([][]byte, 4)
			for i := range plain {
				plain[i] = slices.Clone(src[i])
			}
			w1, err := m.IssueChecked(ctx, src[8:12], refs[8:12], sums[8:12])
			if err != nil {
				t.Fatal(err)
			}
			bent := slices.Clone(sums[:4])
			bent[2]++
			w2, err := m.ScatterChecked(ctx, plain, refs[:4], bent)
			if err != nil {
				t.Fatal(err)
			}
			w3, err := m.IssueChecked(ctx, src[16:20], refs[16:20], sums[16:20])
			if err != nil {
				t.Fatal(err)
			}
			bent4 := slices.Clone(sums[24:28])
			bent4[0]--
			w4, err := m.IssueChecked(ctx, src[24:28], refs[24:28], bent4)
			if err != nil {
				t.Fatal(err)
			}
			for k, c := range []struct {
				wait func() ([]bool, error)
				want []bool
			}{{w3, make([]bool, 4)}, {w1, make([]bool, 4)}, {w4, []bool{true, false, false, false}}, {w2, []bool{false, false, true, false}}} {
				bad, err := c.wait()
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(bad, c.want) {
					t.Fatalf("mixed batch %d: check says %v, want %v", k, bad, c.want)
				}
			}
		})
	}
}

// TestCUDAFusedSmallBatches: a checked batch of pages whose pieces the copy engines would move
// (four regions of 256 KiB) is copied and checked by kvCopyCheck while it is under
// fusedKernelBelow, and by the copy engines with the check after them from there on, as are
// pages of two regions of 512 KiB whatever the batch; all land every page and fail exactly the
// pages whose digests differ.
func TestCUDAFusedSmallBatches(t *testing.T) {
	d, err := OpenCUDA(0)
	if err != nil {
		t.Skip(err)
	}
	defer d.Close()
	const page, slots = 1 << 20, 40
	mem, err := d.AllocDeviceMemory(page * slots)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	for _, regions := range []int{4, 2} {
		t.Run(fmt.Sprintf("regions=%d", regions), func(t *testing.T) { fusedSmallBatches(t, d, mem, regions) })
	}
}

func fusedSmallBatches(t *testing.T, d *CUDADevice, mem *EngineMemory, regions int) {
	const page, slots = 1 << 20, 40
	size := uint64(page / regions)
	var rs []kvmem.Region
	for r := range regions {
		rs = append(rs, kvmem.Region{Offset: uint64(r) * size * slots, Stride: size, Size: size})
	}
	l := kvmem.Layout{TokensPerBlock: 32, Groups: []kvmem.GroupLayout{{ID: 0, Slots: slots, Regions: rs}}}
	rng := rand.New(rand.NewPCG(15, 16))
	m, src, sums, refs := stagedMover(t, d, mem, l, CUDAMoverOptions{}, slots, page, rng, func(i int) int { return (i * 3) % slots })
	ctx := context.Background()
	for _, c := range []struct {
		pages int
		fused bool
	}{{8, regions > 2}, {int(fusedKernelBelow/page) - 1, regions > 2}, {slots, false}} {
		t.Run(fmt.Sprintf("pages=%d", c.pages), func(t *testing.T) {
			s := slices.Clone(sums[:c.pages])
			want := make([]bool, c.pages)
			for _, i := range []int{0, c.pages / 2, c.pages - 1} {
				s[i] ^= 1 << rng.IntN(64)
				want[i] = true
			}
			wait, err := m.ScatterChecked(ctx, src[:c.pages], refs[:c.pages], s)
			if err != nil {
				t.Fatal(err)
			}
			if got := len(m.fused) > 0; got != c.fused {
				t.Fatalf("%d MiB of 1 MiB pages copied by kvCopyCheck: %v, want %v", c.pages, got, c.fused)
			}
			bad, err := wait()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(bad, want) {
				t.Fatalf("check says %v, want %v", bad, want)
			}
			got := make([][]byte, c.pages)
			for i := range got {
				got[i] = make([]byte, page)
			}
			if err := m.Gather(ctx, refs[:c.pages], got); err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if !bytes.Equal(got[i], src[i]) {
					t.Fatalf("page %d landed with other bytes", i)
				}
			}
		})
	}
}
