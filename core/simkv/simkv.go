package simkv

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"

	"github.com/kvctl/kvctl/core/kvmem"
)

// KVBytes is the n-byte value of block b of a prompt of T-token blocks: a function of the
// tokens the block's KV depends on (through the block's end plus lookahead, clipped to the
// prompt), the block, the rank (sharded values only), the layer group and whether it is the
// replicated value. Equal inputs give equal bytes; any difference changes them.
func KVBytes(tokens []int64, b, T, lookahead, rank, group int, replicated bool, n int) []byte {
	h := fnv.New64a()
	var w [8]byte
	for _, t := range tokens[:min(len(tokens), (b+1)*T+lookahead)] {
		binary.LittleEndian.PutUint64(w[:], uint64(t))
		h.Write(w[:])
	}
	if replicated {
		rank = -1
	}
	for _, v := range []int64{int64(b), int64(rank), int64(group), boolInt(replicated)} {
		binary.LittleEndian.PutUint64(w[:], uint64(v))
		h.Write(w[:])
	}
	x := h.Sum64()
	out := make([]byte, n)
	for i := 0; i < n; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(w[:], x)
		copy(out[i:], w[:])
	}
	return out
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// Poison is the byte a page holds from its allocation until a block's KV is written or loaded.
const Poison = 0xEE

// ErrWrongBytes means a page does not hold the KV a cold run computes for its block.
var ErrWrongBytes = errors.New("loaded page holds wrong bytes")

// Pages is one rank's view of its engine memory: kvmem.Mover's page copies.
type Pages interface {
	Gather(ctx context.Context, pages []kvmem.PageRef, dst [][]byte) error
	Scatter(ctx context.Context, src [][]byte, pages []kvmem.PageRef) error
}

// Memory writes and checks the pages of a simulated engine with one Pages per rank, all of
// the same layout. It is not safe for concurrent use.
type Memory struct {
	Layout kvmem.Layout
	// Ranks holds each rank's pages, rank 0 first.
	Ranks []Pages
	// Lookahead is the draft's prompt lookahead the KV of a block depends on.
	Lookahead int
}

// refs lists every page value of block b held in slots pages[g][b]: per group the sharded
// value and, where the group has one, the replicated value.
func (m *Memory) refs(pages [][]int, b int) []kvmem.PageRef {
	var out []kvmem.PageRef
	for g, gl := range m.Layout.Groups {
		out = append(out, kvmem.PageRef{Group: g, Slot: pages[g][b]})
		if gl.ReplicatedBytesPerPage() > 0 {
			out = append(out, kvmem.PageRef{Group: g, Slot: pages[g][b], Replicated: true})
		}
	}
	return out
}

func (m *Memory) size(ref kvmem.PageRef) int {
	g := m.Layout.Groups[ref.Group]
	if ref.Replicated {
		return int(g.ReplicatedBytesPerPage())
	}
	return int(g.BytesPerPage())
}

func (m *Memory) want(tokens []int64, b, rank int, ref kvmem.PageRef) []byte {
	return KVBytes(tokens, b, m.Layout.TokensPerBlock, m.Lookahead, rank, ref.Group, ref.Replicated, m.size(ref))
}

func (m *Memory) read(ctx context.Context, rank int, ref kvmem.PageRef) ([]byte, error) {
	buf := make([]byte, m.size(ref))
	err := m.Ranks[rank].Gather(ctx, []kvmem.PageRef{ref}, [][]byte{buf})
	return buf, err
}

// Poison fills the pages of blocks [0, blocks) with Poison on every rank.
func (m *Memory) Poison(ctx context.Context, pages [][]int, blocks int) error {
	for b := range blocks {
		for _, rk := range m.Ranks {
			for _, ref := range m.refs(pages, b) {
				if err := rk.Scatter(ctx, [][]byte{bytes.Repeat([]byte{Poison}, m.size(ref))}, []kvmem.PageRef{ref}); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Write writes the KV of blocks [first, end) of tokens into their pages on every rank.
func (m *Memory) Write(ctx context.Context, tokens []int64, pages [][]int, first, end int) error {
	for b := first; b < end; b++ {
		for ri, rk := range m.Ranks {
			for _, ref := range m.refs(pages, b) {
				if err := rk.Scatter(ctx, [][]byte{m.want(tokens, b, ri, ref)}, []kvmem.PageRef{ref}); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Check returns an error wrapping ErrWrongBytes, naming request id, unless every page of
// blocks [first, end) holds its KV on every rank.
func (m *Memory) Check(ctx context.Context, id string, tokens []int64, pages [][]int, first, end int) error {
	for b := first; b < end; b++ {
		for ri := range m.Ranks {
			for _, ref := range m.refs(pages, b) {
				got, err := m.read(ctx, ri, ref)
				if err != nil {
					return err
				}
				if !bytes.Equal(got, m.want(tokens, b, ri, ref)) {
					return fmt.Errorf("%w: request %s block %d rank %d page %+v", ErrWrongBytes, id, b, ri, ref)
				}
			}
		}
	}
	return nil
}

// CheckNoWrongByte returns an error wrapping ErrWrongBytes if a page of blocks [0, blocks)
// holds bytes that are neither Poison nor its KV: what a failed load may leave behind.
func (m *Memory) CheckNoWrongByte(ctx context.Context, id string, tokens []int64, pages [][]int, blocks int) error {
	for b := range blocks {
		for ri := range m.Ranks {
			for _, ref := range m.refs(pages, b) {
				got, err := m.read(ctx, ri, ref)
				if err != nil {
					return err
				}
				if !bytes.Equal(got, bytes.Repeat([]byte{Poison}, len(got))) && !bytes.Equal(got, m.want(tokens, b, ri, ref)) {
					return fmt.Errorf("%w: request %s block %d rank %d page %+v holds neither poison nor its KV", ErrWrongBytes, id, b, ri, ref)
				}
			}
		}
	}
	return nil
}

// Slots hands out page slots, the same count in every layer group.
type Slots struct {
	free [][]int // per group; the next slot handed out is the last
}

// NewSlots returns slots 0 to n-1 of groups layer groups, handed out lowest first.
func NewSlots(groups, n int) *Slots {
	s := &Slots{free: make([][]int, groups)}
	for g := range s.free {
		for i := n - 1; i >= 0; i-- {
			s.free[g] = append(s.free[g], i)
		}
	}
	return s
}

// ErrNoSlots is returned when fewer slots are free than a request needs.
var ErrNoSlots = errors.New("not enough free page slots")

// Take returns blocks slots of every group, per group in the order handed out.
func (s *Slots) Take(blocks int) ([][]int, error) {
	for g := range s.free {
		if n := len(s.free[g]); n < blocks {
			return nil, fmt.Errorf("%w: %d needed, %d free", ErrNoSlots, blocks, n)
		}
	}
	out := make([][]int, len(s.free))
	for g := range out {
		n := len(s.free[g])
		out[g] = slices.Clone(s.free[g][n-blocks:])
		slices.Reverse(out[g])
		s.free[g] = s.free[g][:n-blocks]
	}
	return out, nil
}

// Put returns pages taken from s.
func (s *Slots) Put(pages [][]int) {
	for g := range pages {
		s.free[g] = append(s.free[g], pages[g]...)
	}
}
