package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/kvctl/kvctl/core/stats"
	"github.com/kvctl/kvctl/mooncake"
)

// AdminHandler serves the admin HTTP API: the status page at /, the Mooncake master's read
// endpoints over the pool, /metrics with the pool's master-named series and kvctl's kvctl_*
// series, /v1/stats, /healthz and /readyz.
func (d *Daemon) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", d.metricsHandler())
	mux.HandleFunc("GET /v1/stats", d.serveStats)
	mux.HandleFunc("GET /healthz", d.serveHealthz)
	mux.HandleFunc("GET /readyz", d.serveReadyz)
	mux.HandleFunc("GET /{$}", d.serveStatus)
	// The master's read endpoints are served for a pool that can answer them (the embedded
	// one); a Mooncake cluster's master serves its own.
	if insp, ok := d.backend.Pool.(mooncake.Inspector); ok {
		master := mooncake.NewAdminHandler(insp, mooncake.DefaultAdminHandlerOptions())
		mux.Handle("/query_key", d.guardQueryKey(master))
		mux.Handle("/", master)
	} else {
		mux.HandleFunc("/", d.askTheMaster)
	}
	return mux
}

// askTheMaster answers the master's read endpoints on a serve whose pool is a Mooncake
// cluster: the master's own admin server has them.
func (d *Daemon) askTheMaster(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusNotFound)
	_, _ = fmt.Fprintf(w, "%s: this kvctl serve's pool is the Mooncake cluster of master %s; its admin server (mooncake_master --metrics_port, 9003 by default) answers the pool's endpoints; this one serves the status page (/), /v1/stats, /metrics, /healthz and /readyz\n",
		r.URL.Path, d.backend.Info.Master)
}

// HoleStatsJSON is the prefix-hole stats part of /v1/stats.
type HoleStatsJSON struct {
	Lookups                int64 `json:"lookups"`
	LookedUpBlocks         int64 `json:"looked_up_blocks"`
	HitBlocks              int64 `json:"hit_blocks"`
	Holes                  int64 `json:"holes"`
	HoleBlocks             int64 `json:"hole_blocks"`
	RecomputedStoredTokens int64 `json:"recomputed_stored_tokens"`
}

// PhaseJSON is one load phase's time. CPUSeconds is the loading thread's CPU time; synchronous
// loads count it only while serve runs with --stats-interval (reading a thread's CPU clock pins
// the load to its OS thread, which slows loads that wait on a remote pool).
type PhaseJSON struct {
	WallSeconds float64 `json:"wall_seconds"`
	CPUSeconds  float64 `json:"cpu_seconds"`
}

// LoadStatsJSON is the load-phase stats part of /v1/stats.
type LoadStatsJSON struct {
	Loads           int64                `json:"loads"`
	AsyncLoads      int64                `json:"async_loads"`
	Pages           int64                `json:"pages"`
	StoreCalls      int64                `json:"store_calls"`
	LandedBytes     int64                `json:"landed_bytes"`
	FailedPages     int64                `json:"failed_pages"`
	TransferSeconds float64              `json:"transfer_seconds"`
	TransferMaxSecs float64              `json:"transfer_max_seconds"`
	WaitSeconds     float64              `json:"wait_seconds"`
	WaitMaxSeconds  float64              `json:"wait_max_seconds"`
	Phases          map[string]PhaseJSON `json:"phases"`
}

// EngineJSON describes one registered engine rank in /v1/stats.
type EngineJSON struct {
	Engine       string        `json:"engine"`
	ModelKey     string        `json:"model_key"`
	Rank         int           `json:"rank"`
	Shard        string        `json:"shard"`
	Role         string        `json:"role"`
	Scheduler    bool          `json:"scheduler"`
	RegisteredAt time.Time     `json:"registered_at"`
	PrefixHoles  HoleStatsJSON `json:"prefix_holes"`
	Loads        LoadStatsJSON `json:"loads"`
}

// StatsJSON is the body of GET /v1/stats. Field names are a compatibility contract.
type StatsJSON struct {
	Version       string         `json:"version"`
	UptimeSeconds float64        `json:"uptime_seconds"`
	Ready         bool           `json:"ready"`
	Pool          mooncake.Stats `json:"pool"`
	// Backend names the pool backend, its master, this host's segment and the cluster's
	// capacity, and says why the daemon is not ready when it is not.
	Backend     BackendStatusJSON `json:"backend"`
	PrefixHoles HoleStatsJSON     `json:"prefix_holes"`
	Loads       LoadStatsJSON     `json:"loads"`
	Engines     []EngineJSON      `json:"engines"`
	// HitRates and Saves are added by the metrics code (metrics.go).
	HitRates HitRatesJSON  `json:"hit_rates"`
	Saves    SaveStatsJSON `json:"saves"`
}

func holesJSON(h stats.HoleStats) HoleStatsJSON {
	return HoleStatsJSON{h.Lookups, h.LookedUpBlocks, h.HitBlocks, h.Holes, h.HoleBlocks, h.RecomputedStoredTokens}
}

func loadsJSON(t stats.LoadTotals) LoadStatsJSON {
	out := LoadStatsJSON{
		Loads: t.Loads, AsyncLoads: t.AsyncLoads, Pages: t.Pages, StoreCalls: t.StoreCalls,
		LandedBytes: t.LandedBytes, FailedPages: t.FailedPages,
		TransferSeconds: t.TransferSum.Seconds(), TransferMaxSecs: t.TransferMax.Seconds(),
		WaitSeconds: t.WaitSum.Seconds(), WaitMaxSeconds: t.WaitMax.Seconds(),
		Phases: map[string]PhaseJSON{},
	}
	for p := stats.Phase(0); p < stats.NumPhases; p++ {
		out.Phases[p.String()] = PhaseJSON{WallSeconds: t.Phases[p].Wall.Seconds(), CPUSeconds: t.Phases[p].CPU.Seconds()}
	}
	return out
}

// Stats returns what GET /v1/stats serves.
func (d *Daemon) Stats(ctx context.Context) (StatsJSON, error) {
	bs := d.BackendStatus(ctx)
	var ps mooncake.Stats
	if bs.MasterReachable {
		sctx, cancel := context.WithTimeout(ctx, d.cfg.PoolTimeout)
		var err error
		ps, err = d.pool.Stats(sctx)
		cancel()
		if err != nil && !d.backendIsRemote() {
			return StatsJSON{}, err
		}
	}
	out := StatsJSON{Version: d.cfg.Version, UptimeSeconds: time.Since(d.start).Seconds(), Ready: d.ready.Load(), Pool: ps, Backend: bs, Engines: []EngineJSON{}}
	d.mu.RLock()
	holes, loads := d.retiredHoles, d.retiredLoads
	for _, e := range d.engines {
		h, l := e.reporter.HoleTotals(), e.reporter.LoadTotals()
		holes.Add(h)
		loads.Merge(l)
		out.Engines = append(out.Engines, EngineJSON{
			Engine: e.name, ModelKey: e.modelKey, Rank: e.rank, Shard: e.shard, Role: string(e.role),
			Scheduler: e.scheduler != nil, RegisteredAt: e.since.UTC(),
			PrefixHoles: holesJSON(h), Loads: loadsJSON(l),
		})
	}
	d.mu.RUnlock()
	sort.Slice(out.Engines, func(i, j int) bool { return out.Engines[i].Engine < out.Engines[j].Engine })
	out.PrefixHoles, out.Loads = holesJSON(holes), loadsJSON(loads)
	d.met.fillStats(&out)
	return out, nil
}

func (d *Daemon) serveStats(w http.ResponseWriter, r *http.Request) {
	s, err := d.Stats(r.Context())
	if err != nil {
		http.Error(w, "stats: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(s)
}
