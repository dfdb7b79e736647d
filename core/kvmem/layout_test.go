package kvmem

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestLayoutValidate(t *testing.T) {
	good := Layout{TokensPerBlock: 32, Groups: []GroupLayout{
		{ID: 0, Slots: 4, Regions: []Region{{Offset: 0, Stride: 100, Size: 60}, {Offset: 60, Stride: 100, Size: 40}}},
		{ID: 1, Slots: 2, Regions: []Region{{Offset: 400, Stride: 50, Size: 50}}, ReplicatedRegions: []Region{{Offset: 500, Stride: 10, Size: 10}}},
	}}
	if err := good.Validate(520); err != nil {
		t.Fatalf("valid layout refused: %v", err)
	}
	with := func(f func(*Layout)) Layout {
		l := Layout{TokensPerBlock: good.TokensPerBlock}
		for _, g := range good.Groups {
			g.Regions = append([]Region(nil), g.Regions...)
			g.ReplicatedRegions = append([]Region(nil), g.ReplicatedRegions...)
			l.Groups = append(l.Groups, g)
		}
		f(&l)
		return l
	}
	cases := []struct {
		name   string
		layout Layout
		mem    uint64
		want   string
	}{
		{"no tokens per block", with(func(l *Layout) { l.TokensPerBlock = 0 }), 520, "tokens_per_block"},
		{"no groups", Layout{TokensPerBlock: 1}, 520, "no layer groups"},
		{"ids not dense", with(func(l *Layout) { l.Groups[1].ID = 2 }), 520, "ids must be dense"},
		{"no slots", with(func(l *Layout) { l.Groups[0].Slots = 0 }), 520, "0 slots"},
		{"no regions", with(func(l *Layout) { l.Groups[1].Regions = nil }), 520, "no regions"},
		{"empty region", with(func(l *Layout) { l.Groups[0].Regions[1].Size = 0 }), 520, "size 0"},
		{"overlapping slots", with(func(l *Layout) { l.Groups[0].Regions[0].Stride = 59 }), 520, "below its size"},
		{"replicated beyond memory", good, 519, "ends at byte 520"},
		{"overflow", with(func(l *Layout) { l.Groups[1].Slots, l.Groups[1].Regions[0].Stride = 3, math.MaxUint64/2 }), math.MaxUint64, "overflows"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.layout.Validate(c.mem)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Validate = %v, want an error containing %q", err, c.want)
			}
		})
	}
	// One slot needs no stride: nothing can overlap.
	one := Layout{TokensPerBlock: 1, Groups: []GroupLayout{{ID: 0, Slots: 1, Regions: []Region{{Offset: 8, Size: 8}}}}}
	if err := one.Validate(16); err != nil {
		t.Fatalf("single-slot layout refused: %v", err)
	}
	if !good.Equal(with(func(*Layout) {})) {
		t.Fatal("a copy of a layout is not Equal to it")
	}
	if good.Equal(with(func(l *Layout) { l.Groups[1].ReplicatedRegions = nil })) || good.Equal(with(func(l *Layout) { l.Groups[0].Slots = 5 })) {
		t.Fatal("different layouts are Equal")
	}
}

func TestValueSizeAndWalkPages(t *testing.T) {
	l := Layout{TokensPerBlock: 16, Groups: []GroupLayout{
		{ID: 0, Slots: 3, Regions: []Region{{Offset: 0, Stride: 8, Size: 5}, {Offset: 30, Stride: 4, Size: 3}}, ReplicatedRegions: []Region{{Offset: 50, Stride: 16, Size: 16}}},
	}}
	if n, err := l.ValueSize(PageRef{Slot: 2}); err != nil || n != 8 {
		t.Fatalf("ValueSize(sharded) = %d, %v; want 8", n, err)
	}
	if n, err := l.ValueSize(PageRef{Slot: 1, Replicated: true}); err != nil || n != 16 {
		t.Fatalf("ValueSize(replicated) = %d, %v; want 16", n, err)
	}
	if m := l.MaxValueSize(); m != 16 {
		t.Fatalf("MaxValueSize = %d, want 16", m)
	}
	type piece struct {
		page             int
		engine, value, n uint64
	}
	var got []piece
	pages := []PageRef{{Slot: 2}, {Slot: 1, Replicated: true}}
	err := WalkPages(l, pages, [][]byte{make([]byte, 8), make([]byte, 16)}, func(p int, eo, vo, n uint64) {
		got = append(got, piece{p, eo, vo, n})
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []piece{{0, 16, 0, 5}, {0, 38, 5, 3}, {1, 66, 0, 16}}
	if len(got) != len(want) {
		t.Fatalf("pieces %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("pieces %v, want %v", got, want)
		}
	}
	bad := []struct {
		name  string
		pages []PageRef
		bufs  [][]byte
	}{
		{"count mismatch", []PageRef{{Slot: 0}}, nil},
		{"group out of range", []PageRef{{Group: 1}}, [][]byte{make([]byte, 8)}},
		{"slot out of range", []PageRef{{Slot: 3}}, [][]byte{make([]byte, 8)}},
		{"negative slot", []PageRef{{Slot: -1}}, [][]byte{make([]byte, 8)}},
		{"buffer too short", []PageRef{{Slot: 0}}, [][]byte{make([]byte, 7)}},
		{"second page bad", []PageRef{{Slot: 0}, {Slot: 0, Replicated: true}}, [][]byte{make([]byte, 8), make([]byte, 8)}},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			called := false
			err := WalkPages(l, c.pages, c.bufs, func(int, uint64, uint64, uint64) { called = true })
			if !errors.Is(err, ErrBadPage) {
				t.Fatalf("WalkPages = %v, want an error wrapping ErrBadPage", err)
			}
			if called {
				t.Fatal("WalkPages called fn for a batch it refused")
			}
		})
	}
	noRep := Layout{TokensPerBlock: 1, Groups: []GroupLayout{{ID: 0, Slots: 1, Regions: []Region{{Size: 4}}}}}
	if _, err := noRep.ValueSize(PageRef{Replicated: true}); !errors.Is(err, ErrBadPage) {
		t.Fatalf("ValueSize of a replicated page in a group without replicated regions = %v", err)
	}
}

// TestValueSpans: a value's runs of engine memory come in value order, regions back to back
// merged into one run, replicated regions for a replicated reference, appended to what the list
// held; a reference outside the layout is an error.
func TestValueSpans(t *testing.T) {
	l := Layout{TokensPerBlock: 16, Groups: []GroupLayout{{
		ID: 0, Slots: 4,
		// K at 0, V at 1000 (apart), then two regions that lie back to back in every slot.
		Regions:           []Region{{Offset: 0, Stride: 10, Size: 10}, {Offset: 1000, Stride: 10, Size: 10}, {Offset: 2000, Stride: 8, Size: 3}, {Offset: 2003, Stride: 8, Size: 5}},
		ReplicatedRegions: []Region{{Offset: 3000, Stride: 4, Size: 4}},
	}}}
	got, err := l.ValueSpans(PageRef{Group: 0, Slot: 2}, []Span{{Offset: 7, Size: 1}})
	want := []Span{{7, 1}, {20, 10}, {1020, 10}, {2016, 8}}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("ValueSpans = %v, %v; want %v", got, err, want)
	}
	if got, err := l.ValueSpans(PageRef{Group: 0, Slot: 1, Replicated: true}, nil); err != nil || !slices.Equal(got, []Span{{3004, 4}}) {
		t.Fatalf("replicated: %v, %v", got, err)
	}
	for _, ref := range []PageRef{{Group: 1}, {Group: 0, Slot: 4}, {Group: 0, Slot: -1}} {
		if _, err := l.ValueSpans(ref, nil); !errors.Is(err, ErrBadPage) {
			t.Errorf("%+v: %v, want ErrBadPage", ref, err)
		}
	}
}
