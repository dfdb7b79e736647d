package kvcache

import (
	"fmt"
	"testing"

	"pgregory.net/rapid"
)

// checkPages verifies that every page of every pool is free, private to one request or held
// by one cached block.
func checkPages(m *Manager) error {
	for i, p := range m.cfg.Pools {
		seen := make(map[int32]bool, p.GPUSlots)
		mark := func(pg int32) bool {
			if seen[pg] {
				return false
			}
			seen[pg] = true
			return true
		}
		for _, pg := range m.free[i] {
			if !mark(pg) {
				return errf("pool %d: page %d free twice", i, pg)
			}
		}
		for _, r := range m.reqs {
			for _, pp := range r.private {
				if !mark(pp[i]) {
					return errf("pool %d: private page %d owned twice", i, pp[i])
				}
			}
		}
		for _, pp := range m.pages {
			if !mark(pp[i]) {
				return errf("pool %d: cached page %d owned twice", i, pp[i])
			}
		}
		if len(seen) != p.GPUSlots {
			return errf("pool %d: %d pages accounted for, %d exist", i, len(seen), p.GPUSlots)
		}
	}
	if len(m.pages) != m.tree.Len() {
		return errf("%d cached blocks with pages, tree holds %d", len(m.pages), m.tree.Len())
	}
	return m.tree.Check()
}

func TestPropertyReservationsNeverOverCommit(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		const T = 4
		cfg := Config{
			TokensPerBlock:              T,
			Pools:                       pools(rapid.IntRange(4, 24).Draw(rt, "slots0"), rapid.IntRange(4, 24).Draw(rt, "slots1")),
			ReuseMatchBackoff:           rapid.IntRange(0, 5).Draw(rt, "backoff"),
			EnablePartialReuse:          rapid.Bool().Draw(rt, "partial"),
			MaxGenerationLead:           rapid.IntRange(0, 4).Draw(rt, "lead"),
			EnableCompletionReservation: true,
			Disaggregated:               true,
			AdmissionQuery:              &AdmissionQueryConfig{MaxOfferDeferrals: 1},
		}
		m, err := New(cfg, nil, Options{})
		if err != nil {
			rt.Fatal(err)
		}
		prompt := func() []int64 {
			return rapid.SliceOfN(rapid.Int64Range(0, 2), 1, 6*T).Draw(rt, "prompt")
		}
		for step := rapid.IntRange(1, 50).Draw(rt, "steps"); step > 0; step-- {
			id := RequestID(rapid.IntRange(1, 5).Draw(rt, "id"))
			switch rapid.IntRange(0, 7).Draw(rt, "op") {
			case 0:
				_ = m.AdmitGeneration(id, rapid.IntRange(1, 16).Draw(rt, "p"), rapid.IntRange(0, 16).Draw(rt, "o"))
			case 1:
				_ = m.AdmitContext(id, rapid.IntRange(1, 24).Draw(rt, "p"))
			case 2:
				p := prompt()
				_, _ = m.Allocate(id, Prompt{Tokens: p}, rapid.IntRange(1, len(p)+8).Draw(rt, "n"))
			case 3:
				_ = m.Grow(id, rapid.IntRange(1, 40).Draw(rt, "n"))
			case 4:
				if r, ok := m.reqs[id]; ok {
					n := rapid.IntRange(r.computed, min(r.held()*T, len(r.tokens)+4)).Draw(rt, "computed")
					toks := append([]int64(nil), r.tokens...)
					for len(toks) < n {
						toks = append(toks, 1)
					}
					if err := m.Commit(id, toks[:n]); err != nil {
						rt.Fatalf("commit: %v", err)
					}
				}
			case 5:
				_ = m.Free(id)
			case 6:
				_ = m.Revert(id)
			case 7:
				if r, ok := m.reqs[id]; ok {
					if m.SetOffer(id, Offer{Epoch: r.epoch, Tokens: T * rapid.IntRange(0, 3).Draw(rt, "blocks")}) == nil {
						_, _ = m.CoverAdmissionOffer(id, rapid.IntRange(1, 8).Draw(rt, "chunk"), rapid.Bool().Draw(rt, "preempted"))
					}
				}
			}
			if err := m.CheckReservations(); err != nil {
				rt.Fatal(err)
			}
			if err := checkPages(m); err != nil {
				rt.Fatal(err)
			}
		}
		m.Shutdown()
		if err := checkPages(m); err != nil {
			rt.Fatal(err)
		}
		if _, unref := m.CachedBlocks(); unref != m.tree.Len() {
			rt.Fatalf("blocks still referenced after shutdown")
		}
	})
}

func errf(format string, a ...any) error { return fmt.Errorf(format, a...) }
