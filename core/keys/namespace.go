package keys

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
)

// DefaultNamespace is the namespace of keys when Namespace.Namespace is empty.
const DefaultNamespace = "trtllm"

// ReplicatedShard is the shard part of the key of a page whose bytes are identical on every
// rank. It cannot be mistaken for a "w{W}r{R}" shard.
const ReplicatedShard = "replicated"

// Namespace is the part of every pool key that is not the block: who wrote the page and for
// which model and attention shard.
type Namespace struct {
	// Namespace is the first key component; "" means DefaultNamespace.
	Namespace string
	// ModelKey names the model's KV layout. It is required: pages of different models (or of
	// one model under different quantisation) must never share keys.
	ModelKey string
	// WorldSize and Rank are the attention shard under tensor parallelism (world >= 1,
	// 0 <= rank < world).
	WorldSize int
	Rank      int
	// AttentionDP is set when every rank holds all attention heads: every owner then keys its
	// pages as shard 0 of 1, so owners share content.
	AttentionDP bool
}

// Validate returns every problem with the namespace at once, or nil.
func (n Namespace) Validate() error {
	var errs []error
	if n.ModelKey == "" {
		errs = append(errs, errors.New("model key is required: pages of different models must not share keys"))
	}
	if n.WorldSize < 1 {
		errs = append(errs, fmt.Errorf("world size %d: must be at least 1", n.WorldSize))
	}
	if n.Rank < 0 || (n.WorldSize >= 1 && n.Rank >= n.WorldSize) {
		errs = append(errs, fmt.Errorf("rank %d: must be in [0, %d)", n.Rank, max(n.WorldSize, 0)))
	}
	return errors.Join(errs...)
}

func (n Namespace) ns() string {
	if n.Namespace == "" {
		return DefaultNamespace
	}
	return n.Namespace
}

// AttentionWorldSize returns the world size that appears in keys: 1 under attention DP.
func (n Namespace) AttentionWorldSize() int {
	if n.AttentionDP {
		return 1
	}
	return n.WorldSize
}

// AttentionRank returns the rank that appears in keys: 0 under attention DP.
func (n Namespace) AttentionRank() int {
	if n.AttentionDP {
		return 0
	}
	return n.Rank
}

// Shard returns this rank's shard component, "w{W}r{R}"; "w1r0" under attention DP.
func (n Namespace) Shard() string {
	return string(appendShard(nil, n.AttentionWorldSize(), n.AttentionRank()))
}

func appendShard(b []byte, world, rank int) []byte {
	b = append(b, 'w')
	b = strconv.AppendInt(b, int64(world), 10)
	b = append(b, 'r')
	return strconv.AppendInt(b, int64(rank), 10)
}

// appendKey appends "{ns}/{model}/{shard}/lg{g}/t{T}b{bytes}/{hash}"; shard is written by
// the caller-supplied world/rank, or is ReplicatedShard when world < 0.
func (n Namespace) appendKey(b []byte, world, rank, group, tokensPerBlock int, bytesPerPage uint64, h *[2 * HashSize]byte) []byte {
	return append(n.appendKeyPrefix(b, world, rank, group, tokensPerBlock, bytesPerPage), h[:]...)
}

// appendKeyPrefix appends appendKey's key without the hash: everything up to its last '/'.
func (n Namespace) appendKeyPrefix(b []byte, world, rank, group, tokensPerBlock int, bytesPerPage uint64) []byte {
	b = append(b, n.ns()...)
	b = append(b, '/')
	b = append(b, n.ModelKey...)
	b = append(b, '/')
	if world < 0 {
		b = append(b, ReplicatedShard...)
	} else {
		b = appendShard(b, world, rank)
	}
	b = append(b, "/lg"...)
	b = strconv.AppendInt(b, int64(group), 10)
	b = append(b, "/t"...)
	b = strconv.AppendInt(b, int64(tokensPerBlock), 10)
	b = append(b, 'b')
	b = strconv.AppendUint(b, bytesPerPage, 10)
	return append(b, '/')
}

// PageKeyPrefix is PageKey without the hash: the key of block h is the prefix followed by
// AppendHex's hex of h. Callers that build many keys of one group compute it once.
func (n Namespace) PageKeyPrefix(group, tokensPerBlock int, bytesPerPage uint64) string {
	return string(n.appendKeyPrefix(nil, n.AttentionWorldSize(), n.AttentionRank(), group, tokensPerBlock, bytesPerPage))
}

// ReplicatedPageKeyPrefix is ReplicatedPageKey without the hash, as PageKeyPrefix.
func (n Namespace) ReplicatedPageKeyPrefix(group, tokensPerBlock int, bytesPerPage uint64) string {
	return string(n.appendKeyPrefix(nil, -1, 0, group, tokensPerBlock, bytesPerPage))
}

// AppendHex appends h in lowercase hex, as a key ends.
func AppendHex(b []byte, h Hash) []byte {
	n := len(b)
	b = slices.Grow(b, 2*HashSize)[:n+2*HashSize]
	putHex((*[2 * HashSize]byte)(b[n:]), &h)
	return b
}

func hexOf(h Hash) (x [2 * HashSize]byte) {
	putHex(&x, &h)
	return x
}

// putHex writes h in lowercase hex into x, eight digits at a time (a load builds a few hundred
// keys before its first copy).
func putHex(x *[2 * HashSize]byte, h *Hash) {
	for i := 0; i < HashSize; i += 4 {
		binary.LittleEndian.PutUint64(x[2*i:], hex8(binary.BigEndian.Uint32(h[i:])))
	}
}

// hex8 is the eight hex digits of v, most significant first, as the bytes of a little-endian
// word: each nibble is spread into a byte of its own, then '0' is added to every digit and the
// 0x27 between '9'+1 and 'a' to those above 9, without a branch.
func hex8(v uint32) uint64 {
	x := uint64(v)
	// The bytes of v, most significant first, into the low bytes of four 16-bit lanes.
	x = x>>24 | (x>>16&0xff)<<16 | (x>>8&0xff)<<32 | (x&0xff)<<48
	// Each lane's high nibble into its low byte, its low nibble into its high byte.
	x = x>>4&0x000f000f000f000f | (x&0x000f000f000f000f)<<8
	// A digit d has d+6 carry into bit 4 exactly when d > 9; no byte overflows into the next.
	above9 := (x + 0x0606060606060606) >> 4 & 0x0101010101010101
	return x + 0x3030303030303030 + above9*0x27
}

// PageKey returns the key of this rank's page of block h in layer group group:
// "{ns}/{model}/{shard}/lg{group}/t{T}b{bytesPerPage}/{hash}", integers in plain decimal.
// bytesPerPage is the group's shard-specific bytes per page.
func (n Namespace) PageKey(group, tokensPerBlock int, bytesPerPage uint64, h Hash) string {
	return n.PeerPageKey(n.AttentionRank(), group, tokensPerBlock, bytesPerPage, h)
}

// PeerPageKey returns the key of the page that attention shard peerRank (of the same world)
// writes for block h in group group. Under attention DP the only shard is 0.
func (n Namespace) PeerPageKey(peerRank, group, tokensPerBlock int, bytesPerPage uint64, h Hash) string {
	x := hexOf(h)
	return string(n.appendKey(make([]byte, 0, 96), n.AttentionWorldSize(), peerRank, group, tokensPerBlock, bytesPerPage, &x))
}

// ReplicatedPageKey returns the key of the page of block h in group group whose bytes are the
// same on every rank: PageKey with the shard "replicated" and the group's replicated bytes per page.
func (n Namespace) ReplicatedPageKey(group, tokensPerBlock int, bytesPerPage uint64, h Hash) string {
	x := hexOf(h)
	return string(n.appendKey(make([]byte, 0, 96), -1, 0, group, tokensPerBlock, bytesPerPage, &x))
}

// GroupKey returns the eviction group of block h, "{ns}/{model}/w{W}/{hash}", into which every
// page of the block is put so that the pool evicts the block as a whole. W is the attention
// world size (1 under attention DP); the shard, layer group and page geometry are left out.
func (n Namespace) GroupKey(h Hash) string {
	x := hexOf(h)
	b := make([]byte, 0, 64)
	b = append(b, n.ns()...)
	b = append(b, '/')
	b = append(b, n.ModelKey...)
	b = append(b, "/w"...)
	b = strconv.AppendInt(b, int64(n.AttentionWorldSize()), 10)
	b = append(b, '/')
	return string(append(b, x[:]...))
}

// LayerGroupPages is the page geometry of one layer group.
type LayerGroupPages struct {
	// Group is the layer-group index (dense, from 0).
	Group int
	// BytesPerPage is the size of one page of the group's shard-specific regions.
	BytesPerPage uint64
	// ReplicatedBytesPerPage is the size of one page of its replicated regions; 0 means the
	// group has none and gets no replicated key.
	ReplicatedBytesPerPage uint64
}

// BlockKeys returns every key that must exist for block h to be a hit. Order: groups in the
// order given; within a group, the sharded keys of shards 0..W-1 (W the attention world size),
// then the group's replicated key if it has replicated bytes.
func (n Namespace) BlockKeys(tokensPerBlock int, groups []LayerGroupPages, h Hash) []string {
	world := n.AttentionWorldSize()
	return n.AppendBlockKeys(make([]string, 0, len(groups)*(max(world, 0)+1)), tokensPerBlock, groups, h)
}

// AppendBlockKeys appends the keys of BlockKeys to dst and returns the extended slice.
func (n Namespace) AppendBlockKeys(dst []string, tokensPerBlock int, groups []LayerGroupPages, h Hash) []string {
	x := hexOf(h)
	var scratch [160]byte
	world := n.AttentionWorldSize()
	for _, g := range groups {
		for r := 0; r < world; r++ {
			dst = append(dst, string(n.appendKey(scratch[:0], world, r, g.Group, tokensPerBlock, g.BytesPerPage, &x)))
		}
		if g.ReplicatedBytesPerPage > 0 {
			dst = append(dst, string(n.appendKey(scratch[:0], -1, 0, g.Group, tokensPerBlock, g.ReplicatedBytesPerPage, &x)))
		}
	}
	return dst
}

// SaveKeys returns the keys this rank writes for block h: for each group in the order given,
// its own shard's key, then the group's replicated key if it has replicated bytes and this is
// attention rank 0 (every owner under attention DP). The pool's existence check removes the
// duplicates attention-DP owners would write.
func (n Namespace) SaveKeys(tokensPerBlock int, groups []LayerGroupPages, h Hash) []string {
	return n.AppendSaveKeys(make([]string, 0, 2*len(groups)), tokensPerBlock, groups, h)
}

// AppendSaveKeys appends the keys of SaveKeys to dst and returns the extended slice.
func (n Namespace) AppendSaveKeys(dst []string, tokensPerBlock int, groups []LayerGroupPages, h Hash) []string {
	x := hexOf(h)
	var scratch [160]byte
	world, rank := n.AttentionWorldSize(), n.AttentionRank()
	for _, g := range groups {
		dst = append(dst, string(n.appendKey(scratch[:0], world, rank, g.Group, tokensPerBlock, g.BytesPerPage, &x)))
		if g.ReplicatedBytesPerPage > 0 && rank == 0 {
			dst = append(dst, string(n.appendKey(scratch[:0], -1, 0, g.Group, tokensPerBlock, g.ReplicatedBytesPerPage, &x)))
		}
	}
	return dst
}
