package stats

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ReporterOptions configures a Reporter.
type ReporterOptions struct {
	// Interval is the least time between two log lines of one kind. 0 logs nothing (metrics
	// are still kept when Registerer is set).
	Interval time.Duration
	// Logger receives the "prefix-hole stats" and "load stats" lines at info level; nil uses
	// slog.Default().
	Logger *slog.Logger
	// Now is the clock that paces the log lines; nil uses time.Now.
	Now func() time.Time
	// Registerer, when set, gets the reporter's Prometheus collectors. One daemon serves many
	// engines and ranks, so each reporter registers under ConstLabels that tell it apart.
	Registerer  prometheus.Registerer
	ConstLabels prometheus.Labels
	// Observer, when set, gets the duration of every recorded load and save.
	Observer Observer
}

// Reporter keeps a connector's prefix-hole and load-phase stats, logs each kind at most once
// per interval and exports both as Prometheus metrics. It is safe for concurrent use. A nil
// *Reporter accepts every call and does nothing.
type Reporter struct {
	interval time.Duration
	log      *slog.Logger
	now      func() time.Time

	mu           sync.Mutex
	holes        HoleStats // since the last line
	holesTotal   HoleStats
	lastHoleLine time.Time
	lastLoadLine time.Time

	loads LoadStats
	saves saveStats
	obs   Observer

	reg       prometheus.Registerer
	collected []prometheus.Collector
	m         metrics
}

type metrics struct {
	lookups, lookedUp, hitBlocks, holes, holeBlocks, recomputed prometheus.Counter
	loads, pages, storeCalls, bytes, failedPages                prometheus.Counter
	transferSeconds, waitSeconds                                prometheus.Counter
	phaseWall, phaseCPU                                         *prometheus.CounterVec
	queued, active                                              prometheus.Gauge
}

// NewReporter returns a reporter and registers its collectors when o.Registerer is set.
func NewReporter(o ReporterOptions) (*Reporter, error) {
	if o.Interval < 0 {
		return nil, fmt.Errorf("stats interval %v: must not be negative", o.Interval)
	}
	r := &Reporter{interval: o.Interval, log: o.Logger, now: o.Now, reg: o.Registerer, obs: o.Observer}
	if r.log == nil {
		r.log = slog.Default()
	}
	if r.now == nil {
		r.now = time.Now
	}
	r.lastHoleLine = r.now()
	r.lastLoadLine = r.lastHoleLine

	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: o.ConstLabels})
		r.collected = append(r.collected, c)
		return c
	}
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: o.ConstLabels})
		r.collected = append(r.collected, g)
		return g
	}
	phases := func(name, help string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: o.ConstLabels}, []string{"phase"})
		for p := Phase(0); p < NumPhases; p++ {
			v.WithLabelValues(p.String()) // export every phase from the start, at 0
		}
		r.collected = append(r.collected, v)
		return v
	}
	r.m = metrics{
		lookups:         counter("kvctl_prefix_lookups_total", "Prefix lookups that had at least one candidate block."),
		lookedUp:        counter("kvctl_prefix_looked_up_blocks_total", "Candidate blocks asked of the pool by prefix lookups."),
		hitBlocks:       counter("kvctl_prefix_hit_blocks_total", "Blocks served by prefix hits (leading complete blocks)."),
		holes:           counter("kvctl_prefix_holes_total", "Runs of missing blocks with a stored block behind them."),
		holeBlocks:      counter("kvctl_prefix_hole_blocks_total", "Missing blocks inside holes."),
		recomputed:      counter("kvctl_prefix_recomputed_stored_tokens_total", "Stored tokens behind a missing block, recomputed anyway."),
		loads:           counter("kvctl_load_loads_total", "Load passes that moved pages and asynchronous loads."),
		pages:           counter("kvctl_load_pages_total", "Pages asked of the pool by loads."),
		storeCalls:      counter("kvctl_load_store_calls_total", "Pool get calls made by loads."),
		bytes:           counter("kvctl_load_bytes_total", "Bytes that loads landed in engine memory."),
		failedPages:     counter("kvctl_load_failed_pages_total", "Pages the pool could not serve to a load."),
		transferSeconds: counter("kvctl_load_transfer_seconds_total", "Seconds from the start to the end of loads."),
		waitSeconds:     counter("kvctl_load_wait_seconds_total", "Seconds asynchronous loads waited for a load worker."),
		phaseWall:       phases("kvctl_load_phase_seconds_total", "Wall seconds spent in each load phase."),
		phaseCPU:        phases("kvctl_load_phase_cpu_seconds_total", "CPU seconds of the loading thread in each load phase, counted only while the stats line is on (stats_interval)."),
		queued:          gauge("kvctl_load_queue", "Asynchronous loads waiting for a load worker."),
		active:          gauge("kvctl_load_active", "Asynchronous loads being loaded."),
	}
	if r.reg != nil {
		var errs []error
		for i, c := range r.collected {
			if err := r.reg.Register(c); err != nil {
				for _, done := range r.collected[:i] {
					r.reg.Unregister(done)
				}
				errs = append(errs, err)
				break
			}
		}
		if err := errors.Join(errs...); err != nil {
			return nil, fmt.Errorf("register stats metrics: %w", err)
		}
	}
	return r, nil
}

// Enabled reports whether the reporter records anything (it is not nil).
func (r *Reporter) Enabled() bool { return r != nil }

// RecordLookup folds one lookup's hole stats in.
func (r *Reporter) RecordLookup(h HoleStats) {
	if r == nil || h.IsZero() {
		return
	}
	r.mu.Lock()
	r.holes.Add(h)
	r.holesTotal.Add(h)
	r.mu.Unlock()
	r.m.lookups.Add(float64(h.Lookups))
	r.m.lookedUp.Add(float64(h.LookedUpBlocks))
	r.m.hitBlocks.Add(float64(h.HitBlocks))
	r.m.holes.Add(float64(h.Holes))
	r.m.holeBlocks.Add(float64(h.HoleBlocks))
	r.m.recomputed.Add(float64(h.RecomputedStoredTokens))
}

// RecordLoad folds one load sample in. A nil sample is ignored.
func (r *Reporter) RecordLoad(s *LoadSample) {
	if r == nil || s == nil {
		return
	}
	r.loads.Record(s)
	if r.obs != nil {
		r.obs.ObserveLoad(s.Transfer, s.FailedPages > 0)
	}
	r.m.loads.Inc()
	r.m.pages.Add(float64(s.Pages))
	r.m.storeCalls.Add(float64(s.StoreCalls))
	r.m.bytes.Add(float64(s.LandedBytes))
	r.m.failedPages.Add(float64(s.FailedPages))
	r.m.transferSeconds.Add(s.Transfer.Seconds())
	if s.Async {
		r.m.waitSeconds.Add(s.Wait.Seconds())
	}
	for p := Phase(0); p < NumPhases; p++ {
		r.m.phaseWall.WithLabelValues(p.String()).Add(s.Phases[p].Wall.Seconds())
		r.m.phaseCPU.WithLabelValues(p.String()).Add(max(0, s.Phases[p].CPU.Seconds()))
	}
}

// SetLoadQueue records the asynchronous loads queued and in progress.
func (r *Reporter) SetLoadQueue(queued, active int) {
	if r == nil {
		return
	}
	r.loads.SetQueue(queued, active)
	r.m.queued.Set(float64(queued))
	r.m.active.Set(float64(active))
}

// HoleTotals returns the hole stats recorded since the reporter was made.
func (r *Reporter) HoleTotals() HoleStats {
	if r == nil {
		return HoleStats{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.holesTotal
}

// LoadTotals returns the load stats recorded since the reporter was made.
func (r *Reporter) LoadTotals() LoadTotals {
	if r == nil {
		return LoadTotals{}
	}
	return r.loads.Totals()
}

// TickHoles logs a "prefix-hole stats" line if the interval has passed since the previous one
// and a lookup was recorded since.
func (r *Reporter) TickHoles() {
	if r == nil || r.interval <= 0 {
		return
	}
	r.mu.Lock()
	now := r.now()
	if now.Sub(r.lastHoleLine) < r.interval || r.holes.IsZero() {
		r.mu.Unlock()
		return
	}
	h := r.holes
	r.holes = HoleStats{}
	r.lastHoleLine = now
	r.mu.Unlock()
	r.logHoles(h)
}

// TickLoads logs a "load stats" line if the interval has passed since the previous one and a
// load was recorded since.
func (r *Reporter) TickLoads() {
	if r == nil || r.interval <= 0 {
		return
	}
	r.mu.Lock()
	now := r.now()
	if now.Sub(r.lastLoadLine) < r.interval {
		r.mu.Unlock()
		return
	}
	t, queued, active := r.loads.Drain()
	if t.Loads == 0 {
		r.mu.Unlock()
		return
	}
	r.lastLoadLine = now
	r.mu.Unlock()
	r.logLoads(t, queued, active)
}

// Flush logs whatever was recorded since the previous lines, regardless of the interval. A
// connector calls it when it shuts down.
func (r *Reporter) Flush() {
	if r == nil || r.interval <= 0 {
		return
	}
	r.mu.Lock()
	h := r.holes
	r.holes = HoleStats{}
	t, queued, active := r.loads.Drain()
	now := r.now()
	r.lastHoleLine, r.lastLoadLine = now, now
	r.mu.Unlock()
	if !h.IsZero() {
		r.logHoles(h)
	}
	if t.Loads > 0 {
		r.logLoads(t, queued, active)
	}
}

// Unregister removes the reporter's collectors from the registerer it was given.
func (r *Reporter) Unregister() {
	if r == nil || r.reg == nil {
		return
	}
	for _, c := range r.collected {
		r.reg.Unregister(c)
	}
}

func (r *Reporter) logHoles(h HoleStats) {
	r.log.Info("prefix-hole stats",
		"lookups", h.Lookups,
		"looked_up_blocks", h.LookedUpBlocks,
		"hit_blocks", h.HitBlocks,
		"holes", h.Holes,
		"hole_blocks", h.HoleBlocks,
		"recomputed_stored_tokens", h.RecomputedStoredTokens,
	)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func (r *Reporter) logLoads(t LoadTotals, queued, active int) {
	attrs := []any{
		"loads", t.Loads,
		"pages", t.Pages,
		"store_calls", t.StoreCalls,
		"landed_bytes", t.LandedBytes,
		"failed_pages", t.FailedPages,
		"transfer_ms_mean", ms(t.TransferSum / time.Duration(max(1, t.Loads))),
		"transfer_ms_max", ms(t.TransferMax),
	}
	for p := Phase(0); p < NumPhases; p++ {
		attrs = append(attrs, p.String()+"_wall_ms", ms(t.Phases[p].Wall), p.String()+"_cpu_ms", ms(t.Phases[p].CPU))
	}
	if t.GPUCopySum > 0 || t.GPUCheckSum > 0 {
		attrs = append(attrs, "gpu_copy_ms", ms(t.GPUCopySum), "gpu_check_ms", ms(t.GPUCheckSum))
	}
	if t.AsyncLoads > 0 || queued > 0 || active > 0 {
		attrs = append(attrs,
			"async_loads", t.AsyncLoads,
			"wait_ms_mean", ms(t.WaitSum/time.Duration(max(1, t.AsyncLoads))),
			"wait_ms_max", ms(t.WaitMax),
			"queue", queued,
			"active", active,
		)
	}
	r.log.Info("load stats", attrs...)
}
