package radix

import (
	"encoding/binary"
	"math/bits"

	"github.com/kvctl/kvctl/core/keys"
)

// keyIndex maps a block key to its node with open addressing and linear probing. A slot packs
// the low 32 bits of the key's mixed hash (tag) above the node id, so most probes that do not
// match are rejected without touching the node. Ids are never 0 (the root is not indexed), so
// a zero slot is empty. Deletion shifts later entries back, so there are no tombstones.
type keyIndex struct {
	slots []uint64
	mask  uint64
	count int
}

const minIndexSlots = 16

func hashKey(k *keys.Hash) uint64 {
	lo := binary.LittleEndian.Uint64(k[0:8])
	hi := binary.LittleEndian.Uint64(k[8:16])
	// Chain keys are already uniform; the mixing keeps structured keys (tests, hand-made
	// ids) from clustering in the table.
	h := lo*0x9e3779b97f4a7c15 ^ bits.RotateLeft64(hi*0xc2b2ae3d27d4eb4f, 31)
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	return h
}

func (x *keyIndex) init(n int) {
	size := minIndexSlots
	for size*3 < n*4 {
		size <<= 1
	}
	x.slots = make([]uint64, size)
	x.mask = uint64(size - 1)
	x.count = 0
}

// get returns the id stored for k, or 0. nodeKey reads a node's key.
func (t *Tree) indexGet(k *keys.Hash) int32 {
	x := &t.index
	h := hashKey(k)
	tag := h & 0xffffffff
	for i := h & x.mask; ; i = (i + 1) & x.mask {
		s := x.slots[i]
		if s == 0 {
			return 0
		}
		if s>>32 == tag {
			id := int32(uint32(s))
			if t.nd(id).key == *k {
				return id
			}
		}
	}
}

func (t *Tree) indexPut(k *keys.Hash, id int32) {
	x := &t.index
	if (x.count+1)*4 > len(x.slots)*3 {
		x.grow()
	}
	h := hashKey(k)
	tag := h & 0xffffffff
	i := h & x.mask
	for x.slots[i] != 0 {
		i = (i + 1) & x.mask
	}
	x.slots[i] = tag<<32 | uint64(uint32(id))
	x.count++
}

func (x *keyIndex) grow() {
	old := x.slots
	x.slots = make([]uint64, 2*len(old))
	x.mask = uint64(len(x.slots) - 1)
	for _, s := range old {
		if s == 0 {
			continue
		}
		i := (s >> 32) & x.mask
		for x.slots[i] != 0 {
			i = (i + 1) & x.mask
		}
		x.slots[i] = s
	}
}

// indexDelete removes the entry for id, whose key is k.
func (t *Tree) indexDelete(k *keys.Hash, id int32) {
	x := &t.index
	h := hashKey(k)
	i := h & x.mask
	for {
		s := x.slots[i]
		if s == 0 {
			return
		}
		if int32(uint32(s)) == id {
			break
		}
		i = (i + 1) & x.mask
	}
	// Backward shift: move later entries of the run into the gap when their home position
	// does not lie cyclically between the gap and their current slot.
	j := i
	for {
		j = (j + 1) & x.mask
		s := x.slots[j]
		if s == 0 {
			break
		}
		home := (s >> 32) & x.mask
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			x.slots[i] = s
			i = j
		}
	}
	x.slots[i] = 0
	x.count--
}
