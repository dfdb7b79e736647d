package mooncake

import "github.com/kvctl/kvctl/mooncake/transfer"

// SegmentServerStats returns the counters of the Transfer Engine server that serves this
// client's segment to peers: how many reads and writes of it peers made, and their bytes.
// It is zero when the client donates no segment.
func (n *Native) SegmentServerStats() transfer.ServerStats {
	if n.srv == nil {
		return transfer.ServerStats{}
	}
	return n.srv.Stats()
}
