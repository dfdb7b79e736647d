package stats

// HoleStats counts what prefix lookups found in the pool. Every field only grows; see the
// package documentation for the meaning of each. It is the one prefix-hole stats type: the
// connector counts in it, /v1/stats serves it ("prefix_holes"), kvctl stats reads it back and
// kvctl replay reports it ("holes"); its JSON names are a compatibility contract.
type HoleStats struct {
	Lookups                int64 `json:"lookups"`                  // lookups that had at least one candidate block
	LookedUpBlocks         int64 `json:"looked_up_blocks"`         // candidate blocks asked about
	HitBlocks              int64 `json:"hit_blocks"`               // leading complete blocks, the ones a prefix hit serves
	Holes                  int64 `json:"holes"`                    // runs of incomplete blocks with a complete block behind them
	HoleBlocks             int64 `json:"hole_blocks"`              // incomplete blocks inside holes
	RecomputedStoredTokens int64 `json:"recomputed_stored_tokens"` // tokens of complete blocks behind the first incomplete one
}

// Add adds o to h.
func (h *HoleStats) Add(o HoleStats) {
	h.Lookups += o.Lookups
	h.LookedUpBlocks += o.LookedUpBlocks
	h.HitBlocks += o.HitBlocks
	h.Holes += o.Holes
	h.HoleBlocks += o.HoleBlocks
	h.RecomputedStoredTokens += o.RecomputedStoredTokens
}

// IsZero reports whether nothing was counted.
func (h HoleStats) IsZero() bool { return h == HoleStats{} }

// FoldLookup folds one lookup's per-block answer (complete[i]: every key of candidate block i
// exists) into its prefix hit and its hole stats. The hit is the number of leading complete
// blocks; the stats describe the blocks behind it. It reads nothing but complete, so the
// existence answer a lookup already has is enough. A lookup with no candidate counts nothing.
func FoldLookup(complete []bool, tokensPerBlock int) (hit int, s HoleStats) {
	if len(complete) == 0 {
		return 0, HoleStats{}
	}
	for hit < len(complete) && complete[hit] {
		hit++
	}
	s.Lookups = 1
	s.LookedUpBlocks = int64(len(complete))
	s.HitBlocks = int64(hit)
	run := 0 // incomplete blocks since the last complete one
	for _, ok := range complete[hit:] {
		if !ok {
			run++
			continue
		}
		if run > 0 {
			s.Holes++
			s.HoleBlocks += int64(run)
			run = 0
		}
		s.RecomputedStoredTokens += int64(tokensPerBlock)
	}
	return hit, s
}
