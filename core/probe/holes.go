package probe

import "github.com/kvctl/kvctl/core/stats"

// Hole is one run of incomplete blocks with a complete block behind it.
type Hole struct {
	// Start is the index of the hole's first block; Blocks is its length.
	Start, Blocks int
	// StoredBlocks are the complete blocks right behind the hole, up to the next incomplete
	// block or the end of the prompt; their tokens are recomputed although the pool holds them.
	StoredBlocks           int
	RecomputedStoredTokens int64
}

// Analysis is where a prompt's prefix stops and what lies behind it.
type Analysis struct {
	Blocks int
	// Hit is the number of leading complete blocks.
	Hit   int
	Holes []Hole
	// MissingTail is the number of incomplete blocks that reach the end of the prompt.
	MissingTail int
	// Stats are the counts core/stats folds for the same lookup.
	Stats stats.HoleStats
}

// Analyze finds the hit prefix and the holes of one lookup: complete[i] reports whether every
// key of block i exists. Its counts agree with stats.FoldLookup on the same input.
func Analyze(complete []bool, tokensPerBlock int) Analysis {
	a := Analysis{Blocks: len(complete)}
	a.Hit, a.Stats = stats.FoldLookup(complete, tokensPerBlock)
	i := a.Hit
	for i < len(complete) {
		start := i
		for i < len(complete) && !complete[i] {
			i++
		}
		if i == len(complete) {
			a.MissingTail = i - start
			break
		}
		h := Hole{Start: start, Blocks: i - start}
		for i < len(complete) && complete[i] {
			h.StoredBlocks++
			i++
		}
		h.RecomputedStoredTokens = int64(h.StoredBlocks) * int64(tokensPerBlock)
		a.Holes = append(a.Holes, h)
	}
	return a
}
