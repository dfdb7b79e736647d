package stats

import (
	"fmt"

	"github.com/kvctl/kvctl/core/statsapi"
)

// backendRows are the table rows of a serve's backend.
func backendRows(b *statsapi.BackendStatusJSON) [][2]string {
	if b == nil || b.Kind == "" {
		return nil
	}
	rows := [][2]string{{"backend", b.Kind}}
	if b.Master != "" {
		rows = append(rows, [2]string{"master", b.Master})
	}
	mounted := "mounted"
	if !b.SegmentMounted {
		mounted = "not mounted"
	}
	rows = append(rows, [2]string{"segment", fmt.Sprintf("%s, %s, %s", b.Segment, bytesHuman(b.SegmentBytes), mounted)})
	if b.Kind == statsapi.BackendMooncake {
		rows = append(rows, [2]string{"cluster", fmt.Sprintf("%d segments, %s / %s", b.ClusterSegments, bytesHuman(b.ClusterUsedBytes), bytesHuman(b.ClusterCapacityBytes))})
	}
	if b.UnreadyReason != "" {
		rows = append(rows, [2]string{"unready reason", b.UnreadyReason})
	}
	if s := b.SegmentServed; s != nil {
		rows = append(rows, [2]string{"served to peers", fmt.Sprintf("%d reads, %s", s.PeerReads, bytesHuman(int64(s.BytesRead)))})
	}
	if f := b.PoolCallFailures; f != (statsapi.PoolFailuresJSON{}) {
		rows = append(rows, [2]string{"pool failures", fmt.Sprintf("%d timeouts, %d lookup keys, %d dropped save pages, %d load pages", f.Timeouts, f.LookupKeys, f.DroppedSavePages, f.LoadPages)})
	}
	return rows
}
