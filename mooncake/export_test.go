package mooncake

// SetExistSplit sets the fewest keys one of n's BatchIsExist sub-batches carries, so that a
// test splits small batches. Call it before n is used.
func SetExistSplit(n *Native, keys int) { n.existSplit = keys }

// SetCoalesced sets the most bytes one transfer of n's gets and puts moves (0: one page a
// transfer), so that a benchmark compares coalesced transfers with single ones in one run.
func SetCoalesced(n *Native, bytes int) { n.coalesce = bytes }

// MaxCoalesced is maxCoalesced: the most bytes one transfer of a get or put moves.
const MaxCoalesced = maxCoalesced
