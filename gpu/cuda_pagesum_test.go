//go:build cgo && linux

package gpu_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/gpu"
)

// checkLayout has three layer groups: pages of three regions with uneven sizes (multiples of
// 64 bytes) and a little over 1 MiB, pages of 64 KiB, and pages of 256 bytes.
func checkLayout() kvmem.Layout {
	const slots0, slots1, slots2 = 8, 300, 16
	a, b, c := uint64(64*1000), uint64(64*37), uint64(1<<20)
	off := uint64(0)
	next := func(n uint64, slots int) uint64 { o := off; off += n * uint64(slots); return o }
	g0 := kvmem.GroupLayout{ID: 0, Slots: slots0, Regions: []kvmem.Region{
		{Offset: next(a, slots0), Stride: a, Size: a},
		{Offset: next(b, slots0), Stride: b, Size: b},
		{Offset: next(c, slots0), Stride: c, Size: c},
	}}
	g1 := kvmem.GroupLayout{ID: 1, Slots: slots1, Regions: []kvmem.Region{{Offset: next(64<<10, slots1), Stride: 64 << 10, Size: 64 << 10}}}
	g2 := kvmem.GroupLayout{ID: 2, Slots: slots2, Regions: []kvmem.Region{{Offset: next(256, slots2), Stride: 256, Size: 256}}}
	return kvmem.Layout{TokensPerBlock: 32, Groups: []kvmem.GroupLayout{g0, g1, g2}}
}

func layoutBytes(l kvmem.Layout) uint64 {
	var end uint64
	for _, g := range l.Groups {
		for _, r := range g.Regions {
			end = max(end, r.Offset+r.Stride*uint64(g.Slots))
		}
	}
	return end
}

// checkMover is a CUDA mover with the default options over device memory for l, both closed
// when the test ends.
func checkMover(t *testing.T, l kvmem.Layout) kvmem.Mover {
	t.Helper()
	d := openCUDA(t)
	mem, err := d.AllocDeviceMemory(layoutBytes(l))
	if err != nil {
		t.Fatal(err)
	}
	m, err := d.NewMover(mem, l, gpu.CUDAMoverOptions{})
	if err != nil {
		_ = mem.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = m.Close()
		_ = mem.Close()
	})
	return m
}

// TestCUDAPageChecks checks pages on the GPU after a scatter: every digest the kernel computes
// equals XXH3-64 of the page (for pages of several regions, of one, and short ones, in batches
// larger than the GPU has multiprocessors), and a page whose digest differs is reported bad,
// exactly those pages.
func TestCUDAPageChecks(t *testing.T) {
	l := checkLayout()
	m := checkMover(t, l)
	pc, ok := m.(kvmem.PageChecker)
	if !ok {
		t.Fatal("the CUDA mover is not a PageChecker")
	}
	if err := pc.PageCheckError(); err != nil {
		t.Fatalf("the CUDA mover cannot check pages: %v", err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	ctx := context.Background()
	for _, batch := range []struct{ group, n int }{{0, 8}, {1, 300}, {2, 16}, {1, 1}} {
		t.Run(fmt.Sprintf("group=%d/pages=%d", batch.group, batch.n), func(t *testing.T) {
			refs := make([]kvmem.PageRef, batch.n)
			src := make([][]byte, batch.n)
			sums := make([]uint64, batch.n)
			for i := range refs {
				refs[i] = kvmem.PageRef{Group: batch.group, Slot: (i * 7) % l.Groups[batch.group].Slots}
				if batch.n > l.Groups[batch.group].Slots {
					refs[i].Slot = i % l.Groups[batch.group].Slots
				}
				size, err := l.ValueSize(refs[i])
				if err != nil {
					t.Fatal(err)
				}
				src[i] = make([]byte, size)
				for j := range src[i] {
					src[i][j] = byte(rng.Uint32())
				}
				sums[i] = uint64(keys.PageChecksum(src[i]))
			}
			// Slots repeat in the 300-page batch: the last write wins, so check one page a slot.
			last := map[int]int{}
			for i, r := range refs {
				last[r.Slot] = i
			}
			bad, err := scatterChecked(ctx, pc, src, refs, sums)
			if err != nil {
				t.Fatal(err)
			}
			for i := range refs {
				if last[refs[i].Slot] == i && bad[i] {
					t.Fatalf("page %d (%d bytes) reported bad; its digest is XXH3's", i, len(src[i]))
				}
			}
			// Read back one page: the scatter itself landed.
			got := make([][]byte, 1)
			got[0] = make([]byte, len(src[0]))
			i0 := last[refs[0].Slot]
			if err := m.Gather(ctx, refs[i0:i0+1], got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got[0], src[i0]) {
				t.Fatal("gathered page differs from what was scattered")
			}
			// Wrong digests for some pages: exactly those are bad.
			want := map[int]bool{}
			for i := range refs {
				if last[refs[i].Slot] == i && rng.IntN(3) == 0 {
					sums[i] ^= 1 << rng.IntN(64)
					want[i] = true
				}
			}
			if bad, err = scatterChecked(ctx, pc, src, refs, sums); err != nil {
				t.Fatal(err)
			}
			for i := range refs {
				if last[refs[i].Slot] == i && bad[i] != want[i] {
					t.Fatalf("page %d: bad=%v, want %v", i, bad[i], want[i])
				}
			}
		})
	}
	t.Run("corrupted source", func(t *testing.T) {
		// The digest is of the bytes as written; one flipped byte in what is copied is caught.
		ref := []kvmem.PageRef{{Group: 0, Slot: 3}}
		size, _ := l.ValueSize(ref[0])
		page := make([]byte, size)
		for j := range page {
			page[j] = byte(rng.Uint32())
		}
		sum := []uint64{uint64(keys.PageChecksum(page))}
		for _, at := range []int{0, 64*1000 - 1, 64 * 1000, 64*1037 + 5, len(page) - 1} {
			page[at] ^= 0x40
			bad, err := scatterChecked(ctx, pc, [][]byte{page}, ref, sum)
			if err != nil {
				t.Fatal(err)
			}
			if !bad[0] {
				t.Fatalf("byte %d flipped: page not reported bad", at)
			}
			page[at] ^= 0x40
		}
	})
}

// TestCUDAPageChecksLargeBatches checks batches large enough to be copied and checked in
// chunks (from pinned memory, 16 MiB or more through the copy engines, 64 MiB or more through
// the copy kernel) and one copied by the copy kernel in one piece:
// every page lands, a page whose digest differs is reported bad in whichever chunk it is, and
// only those pages.
func TestCUDAPageChecksLargeBatches(t *testing.T) {
	d := openCUDA(t)
	for _, c := range []struct {
		name      string
		pages     int
		pageBytes int
	}{{"engines, chunked", 40, 1 << 20}, {"kernel", 400, 64 << 10}, {"kernel, chunked", 1100, 64 << 10}} {
		t.Run(c.name, func(t *testing.T) {
			half := uint64(c.pageBytes / 2)
			l := kvmem.Layout{TokensPerBlock: 32, Groups: []kvmem.GroupLayout{{ID: 0, Slots: c.pages, Regions: []kvmem.Region{
				{Offset: 0, Stride: half, Size: half}, {Offset: half * uint64(c.pages), Stride: half, Size: half}}}}}
			mem, err := d.AllocDeviceMemory(uint64(c.pages * c.pageBytes))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = mem.Close() })
			m, err := d.NewMover(mem, l, gpu.CUDAMoverOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = m.Close() })
			st, err := m.NewStaging(c.pages, c.pageBytes)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			rng := rand.New(rand.NewPCG(7, 8))
			refs := make([]kvmem.PageRef, c.pages)
			src := make([][]byte, c.pages)
			sums := make([]uint64, c.pages)
			for i := range refs {
				refs[i] = kvmem.PageRef{Slot: (i * 7919) % c.pages}
				src[i] = st.Slot(i)
				for j := 0; j < len(src[i]); j += 8 {
					binary.LittleEndian.PutUint64(src[i][j:], rng.Uint64())
				}
				sums[i] = uint64(keys.PageChecksum(src[i]))
			}
			pc := m.(kvmem.PageChecker)
			ctx := context.Background()
			bad, err := scatterChecked(ctx, pc, src, refs, sums)
			if err != nil {
				t.Fatal(err)
			}
			if i := slices.Index(bad, true); i >= 0 {
				t.Fatalf("page %d reported bad; its digest is XXH3's", i)
			}
			got := make([][]byte, c.pages)
			for i := range got {
				got[i] = make([]byte, c.pageBytes)
			}
			if err := m.Gather(ctx, refs, got); err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if !bytes.Equal(got[i], src[i]) {
					t.Fatalf("page %d landed with other bytes", i)
				}
			}
			// One wrong digest in each quarter of the batch, the first and the last page.
			want := map[int]bool{0: true, c.pages - 1: true}
			for q := range 4 {
				want[q*c.pages/4+rng.IntN(c.pages/4)] = true
			}
			for i := range want {
				sums[i] ^= 1 << rng.IntN(64)
			}
			if bad, err = scatterChecked(ctx, pc, src, refs, sums); err != nil {
				t.Fatal(err)
			}
			for i := range bad {
				if bad[i] != want[i] {
					t.Fatalf("page %d: bad=%v, want %v", i, bad[i], want[i])
				}
			}
		})
	}
}

func scatterChecked(ctx context.Context, pc kvmem.PageChecker, src [][]byte, refs []kvmem.PageRef, sums []uint64) ([]bool, error) {
	wait, err := pc.ScatterChecked(ctx, src, refs, sums)
	if err != nil {
		return nil, err
	}
	return wait()
}

// TestCUDAPageCheckOverlapped: checks of consecutive batches overlap; each result stays with
// its own batch, also when several are collected late.
func TestCUDAPageCheckOverlapped(t *testing.T) {
	pc := checkMover(t, checkLayout()).(kvmem.PageChecker)
	rng := rand.New(rand.NewPCG(5, 6))
	ctx := context.Background()
	type batch struct {
		wait func() ([]bool, error)
		want []bool
	}
	var batches []batch
	began := time.Now()
	for k := range 5 {
		n := 40
		refs := make([]kvmem.PageRef, n)
		src := make([][]byte, n)
		sums := make([]uint64, n)
		want := make([]bool, n)
		for i := range refs {
			refs[i] = kvmem.PageRef{Group: 1, Slot: k*n + i}
			src[i] = make([]byte, 64<<10)
			for j := range src[i] {
				src[i][j] = byte(rng.Uint32())
			}
			sums[i] = uint64(keys.PageChecksum(src[i]))
			if rng.IntN(4) == 0 {
				sums[i]++
				want[i] = true
			}
		}
		wait, err := pc.ScatterChecked(ctx, src, refs, sums)
		if err != nil {
			t.Fatal(err)
		}
		batches = append(batches, batch{wait, want})
	}
	for k := len(batches) - 1; k >= 0; k-- {
		bad, err := batches[k].wait()
		if err != nil {
			t.Fatal(err)
		}
		for i := range bad {
			if bad[i] != batches[k].want[i] {
				t.Fatalf("batch %d page %d: bad=%v, want %v", k, i, bad[i], batches[k].want[i])
			}
		}
	}
	// Every check read adds its device time: copies and check both took some, and no more
	// than the host waited for all of them.
	wall := time.Since(began)
	g := pc.(kvmem.GPUTimer).GPUTime()
	if g.Copy <= 0 || g.Check <= 0 || g.Copy+g.Check > wall {
		t.Errorf("GPU time %+v after five checked scatters in %v", g, wall)
	}
	t.Logf("GPU time of five checked scatters of 40 pages: %+v (wall %v)", g, wall)
}

// TestCUDAPageCheckRefused: a layout the kernel cannot read stripe by stripe makes the mover
// say why, and ScatterChecked fails rather than guess.
func TestCUDAPageCheckRefused(t *testing.T) {
	d := openCUDA(t)
	l := kvmem.Layout{TokensPerBlock: 32, Groups: []kvmem.GroupLayout{{ID: 0, Slots: 4, Regions: []kvmem.Region{{Stride: 1000, Size: 1000}}}}}
	mem, err := d.AllocDeviceMemory(4000)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	m, err := d.NewMover(mem, l, gpu.CUDAMoverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	pc := m.(kvmem.PageChecker)
	if pc.PageCheckError() == nil {
		t.Fatal("1000-byte regions accepted for GPU checks")
	}
	if _, err := scatterChecked(context.Background(), pc, [][]byte{make([]byte, 1000)}, []kvmem.PageRef{{Slot: 1}}, []uint64{0}); err == nil {
		t.Fatal("ScatterChecked ran on a layout it cannot check")
	}
}

// BenchmarkCUDAPageCheck compares a scatter of a batch of pages (64 MiB, or 4 MiB to see a
// batch's fixed cost) with the same scatter followed by the check on the GPU, and with one
// pinned copy of the same bytes ("copy"): the check's cost is the ratio.
func BenchmarkCUDAPageCheck(b *testing.B) {
	d := openCUDA(b)
	for _, c := range []struct {
		batchMiB, pageKiB, regions int
		kernel                     bool
	}{{64, 64, 2, false}, {64, 64, 2, true}, {64, 256, 2, false}, {64, 256, 2, true}, {64, 256, 8, false}, {64, 256, 8, true}, {64, 1024, 2, false}, {64, 1024, 2, true},
		{4, 64, 2, false}, {4, 64, 2, true}, {4, 1024, 2, false}, {4, 1024, 2, true}} {
		pageKiB := c.pageKiB
		size := pageKiB << 10
		n := (c.batchMiB << 20) / size
		piece := uint64(size / c.regions)
		var regions []kvmem.Region
		for r := range c.regions {
			regions = append(regions, kvmem.Region{Offset: uint64(r*n) * piece, Stride: piece, Size: piece})
		}
		l := kvmem.Layout{TokensPerBlock: 32, Groups: []kvmem.GroupLayout{{ID: 0, Slots: n, Regions: regions}}}
		mem, err := d.AllocDeviceMemory(uint64(n * size))
		if err != nil {
			b.Fatal(err)
		}
		m, err := d.NewMover(mem, l, gpu.CUDAMoverOptions{Scatter: scatterPath(c.kernel)})
		if err != nil {
			b.Fatal(err)
		}
		st, err := m.NewStaging(n, size)
		if err != nil {
			b.Fatal(err)
		}
		refs := make([]kvmem.PageRef, n)
		src := make([][]byte, n)
		sums := make([]uint64, n)
		for i := range refs {
			refs[i] = kvmem.PageRef{Slot: i}
			src[i] = st.Slot(i)
			for j := range src[i] {
				src[i][j] = byte(i + j)
			}
			sums[i] = uint64(keys.PageChecksum(src[i]))
		}
		pc := m.(kvmem.PageChecker)
		ctx := context.Background()
		name := fmt.Sprintf("page=%dKiB/regions=%d/kernel=%v", pageKiB, c.regions, c.kernel)
		if c.batchMiB != 64 {
			name = fmt.Sprintf("batch=%dMiB/%s", c.batchMiB, name)
		}
		if !c.kernel {
			b.Run(name+"/copy", func(b *testing.B) {
				s, err := d.NewStream()
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				pinned, err := d.AllocPinned(n*size, false)
				if err != nil {
					b.Fatal(err)
				}
				defer pinned.Close()
				b.SetBytes(int64(n * size))
				for b.Loop() {
					if err := s.CopyChunks(true, mem.Pointer(), pinned.Bytes(), n*size); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		b.Run(name+"/scatter", func(b *testing.B) {
			b.SetBytes(int64(n * size))
			for b.Loop() {
				if err := m.Scatter(ctx, src, refs); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/scatter+check", func(b *testing.B) {
			b.SetBytes(int64(n * size))
			for b.Loop() {
				bad, err := scatterChecked(ctx, pc, src, refs, sums)
				if err != nil {
					b.Fatal(err)
				}
				for i := range bad {
					if bad[i] {
						b.Fatalf("page %d bad", i)
					}
				}
			}
		})
		b.Run(name+"/scatter+check,overlapped", func(b *testing.B) {
			// As a load uses it: the check of one batch runs while the next batch is copied.
			b.SetBytes(int64(n * size))
			var prev func() ([]bool, error)
			for b.Loop() {
				wait, err := pc.ScatterChecked(ctx, src, refs, sums)
				if err != nil {
					b.Fatal(err)
				}
				if prev != nil {
					if _, err := prev(); err != nil {
						b.Fatal(err)
					}
				}
				prev = wait
			}
			if _, err := prev(); err != nil {
				b.Fatal(err)
			}
		})
		st.Close()
		m.Close()
		mem.Close()
	}
}

// scatterPath is the copy kernel or the copy engines, for benchmarks that compare the two.
func scatterPath(kernel bool) gpu.ScatterPath {
	if kernel {
		return gpu.ScatterKernel
	}
	return gpu.ScatterCopyEngines
}

// TestCUDAIssueChecked queues checked scatters back to back without waiting for their copies
// (IssueChecked), from pinned memory through the copy kernel and through the copy engines: each
// batch's check result is right whatever order they are read in, and once every wait returned
// the device holds every page's bytes. The third and fourth batches reuse the first two's check
// buffers, so they also wait for those internally.
func TestCUDAIssueChecked(t *testing.T) {
	d := openCUDA(t)
	const piece, slots, batches, per = 32 << 10, 512, 4, 100
	l := kvmem.Layout{TokensPerBlock: 32, Groups: []kvmem.GroupLayout{{ID: 0, Slots: slots, Regions: []kvmem.Region{
		{Offset: 0, Stride: piece, Size: piece}, {Offset: piece * slots, Stride: piece, Size: piece}}}}}
	mem, err := d.AllocDeviceMemory(2 * piece * slots)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	src, err := d.AllocPinned(batches*per*2*piece, false)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	rng := rand.New(rand.NewPCG(9, 10))
	for i := range src.Bytes() {
		src.Bytes()[i] = byte(rng.Uint32())
	}
	for _, path := range []struct {
		name string
		path gpu.ScatterPath
	}{{"kernel", gpu.ScatterKernel}, {"engines", gpu.ScatterCopyEngines}} {
		t.Run(path.name, func(t *testing.T) {
			mv, err := d.NewMover(mem, l, gpu.CUDAMoverOptions{Scatter: path.path})
			if err != nil {
				t.Fatal(err)
			}
			defer mv.Close()
			ac := mv.(kvmem.AsyncPageChecker)
			type batch struct {
				wait  func() ([]bool, error)
				want  []bool
				pages []kvmem.PageRef
				src   [][]byte
			}
			var bs []batch
			for k := range batches {
				var b batch
				for i := range per {
					p := (k*per + i) * 2 * piece
					b.src = append(b.src, src.Bytes()[p:p+2*piece])
					b.pages = append(b.pages, kvmem.PageRef{Slot: (k*per*7 + i*7) % slots}) // distinct over every batch
				}
				sums := make([]uint64, per)
				b.want = make([]bool, per)
				for i := range sums {
					sums[i] = uint64(keys.PageChecksum(b.src[i]))
					if rng.IntN(5) == 0 {
						sums[i] ^= 1
						b.want[i] = true
					}
				}
				if b.wait, err = ac.IssueChecked(context.Background(), b.src, b.pages, sums); err != nil {
					t.Fatalf("batch %d: %v", k, err)
				}
				bs = append(bs, b)
			}
			for _, k := range []int{2, 0, 3, 1} {
				bad, err := bs[k].wait()
				if err != nil {
					t.Fatalf("batch %d: %v", k, err)
				}
				if !slices.Equal(bad, bs[k].want) {
					t.Fatalf("batch %d: check says %v, want %v", k, bad, bs[k].want)
				}
			}
			last := map[int][]byte{}
			for _, b := range bs {
				for i, p := range b.pages {
					last[p.Slot] = b.src[i]
				}
			}
			if len(last) != batches*per {
				t.Fatalf("%d distinct slots, want %d", len(last), batches*per)
			}
			got := make([]byte, piece)
			for s, want := range last {
				for r := range 2 {
					if err := mem.CopyOut(uint64(r*piece*slots+s*piece), got); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got, want[r*piece:(r+1)*piece]) {
						t.Fatalf("slot %d region %d holds other bytes than were scattered into it", s, r)
					}
				}
			}
		})
	}
}

// TestCUDAWakeDevice: waking the device queues nothing a transfer notices. Woken (twice) before
// each of several checked scatters, on the stream the copies use, every page lands and passes
// its check, a page with a wrong digest still fails, and a closed mover refuses to wake.
func TestCUDAWakeDevice(t *testing.T) {
	l := checkLayout()
	d := openCUDA(t)
	mem, err := d.AllocDeviceMemory(layoutBytes(l))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	for _, kernel := range []bool{true, false} {
		t.Run(fmt.Sprintf("kernel=%v", kernel), func(t *testing.T) {
			m, err := d.NewMover(mem, l, gpu.CUDAMoverOptions{Scatter: scatterPath(kernel)})
			if err != nil {
				t.Fatal(err)
			}
			w, ok := m.(kvmem.DeviceWaker)
			if !ok {
				t.Fatal("the CUDA mover is not a DeviceWaker")
			}
			pc := m.(kvmem.PageChecker)
			rng := rand.New(rand.NewPCG(5, 6))
			ctx := context.Background()
			const n = 200
			// From pinned memory, as loads from the pool copy: the copies queue on the stream
			// the device was woken on.
			pinned, err := d.AllocPinned(n<<16, false)
			if err != nil {
				t.Fatal(err)
			}
			defer pinned.Close()
			refs := make([]kvmem.PageRef, n)
			src := make([][]byte, n)
			sums := make([]uint64, n)
			for i := range refs {
				refs[i] = kvmem.PageRef{Group: 1, Slot: i}
				src[i] = pinned.Bytes()[i<<16 : (i+1)<<16]
				for j := range src[i] {
					src[i][j] = byte(rng.Uint32())
				}
				sums[i] = uint64(keys.PageChecksum(src[i]))
			}
			for round := range 3 {
				for range 2 {
					if err := w.WakeDevice(); err != nil {
						t.Fatalf("round %d: wake: %v", round, err)
					}
				}
				bad := round == 2
				if bad {
					sums[17] ^= 1
				}
				got, err := scatterChecked(ctx, pc, src, refs, sums)
				if err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				for i, b := range got {
					if b != (bad && i == 17) {
						t.Fatalf("round %d: page %d bad=%v", round, i, b)
					}
				}
				back := [][]byte{make([]byte, 64<<10)}
				if err := m.Gather(ctx, refs[n-1:], back); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(back[0], src[n-1]) {
					t.Fatalf("round %d: the last page did not land", round)
				}
			}
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			if err := w.WakeDevice(); !errors.Is(err, kvmem.ErrClosed) {
				t.Fatalf("wake after close = %v, want kvmem.ErrClosed", err)
			}
		})
	}
}
