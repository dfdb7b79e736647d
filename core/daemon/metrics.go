package daemon

import (
	"context"
	"net/http"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"

	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/stats"
	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/mooncake"
)

// DefaultEngineSeriesRetention is how long the per-engine series of an engine that has left
// are still exported, so a scrape between its leaving and a restart sees no counter reset.
const DefaultEngineSeriesRetention = 15 * time.Minute

// MaxEngineSeries bounds the distinct (model_key, rank) label pairs exported at once; engines
// beyond it are counted under model_key="_other", rank="_other".
const MaxEngineSeries = 256

// OverflowLabel is the model_key and rank label value of engines beyond MaxEngineSeries.
const OverflowLabel = "_other"

// latencyBuckets are the classic buckets of kvctl's latency histograms, 100 µs to 10 s. Scrapers
// that negotiate the protobuf format get native histograms as well.
var latencyBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

func latencyHistogramOpts(name, help string) prometheus.HistogramOpts {
	return prometheus.HistogramOpts{
		Name: name, Help: help, Buckets: latencyBuckets,
		NativeHistogramBucketFactor:     1.1,
		NativeHistogramMaxBucketNumber:  160,
		NativeHistogramMinResetDuration: time.Hour,
	}
}

// seriesKey is the label pair of one engine's series.
type seriesKey struct{ model, rank string }

// engineTotals is what one engine, or many folded together, counted.
type engineTotals struct {
	holes          stats.HoleStats
	loads          stats.LoadTotals
	saves          stats.SaveTotals
	queued, active int
}

func (t *engineTotals) add(o engineTotals) {
	t.holes.Add(o.holes)
	t.loads.Merge(o.loads)
	t.saves.Merge(o.saves)
	t.queued += o.queued
	t.active += o.active
}

func totalsOf(e *engine) engineTotals {
	q, a := e.reporter.LoadQueue()
	return engineTotals{holes: e.reporter.HoleTotals(), loads: e.reporter.LoadTotals(), saves: e.reporter.SaveTotals(), queued: q, active: a}
}

// series is one (model_key, rank) pair: what its departed engines counted, how many engines
// hold it now, and when the last one left.
type series struct {
	retired engineTotals
	live    int
	leftAt  time.Time
}

// daemonMetrics is the daemon's Prometheus side: the kvctl_* families computed at scrape time
// from the engines it serves (live and departed), the latency histograms, and the registry's
// other collectors.
type daemonMetrics struct {
	d         *Daemon
	retention time.Duration
	now       func() time.Time

	lookupDur prometheus.Histogram
	loadDur   prometheus.Histogram
	saveDur   prometheus.Histogram
	callDur   *prometheus.HistogramVec

	lookups lookupCounters
	history history

	mu      sync.Mutex
	live    map[*engine]seriesKey
	retired engineTotals
	series  map[seriesKey]*series

	descs map[string]*prometheus.Desc
}

// totalDef is one counter or gauge exported daemon-wide as kvctl_<name> and per engine as
// kvctl_rank_<name>.
type totalDef struct {
	name, help string
	kind       prometheus.ValueType
	get        func(*engineTotals) float64
}

func n64(v int64) float64 { return float64(v) }

var totalDefs = []totalDef{
	{"prefix_lookups_total", "Prefix lookups that had at least one candidate block.", prometheus.CounterValue, func(t *engineTotals) float64 { return n64(t.holes.Lookups) }},
	{"prefix_looked_up_blocks_total", "Candidate blocks asked of the pool by prefix lookups.", prometheus.CounterValue, func(t *engineTotals) float64 { return n64(t.holes.LookedUpBlocks) }},
	{"prefix_hit_blocks_total", "Blocks served by prefix hits (leading complete blocks).", prometheus.CounterValue, func(t *engineTotals) float64 { return n64(t.holes.HitBlocks) }},
	{"prefix_holes_total", "Runs of missing blocks with a stored block behind them.", prometheus.CounterValue, func(t *engineTotals) float64 { return n64(t.holes.Holes) }},
	{"prefix_hole_blocks_total", "Missing blocks inside holes.", prometheus.CounterValue, func(t *engineTotals) float64 { return n64(t.holes.HoleBlocks) }},
	{"prefix_recomputed_stored_tokens_total", "Stored tokens behind a missing block, recomputed anyway.", prometheus.CounterValue, func(t *engineTotals) float64 { return n64(t.holes.RecomputedStoredTokens) }},
	{"load_loads_total", "Load passes that moved pages, and asynchronous loads.", prometheus.CounterValue, func(t *engineTotals) float64 { return n64(t.loads.Loads) }},
	{"load_async_loads_total", "Asynchronous loads.", prometheus.CounterValue, func(t *engineTotals) float64 { return n64(t.loads.AsyncLoads) }},
	{"load_pages_total", "Pages asked of the pool by loads.", prometheus.CounterValue, func(t *engineTotals) float64 { return n64(t.loads.Pages) }},
	{"load_store_calls_total", "Pool get calls made by loads.", prometheus.CounterValue, func(t *engineTotals) float64 { return n64(t.loads.StoreCalls) }},
	{"load_bytes_total", "Bytes that loads landed in engine memory.", prometheus.CounterValue, func(t *engineTotals) float64 { return n64(t.loads.LandedBytes) }},
	{"load_failed_pages_total", "Pages the pool could not serve to a load.", prometheus.CounterValue, func(t *engineTotals) float64 { return n64(t.loads.FailedPages) }},
	{"load_transfer_seconds_total", "Seconds from the start to the end of loads.", prometheus.CounterValue, func(t *engineTotals) float64 { return t.loads.TransferSum.Seconds() }},
	{"load_wait_seconds_total", "Seconds asynchronous loads waited for a load worker.", prometheus.CounterValue, func(t *engineTotals) float64 { return t.loads.WaitSum.Seconds() }},
	{"load_gpu_copy_seconds_total", "Seconds the GPU spent copying pages that it checked, from each batch's first copy to its last (CUDA events).", prometheus.CounterValue, func(t *engineTotals) float64 { return t.loads.GPUCopySum.Seconds() }},
	{"load_gpu_check_seconds_total", "Seconds the GPU spent on page checks after the copies were done, until the digests were back on the host (CUDA events).", prometheus.CounterValue, func(t *engineTotals) float64 { return t.loads.GPUCheckSum.Seconds() }},
	{"load_queue", "Asynchronous loads waiting for a load worker.", prometheus.GaugeValue, func(t *engineTotals) float64 { return float64(t.queued) }},
	{"load_active", "Asynchronous loads being loaded.", prometheus.GaugeValue, func(t *engineTotals) float64 { return float64(t.active) }},
	{"save_saves_total", "Save jobs written (one per WaitForSave with saves bound).", prometheus.CounterValue, func(t *engineTotals) float64 { return n64(t.saves.Saves) }},
	{"save_failed_saves_total", "Save jobs that stopped on an error or lost at least one page.", prometheus.CounterValue, func(t *engineTotals) float64 { return n64(t.saves.FailedSaves) }},
	{"save_pages_total", "Pages handed to saves.", prometheus.CounterValue, func(t *engineTotals) float64 { return n64(t.saves.Pages) }},
	{"save_skipped_pages_total", "Pages saves skipped because the pool already held them.", prometheus.CounterValue, func(t *engineTotals) float64 { return n64(t.saves.SkippedPages) }},
	{"save_put_pages_total", "Pages saves handed to the pool that it accepted (stored, or found stored by a concurrent save).", prometheus.CounterValue, func(t *engineTotals) float64 { return n64(t.saves.PutPages) }},
	{"save_bytes_total", "Bytes of the pages counted by save_put_pages_total.", prometheus.CounterValue, func(t *engineTotals) float64 { return n64(t.saves.PutBytes) }},
	{"save_failed_pages_total", "Pages whose put failed (pool full, transfer error).", prometheus.CounterValue, func(t *engineTotals) float64 { return n64(t.saves.FailedPages) }},
	{"save_refused_pages_total", "Pages the pool refused as invalid (a soft-pin TTL above its limit).", prometheus.CounterValue, func(t *engineTotals) float64 { return n64(t.saves.RefusedPages) }},
	{"save_not_joined_saves_total", "Save jobs that saved nothing because this host had not joined the Mooncake cluster yet (segment not mounted); not failures: the pool was not asked.", prometheus.CounterValue, func(t *engineTotals) float64 { return n64(t.saves.NotJoinedSaves) }},
	{"save_not_joined_pages_total", "Pages not saved because this host had not joined the Mooncake cluster yet; another host may hold them.", prometheus.CounterValue, func(t *engineTotals) float64 { return n64(t.saves.NotJoinedPages) }},
}

func newDaemonMetrics(d *Daemon, retention time.Duration) *daemonMetrics {
	if retention <= 0 {
		retention = DefaultEngineSeriesRetention
	}
	m := &daemonMetrics{
		d: d, retention: retention, now: time.Now,
		lookupDur: prometheus.NewHistogram(latencyHistogramOpts("kvctl_lookup_duration_seconds", "Seconds a prefix Lookup or AdmissionQuery took, pool probe included.")),
		loadDur:   prometheus.NewHistogram(latencyHistogramOpts("kvctl_load_duration_seconds", "Seconds from the start to the end of a load pass or asynchronous load.")),
		saveDur:   prometheus.NewHistogram(latencyHistogramOpts("kvctl_save_duration_seconds", "Seconds a save job took from its fence passing to the pool's last answer.")),
		callDur:   prometheus.NewHistogramVec(latencyHistogramOpts("kvctl_engine_call_duration_seconds", "Seconds the daemon spent on an engine API call, by method."), []string{"method"}),
		live:      map[*engine]seriesKey{},
		series:    map[seriesKey]*series{},
		descs:     map[string]*prometheus.Desc{},
	}
	for _, def := range totalDefs {
		m.descs["kvctl_"+def.name] = prometheus.NewDesc("kvctl_"+def.name, def.help, nil, nil)
		m.descs["kvctl_rank_"+def.name] = prometheus.NewDesc("kvctl_rank_"+def.name, def.help+" Per engine rank.", []string{"model_key", "rank"}, nil)
	}
	m.descs["kvctl_load_phase_seconds_total"] = prometheus.NewDesc("kvctl_load_phase_seconds_total", "Wall seconds spent in each load phase.", []string{"phase"}, nil)
	m.descs["kvctl_load_phase_cpu_seconds_total"] = prometheus.NewDesc("kvctl_load_phase_cpu_seconds_total", "CPU seconds of the loading thread in each load phase, counted only while --stats-interval is set (synchronous and asynchronous loads alike).", []string{"phase"}, nil)
	m.descs["kvctl_rank_registered"] = prometheus.NewDesc("kvctl_rank_registered", "Engines registered with this model key and rank now (0 after the last one left, until the series expires).", []string{"model_key", "rank"}, nil)
	m.descs["kvctl_engines_registered"] = prometheus.NewDesc("kvctl_engines_registered", "Engine ranks registered now.", nil, nil)
	m.descs["kvctl_ready"] = prometheus.NewDesc("kvctl_ready", "1 while the daemon accepts engine calls, 0 while it starts or drains.", nil, nil)
	m.descs["kvctl_pool_capacity_bytes"] = prometheus.NewDesc("kvctl_pool_capacity_bytes", "Bytes this host's pool can hold: the embedded pool, or this host's segment of a Mooncake cluster (so a sum over hosts counts each byte once).", nil, nil)
	m.descs["kvctl_pool_used_bytes"] = prometheus.NewDesc("kvctl_pool_used_bytes", "Bytes this host's pool holds now: the embedded pool, or this host's segment of a Mooncake cluster.", nil, nil)
	m.descs["kvctl_pool_objects"] = prometheus.NewDesc("kvctl_pool_objects", "Objects (pages) the embedded pool holds now (a Mooncake cluster's are kvctl_cluster_objects).", nil, nil)
	m.descs["kvctl_pool_occupancy_ratio"] = prometheus.NewDesc("kvctl_pool_occupancy_ratio", "Used bytes over capacity of this host's pool (or segment), 0 to 1.", nil, nil)
	// Every host of a cluster exports the cluster's totals, labelled by master, so that a query
	// takes them once: max by (master) (...).
	m.descs["kvctl_cluster_capacity_bytes"] = prometheus.NewDesc("kvctl_cluster_capacity_bytes", "Bytes the Mooncake cluster can hold, all segments (each host reports it: take max by (master)).", []string{"master"}, nil)
	m.descs["kvctl_cluster_used_bytes"] = prometheus.NewDesc("kvctl_cluster_used_bytes", "Bytes the Mooncake cluster holds, all segments (each host reports it: take max by (master)).", []string{"master"}, nil)
	m.descs["kvctl_cluster_objects"] = prometheus.NewDesc("kvctl_cluster_objects", "Objects the Mooncake cluster holds (each host reports it: take max by (master)).", []string{"master"}, nil)
	m.descs["kvctl_pool_evicted_objects_total"] = prometheus.NewDesc("kvctl_pool_evicted_objects_total", "Objects the pool evicted to make room.", nil, nil)
	m.descs["kvctl_pool_put_failures_total"] = prometheus.NewDesc("kvctl_pool_put_failures_total", "Puts the pool failed (no room, bad input).", nil, nil)
	m.descs["kvctl_pool_lookup_keys_from_kept_total"] = prometheus.NewDesc("kvctl_pool_lookup_keys_from_kept_total", "Keys lookups answered from the replica lists an earlier lookup kept, without asking the Mooncake master (0 for the embedded pool).", nil, nil)
	m.descs["kvctl_pool_up"] = prometheus.NewDesc("kvctl_pool_up", "1 when this scrape read the pool's statistics, 0 when the pool did not answer (its other gauges are then left out).", nil, nil)
	return m
}

// register adds every collector of the daemon's /metrics to reg; pool is nil for a backend
// that keeps no master-named metrics.
func (m *daemonMetrics) register(reg *prometheus.Registry, pool mooncake.Inspector, version, commit string) {
	if pool != nil {
		// The master-named families, for a pool that keeps them (the embedded one); a Mooncake
		// cluster's master exports its own.
		reg.MustRegister(mooncake.NewMasterCollector(pool))
	}
	reg.MustRegister(
		m, m.lookupDur, m.loadDur, m.saveDur, m.callDur,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfo(version, commit),
	)
	m.registerLookupCounters(reg)
	for _, md := range enginepb.Engine_ServiceDesc.Methods {
		m.callDur.WithLabelValues(md.MethodName)
		m.d.calls.calls.WithLabelValues(md.MethodName)
		// kvctl_engine_call_errors_total exists at 0 from the start, as every family does, for
		// the codes the daemon itself answers with: Internal (an error it does not classify)
		// and Unavailable (draining, or the connector closed). Other codes appear when they
		// first happen.
		for _, c := range []codes.Code{codes.Internal, codes.Unavailable} {
			m.d.calls.errors.WithLabelValues(md.MethodName, c.String())
		}
	}
}

// buildInfo is kvctl_build_info: always 1, labelled with what was built. The revision is the
// commit the binary was linked with (kvctl version's), else the Go toolchain's VCS stamp.
func buildInfo(version, commit string) prometheus.Collector {
	revision := "unknown"
	if commit != "" {
		revision = commit
	} else if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				revision = s.Value
			}
		}
	}
	if version == "" {
		version = "dev"
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvctl_build_info", Help: "Always 1; its labels name the kvctl version, VCS revision and Go version that built the daemon.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "goversion": runtime.Version()},
	})
	g.Set(1)
	return g
}

// ObserveLoad implements stats.Observer.
func (m *daemonMetrics) ObserveLoad(d time.Duration, _ bool) { m.loadDur.Observe(d.Seconds()) }

// ObserveSave implements stats.Observer.
func (m *daemonMetrics) ObserveSave(d time.Duration, _ bool) { m.saveDur.Observe(d.Seconds()) }

// track starts counting e under its (model_key, rank) series. It must be called once the
// engine is registered, before its first call can be recorded.
func (m *daemonMetrics) track(e *engine) {
	k := seriesKey{e.modelKey, strconv.Itoa(e.rank)}
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.series[k]
	if s == nil {
		if len(m.series) >= MaxEngineSeries {
			k = seriesKey{OverflowLabel, OverflowLabel}
			s = m.series[k]
		}
		if s == nil {
			s = &series{}
			m.series[k] = s
		}
	}
	s.live++
	m.live[e] = k
}

// retire folds e's final counts into its series and the daemon's totals, so neither goes
// back when the engine leaves.
func (m *daemonMetrics) retire(e *engine) {
	t := totalsOf(e)
	t.queued, t.active = 0, 0
	m.mu.Lock()
	defer m.mu.Unlock()
	k, ok := m.live[e]
	if !ok {
		return
	}
	delete(m.live, e)
	m.retired.add(t)
	if s := m.series[k]; s != nil {
		s.retired.add(t)
		s.live--
		s.leftAt = m.now()
	}
}

type seriesSnapshot struct {
	key    seriesKey
	totals engineTotals
	live   int
}

// snapshot returns the daemon's totals and each exported series, dropping series whose last
// engine left longer than the retention ago.
func (m *daemonMetrics) snapshot() (engineTotals, []seriesSnapshot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	for k, s := range m.series {
		if s.live <= 0 && now.Sub(s.leftAt) > m.retention {
			delete(m.series, k)
		}
	}
	total := m.retired
	per := make(map[seriesKey]*seriesSnapshot, len(m.series))
	for k, s := range m.series {
		per[k] = &seriesSnapshot{key: k, totals: s.retired, live: s.live}
	}
	for e, k := range m.live {
		t := totalsOf(e)
		total.add(t)
		if p := per[k]; p != nil {
			p.totals.add(t)
		}
	}
	out := make([]seriesSnapshot, 0, len(per))
	for _, p := range per {
		out = append(out, *p)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].key.model != out[j].key.model {
			return out[i].key.model < out[j].key.model
		}
		return out[i].key.rank < out[j].key.rank
	})
	return total, out
}

// Describe implements prometheus.Collector.
func (m *daemonMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range m.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *daemonMetrics) Collect(ch chan<- prometheus.Metric) {
	total, per := m.snapshot()
	for _, def := range totalDefs {
		ch <- prometheus.MustNewConstMetric(m.descs["kvctl_"+def.name], def.kind, def.get(&total))
		for _, s := range per {
			ch <- prometheus.MustNewConstMetric(m.descs["kvctl_rank_"+def.name], def.kind, def.get(&s.totals), s.key.model, s.key.rank)
		}
	}
	for _, s := range per {
		ch <- prometheus.MustNewConstMetric(m.descs["kvctl_rank_registered"], prometheus.GaugeValue, float64(s.live), s.key.model, s.key.rank)
	}
	for p := stats.Phase(0); p < stats.NumPhases; p++ {
		ch <- prometheus.MustNewConstMetric(m.descs["kvctl_load_phase_seconds_total"], prometheus.CounterValue, total.loads.Phases[p].Wall.Seconds(), p.String())
		ch <- prometheus.MustNewConstMetric(m.descs["kvctl_load_phase_cpu_seconds_total"], prometheus.CounterValue, max(0, total.loads.Phases[p].CPU.Seconds()), p.String())
	}
	ch <- prometheus.MustNewConstMetric(m.descs["kvctl_engines_registered"], prometheus.GaugeValue, float64(m.d.engineCount()))
	ready := 0.0
	if m.d.ready.Load() {
		ready = 1
	}
	ch <- prometheus.MustNewConstMetric(m.descs["kvctl_ready"], prometheus.GaugeValue, ready)

	ctx, cancel := context.WithTimeout(context.Background(), mooncake.MasterCollectorTimeout)
	defer cancel()
	m.poolMetrics(ctx, ch)
}

func (m *daemonMetrics) poolMetrics(ctx context.Context, ch chan<- prometheus.Metric) {
	// This host's own count, kept whether or not the pool answers a scrape.
	var kept int64
	if k, ok := m.d.backend.Pool.(interface{ KeptAnswers() int64 }); ok {
		kept = k.KeptAnswers()
	}
	ch <- prometheus.MustNewConstMetric(m.descs["kvctl_pool_lookup_keys_from_kept_total"], prometheus.CounterValue, float64(kept))
	st, err := m.d.pool.Stats(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(m.descs["kvctl_pool_up"], prometheus.GaugeValue, 0)
		return
	}
	capacity, used := st.CapacityBytes, st.UsedBytes
	if m.d.backendIsRemote() {
		// A cluster's Stats are the cluster's: this host's gauges are its own segment's, and
		// the cluster's totals go out once more under the master's label.
		segs, err := m.d.pool.Segments(ctx)
		if err != nil {
			ch <- prometheus.MustNewConstMetric(m.descs["kvctl_pool_up"], prometheus.GaugeValue, 0)
			return
		}
		capacity, used = 0, 0
		name := m.d.segmentName()
		for _, s := range segs {
			if s.Name == name {
				capacity, used = s.Capacity, s.Used
			}
		}
		master := m.d.backend.Info.Master
		ch <- prometheus.MustNewConstMetric(m.descs["kvctl_cluster_capacity_bytes"], prometheus.GaugeValue, float64(st.CapacityBytes), master)
		ch <- prometheus.MustNewConstMetric(m.descs["kvctl_cluster_used_bytes"], prometheus.GaugeValue, float64(st.UsedBytes), master)
		ch <- prometheus.MustNewConstMetric(m.descs["kvctl_cluster_objects"], prometheus.GaugeValue, float64(st.Objects), master)
	} else {
		ch <- prometheus.MustNewConstMetric(m.descs["kvctl_pool_objects"], prometheus.GaugeValue, float64(st.Objects))
	}
	ch <- prometheus.MustNewConstMetric(m.descs["kvctl_pool_up"], prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(m.descs["kvctl_pool_capacity_bytes"], prometheus.GaugeValue, float64(capacity))
	ch <- prometheus.MustNewConstMetric(m.descs["kvctl_pool_used_bytes"], prometheus.GaugeValue, float64(used))
	occ := 0.0
	if capacity > 0 {
		occ = float64(used) / float64(capacity)
	}
	ch <- prometheus.MustNewConstMetric(m.descs["kvctl_pool_occupancy_ratio"], prometheus.GaugeValue, occ)
	ch <- prometheus.MustNewConstMetric(m.descs["kvctl_pool_evicted_objects_total"], prometheus.CounterValue, float64(st.Evicted))
	ch <- prometheus.MustNewConstMetric(m.descs["kvctl_pool_put_failures_total"], prometheus.CounterValue, float64(st.PutFailures))
}

// metricsHandler serves the registry with content negotiation: Prometheus text, OpenMetrics
// text, or protobuf (with native histograms) as the scraper asks, gzipped when it accepts gzip.
func (d *Daemon) metricsHandler() http.Handler {
	return promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{
		EnableOpenMetrics: true,
		ErrorHandling:     promhttp.ContinueOnError,
		Timeout:           20 * time.Second, // under the listeners' 30 s write timeout
	})
}

// lookupCounters count the prompt tokens of Lookup calls by where they came from.
type lookupCounters struct {
	lookups, prompt, local, pool atomic.Int64
}

// countLookup records one Lookup: a prompt of prompt tokens, local of them computed by the
// engine already, pool more matched in the pool.
func (m *daemonMetrics) countLookup(prompt, local, pool int) {
	local = min(max(local, 0), prompt)
	pool = min(max(pool, 0), prompt-local)
	m.lookups.lookups.Add(1)
	m.lookups.prompt.Add(int64(prompt))
	m.lookups.local.Add(int64(local))
	m.lookups.pool.Add(int64(pool))
}

func (m *daemonMetrics) hitRates() statsapi.HitRatesJSON {
	h := statsapi.HitRatesJSON{Lookups: m.lookups.lookups.Load(), PromptTokens: m.lookups.prompt.Load(), LocalTokens: m.lookups.local.Load(), PoolTokens: m.lookups.pool.Load()}
	if h.PromptTokens > 0 {
		p := float64(h.PromptTokens)
		h.Local, h.Pool = float64(h.LocalTokens)/p, float64(h.PoolTokens)/p
		h.Total = float64(h.LocalTokens+h.PoolTokens) / p
	}
	return h
}

// fillStats adds what only the metrics code keeps to a /v1/stats answer.
func (m *daemonMetrics) fillStats(s *statsapi.StatsJSON) {
	s.HitRates = m.hitRates()
	total, _ := m.snapshot()
	t := total.saves
	s.Saves = statsapi.SaveStatsJSON{Saves: t.Saves, FailedSaves: t.FailedSaves, Pages: t.Pages, SkippedPages: t.SkippedPages,
		PutPages: t.PutPages, PutBytes: t.PutBytes, FailedPages: t.FailedPages, RefusedPages: t.RefusedPages, Seconds: t.Duration.Seconds(),
		NotJoinedSaves: t.NotJoinedSaves, NotJoinedPages: t.NotJoinedPages}
}

func (m *daemonMetrics) registerLookupCounters(reg *prometheus.Registry) {
	counter := func(name, help string, v *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v.Load()) })
	}
	reg.MustRegister(
		counter("kvctl_lookup_calls_total", "Lookup calls answered (AdmissionQuery not counted).", &m.lookups.lookups),
		counter("kvctl_lookup_prompt_tokens_total", "Prompt tokens of Lookup calls.", &m.lookups.prompt),
		counter("kvctl_lookup_local_tokens_total", "Prompt tokens of Lookup calls the engine had computed already (its own cache).", &m.lookups.local),
		counter("kvctl_lookup_pool_tokens_total", "Prompt tokens of Lookup calls matched in the pool.", &m.lookups.pool),
	)
}
