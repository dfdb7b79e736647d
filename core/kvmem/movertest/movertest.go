package movertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvctl/kvctl/core/kvmem"
)

// Engine is engine memory as a test sees it.
type Engine interface {
	// Size is the number of bytes registered.
	Size() int
	// Write and Read copy to and from engine memory at off, bypassing any Mover.
	Write(off int, p []byte) error
	Read(off int, p []byte) error
	// NewMover returns a Mover over this memory for layout.
	NewMover(layout kvmem.Layout) (kvmem.Mover, error)
	// Close releases the memory.
	Close() error
}

// Backend makes engine memory of a given size.
type Backend struct {
	Name      string
	NewEngine func(t *testing.T, size int) Engine
	// LiveAllocations counts the backend's host staging allocations not yet released (page
	// locked or plain), so the suite can check that Close releases everything.
	LiveAllocations func() int
}

// Run runs the whole suite against b.
func Run(t *testing.T, b Backend) {
	t.Run("RoundTrip", func(t *testing.T) { testRoundTrip(t, b, false) })
	t.Run("RoundTripStaging", func(t *testing.T) { testRoundTrip(t, b, true) })
	t.Run("Clone", func(t *testing.T) { testClone(t, b) })
	t.Run("BadInput", func(t *testing.T) { testBadInput(t, b) })
	t.Run("ReleasesAllocations", func(t *testing.T) { testReleases(t, b) })
}

// RandomLayout returns a valid layout of several groups with sharded and replicated regions of
// odd sizes laid out one after another, and the number of bytes it spans.
func RandomLayout(r *rand.Rand) (kvmem.Layout, int) {
	l := kvmem.Layout{TokensPerBlock: 1 << r.IntN(7)}
	var off uint64
	region := func(slots int) kvmem.Region {
		size := uint64(1 + r.IntN(3000))
		stride := size + uint64(r.IntN(3))*uint64(1+r.IntN(512))
		reg := kvmem.Region{Offset: off + uint64(r.IntN(64)), Stride: stride, Size: size}
		off = reg.Offset + stride*uint64(slots-1) + size
		return reg
	}
	for g := range 1 + r.IntN(4) {
		gl := kvmem.GroupLayout{ID: g, Slots: 1 + r.IntN(24)}
		for range 1 + r.IntN(4) {
			gl.Regions = append(gl.Regions, region(gl.Slots))
		}
		for range r.IntN(3) {
			gl.ReplicatedRegions = append(gl.ReplicatedRegions, region(gl.Slots))
		}
		l.Groups = append(l.Groups, gl)
	}
	return l, int(off) + r.IntN(100)
}

// expectedValue reads ref's value from a host copy of engine memory.
func expectedValue(mem []byte, l kvmem.Layout, ref kvmem.PageRef) []byte {
	g := l.Groups[ref.Group]
	rs := g.Regions
	if ref.Replicated {
		rs = g.ReplicatedRegions
	}
	var v []byte
	for _, r := range rs {
		o := r.Offset + r.Stride*uint64(ref.Slot)
		v = append(v, mem[o:o+r.Size]...)
	}
	return v
}

func applyValue(mem []byte, l kvmem.Layout, ref kvmem.PageRef, v []byte) {
	g := l.Groups[ref.Group]
	rs := g.Regions
	if ref.Replicated {
		rs = g.ReplicatedRegions
	}
	for _, r := range rs {
		o := r.Offset + r.Stride*uint64(ref.Slot)
		copy(mem[o:o+r.Size], v[:r.Size])
		v = v[r.Size:]
	}
}

// allPages lists every page value of l.
func allPages(l kvmem.Layout) []kvmem.PageRef {
	var refs []kvmem.PageRef
	for _, g := range l.Groups {
		for s := range g.Slots {
			refs = append(refs, kvmem.PageRef{Group: g.ID, Slot: s})
			if len(g.ReplicatedRegions) > 0 {
				refs = append(refs, kvmem.PageRef{Group: g.ID, Slot: s, Replicated: true})
			}
		}
	}
	return refs
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func newEngine(t *testing.T, b Backend, r *rand.Rand, size int) (Engine, []byte) {
	t.Helper()
	e := b.NewEngine(t, size)
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close engine memory: %v", err)
		}
	})
	model := randBytes(r, size)
	if err := e.Write(0, model); err != nil {
		t.Fatalf("fill engine memory: %v", err)
	}
	return e, model
}

func checkEngine(t *testing.T, e Engine, model []byte, what string) {
	t.Helper()
	got := make([]byte, len(model))
	if err := e.Read(0, got); err != nil {
		t.Fatalf("read engine memory: %v", err)
	}
	if i := firstDiff(got, model); i >= 0 {
		t.Fatalf("%s: engine memory differs from the expected bytes at offset %d (got %#x, want %#x)", what, i, got[i], model[i])
	}
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func mustMover(t *testing.T, e Engine, l kvmem.Layout) kvmem.Mover {
	t.Helper()
	m, err := e.NewMover(l)
	if err != nil {
		t.Fatalf("new mover: %v", err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// buffers returns one buffer per page, either ordinary Go memory or slots of st.
func buffers(t *testing.T, l kvmem.Layout, pages []kvmem.PageRef, st kvmem.Staging) [][]byte {
	t.Helper()
	bufs := make([][]byte, len(pages))
	for i, p := range pages {
		n, err := l.ValueSize(p)
		if err != nil {
			t.Fatal(err)
		}
		if st == nil {
			bufs[i] = make([]byte, n)
		} else {
			bufs[i] = st.Slot(i)[:n]
		}
	}
	return bufs
}

func testRoundTrip(t *testing.T, b Backend, staged bool) {
	ctx := context.Background()
	for seed := range uint64(12) {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 0x6b76))
			l, size := RandomLayout(r)
			e, model := newEngine(t, b, r, size)
			m := mustMover(t, e, l)

			pages := allPages(l)
			r.Shuffle(len(pages), func(i, j int) { pages[i], pages[j] = pages[j], pages[i] })
			pages = pages[:1+r.IntN(len(pages))]
			var st kvmem.Staging
			if staged {
				var err error
				st, err = m.NewStaging(len(pages), int(l.MaxValueSize()))
				if err != nil {
					t.Fatalf("new staging: %v", err)
				}
				defer func() { _ = st.Close() }()
				if st.Slots() != len(pages) || st.SlotBytes() != int(l.MaxValueSize()) || len(st.Slot(len(pages)-1)) != st.SlotBytes() {
					t.Fatalf("staging has %d slots of %d bytes, asked for %d of %d", st.Slots(), st.SlotBytes(), len(pages), l.MaxValueSize())
				}
			}

			bufs := buffers(t, l, pages, st)
			if err := m.Gather(ctx, pages, bufs); err != nil {
				t.Fatalf("gather: %v", err)
			}
			for i, p := range pages {
				if want := expectedValue(model, l, p); !bytes.Equal(bufs[i], want) {
					t.Fatalf("gather: page %+v: value differs at byte %d", p, firstDiff(bufs[i], want))
				}
			}

			for i, p := range pages {
				copy(bufs[i], randBytes(r, len(bufs[i])))
				applyValue(model, l, p, bufs[i])
			}
			if err := m.Scatter(ctx, bufs, pages); err != nil {
				t.Fatalf("scatter: %v", err)
			}
			checkEngine(t, e, model, "after scatter")

			// Gather again into fresh buffers: what was scattered comes back.
			again := buffers(t, l, pages, nil)
			if err := m.Gather(ctx, pages, again); err != nil {
				t.Fatalf("second gather: %v", err)
			}
			for i := range pages {
				if !bytes.Equal(again[i], bufs[i]) {
					t.Fatalf("round trip: page %+v differs at byte %d", pages[i], firstDiff(again[i], bufs[i]))
				}
			}
			if err := m.Gather(ctx, nil, nil); err != nil {
				t.Fatalf("empty gather: %v", err)
			}
		})
	}
}

func testClone(t *testing.T, b Backend) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(99, 1))
	l, size := RandomLayout(r)
	e, model := newEngine(t, b, r, size)
	m := mustMover(t, e, l)
	c, err := m.Clone()
	if err != nil {
		t.Fatalf("clone: %v", err)
	}
	ref := kvmem.PageRef{Group: 0, Slot: l.Groups[0].Slots - 1}
	v := randBytes(r, int(l.Groups[0].BytesPerPage()))
	if err := c.Scatter(ctx, [][]byte{v}, []kvmem.PageRef{ref}); err != nil {
		t.Fatalf("scatter through clone: %v", err)
	}
	applyValue(model, l, ref, v)
	if err := c.Close(); err != nil {
		t.Fatalf("close clone: %v", err)
	}
	got := [][]byte{make([]byte, len(v))}
	if err := m.Gather(ctx, []kvmem.PageRef{ref}, got); err != nil {
		t.Fatalf("gather after the clone closed: %v", err)
	}
	if !bytes.Equal(got[0], v) {
		t.Fatalf("the original does not see what the clone wrote")
	}
	if !l.Equal(m.Layout()) || !l.Equal(c.Layout()) {
		t.Fatalf("Layout() differs from the registered layout")
	}
	if err := c.Scatter(ctx, [][]byte{v}, []kvmem.PageRef{ref}); err == nil {
		t.Fatalf("scatter through a closed clone succeeded")
	}
	checkEngine(t, e, model, "after clone scatter")
}

func testBadInput(t *testing.T, b Backend) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(7, 7))
	l := kvmem.Layout{TokensPerBlock: 16, Groups: []kvmem.GroupLayout{
		{ID: 0, Slots: 4, Regions: []kvmem.Region{{Offset: 0, Stride: 256, Size: 100}, {Offset: 1024, Stride: 64, Size: 60}}},
		{ID: 1, Slots: 2, Regions: []kvmem.Region{{Offset: 2048, Stride: 512, Size: 512}},
			ReplicatedRegions: []kvmem.Region{{Offset: 3072, Stride: 32, Size: 32}}},
	}}
	e, model := newEngine(t, b, r, 4096)
	if _, err := e.NewMover(kvmem.Layout{TokensPerBlock: 16, Groups: []kvmem.GroupLayout{{ID: 0, Slots: 2, Regions: []kvmem.Region{{Offset: 4000, Stride: 100, Size: 100}}}}}); err == nil {
		t.Fatalf("a layout beyond the engine memory was accepted")
	}
	m := mustMover(t, e, l)
	ok := func(n int) []byte { return make([]byte, n) }
	cases := []struct {
		name  string
		pages []kvmem.PageRef
		bufs  [][]byte
	}{
		{"negative group", []kvmem.PageRef{{Group: -1}}, [][]byte{ok(160)}},
		{"group past the end", []kvmem.PageRef{{Group: 2}}, [][]byte{ok(160)}},
		{"negative slot", []kvmem.PageRef{{Group: 0, Slot: -1}}, [][]byte{ok(160)}},
		{"slot past the end", []kvmem.PageRef{{Group: 1, Slot: 2}}, [][]byte{ok(512)}},
		{"no replicated regions", []kvmem.PageRef{{Group: 0, Replicated: true}}, [][]byte{ok(160)}},
		{"buffer too short", []kvmem.PageRef{{Group: 0}}, [][]byte{ok(159)}},
		{"buffer too long", []kvmem.PageRef{{Group: 1, Replicated: true}}, [][]byte{ok(33)}},
		{"nil buffer", []kvmem.PageRef{{Group: 1}}, [][]byte{nil}},
		{"fewer buffers than pages", []kvmem.PageRef{{Group: 0}, {Group: 0, Slot: 1}}, [][]byte{ok(160)}},
		{"bad page after good ones", []kvmem.PageRef{{Group: 0}, {Group: 1, Slot: 1}, {Group: 0, Slot: 9}}, [][]byte{ok(160), ok(512), ok(160)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := m.Gather(ctx, c.pages, c.bufs); !errors.Is(err, kvmem.ErrBadPage) {
				t.Errorf("gather: got %v, want an error wrapping ErrBadPage", err)
			}
			if err := m.Scatter(ctx, c.bufs, c.pages); !errors.Is(err, kvmem.ErrBadPage) {
				t.Errorf("scatter: got %v, want an error wrapping ErrBadPage", err)
			}
		})
	}
	// A rejected scatter must not have written anything, even for its good pages.
	checkEngine(t, e, model, "after rejected scatters")

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := m.Gather(cctx, []kvmem.PageRef{{Group: 0}}, [][]byte{ok(160)}); !errors.Is(err, context.Canceled) {
		t.Errorf("gather with a cancelled context: got %v", err)
	}
	for _, shape := range [][2]int{{0, 10}, {10, 0}, {-1, 10}} {
		if st, err := m.NewStaging(shape[0], shape[1]); err == nil {
			_ = st.Close()
			t.Errorf("NewStaging(%d, %d) succeeded", shape[0], shape[1])
		}
	}
}

func testReleases(t *testing.T, b Backend) {
	if b.LiveAllocations == nil {
		t.Fatalf("backend %s has no LiveAllocations counter", b.Name)
	}
	before := b.LiveAllocations()
	r := rand.New(rand.NewPCG(3, 3))
	l, size := RandomLayout(r)
	e, _ := newEngine(t, b, r, size)
	m, err := e.NewMover(l)
	if err != nil {
		t.Fatal(err)
	}
	c, err := m.Clone()
	if err != nil {
		t.Fatal(err)
	}
	var sts []kvmem.Staging
	for i := range 3 {
		for _, mv := range []kvmem.Mover{m, c} {
			st, err := mv.NewStaging(1+i, 4096*(i+1))
			if err != nil {
				t.Fatalf("new staging: %v", err)
			}
			sts = append(sts, st)
		}
	}
	// Exercise both movers so any internal buffers exist too.
	pages := allPages(l)
	for _, mv := range []kvmem.Mover{m, c} {
		if err := mv.Gather(context.Background(), pages, buffers(t, l, pages, nil)); err != nil {
			t.Fatalf("gather: %v", err)
		}
	}
	if got := b.LiveAllocations(); got < before+len(sts) {
		t.Fatalf("%d live staging allocations with %d staging pools open, %d before", got, len(sts), before)
	}
	for _, st := range sts {
		if err := st.Close(); err != nil {
			t.Fatalf("close staging: %v", err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatalf("close clone: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("close mover: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if got := b.LiveAllocations(); got != before {
		t.Fatalf("%d live staging allocations after close, %d before", got, before)
	}
}
