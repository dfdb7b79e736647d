package kvmem

import (
	"errors"
	"fmt"
)

// ErrBadPage is wrapped by the errors Gather and Scatter return for a page reference or buffer
// that does not fit the layout.
var ErrBadPage = errors.New("bad page reference")

// ValueSize returns the size of the page value ref names in layout l.
func (l Layout) ValueSize(ref PageRef) (uint64, error) {
	rs, err := l.regions(ref)
	if err != nil {
		return 0, err
	}
	return sumSizes(rs), nil
}

// MaxValueSize is the largest page value over all groups, sharded or replicated: the width a
// staging slot needs.
func (l Layout) MaxValueSize() uint64 {
	var m uint64
	for _, g := range l.Groups {
		m = max(m, g.BytesPerPage(), g.ReplicatedBytesPerPage())
	}
	return m
}

// regions returns the regions whose bytes make up ref's value, in value order.
func (l Layout) regions(ref PageRef) ([]Region, error) {
	if ref.Group < 0 || ref.Group >= len(l.Groups) {
		return nil, fmt.Errorf("%w: group %d outside 0..%d", ErrBadPage, ref.Group, len(l.Groups)-1)
	}
	g := l.Groups[ref.Group]
	if ref.Slot < 0 || ref.Slot >= g.Slots {
		return nil, fmt.Errorf("%w: slot %d outside 0..%d of group %d", ErrBadPage, ref.Slot, g.Slots-1, ref.Group)
	}
	if ref.Replicated {
		if len(g.ReplicatedRegions) == 0 {
			return nil, fmt.Errorf("%w: group %d has no replicated regions", ErrBadPage, ref.Group)
		}
		return g.ReplicatedRegions, nil
	}
	return g.Regions, nil
}

// PieceFunc receives one contiguous piece of page value number page of a batch: engine-memory
// offset engineOff, value offset valueOff, n bytes.
type PieceFunc func(page int, engineOff, valueOff, n uint64)

// WalkPages checks a batch against the layout and the buffer sizes and then calls fn for every
// region of every page, in page order and region order; a nil fn only checks. Every Mover
// backend walks its batches with it, so they agree on what a page value is and on which
// batches are refused. It reports every problem before any copy starts, so a bad batch leaves
// engine memory and buffers untouched; the errors wrap ErrBadPage.
func WalkPages(l Layout, pages []PageRef, bufs [][]byte, fn PieceFunc) error {
	if len(pages) != len(bufs) {
		return fmt.Errorf("%w: %d pages but %d buffers", ErrBadPage, len(pages), len(bufs))
	}
	for i, ref := range pages {
		rs, err := l.regions(ref)
		if err != nil {
			return fmt.Errorf("page %d: %w", i, err)
		}
		if want := sumSizes(rs); uint64(len(bufs[i])) != want {
			return fmt.Errorf("page %d: %w: buffer of %d bytes, value is %d", i, ErrBadPage, len(bufs[i]), want)
		}
	}
	if fn == nil {
		return nil
	}
	for i, ref := range pages {
		rs, _ := l.regions(ref)
		var v uint64
		for _, r := range rs {
			fn(i, r.Offset+r.Stride*uint64(ref.Slot), v, r.Size)
			v += r.Size
		}
	}
	return nil
}

// Span is a run of engine memory: Size bytes from Offset.
type Span struct{ Offset, Size uint64 }

// ValueSpans appends to out the runs of engine memory ref's value occupies, in value order,
// regions that lie back to back merged into one run, and returns the list; an error for a
// reference outside the layout.
func (l Layout) ValueSpans(ref PageRef, out []Span) ([]Span, error) {
	rs, err := l.regions(ref)
	if err != nil {
		return out, err
	}
	slot := uint64(ref.Slot)
	start := len(out)
	for _, r := range rs {
		off := r.Offset + r.Stride*slot
		if n := len(out); n > start && out[n-1].Offset+out[n-1].Size == off {
			out[n-1].Size += r.Size
			continue
		}
		out = append(out, Span{Offset: off, Size: r.Size})
	}
	return out, nil
}

// ContiguousValue reports where ref's value lies in engine memory when it is one contiguous
// piece there (its regions back to back, in value order): its offset and size. ok is false when
// the value is split, and for a reference outside the layout.
func (l Layout) ContiguousValue(ref PageRef) (off, size uint64, ok bool) {
	rs, err := l.regions(ref)
	if err != nil || len(rs) == 0 {
		return 0, 0, false
	}
	slot := uint64(ref.Slot)
	off = rs[0].Offset + rs[0].Stride*slot
	end := off
	for _, r := range rs {
		if r.Offset+r.Stride*slot != end {
			return 0, 0, false
		}
		end += r.Size
	}
	return off, end - off, true
}
