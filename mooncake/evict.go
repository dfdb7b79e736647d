package mooncake

import (
	"container/heap"
	"math"
	"sort"
	"time"
)

// candHeap orders objects by lease deadline, oldest first; put order breaks ties.
type candHeap []*object

func (h candHeap) Len() int { return len(h) }
func (h candHeap) Less(i, j int) bool {
	if !h[i].lease.Equal(h[j].lease) {
		return h[i].lease.Before(h[j].lease)
	}
	return h[i].seq < h[j].seq
}
func (h candHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *candHeap) Push(x any)   { *h = append(*h, x.(*object)) }
func (h *candHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
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

	var unpinned, soft candHeap
	base := 0
	for _, o := range e.objs {
		if o.hardPin || !o.complete || o.refcnt > 0 {
			continue
		}
		base++
		if o.lease.After(now) {
			continue
		}
		if o.softPin.After(now) {
			if e.opts.AllowEvictSoftPinned {
				soft = append(soft, o)
			}
			continue
		}
		unpinned = append(unpinned, o)
	}
	round.Base = base
	heap.Init(&unpinned)

	skipped := map[*group]bool{}
	evict := func(o *object, pass int, allowSoft bool) int {
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
				e.evictOne(&round, m, pass, now)
				n++
			}
			return n
		}
		if !e.evictable(o, now, allowSoft) {
			return 0
		}
		e.evictOne(&round, o, pass, now)
		return 1
	}

	evicted := 0
	want := int(math.Ceil(float64(base) * target))
	if want > len(unpinned) {
		want = len(unpinned)
	}
	for evicted < want && unpinned.Len() > 0 {
		evicted += evict(heap.Pop(&unpinned).(*object), 1, false)
	}

	floor := int(math.Ceil(float64(base) * lower))
	if evicted < floor {
		need := floor - evicted
		if cap := unpinned.Len() + len(soft); need > cap {
			need = cap
		}
		got := 0
		for got < need && unpinned.Len() > 0 {
			got += evict(heap.Pop(&unpinned).(*object), 2, false)
		}
		if got < need && len(soft) > 0 {
			heap.Init(&soft)
			for got < need && soft.Len() > 0 {
				got += evict(heap.Pop(&soft).(*object), 2, true)
			}
		}
		evicted += got
	}

	e.c.rounds.Add(1)
	if len(round.Evicted) > 0 {
		e.c.successfulRounds.Add(1)
		e.needEvict = false
	}
	return round, true
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

func (e *Embedded) evictOne(r *EvictionRound, o *object, pass int, now time.Time) {
	ev := EvictedObject{Key: o.key, Size: o.size, Pass: pass, SoftPinned: o.softPin.After(now)}
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
