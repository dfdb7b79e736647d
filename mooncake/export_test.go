package mooncake

// SetExistSplit sets the fewest keys one of n's BatchIsExist sub-batches carries, so that a
// test splits small batches. Call it before n is used.
func SetExistSplit(n *Native, keys int) { n.existSplit = keys }

// MaxCoalescedRead is maxCoalescedRead: the most bytes one transfer of a get reads.
const MaxCoalescedRead = maxCoalescedRead
