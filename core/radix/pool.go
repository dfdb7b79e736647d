package radix

import (
	"fmt"

	"github.com/kvctl/kvctl/core/keys"
)

// PoolIndex mirrors which blocks a pool holds, as a tree of chain keys: insert on put,
// remove on eviction. It answers prefix questions without a pool round trip. A removed block
// that still has descendants stays in the tree as a hole, so the blocks after it are known to
// be held but unreachable by a prefix load. Not safe for concurrent use; Probe, Contains and
// the counters do not modify the index.
type PoolIndex struct {
	t       *Tree
	present int
}

// NewPoolIndex returns an empty index. sizeHint presizes it for that many blocks.
func NewPoolIndex(sizeHint int) *PoolIndex {
	t, err := New(Config{TokensPerBlock: 1, DisableLRU: true, SizeHint: max(sizeHint, 0)})
	if err != nil {
		// The config above is constant and valid.
		panic(err)
	}
	return &PoolIndex{t: t}
}

// Insert records that the pool holds every block of chain (chain[i] is the key of block i of
// one prompt). It returns how many blocks became held.
func (p *PoolIndex) Insert(chain []keys.Hash) (int, error) {
	added := 0
	cur := int32(0)
	for i := range chain {
		c := p.t.findChild(cur, &chain[i])
		if c == 0 {
			if id := p.t.indexGet(&chain[i]); id != 0 {
				return added, fmt.Errorf("block %d: %w: key %s", i, ErrKeyConflict, chain[i])
			}
			id, _, err := p.t.Insert(NodeID(cur), Block{Key: chain[i], NumTokens: 1})
			if err != nil {
				return added, fmt.Errorf("block %d: %w", i, err)
			}
			c = int32(id)
			added++
		} else if n := p.t.nd(c); n.flags&flagAbsent != 0 {
			n.flags &^= flagAbsent
			added++
		}
		cur = c
	}
	p.present += added
	return added, nil
}

// Remove records that the pool no longer holds block h. It reports whether h was held.
func (p *PoolIndex) Remove(h keys.Hash) bool {
	id := p.t.indexGet(&h)
	if id == 0 {
		return false
	}
	n := p.t.nd(id)
	if n.flags&flagAbsent != 0 {
		return false
	}
	p.present--
	if n.nChildren > 0 {
		n.flags |= flagAbsent
		return true
	}
	// A hole with no descendants left tells nothing; drop it and any holes it leaves bare.
	for id != 0 {
		parent := p.t.nd(id).parent
		p.t.removeNode(id)
		if parent == 0 {
			break
		}
		pn := p.t.nd(parent)
		if pn.flags&flagAbsent == 0 || pn.nChildren > 0 {
			break
		}
		id = parent
	}
	return true
}

// Contains reports whether the pool holds block h.
func (p *PoolIndex) Contains(h keys.Hash) bool {
	id := p.t.indexGet(&h)
	return id != 0 && p.t.nd(id).flags&flagAbsent == 0
}

// Len returns the number of blocks held.
func (p *PoolIndex) Len() int { return p.present }

// Nodes returns the number of nodes, holes included.
func (p *PoolIndex) Nodes() int { return p.t.Len() }

// Hole is a run of blocks the pool lacks with a held block after it: blocks
// [Start, Start+Len) of the probed chain.
type Hole struct {
	Start int `json:"start"`
	Len   int `json:"len"`
}

// ProbeResult answers a prefix question.
type ProbeResult struct {
	// Hit is the number of leading blocks the pool holds: what a prefix load can fetch.
	Hit int `json:"hit"`
	// Holes are the gaps that have held blocks after them in this chain.
	Holes []Hole `json:"holes,omitempty"`
	// BehindHoles counts held blocks after the first hole.
	BehindHoles int `json:"behind_holes"`
}

// Probe walks chain through the index.
func (p *PoolIndex) Probe(chain []keys.Hash) ProbeResult {
	var r ProbeResult
	cur := int32(0)
	gapStart := -1
	for i := range chain {
		c := p.t.findChild(cur, &chain[i])
		if c == 0 {
			break
		}
		if p.t.nd(c).flags&flagAbsent != 0 {
			if gapStart < 0 {
				gapStart = i
			}
		} else {
			if gapStart >= 0 {
				r.Holes = append(r.Holes, Hole{Start: gapStart, Len: i - gapStart})
				gapStart = -1
			}
			if len(r.Holes) == 0 {
				r.Hit++
			} else {
				r.BehindHoles++
			}
		}
		cur = c
	}
	return r
}
