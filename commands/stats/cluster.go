package stats

import (
	"context"
	"fmt"

	"github.com/kvctl/kvctl/core/probe"
	"github.com/kvctl/kvctl/core/statsapi"
)

// gatherClusterServe reports a kvctl serve whose pool is a Mooncake cluster from its
// /v1/stats alone: such a serve answers none of the master's read endpoints (the master itself
// does; give it as another --pool). done is false for a serve on the embedded pool, which
// gatherPool reports in full.
func gatherClusterServe(ctx context.Context, t *probe.Target, src *Source) (done bool, err error) {
	st, err := t.ServeStats(ctx)
	if err != nil {
		return false, err
	}
	if st.Backend.Kind != statsapi.BackendMooncake {
		return false, nil
	}
	p := st.Pool
	src.Version = st.Version
	src.Ready = &st.Ready
	engines := len(st.Engines)
	src.Engines = &engines
	u := &Usage{CapacityBytes: st.Backend.ClusterCapacityBytes, UsedBytes: st.Backend.ClusterUsedBytes, Objects: p.Objects,
		SoftPinnedObjects: p.SoftPinned, Segments: []Segment{}}
	if u.CapacityBytes > 0 {
		u.UsedPercent = float64(u.UsedBytes) * 100 / float64(u.CapacityBytes)
	}
	g := &Gets{Hits: p.Hits, Misses: p.Misses}
	if g.Hits+g.Misses > 0 {
		g.HitRatio = float64(g.Hits) / float64(g.Hits+g.Misses)
	}
	holes, loads, backend := st.PrefixHoles, st.Loads, st.Backend
	src.Usage, src.Gets, src.PrefixHoles, src.Loads, src.Backend = u, g, &holes, &loads, &backend
	return true, nil
}

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
