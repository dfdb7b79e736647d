//go:build cgo && linux

package gpu

import (
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
		want   batchNeeds
	}{
		{"64KiB pages, 2 regions, fewer slots than the batch", kvmem.Layout{Groups: []kvmem.GroupLayout{
			{Slots: 272, Regions: regions(2, 32<<10)}}},
			batchNeeds{pages: 272, pieces: 544, blocks: 272 * 63, copies: 544}},
		// 64 pages, checked as 16 units of 64 KiB each.
		{"1MiB pages, 2 regions", kvmem.Layout{Groups: []kvmem.GroupLayout{
			{Slots: 4096, Regions: regions(2, 512<<10)}}},
			batchNeeds{pages: 64 * 16, pieces: 64 * 16, blocks: 64 * 16 * 63, copies: 64 * 16}},
		// Units of 64, 64 and 72 KiB: the first region in the first two, the second in the
		// last two; the last unit is two copies.
		{"200KiB pages, regions across units", kvmem.Layout{Groups: []kvmem.GroupLayout{
			{Slots: 8, Regions: []kvmem.Region{{Offset: 0, Stride: 100 << 10, Size: 100 << 10}, {Offset: 1 << 30, Stride: 100 << 10, Size: 100 << 10}}}}},
			batchNeeds{pages: 8 * 3, pieces: 8 * 4, blocks: 8 * (63 + 63 + 71), copies: 8 * (1 + 2 + 2)}},
		{"the group with the most pages decides; replicated regions count", kvmem.Layout{Groups: []kvmem.GroupLayout{
			{Slots: 4096, Regions: regions(8, 32<<10)},
			{Slots: 8192, Regions: regions(1, 128<<10), ReplicatedRegions: regions(1, 4<<10)}}},
			batchNeeds{pages: 8192, pieces: 8192, blocks: 256 * 4 * 63, copies: 8192}},
		{"no slots", kvmem.Layout{Groups: []kvmem.GroupLayout{{Slots: 0, Regions: regions(2, 4096)}}}, batchNeeds{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := reserveNeeds(c.layout); got != c.want {
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
