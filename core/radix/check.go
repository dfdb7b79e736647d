package radix

import "fmt"

// Check verifies the tree's structural invariants: every live node hangs off a live parent
// through consistent sibling links, child counts agree, reference counts are not negative,
// the key index holds exactly the live nodes, and the LRU heap holds exactly the unreferenced
// leaves in heap order. It walks the whole tree; tests and debugging use it.
func (t *Tree) Check() error {
	seen, pinned := 0, 0
	for id := int32(1); id < t.next; id++ {
		n := t.nd(id)
		if n.flags&flagLive == 0 {
			continue
		}
		seen++
		if n.refs > 0 {
			pinned++
		}
		if n.refs < 0 {
			return fmt.Errorf("node %d: negative reference count %d", id, n.refs)
		}
		if n.parent < 0 || n.parent >= t.next || t.nd(n.parent).flags&flagLive == 0 {
			return fmt.Errorf("node %d: orphan, parent %d is not live", id, n.parent)
		}
		found := false
		for c := t.nd(n.parent).firstChild; c != 0; c = t.nd(c).nextSib {
			if c == id {
				found = true
				break
			}
		}
		if !found {
			return fmt.Errorf("node %d: missing from the children of %d", id, n.parent)
		}
		if got := t.indexGet(&n.key); got != id {
			return fmt.Errorf("node %d: index maps its key to %d", id, got)
		}
		if (n.flags&flagTokens != 0) != (t.tokens[id] != nil) {
			return fmt.Errorf("node %d: token flag disagrees with stored tokens", id)
		}
		if n.flags&flagTokens != 0 && len(t.tokens[id]) != int(n.nTokens) {
			return fmt.Errorf("node %d: %d stored tokens for %d", id, len(t.tokens[id]), n.nTokens)
		}
		want := t.evictable(id)
		if want != (n.heapPos != 0) {
			return fmt.Errorf("node %d: evictable %v but heap position %d", id, want, n.heapPos)
		}
	}
	if seen != t.live {
		return fmt.Errorf("%d live nodes, counter says %d", seen, t.live)
	}
	if pinned != t.pinned {
		return fmt.Errorf("%d referenced nodes, counter says %d", pinned, t.pinned)
	}
	if t.index.count != t.live {
		return fmt.Errorf("index holds %d keys for %d nodes", t.index.count, t.live)
	}
	for id := int32(0); id < t.next; id++ {
		n := t.nd(id)
		if n.flags&flagLive == 0 {
			continue
		}
		count := int32(0)
		prev := int32(0)
		for c := n.firstChild; c != 0; c = t.nd(c).nextSib {
			cn := t.nd(c)
			if cn.parent != id || cn.prevSib != prev {
				return fmt.Errorf("node %d: child %d has parent %d and previous sibling %d", id, c, cn.parent, cn.prevSib)
			}
			prev = c
			count++
		}
		if count != n.nChildren {
			return fmt.Errorf("node %d: %d children, counter says %d", id, count, n.nChildren)
		}
	}
	for i, id := range t.heap {
		if int(t.nd(id).heapPos) != i+1 {
			return fmt.Errorf("heap slot %d: node %d records position %d", i, id, t.nd(id).heapPos)
		}
		if i > 0 && t.heapLess(i, (i-1)/2) {
			return fmt.Errorf("heap slot %d out of order", i)
		}
	}
	return nil
}
