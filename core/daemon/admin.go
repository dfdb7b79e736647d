package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/kvctl/kvctl/core/stats"
	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/pool"
)

// AdminHandler serves the admin HTTP API: the status page at /, the Mooncake master's read
// endpoints over the pool, /metrics with the pool's master-named series and kvctl's kvctl_*
// series, /v1/stats, /healthz and /readyz, and Go's runtime profiles under /debug/pprof/ with
// Config.AdminPprof (pprof.go).
func (d *Daemon) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", d.metricsHandler())
	mux.HandleFunc("GET /v1/stats", d.serveStats)
	mux.HandleFunc("GET /healthz", d.serveHealthz)
	mux.HandleFunc("GET /readyz", d.serveReadyz)
	mux.HandleFunc("GET /{$}", d.serveStatus)
	mux.Handle(pprofPrefix, d.pprofHandler())
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

func loadsJSON(t stats.LoadTotals) statsapi.LoadStatsJSON {
	out := statsapi.LoadStatsJSON{
		Loads: t.Loads, AsyncLoads: t.AsyncLoads, Pages: t.Pages, StoreCalls: t.StoreCalls,
		LandedBytes: t.LandedBytes, FailedPages: t.FailedPages,
		TransferSeconds: t.TransferSum.Seconds(), TransferMaxSecs: t.TransferMax.Seconds(),
		WaitSeconds: t.WaitSum.Seconds(), WaitMaxSeconds: t.WaitMax.Seconds(),
		Phases:         map[string]statsapi.PhaseJSON{},
		GPUCopySeconds: t.GPUCopySum.Seconds(), GPUCheckSeconds: t.GPUCheckSum.Seconds(),
	}
	for p := stats.Phase(0); p < stats.NumPhases; p++ {
		out.Phases[p.String()] = statsapi.PhaseJSON{WallSeconds: t.Phases[p].Wall.Seconds(), CPUSeconds: t.Phases[p].CPU.Seconds()}
	}
	return out
}

// Stats returns what GET /v1/stats serves.
func (d *Daemon) Stats(ctx context.Context) (statsapi.StatsJSON, error) {
	bs := d.BackendStatus(ctx)
	var ps pool.Stats
	if bs.MasterReachable {
		sctx, cancel := context.WithTimeout(ctx, d.cfg.PoolTimeout)
		var err error
		ps, err = d.pool.Stats(sctx)
		cancel()
		if err != nil && !d.backendIsRemote() {
			return statsapi.StatsJSON{}, err
		}
	}
	out := statsapi.StatsJSON{Version: d.cfg.Version, UptimeSeconds: time.Since(d.start).Seconds(), Ready: d.ready.Load(), Pool: poolStatsJSON(ps), Backend: bs, Engines: []statsapi.EngineJSON{}}
	d.mu.RLock()
	holes, loads := d.retiredHoles, d.retiredLoads
	for _, e := range d.engines {
		h, l := e.reporter.HoleTotals(), e.reporter.LoadTotals()
		holes.Add(h)
		loads.Merge(l)
		out.Engines = append(out.Engines, statsapi.EngineJSON{
			Engine: e.name, ModelKey: e.modelKey, Rank: e.rank, Shard: e.shard, Role: string(e.role),
			Scheduler: e.scheduler != nil, RegisteredAt: e.since.UTC(),
			PrefixHoles: h, Loads: loadsJSON(l),
		})
	}
	d.mu.RUnlock()
	sort.Slice(out.Engines, func(i, j int) bool { return out.Engines[i].Engine < out.Engines[j].Engine })
	out.PrefixHoles, out.Loads = holes, loadsJSON(loads)
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

// poolStatsJSON is /v1/stats's pool object: the figures every backend reports, and the
// backend's own (pool.Stats.Detail) under the JSON names they carry there. A name the wire
// type does not have is dropped; the backend registry's test pins that every backend's names
// are the wire type's.
func poolStatsJSON(ps pool.Stats) statsapi.PoolStats {
	out := statsapi.PoolStats{
		CapacityBytes: ps.CapacityBytes, UsedBytes: ps.UsedBytes, Objects: ps.Objects,
		Hits: ps.Hits, Misses: ps.Misses, Puts: ps.Puts, SkippedExisting: ps.SkippedExisting,
		PutFailures: ps.PutFailures, BytesIn: ps.BytesIn, BytesOut: ps.BytesOut,
		ChecksumErrors: ps.ChecksumErrors, AllocFailures: ps.AllocFailures,
	}
	if len(ps.Detail) > 0 {
		out.SetDetail(ps.Detail)
	}
	return out
}
