//go:build cgo && linux

package gpu

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvctl/kvctl/core/kvmem"
)

func TestReserveNeeds(t *testing.T) {
	regions := func(n int, size uint64) []kvmem.Region {
		var rs []kvmem.Region
		for i := range n {
			rs = append(rs, kvmem.Region{Offset: uint64(i) << 30, Stride: size, Size: size})
		}
		return rs
	}
	cases := []struct {
		name   string
		layout kvmem.Layout
		batch  uint64 // reserveBatchBytes when 0
		want   batchNeeds
	}{
		{"64KiB pages, 2 regions, fewer slots than the batch", kvmem.Layout{Groups: []kvmem.GroupLayout{
			{Slots: 272, Regions: regions(2, 32<<10)}}},
			0, batchNeeds{pages: 272, pieces: 544, blocks: 272 * 63, copies: 544}},
		// 64 pages, checked as 16 units of 64 KiB each.
		{"1MiB pages, 2 regions", kvmem.Layout{Groups: []kvmem.GroupLayout{
			{Slots: 4096, Regions: regions(2, 512<<10)}}},
			0, batchNeeds{pages: 64 * 16, pieces: 64 * 16, blocks: 64 * 16 * 63, copies: 64 * 16}},
		// The check sets' batch: 256 pages.
		{"1MiB pages, 2 regions, the sets' batch", kvmem.Layout{Groups: []kvmem.GroupLayout{
			{Slots: 4096, Regions: regions(2, 512<<10)}}},
			reserveSetBatchBytes, batchNeeds{pages: 256 * 16, pieces: 256 * 16, blocks: 256 * 16 * 63, copies: 256 * 16}},
		// Units of 64, 64 and 72 KiB: the first region in the first two, the second in the
		// last two; the last unit is two copies.
		{"200KiB pages, regions across units", kvmem.Layout{Groups: []kvmem.GroupLayout{
			{Slots: 8, Regions: []kvmem.Region{{Offset: 0, Stride: 100 << 10, Size: 100 << 10}, {Offset: 1 << 30, Stride: 100 << 10, Size: 100 << 10}}}}},
			0, batchNeeds{pages: 8 * 3, pieces: 8 * 4, blocks: 8 * (63 + 63 + 71), copies: 8 * (1 + 2 + 2)}},
		{"the group with the most pages decides; replicated regions count", kvmem.Layout{Groups: []kvmem.GroupLayout{
			{Slots: 4096, Regions: regions(8, 32<<10)},
			{Slots: 8192, Regions: regions(1, 128<<10), ReplicatedRegions: regions(1, 4<<10)}}},
			0, batchNeeds{pages: 8192, pieces: 8192, blocks: 256 * 4 * 63, copies: 8192}},
		{"no slots", kvmem.Layout{Groups: []kvmem.GroupLayout{{Slots: 0, Regions: regions(2, 4096)}}}, 0, batchNeeds{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			batch := c.batch
			if batch == 0 {
				batch = reserveBatchBytes
			}
			if got := reserveNeeds(c.layout, batch); got != c.want {
				t.Errorf("reserveNeeds = %+v, want %+v", got, c.want)
			}
		})
	}
}

// TestReserveSetBytes: the reserved check buffers hold a fused check's records, which take more
// than the separate check's descriptors (a kvCheckedCopy is 56 bytes, a kvPage and a kvPiece 24
// each, and a page has one piece or more, a piece one copy or more), so the first loads of a StartLoad's size do not grow them.
func TestReserveSetBytes(t *testing.T) {
	for _, c := range []struct {
		name string
		n    batchNeeds
		want int
	}{
		{"one region a page", batchNeeds{pages: 1024, pieces: 1024, blocks: 1024 * 63, copies: 1024}, 1024*56 + 8*1024},
		{"64 regions a page", batchNeeds{pages: 256, pieces: 256 * 64, blocks: 256 * 255, copies: 256 * 64}, 256*64*56 + 8*256},
		{"regions longer than a copy", batchNeeds{pages: 16, pieces: 32, blocks: 16 * 2047, copies: 16 * 32}, 16*32*56 + 8*16},
	} {
		if got := reserveSetBytes(c.n); got != c.want {
			t.Errorf("%s: %d bytes, want %d", c.name, got, c.want)
		}
	}
}

// TestCUDACheckSetsReserved: a new mover's check sets hold a checked batch of
// reserveSetBatchBytes of 1 MiB pages, so such loads allocate nothing; a batch past that grows
// the set it uses to at least twice its size and keeps the set's fused sums (growDeltas), and the pages
// of both batches pass their checks.
func TestCUDACheckSetsReserved(t *testing.T) {
	d, err := OpenCUDA(0)
	if err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { _ = d.Close() }) // last: after the memory's and the mover's
	const page = 1 << 20
	slots := reserveSetBatchBytes/page + 64
	half := uint64(page / 2)
	l := kvmem.Layout{TokensPerBlock: 32, Groups: []kvmem.GroupLayout{{ID: 0, Slots: slots, Regions: []kvmem.Region{
		{Offset: 0, Stride: half, Size: half}, {Offset: half * uint64(slots), Stride: half, Size: half}}}}}
	mem, err := d.AllocDeviceMemory(uint64(slots * page))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mem.Close() }) // after the mover's (stagedMover's cleanups)
	m, src, sums, refs := stagedMover(t, d, mem, l, CUDAMoverOptions{}, slots, page, rand.New(rand.NewPCG(5, 6)), func(i int) int { return (i * 7) % slots })
	type caps struct {
		cap, deltaCap int
		deltas        uint64
	}
	snapshot := func() [2]caps {
		var out [2]caps
		for i := range m.checks.sets {
			s := &m.checks.sets[i]
			out[i] = caps{s.cap, int(s.deltaCap), s.deltas}
		}
		return out
	}
	reserved := snapshot()
	for i, c := range reserved {
		if c.cap == 0 || c.deltas == 0 {
			t.Fatalf("set %d not reserved: %+v", i, c)
		}
	}
	check := func(n int) {
		t.Helper()
		wait, err := m.ScatterChecked(context.Background(), src[:n], refs[:n], sums[:n])
		if err != nil {
			t.Fatal(err)
		}
		bad, err := wait()
		if err != nil {
			t.Fatal(err)
		}
		if k := slices.Index(bad, true); k >= 0 || len(bad) != n {
			t.Fatalf("%d pages: %d results, first failed %d", n, len(bad), k)
		}
	}
	// Both sets, at the reserved batch.
	n := reserveSetBatchBytes / page
	check(n)
	check(n)
	if got := snapshot(); got != reserved {
		t.Fatalf("a batch of %d MiB grew the check sets: %+v, reserved %+v", n, got, reserved)
	}
	// Past it: the set used grows, by half again, and keeps its sums.
	check(slots)
	grown := snapshot()
	j := m.checks.next ^ 1 // the set the last batch used
	if grown[j].cap <= reserved[j].cap || grown[j].deltas != reserved[j].deltas || grown[j].deltaCap != reserved[j].deltaCap {
		t.Fatalf("set %d after a larger batch: %+v, reserved %+v", j, grown[j], reserved[j])
	}
	if grown[j^1] != reserved[j^1] {
		t.Fatalf("the other set changed: %+v, reserved %+v", grown[j^1], reserved[j^1])
	}
	if grown[j].cap < 2*reserved[j].cap {
		t.Fatalf("set %d grew from %d to %d bytes, less than twice", j, reserved[j].cap, grown[j].cap)
	}
	check(slots)
	check(slots)
}
