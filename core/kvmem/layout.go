package kvmem

import (
	"fmt"
	"math/bits"
	"slices"
)

// Region is one contiguous piece of every page slot of a layer group: slot i of the region
// starts at Offset + Stride*i within the engine memory the layout was registered with and is
// Size bytes long.
type Region struct {
	Offset uint64 `json:"offset"`
	Stride uint64 `json:"stride"`
	Size   uint64 `json:"size"`
}

// GroupLayout describes one KVCacheManagerV2 layer group.
type GroupLayout struct {
	ID    int `json:"id"`    // layer group id, dense from 0
	Slots int `json:"slots"` // number of page slots in the group's pool
	// Regions hold the shard-specific bytes of a page, in the order they are concatenated into
	// the pool value. ReplicatedRegions hold bytes that are identical on every rank.
	Regions           []Region `json:"regions"`
	ReplicatedRegions []Region `json:"replicated_regions,omitempty"`
}

// BytesPerPage is the size of the group's sharded page value.
func (g GroupLayout) BytesPerPage() uint64 { return sumSizes(g.Regions) }

// ReplicatedBytesPerPage is the size of the group's replicated page value (0 when none).
func (g GroupLayout) ReplicatedBytesPerPage() uint64 { return sumSizes(g.ReplicatedRegions) }

func sumSizes(rs []Region) uint64 {
	var n uint64
	for _, r := range rs {
		n += r.Size
	}
	return n
}

// Layout is an engine's KV memory as it registers it with kvctl.
type Layout struct {
	TokensPerBlock int           `json:"tokens_per_block"`
	Groups         []GroupLayout `json:"groups"`
}

// Validate checks that the layout is addressable within memBytes bytes of engine memory.
func (l Layout) Validate(memBytes uint64) error {
	if l.TokensPerBlock < 1 {
		return fmt.Errorf("layout: tokens_per_block must be at least 1, got %d", l.TokensPerBlock)
	}
	if len(l.Groups) == 0 {
		return fmt.Errorf("layout: no layer groups")
	}
	for i, g := range l.Groups {
		if g.ID != i {
			return fmt.Errorf("layout: group %d has id %d; ids must be dense from 0", i, g.ID)
		}
		if g.Slots < 1 {
			return fmt.Errorf("layout: group %d has %d slots", i, g.Slots)
		}
		if len(g.Regions) == 0 {
			return fmt.Errorf("layout: group %d has no regions", i)
		}
		for _, set := range [][]Region{g.Regions, g.ReplicatedRegions} {
			for j, r := range set {
				if r.Size == 0 {
					return fmt.Errorf("layout: group %d region %d has size 0", i, j)
				}
				if g.Slots > 1 && r.Stride < r.Size {
					// Slots would overlap: a scatter into one page would overwrite its neighbour.
					return fmt.Errorf("layout: group %d region %d has stride %d below its size %d", i, j, r.Stride, r.Size)
				}
				last, ok := regionEnd(r, g.Slots)
				if !ok {
					return fmt.Errorf("layout: group %d region %d overflows", i, j)
				}
				if last > memBytes {
					return fmt.Errorf("layout: group %d region %d ends at byte %d, beyond the %d bytes registered", i, j, last, memBytes)
				}
			}
		}
	}
	return nil
}

// regionEnd returns the end of the last slot of r, Offset + Stride·(slots−1) + Size, and false
// when that does not fit in 64 bits.
func regionEnd(r Region, slots int) (uint64, bool) {
	hi, span := bits.Mul64(r.Stride, uint64(slots-1))
	if hi != 0 {
		return 0, false
	}
	end, carry := bits.Add64(r.Offset, span, 0)
	if carry != 0 {
		return 0, false
	}
	end, carry = bits.Add64(end, r.Size, 0)
	return end, carry == 0
}

// PageRef names one page value: the sharded or replicated regions of one slot of a group.
type PageRef struct {
	Group      int
	Slot       int
	Replicated bool
}

// Equal reports whether l and o describe the same memory.
func (l Layout) Equal(o Layout) bool {
	if l.TokensPerBlock != o.TokensPerBlock || len(l.Groups) != len(o.Groups) {
		return false
	}
	for i, g := range l.Groups {
		h := o.Groups[i]
		if g.ID != h.ID || g.Slots != h.Slots || !slices.Equal(g.Regions, h.Regions) || !slices.Equal(g.ReplicatedRegions, h.ReplicatedRegions) {
			return false
		}
	}
	return true
}
