package mooncake

// SetExistSplit sets the fewest keys one of n's BatchIsExist sub-batches carries, so that a
// test splits small batches. Call it before n is used.
func SetExistSplit(n *Native, keys int) { n.existSplit = keys }

// SetCoalescedRead sets the most bytes one transfer of n's gets reads (0: one page a
// transfer), so that a benchmark compares coalesced reads with single ones in one run.
func SetCoalescedRead(n *Native, bytes int) { n.coalesce = bytes }

// MaxCoalescedRead is maxCoalescedRead: the most bytes one transfer of a get reads.
const MaxCoalescedRead = maxCoalescedRead
