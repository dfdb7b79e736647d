package kvcache

import "fmt"

// AdmitGeneration reserves a disaggregated generation request's completion bound: its
// prompt, its output limit and the maximum generation lead. A refusal wraps
// ErrNoReservation; the caller frees the request's cache instead of suspending it. Without
// reservations in force it admits everything.
func (m *Manager) AdmitGeneration(id RequestID, promptTokens, maxOutputTokens int) error {
	if promptTokens < 1 || maxOutputTokens < 0 {
		return fmt.Errorf("%w: prompt %d, output limit %d", ErrBadRequest, promptTokens, maxOutputTokens)
	}
	return m.admit(id, promptTokens+maxOutputTokens+m.cfg.MaxGenerationLead)
}

// AdmitContext reserves a connector first chunk through the end of its prompt.
func (m *Manager) AdmitContext(id RequestID, promptTokens int) error {
	if promptTokens < 1 {
		return fmt.Errorf("%w: prompt %d", ErrBadRequest, promptTokens)
	}
	return m.admit(id, promptTokens)
}

func (m *Manager) admit(id RequestID, boundTokens int) error {
	if m.closed {
		return ErrShutdown
	}
	if !m.reserve {
		return nil
	}
	bound := (boundTokens + m.t - 1) / m.t
	held := 0
	if r, ok := m.reqs[id]; ok {
		held = r.held()
	}
	others := m.outstanding(id)
	avail := m.tree.Unreferenced()
	for i, f := range m.free {
		if others+max(bound-held, 0) > len(f)+avail {
			return fmt.Errorf("%w: request %d needs %d more blocks, pool %q has %d free and %d evictable with %d reserved",
				ErrNoReservation, id, max(bound-held, 0), m.cfg.Pools[i].Group, len(f), avail, others)
		}
	}
	m.bounds[id] = bound
	return nil
}

// ReleaseReservation drops request id's bound without touching its pages, as when a first
// chunk's resize fails while the chunk is unconsumed.
func (m *Manager) ReleaseReservation(id RequestID) { delete(m.bounds, id) }

// Reservation returns request id's bound in blocks.
func (m *Manager) Reservation(id RequestID) (int, bool) {
	b, ok := m.bounds[id]
	return b, ok
}

// outstanding sums what admitted requests other than skip may still take.
func (m *Manager) outstanding(skip RequestID) int {
	sum := m.outstandingAll()
	if b, ok := m.bounds[skip]; ok {
		sum -= max(b-m.heldBy(skip), 0)
	}
	return sum
}

func (m *Manager) outstandingAll() int {
	sum := 0
	for id, b := range m.bounds {
		sum += max(b-m.heldBy(id), 0)
	}
	return sum
}

func (m *Manager) heldBy(id RequestID) int {
	if r, ok := m.reqs[id]; ok {
		return r.held()
	}
	return 0
}

// CheckReservations verifies that every pool's free and evictable pages cover what the
// admitted requests may still take.
func (m *Manager) CheckReservations() error {
	need := m.outstandingAll()
	avail := m.tree.Unreferenced()
	for i, f := range m.free {
		if need > len(f)+avail {
			return fmt.Errorf("pool %q over-committed: %d blocks reserved, %d free, %d evictable", m.cfg.Pools[i].Group, need, len(f), avail)
		}
	}
	return nil
}

// ResizeFirstChunk grows request id's allocation to numTokens for a first chunk that has not
// been consumed yet. When the pools cannot cover it, the request keeps what it held and its
// completion bound is released (seed commit 6), so a chunk that is given back does not keep
// headroom from the requests admitted after it.
func (m *Manager) ResizeFirstChunk(id RequestID, numTokens int) error {
	r, err := m.req(id)
	if err != nil {
		return err
	}
	if err := m.grow(id, r, numTokens); err != nil {
		delete(m.bounds, id)
		return err
	}
	return nil
}

// ReservationsHeld returns how many admitted requests hold a completion bound and how many
// blocks those requests may still take beyond the pages they hold.
func (m *Manager) ReservationsHeld() (requests, blocks int) {
	return len(m.bounds), m.outstandingAll()
}
