package embedded

import "sort"

// extent is a free byte range [off, off+size) of a segment.
type extent struct {
	off, size int64
}

// offsetAllocator hands out byte ranges of one segment: first fit over a free list kept
// sorted by offset, with neighbours coalesced on free. Like the master's offset allocator it
// adds no padding, so used bytes are exactly the sum of the live object sizes. It is not safe
// for concurrent use; the pool's lock guards it.
type offsetAllocator struct {
	capacity int64
	used     int64
	free     []extent
}

func newOffsetAllocator(capacity int64) *offsetAllocator {
	return &offsetAllocator{capacity: capacity, free: []extent{{0, capacity}}}
}

// alloc returns the offset of a free range of size bytes, or false when no free range is large
// enough (the pool is full or too fragmented).
func (a *offsetAllocator) alloc(size int64) (int64, bool) {
	for i := range a.free {
		e := &a.free[i]
		if e.size < size {
			continue
		}
		off := e.off
		if e.size == size {
			a.free = append(a.free[:i], a.free[i+1:]...)
		} else {
			e.off += size
			e.size -= size
		}
		a.used += size
		return off, true
	}
	return 0, false
}

// release returns [off, off+size) to the free list.
func (a *offsetAllocator) release(off, size int64) {
	a.used -= size
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].off > off })
	mergePrev := i > 0 && a.free[i-1].off+a.free[i-1].size == off
	mergeNext := i < len(a.free) && off+size == a.free[i].off
	switch {
	case mergePrev && mergeNext:
		a.free[i-1].size += size + a.free[i].size
		a.free = append(a.free[:i], a.free[i+1:]...)
	case mergePrev:
		a.free[i-1].size += size
	case mergeNext:
		a.free[i].off = off
		a.free[i].size += size
	default:
		a.free = append(a.free, extent{})
		copy(a.free[i+1:], a.free[i:])
		a.free[i] = extent{off, size}
	}
}
