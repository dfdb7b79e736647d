package radix

import (
	"fmt"

	"github.com/kvctl/kvctl/core/keys"
)

// Block is one block to insert.
type Block struct {
	// Key is the block's chain key.
	Key keys.Hash
	// Tokens are the block's tokens. They are required for a partial block and optional for a
	// full one; the tree keeps a full block's tokens only with Config.StoreTokens.
	Tokens []int64
	// Scope names the reuse scope the block's key chain was seeded with (keys.Chain.Seed). Only
	// blocks of one scope are compared by content: a partial match or a sibling prefix rule
	// never crosses scopes. Every block under a parent other than the root shares its parent's
	// scope through its key; the zero value is one scope like any other.
	Scope keys.Hash
	// NumTokens is the block's token count when Tokens is nil; with Tokens it must be 0 or
	// len(Tokens).
	NumTokens int
}

// Outcome says what Insert did.
type Outcome uint8

const (
	// Inserted means the block was added as a new node.
	Inserted Outcome = iota + 1
	// Duplicate means a node with the same key exists under the parent; it is returned.
	Duplicate
	// Useless means the block's tokens are a prefix of a sibling's, so it adds nothing; the
	// sibling is returned and the block is not inserted.
	Useless
	// Replaced means the block is longer than a partial sibling that is its prefix. The sibling's
	// node takes the block's key and tokens in place, so its id, references and pages now
	// belong to the longer block.
	Replaced
)

func (o Outcome) String() string {
	switch o {
	case Inserted:
		return "inserted"
	case Duplicate:
		return "duplicate"
	case Useless:
		return "useless"
	case Replaced:
		return "replaced"
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

func hasPrefix(s, prefix []int64) bool {
	if len(prefix) > len(s) {
		return false
	}
	for i, v := range prefix {
		if s[i] != v {
			return false
		}
	}
	return true
}

// Insert adds one block under parent and applies the insertion rules: a duplicate key returns
// the existing node; a block whose tokens are a prefix of a sibling's is not inserted; a
// block that extends a partial sibling replaces it in place.
func (t *Tree) Insert(parent NodeID, b Block) (NodeID, Outcome, error) {
	p, err := t.get(parent)
	if err != nil {
		return 0, 0, err
	}
	if parent != Root && int(p.nTokens) < t.t {
		return 0, 0, fmt.Errorf("%w: parent %d holds %d of %d tokens", ErrPartialParent, parent, p.nTokens, t.t)
	}
	if p.flags&flagAbsent != 0 {
		return 0, 0, fmt.Errorf("%w: parent %d is not held", ErrNoNode, parent)
	}
	n := b.NumTokens
	if b.Tokens != nil {
		if n != 0 && n != len(b.Tokens) {
			return 0, 0, fmt.Errorf("%w: NumTokens %d but %d tokens", ErrBadBlock, n, len(b.Tokens))
		}
		n = len(b.Tokens)
	}
	if n < 1 || n > t.t {
		return 0, 0, fmt.Errorf("%w: %d tokens, want 1..%d", ErrBadBlock, n, t.t)
	}
	partial := n < t.t
	if partial && b.Tokens == nil {
		return 0, 0, fmt.Errorf("%w: a partial block of %d tokens needs its tokens", ErrBadBlock, n)
	}

	if id := t.indexGet(&b.Key); id != 0 {
		en := t.nd(id)
		if en.parent != int32(parent) {
			return 0, 0, fmt.Errorf("%w: key %s", ErrKeyConflict, b.Key)
		}
		return NodeID(id), Duplicate, nil
	}

	if b.Tokens != nil && (partial || p.flags&flagPartialChild != 0) {
		sawPartial := false
		for c := p.firstChild; c != 0; c = t.nd(c).nextSib {
			cn := t.nd(c)
			if int(cn.nTokens) < t.t {
				sawPartial = true
			}
			if cn.flags&flagTokens == 0 || t.scopes[c] != b.Scope {
				continue
			}
			st := t.tokens[c]
			if partial && hasPrefix(st, b.Tokens) {
				return NodeID(c), Useless, nil
			}
			if len(st) < n && hasPrefix(b.Tokens, st) {
				t.replace(c, b, n)
				return NodeID(c), Replaced, nil
			}
		}
		if !sawPartial {
			p.flags &^= flagPartialChild
		}
	}

	id := t.alloc()
	// alloc may grow the chunk table, but node pointers stay valid: chunks never move.
	nn := t.nd(id)
	nn.key = b.Key
	nn.nTokens = uint16(n)
	nn.attnCov = uint16(n)
	nn.flags = flagLive
	t.clock++
	nn.stamp = t.clock
	if b.Tokens != nil && (partial || t.cfg.StoreTokens) {
		t.tokens[id] = append([]int64(nil), b.Tokens...)
		t.setScope(id, b.Scope)
		nn.flags |= flagTokens
	}
	t.link(int32(parent), id)
	if partial {
		t.nd(int32(parent)).flags |= flagPartialChild
	}
	t.indexPut(&nn.key, id)
	t.live++
	if t.evictable(id) {
		t.heapPush(id)
	}
	return NodeID(id), Inserted, nil
}

func (t *Tree) setScope(id int32, s keys.Hash) {
	if s == (keys.Hash{}) {
		delete(t.scopes, id)
		return
	}
	t.scopes[id] = s
}

func (t *Tree) replace(id int32, b Block, n int) {
	cn := t.nd(id)
	t.indexDelete(&cn.key, id)
	cn.key = b.Key
	cn.nTokens = uint16(n)
	cn.attnCov = uint16(n)
	cn.ssmCov = 0
	if n < t.t || t.cfg.StoreTokens {
		t.tokens[id] = append([]int64(nil), b.Tokens...)
		t.setScope(id, b.Scope)
	} else {
		delete(t.tokens, id)
		delete(t.scopes, id)
		cn.flags &^= flagTokens
	}
	t.indexPut(&cn.key, id)
	t.clock++
	cn.stamp = t.clock
	if cn.heapPos != 0 {
		t.heapFix(int(cn.heapPos - 1))
	}
}

// InsertChain inserts blocks as a path under parent, one below the other, and appends the id
// that stands for each block to dst. A Useless block ends the chain (it can only be the last).
func (t *Tree) InsertChain(dst []NodeID, parent NodeID, blocks []Block) ([]NodeID, error) {
	cur := parent
	for i, b := range blocks {
		id, out, err := t.Insert(cur, b)
		if err != nil {
			return dst, fmt.Errorf("block %d: %w", i, err)
		}
		dst = append(dst, id)
		if out == Useless {
			if i != len(blocks)-1 {
				return dst, fmt.Errorf("block %d: %w: only the last block may be partial", i, ErrBadBlock)
			}
			break
		}
		cur = id
	}
	return dst, nil
}
