package simkv

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/kvctl/kvctl/core/hostmem"
	"github.com/kvctl/kvctl/core/kvmem"
)

func TestKVBytes(t *testing.T) {
	const T = 4
	toks := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9}
	base := KVBytes(toks, 1, T, 0, 0, 0, false, 20)
	if len(base) != 20 || !bytes.Equal(base, KVBytes(append([]int64(nil), toks...), 1, T, 0, 0, 0, false, 20)) {
		t.Fatal("equal inputs give different bytes")
	}
	changed := append([]int64(nil), toks...)
	changed[7]++
	later := append([]int64(nil), toks...)
	later[8]++
	for name, v := range map[string][]byte{
		"a token of the block": KVBytes(changed, 1, T, 0, 0, 0, false, 20),
		"another block":        KVBytes(toks, 0, T, 0, 0, 0, false, 20),
		"another rank":         KVBytes(toks, 1, T, 0, 1, 0, false, 20),
		"another group":        KVBytes(toks, 1, T, 0, 0, 1, false, 20),
		"the replicated value": KVBytes(toks, 1, T, 0, 0, 0, true, 20),
		"a token in lookahead": KVBytes(later, 1, T, 1, 0, 0, false, 20),
		"a lookahead of one":   KVBytes(toks, 1, T, 1, 0, 0, false, 20),
	} {
		if bytes.Equal(v, base) {
			t.Errorf("%s gives the same bytes", name)
		}
	}
	if !bytes.Equal(KVBytes(later, 1, T, 0, 0, 0, false, 20), base) {
		t.Error("a token past the block and its lookahead changed the bytes")
	}
	if !bytes.Equal(KVBytes(toks, 1, T, 0, 0, 0, true, 20), KVBytes(toks, 1, T, 0, 3, 0, true, 20)) {
		t.Error("the replicated value differs per rank")
	}
	// A lookahead past the prompt's end is clipped to the prompt.
	if !bytes.Equal(KVBytes(toks, 1, T, 100, 0, 0, false, 8), KVBytes(toks, 1, T, 1, 0, 0, false, 8)) {
		t.Error("a lookahead clipped to the prompt gives other bytes")
	}
}

func TestSlots(t *testing.T) {
	s := NewSlots(2, 5)
	a, err := s.Take(3)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{0, 1, 2}; !equal(a[0], want) || !equal(a[1], want) {
		t.Fatalf("first take %v, want %v in both groups", a, want)
	}
	if _, err := s.Take(3); !errors.Is(err, ErrNoSlots) {
		t.Fatalf("take past the free slots: %v, want ErrNoSlots", err)
	}
	// A failed take holds nothing back.
	b, err := s.Take(2)
	if err != nil || !equal(b[0], []int{3, 4}) || !equal(b[1], []int{3, 4}) {
		t.Fatalf("take after a failed one: %v %v", b, err)
	}
	s.Put(a)
	if c, err := s.Take(3); err != nil || !equal(c[0], []int{2, 1, 0}) {
		t.Fatalf("take after put: %v %v, want the returned slots", c, err)
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Memory writes KV, finds it, and tells a poisoned page, a page of another block and a
// page of another rank from the right one, on real host memory.
func TestMemory(t *testing.T) {
	ctx := context.Background()
	const T, slots = 4, 8
	layout := kvmem.Layout{TokensPerBlock: T, Groups: []kvmem.GroupLayout{
		{ID: 0, Slots: slots, Regions: []kvmem.Region{{Offset: 0, Stride: 16, Size: 16}}, ReplicatedRegions: []kvmem.Region{{Offset: 16 * slots, Stride: 8, Size: 8}}},
	}}
	size := int64(24 * slots)
	m := &Memory{Layout: layout}
	for range 2 {
		mem, err := hostmem.NewSharedMemory(size)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = mem.Close() })
		mv, err := hostmem.NewMover(mem.FD, size, layout)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = mv.Close() })
		m.Ranks = append(m.Ranks, mv)
	}
	toks := []int64{1, 2, 3, 4, 5, 6, 7, 8}
	pages := [][]int{{5, 2}}
	if err := m.Poison(ctx, pages, 2); err != nil {
		t.Fatal(err)
	}
	if err := m.CheckNoWrongByte(ctx, "r", toks, pages, 2); err != nil {
		t.Fatalf("poisoned pages: %v", err)
	}
	if err := m.Check(ctx, "r", toks, pages, 0, 1); !errors.Is(err, ErrWrongBytes) {
		t.Fatalf("check of a poisoned page: %v, want ErrWrongBytes", err)
	}
	if err := m.Write(ctx, toks, pages, 0, 2); err != nil {
		t.Fatal(err)
	}
	if err := m.Check(ctx, "r", toks, pages, 0, 2); err != nil {
		t.Fatalf("check of written pages: %v", err)
	}
	// Block 1's KV in block 0's page, on rank 1 only.
	if err := m.Ranks[1].Scatter(ctx, [][]byte{KVBytes(toks, 1, T, 0, 1, 0, false, 16)}, []kvmem.PageRef{{Group: 0, Slot: 5}}); err != nil {
		t.Fatal(err)
	}
	if err := m.Check(ctx, "r", toks, pages, 0, 1); !errors.Is(err, ErrWrongBytes) {
		t.Fatalf("check of a page holding another block: %v, want ErrWrongBytes", err)
	}
	if err := m.CheckNoWrongByte(ctx, "r", toks, pages, 2); !errors.Is(err, ErrWrongBytes) {
		t.Fatalf("no-wrong-byte check of a page holding another block: %v, want ErrWrongBytes", err)
	}
}
