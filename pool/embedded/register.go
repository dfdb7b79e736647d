package embedded

import (
	"context"
	"fmt"

	"github.com/kvctl/kvctl/core/config"
	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/pool"
)

// SegmentName is the name of the one segment `kvctl serve` gives its embedded pool.
const SegmentName = "kvctl-embedded-0"

func init() {
	pool.Register(pool.Backend{
		Name:        config.PoolBackendEmbedded,
		Summary:     "an in-process pool with the Mooncake master's semantics, in this host's memory",
		ConfigKeys:  []string{config.ServeKeyPoolPrefault},
		StatsDetail: StatsDetail,
		New:         newServePool,
	})
}

// newServePool builds the embedded pool of `kvctl serve`: one segment of the plan's pool size,
// prefaulted when the plan asks.
func newServePool(_ context.Context, s pool.Spec) (pool.Pool, statsapi.BackendInfo, error) {
	o := DefaultOptions()
	o.Segments = []SegmentSpec{{Name: SegmentName, Capacity: s.Plan.PoolBytes}}
	o.Prefault = s.Plan.Config.PoolPrefault
	p, err := NewEmbedded(o)
	if err != nil {
		return nil, statsapi.BackendInfo{}, fmt.Errorf("embedded pool: %w", err)
	}
	return p, Info(o), nil
}

// Info is what /v1/stats's backend object shows of an embedded pool with options o: its
// segments are all this host's.
func Info(o Options) statsapi.BackendInfo {
	info := statsapi.BackendInfo{Kind: statsapi.BackendEmbedded}
	for i, s := range o.Segments {
		if i == 0 {
			info.Segment = s.Name
		}
		info.SegmentBytes += s.Capacity
	}
	return info
}
