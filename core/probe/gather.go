package probe

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/kvctl/kvctl/core/stats"
	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/mooncake"
)

// Segment is one memory segment of a pool.
type Segment struct {
	Name          string `json:"name"`
	UsedBytes     int64  `json:"used_bytes"`
	CapacityBytes int64  `json:"capacity_bytes"`
}

// Usage is a pool's capacity and what fills it.
type Usage struct {
	CapacityBytes     int64     `json:"capacity_bytes"`
	UsedBytes         int64     `json:"used_bytes"`
	UsedPercent       float64   `json:"used_percent"`
	Objects           int64     `json:"objects"`
	SoftPinnedObjects int64     `json:"soft_pinned_objects"`
	HardPinnedObjects *int64    `json:"hard_pinned_objects,omitempty"`
	GroupedObjects    *int64    `json:"grouped_objects,omitempty"`
	Segments          []Segment `json:"segments"`
}

// Gets are the pool's own gets (the master's, or an embedded pool's): those that found their
// object (Hits) and those that did not. HitRatio is Hits over all gets; it is not the prefix hit
// rate of engines' lookups (Source.HitRates), and the table calls it "gets found ratio".
type Gets struct {
	Hits     int64   `json:"hits"`
	Misses   int64   `json:"misses"`
	HitRatio float64 `json:"hit_ratio"`
}

// EvictionPasses splits evicted objects by the eviction pass that took them (kvctl serve only).
type EvictionPasses struct {
	Pass1      int64 `json:"pass1"`
	Pass2      int64 `json:"pass2"`
	SoftPinned int64 `json:"soft_pinned"`
	Grouped    int64 `json:"grouped"`
	Failed     int64 `json:"failed"`
}

// Evictions are a pool's eviction rounds and what they removed.
type Evictions struct {
	Attempts     int64           `json:"attempts"`
	Successful   int64           `json:"successful"`
	EvictedKeys  int64           `json:"evicted_keys"`
	EvictedBytes int64           `json:"evicted_bytes"`
	ByPass       *EvictionPasses `json:"by_pass,omitempty"`
}

// LogLines counts the lines of a log source.
type LogLines struct {
	Lines     int `json:"lines"`
	HoleLines int `json:"prefix_hole_lines"`
	LoadLines int `json:"load_lines"`
	Skipped   int `json:"skipped"`
	Malformed int `json:"malformed"`
}

// Counters are the figures that only grow; a watch reports their change per interval.
type Counters struct {
	Hits                   int64 `json:"hits"`
	Misses                 int64 `json:"misses"`
	EvictionAttempts       int64 `json:"eviction_attempts"`
	EvictedKeys            int64 `json:"evicted_keys"`
	Lookups                int64 `json:"lookups"`
	HitBlocks              int64 `json:"hit_blocks"`
	Holes                  int64 `json:"holes"`
	HoleBlocks             int64 `json:"hole_blocks"`
	RecomputedStoredTokens int64 `json:"recomputed_stored_tokens"`
	Loads                  int64 `json:"loads"`
	LoadedPages            int64 `json:"loaded_pages"`
	LandedBytes            int64 `json:"landed_bytes"`
	Saves                  int64 `json:"saves"`
	FailedSaves            int64 `json:"failed_saves"`
}

// Source is the report of one pool or log file.
type Source struct {
	Source      string                  `json:"source"`
	Kind        string                  `json:"kind"`
	Version     string                  `json:"version,omitempty"`
	Role        string                  `json:"role,omitempty"`
	Ready       *bool                   `json:"ready,omitempty"`
	Engines     *int                    `json:"engines,omitempty"`
	Usage       *Usage                  `json:"usage,omitempty"`
	Gets        *Gets                   `json:"gets,omitempty"`
	Evictions   *Evictions              `json:"evictions,omitempty"`
	PrefixHoles *stats.HoleStats        `json:"prefix_holes,omitempty"`
	Loads       *statsapi.LoadStatsJSON `json:"loads,omitempty"`
	// HitRates is where a kvctl serve's lookups found their prompt tokens: the prefix hit rate.
	HitRates *statsapi.HitRatesJSON `json:"hit_rates,omitempty"`
	// Saves are a kvctl serve's save jobs, those that failed among them, and their pages.
	Saves *statsapi.SaveStatsJSON `json:"saves,omitempty"`
	// Backend is a kvctl serve's pool backend: its master, this host's segment and the
	// cluster's capacity (cluster.go).
	Backend *statsapi.BackendStatusJSON `json:"backend,omitempty"`
	Log     *LogLines                   `json:"log,omitempty"`
	// Error says why a pool could not be read (Kind is KindError); the other sources of the
	// report are still there.
	Error string `json:"error,omitempty"`
	// Delta is the change of the counters since the previous report of a watch.
	Delta *Counters `json:"delta,omitempty"`
}

// KindLog is the kind of a --from-log source.
const KindLog = "log"

// KindError is the kind of a pool that could not be read.
const KindError = "error"

// StatsReport is what pools and connector logs report: the output of `kvctl stats`. Field
// names are a compatibility contract.
type StatsReport struct {
	Sources []Source `json:"sources"`
}

// Pool is one --pool: an admin address (Target) or a Mooncake master's RPC address.
type Pool struct {
	Target  *Target
	RPCAddr string
	Timeout time.Duration
}

// gatherAny reads one pool. A bare host:port that drops HTTP requests is asked over RPC.
func gatherAny(ctx context.Context, p Pool) (Source, error) {
	if p.RPCAddr != "" {
		s, err := gatherRPC(ctx, p.RPCAddr, p.Timeout)
		if err != nil {
			return Source{}, &PoolError{Addr: RPCScheme + p.RPCAddr, RPC: true, Err: err}
		}
		return s, nil
	}
	s, err := gatherPool(ctx, p.Target)
	if err == nil {
		return s, nil
	}
	host := strings.TrimPrefix(p.Target.Addr(), "http://")
	if errors.Is(err, mooncake.ErrUnreachable) && LooksLikeRPC(host, err) {
		if s, rerr := gatherRPC(ctx, host, p.Timeout); rerr == nil {
			return s, nil
		}
	}
	return Source{}, &PoolError{Addr: p.Target.Addr(), Timeout: p.Target.Timeout, Err: err}
}

// Gather reads every pool and log once. A pool that fails is a *PoolError (joined with the
// others' errors) and a source of KindError in the report, which holds every pool that
// answered; a log with no stats line wraps ErrNoStatsLines, and a log error returns no report.
func Gather(ctx context.Context, targets []Pool, logs []string) (*StatsReport, error) {
	res := &StatsReport{Sources: []Source{}}
	var errs []error
	for _, p := range targets {
		s, err := gatherAny(ctx, p)
		if err != nil {
			addr := RPCScheme + p.RPCAddr
			if p.Target != nil {
				addr = p.Target.Addr()
			}
			s = Source{Source: addr, Kind: KindError, Error: err.Error()}
			errs = append(errs, err)
		}
		res.Sources = append(res.Sources, s)
	}
	if len(errs) > 0 {
		// Every pool that answered is reported, with an error source for each that did not.
		return res, errors.Join(errs...)
	}
	for _, name := range logs {
		s, err := gatherLog(name)
		if err != nil {
			return nil, err
		}
		res.Sources = append(res.Sources, s)
	}
	return res, nil
}

func gatherPool(ctx context.Context, t *Target) (Source, error) {
	kind, err := t.Kind(ctx)
	if err != nil {
		return Source{}, err
	}
	src := Source{Source: t.Addr(), Kind: kind}
	if kind == KindServe {
		if done, cerr := gatherClusterServe(ctx, t, &src); done || cerr != nil {
			return src, cerr
		}
	}
	m, err := t.Admin.Metrics(ctx)
	if err != nil {
		return Source{}, err
	}
	segs, err := t.Admin.SegmentsDetail(ctx)
	if err != nil {
		return Source{}, err
	}
	metric := func(name string) int64 {
		v, _ := m.Value(name)
		return int64(v)
	}
	u := &Usage{
		CapacityBytes: metric("master_total_capacity_bytes"), UsedBytes: metric("master_allocated_bytes"),
		Objects: metric("master_key_count"), SoftPinnedObjects: metric("master_soft_pin_key_count"),
		Segments: []Segment{},
	}
	for _, s := range segs {
		u.Segments = append(u.Segments, Segment{Name: s.Name, UsedBytes: s.AllocatorUsedBytes, CapacityBytes: s.AllocatorCapacityBytes})
	}
	ev := &Evictions{
		Attempts: metric("master_attempted_evictions_total"), Successful: metric("master_successful_evictions_total"),
		EvictedKeys: metric("master_evicted_key_count"), EvictedBytes: metric("master_evicted_size_bytes"),
	}
	// The master counts hits as valid gets among all gets; the misses are the rest.
	hits := metric("mem_cache_hit_nums_")
	g := &Gets{Hits: hits, Misses: max(0, metric("total_get_nums_")-metric("valid_get_nums_"))}

	switch kind {
	case KindServe:
		st, err := t.ServeStats(ctx)
		if err != nil {
			return Source{}, err
		}
		p := st.Pool
		src.Version = st.Version
		src.Ready = &st.Ready
		engines := len(st.Engines)
		src.Engines = &engines
		u.CapacityBytes, u.UsedBytes, u.Objects, u.SoftPinnedObjects = p.CapacityBytes, p.UsedBytes, p.Objects, p.SoftPinned
		u.HardPinnedObjects, u.GroupedObjects = &p.HardPinned, &p.Grouped
		g = &Gets{Hits: p.Hits, Misses: p.Misses}
		ev.ByPass = &EvictionPasses{Pass1: p.EvictedPass1, Pass2: p.EvictedPass2, SoftPinned: p.EvictedSoftPinned, Grouped: p.EvictedGrouped, Failed: p.FailedEvictions}
		serveCounts(&src, st)
	case KindMaster:
		sum, err := t.Admin.MetricsSummary(ctx)
		if err != nil {
			return Source{}, err
		}
		src.Role = sum.Role
		src.Ready = &sum.ServiceReady
		// The summary's key counts are the master's own view; prefer them to the gauges when
		// both are present since they are computed in one pass.
		u.Objects, u.SoftPinnedObjects = sum.Keys, sum.SoftPinnedKeys
	}
	if u.CapacityBytes > 0 {
		u.UsedPercent = float64(u.UsedBytes) * 100 / float64(u.CapacityBytes)
	}
	if g.Hits+g.Misses > 0 {
		g.HitRatio = float64(g.Hits) / float64(g.Hits+g.Misses)
	}
	src.Usage, src.Gets, src.Evictions = u, g, ev
	return src, nil
}

func gatherLog(name string) (Source, error) {
	f, err := os.Open(name)
	if err != nil {
		return Source{}, err
	}
	defer f.Close()
	ls, err := ParseLog(f)
	if err != nil {
		return Source{}, fmt.Errorf("%s: %w", name, err)
	}
	if ls.HoleLines+ls.LoadLines == 0 {
		msg := fmt.Sprintf("%s: no \"prefix-hole stats\" or \"load stats\" lines among %d lines; is stats_interval set on the connector?", name, ls.Lines)
		if ls.Malformed > 0 {
			msg = fmt.Sprintf("%s: no readable stats lines among %d lines (%d malformed, the first at line %d)", name, ls.Lines, ls.Malformed, ls.FirstMalformed)
		}
		return Source{}, &noStatsLines{msg: msg}
	}
	src := Source{Source: name, Kind: KindLog, Log: &LogLines{Lines: ls.Lines, HoleLines: ls.HoleLines, LoadLines: ls.LoadLines, Skipped: ls.Skipped, Malformed: ls.Malformed}}
	if ls.HoleLines > 0 {
		h := ls.Holes
		src.PrefixHoles = &h
	}
	if ls.LoadLines > 0 {
		l := ls.Loads
		src.Loads = &l
	}
	return src, nil
}

// gatherClusterServe reports a kvctl serve whose pool is a Mooncake cluster from its
// /v1/stats alone: such a serve answers none of the master's read endpoints (the master itself
// does; give it as another --pool). done is false for a serve on the embedded pool, which
// gatherPool reports in full.
func gatherClusterServe(ctx context.Context, t *Target, src *Source) (done bool, err error) {
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
	src.Usage, src.Gets = u, g
	serveCounts(src, st)
	return true, nil
}

// serveCounts copies what only a kvctl serve counts into src: prefix holes, loads, lookup hit
// rates, saves and its backend.
func serveCounts(src *Source, st statsapi.StatsJSON) {
	holes, loads, rates, saves, backend := st.PrefixHoles, st.Loads, st.HitRates, st.Saves, st.Backend
	src.PrefixHoles, src.Loads, src.HitRates, src.Saves, src.Backend = &holes, &loads, &rates, &saves, &backend
}

// gatherRPC reports what a master's RPC service tells: that it serves, its store protocol
// version and its storage configuration.
func gatherRPC(ctx context.Context, addr string, timeout time.Duration) (Source, error) {
	c, err := DialMaster(ctx, addr, timeout)
	if err != nil {
		return Source{}, err
	}
	defer func() { _ = c.Close() }()
	version, err := c.ServiceReady(ctx)
	if err != nil {
		return Source{}, err
	}
	if _, err := c.GetStorageConfig(ctx); err != nil {
		return Source{}, err
	}
	ready := true
	return Source{Source: RPCScheme + addr, Kind: KindMasterRPC, Version: version, Ready: &ready}, nil
}

// Counters returns the figures of s that only grow.
func (s Source) Counters() Counters {
	var c Counters
	if s.Gets != nil {
		c.Hits, c.Misses = s.Gets.Hits, s.Gets.Misses
	}
	if s.Evictions != nil {
		c.EvictionAttempts, c.EvictedKeys = s.Evictions.Attempts, s.Evictions.EvictedKeys
	}
	if h := s.PrefixHoles; h != nil {
		c.Lookups, c.HitBlocks, c.Holes, c.HoleBlocks, c.RecomputedStoredTokens = h.Lookups, h.HitBlocks, h.Holes, h.HoleBlocks, h.RecomputedStoredTokens
	}
	if l := s.Loads; l != nil {
		c.Loads, c.LoadedPages, c.LandedBytes = l.Loads, l.Pages, l.LandedBytes
	}
	if sv := s.Saves; sv != nil {
		c.Saves, c.FailedSaves = sv.Saves, sv.FailedSaves
	}
	return c
}

// Minus returns the change from o to c.
func (c Counters) Minus(o Counters) Counters {
	return Counters{
		Hits: c.Hits - o.Hits, Misses: c.Misses - o.Misses,
		EvictionAttempts: c.EvictionAttempts - o.EvictionAttempts, EvictedKeys: c.EvictedKeys - o.EvictedKeys,
		Lookups: c.Lookups - o.Lookups, HitBlocks: c.HitBlocks - o.HitBlocks, Holes: c.Holes - o.Holes,
		HoleBlocks: c.HoleBlocks - o.HoleBlocks, RecomputedStoredTokens: c.RecomputedStoredTokens - o.RecomputedStoredTokens,
		Loads: c.Loads - o.Loads, LoadedPages: c.LoadedPages - o.LoadedPages, LandedBytes: c.LandedBytes - o.LandedBytes,
		Saves: c.Saves - o.Saves, FailedSaves: c.FailedSaves - o.FailedSaves,
	}
}

// SetDeltas sets each source's Delta to the change of its counters since prev, a report of the
// same sources; a nil prev sets nothing.
func (r *StatsReport) SetDeltas(prev *StatsReport) {
	if prev == nil {
		return
	}
	for i := range r.Sources {
		if i >= len(prev.Sources) {
			return
		}
		d := r.Sources[i].Counters().Minus(prev.Sources[i].Counters())
		r.Sources[i].Delta = &d
	}
}
