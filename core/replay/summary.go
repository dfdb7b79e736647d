package replay

import (
	"context"
	"math"
	"slices"

	"github.com/kvctl/kvctl/pool/embedded"
)

// finish assembles the run's report from what the replay counted: rank loads, prefix holes,
// the pool's figures scaled to real pages, bytes moved, hit rates, latencies and balance.
func (o *offline) finish() error {
	run := &o.run
	holes := o.pool.holes
	for _, r := range o.ranks {
		run.RankLoad = append(run.RankLoad, r.load)
	}
	run.Holes = HoleCounts{
		Lookups: holes.Lookups, LookedUpBlocks: holes.LookedUpBlocks, HitBlocks: holes.HitBlocks,
		Holes: holes.Holes, HoleBlocks: holes.HoleBlocks,
		RecomputedStoredTokens: holes.RecomputedStoredTokens * TraceBlockTokens / int64(o.p.TokensPerBlock),
	}
	if o.t.Format != FormatMooncake {
		run.Holes.RecomputedStoredTokens = holes.RecomputedStoredTokens
	}
	st, err := o.emb.Stats(context.Background())
	if err != nil {
		return err
	}
	sim := int64(o.p.SimPageBytes)
	run.Pool.PeakUsedBytes = o.peakUsed / sim * o.p.PageBytes
	run.Pool.FinalUsedBytes = st.UsedBytes / sim * o.p.PageBytes
	if run.Pool.CapacityBytes > 0 {
		run.Pool.PeakOccupancy = float64(run.Pool.PeakUsedBytes) / float64(run.Pool.CapacityBytes)
	}
	run.Pool.Objects = st.Objects
	run.Pool.Puts = st.Puts
	run.Pool.PutFailures = o.pool.putFailed.Load()
	run.Pool.EvictionRounds = o.evictRounds.Load()
	run.Pool.Evicted = o.evicted.Load()
	run.Pool.EvictedSoftPinned = st.Detail[embedded.DetailEvictedSoftPinned]
	run.Pool.EvictedGrouped = st.Detail[embedded.DetailEvictedGrouped]
	run.Moved.SavedPages = o.pool.putOK.Load()
	run.Moved.LoadedBytes = run.Moved.LoadedPages * o.p.PageBytes
	run.Moved.SavedBytes = run.Moved.SavedPages * o.p.PageBytes
	run.Time.SaveSec = float64(run.Moved.SavedBytes) / o.p.SaveBandwidth
	if in := float64(run.Tokens.Input); in > 0 {
		run.HitRate = HitRates{
			Local: float64(run.Tokens.LocalHit) / in,
			Pool:  float64(run.Tokens.PoolHit) / in,
			Total: float64(run.Tokens.LocalHit+run.Tokens.PoolHit) / in,
		}
	}
	if n := len(o.ttfts); n > 0 {
		var sum float64
		for _, v := range o.ttfts {
			sum += v
		}
		slices.Sort(o.ttfts)
		run.Latency = Latency{MeanTTFTSec: sum / float64(n), P50TTFTSec: quantile(o.ttfts, 0.5), P99TTFTSec: quantile(o.ttfts, 0.99)}
	}
	run.Balance = balance(run.RankLoad)
	for _, r := range o.ranks {
		o.wall.alloc += r.eng.allocWall
	}
	run.Wall = WallTimes{
		LookupSec: o.wall.lookup.Seconds(), AllocSec: o.wall.alloc.Seconds(), LoadSec: o.wall.load.Seconds(),
		SaveSec: o.wall.save.Seconds(), EvictSec: o.wall.evict.Seconds(),
	}
	return nil
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func balance(rs []RankLoad) Balance {
	var b Balance
	var rsum, bsum, rmax, bmax float64
	for _, r := range rs {
		rsum += float64(r.RecomputedTokens)
		bsum += r.BusySec
		rmax = max(rmax, float64(r.RecomputedTokens))
		bmax = max(bmax, r.BusySec)
	}
	n := float64(len(rs))
	if rsum > 0 {
		b.RecomputedMaxOverMean = rmax / (rsum / n)
	}
	if bsum > 0 {
		b.BusyMaxOverMean = bmax / (bsum / n)
	}
	return b
}
