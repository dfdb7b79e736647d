package kvcache

import (
	"container/list"

	"github.com/kvctl/kvctl/core/keys"
)

// hostTier keeps blocks evicted from the GPU by key, least recently stored dropped first.
// Chain keys commit to their prefix, so presence by key is enough to extend a match.
type hostTier struct {
	slots int
	order *list.List // front: most recent
	byKey map[keys.Hash]*list.Element
}

func newHostTier(slots int) *hostTier {
	return &hostTier{slots: slots, order: list.New(), byKey: make(map[keys.Hash]*list.Element)}
}

func (h *hostTier) put(k keys.Hash) {
	if e, ok := h.byKey[k]; ok {
		h.order.MoveToFront(e)
		return
	}
	if h.order.Len() >= h.slots {
		old := h.order.Back()
		delete(h.byKey, old.Value.(keys.Hash))
		h.order.Remove(old)
	}
	h.byKey[k] = h.order.PushFront(k)
}

func (h *hostTier) has(k keys.Hash) bool { _, ok := h.byKey[k]; return ok }

func (h *hostTier) take(k keys.Hash) {
	if e, ok := h.byKey[k]; ok {
		h.order.Remove(e)
		delete(h.byKey, k)
	}
}

func (h *hostTier) len() int { return h.order.Len() }
