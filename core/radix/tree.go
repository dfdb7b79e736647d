package radix

import (
	"errors"
	"fmt"

	"github.com/kvctl/kvctl/core/keys"
)

// NodeID names a node of a Tree. It stays valid until the node is evicted or removed; after
// that the id may be reused by a later insertion.
type NodeID int32

// Root is the id of the root node: the empty prefix, which holds no block.
const Root NodeID = 0

// DefaultPartialScanLimit is the largest number of children a node may have for partial
// matching to look at them.
const DefaultPartialScanLimit = 32

// MaxTokensPerBlock bounds T so that per-block token counts fit the compact node layout.
const MaxTokensPerBlock = 1<<16 - 1

var (
	// ErrConfig reports an invalid tree configuration.
	ErrConfig = errors.New("invalid radix tree config")
	// ErrAlignment reports an alignment that is not a positive divisor of tokens per block.
	ErrAlignment = errors.New("reuse match alignment must be a positive divisor of tokens per block")
	// ErrBackoff reports a negative backoff.
	ErrBackoff = errors.New("reuse match backoff must not be negative")
	// ErrNoNode reports an id that names no live node.
	ErrNoNode = errors.New("no such node")
	// ErrKeyConflict reports a key that already exists under another parent. Chain keys commit
	// to their whole prefix, so this means the caller's keys are not a chain.
	ErrKeyConflict = errors.New("block key already exists under another parent")
	// ErrPartialParent reports an insertion under a partial block, which ends its sequence.
	ErrPartialParent = errors.New("a partial block cannot have children")
	// ErrBadBlock reports a block with an invalid token count or missing tokens.
	ErrBadBlock = errors.New("invalid block")
	// ErrNotReferenced reports a release of a node that holds no reference.
	ErrNotReferenced = errors.New("node holds no reference")
	// ErrInUse reports a removal of a node that is referenced or has children.
	ErrInUse = errors.New("node is referenced or has children")
	// ErrQuery reports a query whose keys cover more tokens than it carries.
	ErrQuery = errors.New("invalid query")
)

// Config configures a Tree.
type Config struct {
	// TokensPerBlock is T, the number of tokens in a full block (1..MaxTokensPerBlock).
	TokensPerBlock int
	// StoreTokens keeps the tokens of full blocks too, so a partial query block can match a
	// prefix of a full cached block. Partial blocks always keep their tokens. Off, the tree
	// holds keys only for full blocks, which is what the pool index needs.
	StoreTokens bool
	// PartialScanLimit is the largest child count at which partial matching scans the
	// children of the last matched node; 0 means DefaultPartialScanLimit.
	PartialScanLimit int
	// DisableLRU stops tracking unreferenced leaves, for trees that never evict by recency.
	DisableLRU bool
	// SizeHint is the expected number of blocks; it presizes the key index.
	SizeHint int
}

const (
	chunkBits = 12
	chunkSize = 1 << chunkBits
	chunkMask = chunkSize - 1
)

const (
	flagLive uint16 = 1 << iota
	flagAbsent
	flagTokens
	flagPartialChild
)

// node is 64 bytes: one cache line. Links are node ids; 0 (the root) doubles as "none" for
// child, sibling and heap links because the root is never a child or evictable.
type node struct {
	key        keys.Hash
	stamp      uint64
	parent     int32
	firstChild int32
	nextSib    int32
	prevSib    int32
	refs       int32
	nChildren  int32
	heapPos    int32 // position in the LRU heap plus one; 0 when not in it
	nTokens    uint16
	attnCov    uint16
	ssmCov     uint16
	flags      uint16
}

// Tree is a block radix tree. See the package documentation for its vocabulary.
type Tree struct {
	cfg    Config
	t      int
	chunks []*[chunkSize]node
	next   int32   // next never-used id
	free   []int32 // ids of removed nodes, reused first
	live   int     // live blocks, root excluded
	pinned int     // live blocks with references
	index  keyIndex
	tokens map[int32][]int64
	scopes map[int32]keys.Hash // the Scope of nodes with stored tokens, where not zero
	heap   []int32
	clock  uint64
}

// New returns an empty tree.
func New(cfg Config) (*Tree, error) {
	if cfg.TokensPerBlock < 1 || cfg.TokensPerBlock > MaxTokensPerBlock {
		return nil, fmt.Errorf("%w: tokens per block %d not in 1..%d", ErrConfig, cfg.TokensPerBlock, MaxTokensPerBlock)
	}
	if cfg.PartialScanLimit < 0 {
		return nil, fmt.Errorf("%w: partial scan limit %d is negative", ErrConfig, cfg.PartialScanLimit)
	}
	if cfg.PartialScanLimit == 0 {
		cfg.PartialScanLimit = DefaultPartialScanLimit
	}
	if cfg.SizeHint < 0 {
		return nil, fmt.Errorf("%w: size hint %d is negative", ErrConfig, cfg.SizeHint)
	}
	t := &Tree{cfg: cfg, t: cfg.TokensPerBlock, tokens: make(map[int32][]int64), scopes: make(map[int32]keys.Hash)}
	t.index.init(cfg.SizeHint)
	root := t.alloc()
	rn := t.nd(root)
	rn.flags = flagLive
	rn.nTokens = uint16(cfg.TokensPerBlock)
	return t, nil
}

// TokensPerBlock returns T.
func (t *Tree) TokensPerBlock() int { return t.t }

// Len returns the number of blocks in the tree, root excluded.
func (t *Tree) Len() int { return t.live }

// Unreferenced returns the number of blocks that hold no reference. When every holder pins a
// whole prefix (as a request does), all of them can be evicted, leaf by leaf.
func (t *Tree) Unreferenced() int { return t.live - t.pinned }

// Evictable returns the number of unreferenced leaves (0 when LRU tracking is off).
func (t *Tree) Evictable() int { return len(t.heap) }

func (t *Tree) nd(id int32) *node { return &t.chunks[id>>chunkBits][id&chunkMask] }

func (t *Tree) alloc() int32 {
	if n := len(t.free); n > 0 {
		id := t.free[n-1]
		t.free = t.free[:n-1]
		*t.nd(id) = node{}
		return id
	}
	id := t.next
	if int(id>>chunkBits) == len(t.chunks) {
		t.chunks = append(t.chunks, new([chunkSize]node))
	}
	t.next++
	return id
}

func (t *Tree) valid(id NodeID) bool {
	return id >= 0 && int32(id) < t.next && t.nd(int32(id)).flags&flagLive != 0
}

func (t *Tree) get(id NodeID) (*node, error) {
	if !t.valid(id) {
		return nil, fmt.Errorf("%w: %d", ErrNoNode, id)
	}
	return t.nd(int32(id)), nil
}

// Lookup returns the node that holds key.
func (t *Tree) Lookup(key keys.Hash) (NodeID, bool) {
	id := t.indexGet(&key)
	return NodeID(id), id != 0
}

// NodeInfo describes one node.
type NodeInfo struct {
	Key       keys.Hash
	Parent    NodeID
	NumTokens int
	Refs      int
	Children  int
	Coverage  Coverage
}

// Info returns a description of a live node other than the root.
func (t *Tree) Info(id NodeID) (NodeInfo, error) {
	if id == Root {
		return NodeInfo{}, fmt.Errorf("%w: the root holds no block", ErrNoNode)
	}
	n, err := t.get(id)
	if err != nil {
		return NodeInfo{}, err
	}
	return NodeInfo{
		Key: n.key, Parent: NodeID(n.parent), NumTokens: int(n.nTokens), Refs: int(n.refs),
		Children: int(n.nChildren), Coverage: Coverage{Attention: int(n.attnCov), SSM: int(n.ssmCov)},
	}, nil
}

// Tokens returns the stored tokens of a block, or nil when the tree keeps none for it. The
// slice belongs to the tree and must not be modified.
func (t *Tree) Tokens(id NodeID) []int64 {
	if !t.valid(id) {
		return nil
	}
	return t.tokens[int32(id)]
}

// Coverage is what a block's pages hold, for pruning. Attention is the number of leading
// tokens of the block whose attention KV is present (the block's token count when complete).
// SSM is the position inside the block, 1..tokens, at which a recurrent state snapshot was
// taken, or 0 when the block holds none.
type Coverage struct {
	Attention int
	SSM       int
}

// SetCoverage records what a block's pages hold. New blocks start with full attention
// coverage and no SSM snapshot.
func (t *Tree) SetCoverage(id NodeID, c Coverage) error {
	if id == Root {
		return fmt.Errorf("%w: the root holds no block", ErrNoNode)
	}
	n, err := t.get(id)
	if err != nil {
		return err
	}
	if c.Attention < 0 || c.Attention > int(n.nTokens) || c.SSM < 0 || c.SSM > int(n.nTokens) {
		return fmt.Errorf("%w: coverage %+v outside 0..%d", ErrBadBlock, c, n.nTokens)
	}
	n.attnCov = uint16(c.Attention)
	n.ssmCov = uint16(c.SSM)
	return nil
}

// findChild returns the child of cur keyed by key, or 0. Children inserted along one
// sequence sit next to their parent in memory, so a short scan of the sibling list usually
// wins over the index; wide nodes go to the index.
func (t *Tree) findChild(cur int32, key *keys.Hash) int32 {
	n := t.nd(cur)
	if n.nChildren <= 4 {
		for c := n.firstChild; c != 0; {
			cn := t.nd(c)
			if cn.key == *key {
				return c
			}
			c = cn.nextSib
		}
		return 0
	}
	id := t.indexGet(key)
	if id != 0 && t.nd(id).parent == cur {
		return id
	}
	return 0
}

func (t *Tree) link(parent, id int32) {
	p := t.nd(parent)
	n := t.nd(id)
	n.parent = parent
	n.nextSib = p.firstChild
	n.prevSib = 0
	if p.firstChild != 0 {
		t.nd(p.firstChild).prevSib = id
	}
	p.firstChild = id
	p.nChildren++
	if p.heapPos != 0 {
		t.heapRemove(parent)
	}
}

func (t *Tree) unlink(id int32) {
	n := t.nd(id)
	p := t.nd(n.parent)
	if n.prevSib != 0 {
		t.nd(n.prevSib).nextSib = n.nextSib
	} else {
		p.firstChild = n.nextSib
	}
	if n.nextSib != 0 {
		t.nd(n.nextSib).prevSib = n.prevSib
	}
	p.nChildren--
}

// evictable reports whether id is an unreferenced leaf eligible for the LRU heap.
func (t *Tree) evictable(id int32) bool {
	if id == 0 || t.cfg.DisableLRU {
		return false
	}
	n := t.nd(id)
	return n.flags&flagLive != 0 && n.refs == 0 && n.nChildren == 0
}

// removeNode deletes a leaf and frees its id.
func (t *Tree) removeNode(id int32) {
	n := t.nd(id)
	if n.heapPos != 0 {
		t.heapRemove(id)
	}
	t.unlink(id)
	t.indexDelete(&n.key, id)
	if n.flags&flagTokens != 0 {
		delete(t.tokens, id)
		delete(t.scopes, id)
	}
	parent := n.parent
	*n = node{}
	t.free = append(t.free, id)
	t.live--
	if t.evictable(parent) {
		t.heapPush(parent)
	}
}

// Acquire adds a reference to each node, pinning it (and so its ancestors) against eviction,
// and marks it used now.
func (t *Tree) Acquire(ids ...NodeID) error {
	for _, id := range ids {
		if id == Root || !t.valid(id) {
			return fmt.Errorf("%w: %d", ErrNoNode, id)
		}
	}
	for _, id := range ids {
		n := t.nd(int32(id))
		if n.refs == 0 {
			t.pinned++
		}
		n.refs++
		if n.heapPos != 0 {
			t.heapRemove(int32(id))
		}
		t.clock++
		n.stamp = t.clock
	}
	return nil
}

// Release drops one reference from each node. A node that would go below zero is refused and
// nothing is released.
func (t *Tree) Release(ids ...NodeID) error {
	need := make(map[NodeID]int32, len(ids))
	for _, id := range ids {
		if id == Root || !t.valid(id) {
			return fmt.Errorf("%w: %d", ErrNoNode, id)
		}
		need[id]++
		if t.nd(int32(id)).refs < need[id] {
			return fmt.Errorf("%w: %d", ErrNotReferenced, id)
		}
	}
	for _, id := range ids {
		n := t.nd(int32(id))
		n.refs--
		if n.refs == 0 {
			t.pinned--
		}
		if t.evictable(int32(id)) && n.heapPos == 0 {
			t.heapPush(int32(id))
		}
	}
	return nil
}

// Touch marks nodes used now, for LRU eviction. Unknown ids are ignored.
func (t *Tree) Touch(ids ...NodeID) {
	for _, id := range ids {
		if id == Root || !t.valid(id) {
			continue
		}
		n := t.nd(int32(id))
		t.clock++
		n.stamp = t.clock
		if n.heapPos != 0 {
			t.heapFix(int(n.heapPos - 1))
		}
	}
}

// Evict removes up to n unreferenced leaves, least recently used first. A parent that
// becomes an unreferenced leaf is a candidate in the same call. onEvict, when not nil, sees
// each node while it is still readable. It returns the number of blocks removed.
func (t *Tree) Evict(n int, onEvict func(NodeID)) int {
	done := 0
	for done < n && len(t.heap) > 0 {
		id := t.heap[0]
		if onEvict != nil {
			onEvict(NodeID(id))
		}
		t.removeNode(id)
		done++
	}
	return done
}

// Remove deletes one unreferenced leaf.
func (t *Tree) Remove(id NodeID) error {
	if id == Root {
		return fmt.Errorf("%w: the root cannot be removed", ErrInUse)
	}
	n, err := t.get(id)
	if err != nil {
		return err
	}
	if n.refs != 0 || n.nChildren != 0 {
		return fmt.Errorf("%w: %d", ErrInUse, id)
	}
	t.removeNode(int32(id))
	return nil
}

func (t *Tree) heapLess(i, j int) bool { return t.nd(t.heap[i]).stamp < t.nd(t.heap[j]).stamp }

func (t *Tree) heapSwap(i, j int) {
	h := t.heap
	h[i], h[j] = h[j], h[i]
	t.nd(h[i]).heapPos = int32(i + 1)
	t.nd(h[j]).heapPos = int32(j + 1)
}

func (t *Tree) heapUp(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !t.heapLess(i, p) {
			return
		}
		t.heapSwap(i, p)
		i = p
	}
}

func (t *Tree) heapDown(i int) bool {
	start := i
	n := len(t.heap)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && t.heapLess(r, l) {
			m = r
		}
		if !t.heapLess(m, i) {
			break
		}
		t.heapSwap(i, m)
		i = m
	}
	return i > start
}

func (t *Tree) heapFix(i int) {
	if !t.heapDown(i) {
		t.heapUp(i)
	}
}

func (t *Tree) heapPush(id int32) {
	t.heap = append(t.heap, id)
	i := len(t.heap) - 1
	t.nd(id).heapPos = int32(i + 1)
	t.heapUp(i)
}

func (t *Tree) heapRemove(id int32) {
	n := t.nd(id)
	i := int(n.heapPos - 1)
	last := len(t.heap) - 1
	if i != last {
		t.heapSwap(i, last)
	}
	t.heap = t.heap[:last]
	n.heapPos = 0
	if i != last {
		t.heapFix(i)
	}
}
