package embedded

import (
	"math"
	"slices"
	"sort"
	"time"
)

// cand is an eviction candidate with its sort key copied out of the object, so ordering a
// million candidates compares plain integers instead of chasing pointers.
type cand struct {
	lease int64 // lease deadline, Unix nanoseconds
	seq   uint64
	o     *object
}

func candLess(a, b cand) bool {
	if a.lease != b.lease {
		return a.lease < b.lease
	}
	return a.seq < b.seq
}

func candCmp(a, b cand) int {
	switch {
	case candLess(a, b):
		return -1
	case candLess(b, a):
		return 1
	}
	return 0
}

// candStream yields candidates oldest lease first. A round usually takes a few percent of
// them, so it orders only the k oldest up front (selection, then a sort of those) and sorts the
// rest only if the round needs more.
type candStream struct {
	c      []cand
	sorted int // c[:sorted] is in order and older than everything after it
	pos    int
}

func newCandStream(c []cand, k int) *candStream {
	s := &candStream{c: c}
	if k >= len(c) {
		slices.SortFunc(c, candCmp)
		s.sorted = len(c)
		return s
	}
	if k > 0 {
		selectOldest(c, k)
		slices.SortFunc(c[:k], candCmp)
		s.sorted = k
	}
	return s
}

func (s *candStream) left() int { return len(s.c) - s.pos }

func (s *candStream) next() *object {
	if s.pos >= len(s.c) {
		return nil
	}
	if s.pos == s.sorted {
		slices.SortFunc(s.c[s.sorted:], candCmp)
		s.sorted = len(s.c)
	}
	o := s.c[s.pos].o
	s.pos++
	return o
}

// selectOldest reorders c so that c[:k] holds its k oldest candidates (quickselect).
func selectOldest(c []cand, k int) {
	lo, hi := 0, len(c)-1
	for lo < hi {
		// median of three as the pivot keeps sorted inputs (the common case: leases in put
		// order) linear.
		mid := lo + (hi-lo)/2
		if candLess(c[mid], c[lo]) {
			c[mid], c[lo] = c[lo], c[mid]
		}
		if candLess(c[hi], c[lo]) {
			c[hi], c[lo] = c[lo], c[hi]
		}
		if candLess(c[hi], c[mid]) {
			c[hi], c[mid] = c[mid], c[hi]
		}
		pivot := c[mid]
		i, j := lo, hi
		for i <= j {
			for candLess(c[i], pivot) {
				i++
			}
			for candLess(pivot, c[j]) {
				j--
			}
			if i <= j {
				c[i], c[j] = c[j], c[i]
				i++
				j--
			}
		}
		switch {
		case k-1 <= j:
			hi = j
		case k-1 >= i:
			lo = i
		default:
			return
		}
	}
}

// evictLocked is one tick of the master's eviction thread (reference §2.3): the trigger, the
// census on object counts, pass 1 over expired unpinned objects by lease deadline, and pass 2
// when pass 1 stayed below the lower bound, taking soft-pinned objects only when the unpinned
// ones cannot cover it and the options allow it. Hard-pinned objects are never taken.
func (e *Embedded) evictLocked(now time.Time) (EvictionRound, bool) {
	if e.capacity == 0 {
		return EvictionRound{}, false
	}
	ratio := e.opts.EvictionRatio
	hw := e.opts.HighWatermark
	used := float64(e.used) / float64(e.capacity)
	if !(used > hw || (e.needEvict && ratio > 0)) {
		return EvictionRound{}, false
	}
	target := math.Max(ratio, used-hw+ratio)
	lower := math.Max(target*0.5, used-hw)
	round := EvictionRound{At: now, MemoryRatio: used, NeedMemEviction: e.needEvict, Target: target, LowerBound: lower}

	unpinned := e.cands[:0]
	defer func() {
		clear(unpinned[:cap(unpinned)])
		e.cands = unpinned[:0]
	}()
	var soft []cand
	base := 0
	for _, o := range e.list {
		if o.hardPin || !o.complete || o.refcnt > 0 {
			continue
		}
		base++
		if o.lease.After(now) {
			continue
		}
		if o.softPin.After(now) {
			if e.opts.AllowEvictSoftPinned {
				soft = append(soft, cand{o.lease.UnixNano(), o.seq, o})
			}
			continue
		}
		unpinned = append(unpinned, cand{o.lease.UnixNano(), o.seq, o})
	}
	round.Base = base

	skipped := map[*group]bool{}
	evict := func(o *object, pass int, allowSoft, refill bool) int {
		if o.removed {
			return 0
		}
		if g := o.group; g != nil {
			if skipped[g] {
				return 0
			}
			for m := range g.members {
				if m.lease.After(now) {
					skipped[g] = true
					return 0
				}
			}
			members := make([]*object, 0, len(g.members))
			for m := range g.members {
				members = append(members, m)
			}
			sort.Slice(members, func(i, j int) bool { return members[i].seq < members[j].seq })
			n := 0
			for _, m := range members {
				if !e.evictable(m, now, allowSoft) {
					continue
				}
				e.evictOne(&round, m, pass, now, refill)
				n++
			}
			return n
		}
		if !e.evictable(o, now, allowSoft) {
			return 0
		}
		e.evictOne(&round, o, pass, now, refill)
		return 1
	}

	// Pass 1 tries the whole frontier, the want oldest candidates, whatever a group taken
	// along adds to the count. When the frontier could not give want objects (a member of a
	// group with a leased member is skipped), the master makes up the shortfall from the rest
	// of its candidates in the order of its metadata shards, not by age: the embedded pool
	// does the same in its own shard order (candShard).
	evicted := 0
	want := int(math.Ceil(float64(base) * target))
	if want > len(unpinned) {
		want = len(unpinned)
	}
	stream := newCandStream(unpinned, want)
	for i := 0; i < want; i++ {
		evicted += evict(stream.next(), 1, false, false)
	}
	rest := unpinned[want:]
	if evicted < want && len(rest) > 0 {
		for i := range rest {
			rest[i].lease = int64(candShard(rest[i].o))
		}
		slices.SortFunc(rest, candCmp)
		i := 0
		for ; evicted < want && i < len(rest); i++ {
			evicted += evict(rest[i].o, 1, false, true)
		}
		rest = rest[i:]
		for i := range rest {
			rest[i].lease = rest[i].o.lease.UnixNano()
		}
	}

	floor := int(math.Ceil(float64(base) * lower))
	if evicted < floor {
		need := floor - evicted
		need = min(need, len(rest)+len(soft))
		got := 0
		restStream := newCandStream(rest, need)
		for got < need && restStream.left() > 0 {
			got += evict(restStream.next(), 2, false, false)
		}
		if got < need && len(soft) > 0 {
			softStream := newCandStream(soft, len(soft))
			for got < need && softStream.left() > 0 {
				got += evict(softStream.next(), 2, true, false)
			}
		}
	}

	e.c.rounds.Add(1)
	if len(round.Evicted) > 0 {
		e.c.successfulRounds.Add(1)
		e.needEvict = false
	}
	return round, true
}

// candShards is the number of metadata shards of the master (kNumShards).
const candShards = 1024

// candShard is the shard an object's metadata lives in: FNV-1a of its group id, or of its key
// when ungrouped, modulo candShards. The master hashes the same strings with std::hash, so its
// shard of a key differs; what the two share is that the shortfall is made up in an order that
// has nothing to do with age.
func candShard(o *object) uint64 {
	s := o.key
	if o.group != nil {
		s = o.group.id
	}
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * 1099511628211
	}
	return h % candShards
}

// evictable is the check the master repeats at eviction time for each object.
func (e *Embedded) evictable(o *object, now time.Time, allowSoft bool) bool {
	if o.removed || !o.complete || o.hardPin || o.refcnt > 0 || o.lease.After(now) {
		return false
	}
	if o.softPin.After(now) && !allowSoft {
		return false
	}
	return true
}

func (e *Embedded) evictOne(r *EvictionRound, o *object, pass int, now time.Time, refill bool) {
	ev := EvictedObject{Key: o.key, Size: o.size, Pass: pass, SoftPinned: o.softPin.After(now), Refill: refill}
	if o.group != nil {
		ev.Group = o.group.id
		e.c.evictedGrouped.Add(1)
	}
	if pass == 1 {
		e.c.evictedPass1.Add(1)
	} else {
		e.c.evictedPass2.Add(1)
	}
	if ev.SoftPinned {
		e.c.evictedSoft.Add(1)
	}
	e.c.evictedBytes.Add(o.size)
	r.Evicted = append(r.Evicted, ev)
	e.unlinkLocked(o)
}
