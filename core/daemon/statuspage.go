package daemon

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvctl/kvctl/core/config"
	"github.com/kvctl/kvctl/core/stats"
	"github.com/kvctl/kvctl/core/statsapi"
)

// Status page history: one sample every HistoryInterval, HistorySamples of them (15 minutes).
const (
	HistoryInterval = 5 * time.Second
	HistorySamples  = 180
)

// StatusRefreshSeconds is how often the status page reloads itself.
const StatusRefreshSeconds = 5

// sample is the pool and hit figures at one moment.
type sample struct {
	at                          time.Time
	used, capacity              int64
	prompt, local, pool, lookup int64
}

// history is a ring of samples, safe for concurrent use.
type history struct {
	mu      sync.Mutex
	samples []sample
}

func (h *history) add(s sample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.samples = append(h.samples, s)
	if len(h.samples) > HistorySamples {
		h.samples = h.samples[len(h.samples)-HistorySamples:]
	}
}

func (h *history) all() []sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]sample(nil), h.samples...)
}

// sampleNow reads the figures the history keeps.
func (m *daemonMetrics) sampleNow(ctx context.Context) (sample, bool) {
	st, err := m.d.pool.Stats(ctx)
	if err != nil {
		return sample{}, false
	}
	return sample{at: m.now(), used: st.UsedBytes, capacity: st.CapacityBytes,
		prompt: m.lookups.prompt.Load(), local: m.lookups.local.Load(), pool: m.lookups.pool.Load(), lookup: m.lookups.lookups.Load()}, true
}

// runHistory samples every HistoryInterval until ctx is done.
func (m *daemonMetrics) runHistory(ctx context.Context) {
	t := time.NewTicker(HistoryInterval)
	defer t.Stop()
	for {
		sctx, cancel := context.WithTimeout(ctx, HistoryInterval)
		if s, ok := m.sampleNow(sctx); ok {
			m.history.add(s)
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// statusPage is what the template renders.
type statusPage struct {
	Refresh     int
	Version     string
	Uptime      string
	Backend     string
	Ready       bool
	PoolHealthy bool
	PoolError   string
	// PoolKnown is false when the pool's own figures (occupancy, objects, evictions) could not
	// be read: they show as unknown, never as 0. The daemon's own counters are always shown.
	PoolKnown   bool
	Stats       statsapi.StatsJSON
	UsedPct     float64
	Evicted     int64
	Chart       template.HTML
	ChartSpan   string
	Recent      *statsapi.HitRatesJSON // over the history window, when it has two samples
	Phases      []phaseRow
	Engines     []statsapi.EngineJSON
	GeneratedAt string
}

type phaseRow struct {
	Name      string
	Wall, CPU float64
	Share     float64 // of all phases' wall time, 0-100
}

// backendName names the pool backend the status page shows, with its master for a cluster.
func (d *Daemon) backendName() string {
	if d.backend.Info.Master != "" {
		return d.backend.Info.Kind + " (master " + d.backend.Info.Master + ")"
	}
	return d.backend.Info.Kind
}

func (d *Daemon) serveStatus(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	page := statusPage{Refresh: StatusRefreshSeconds, Version: d.cfg.Version, Backend: d.backendName(), Ready: d.ready.Load(),
		GeneratedAt: time.Now().UTC().Format(time.RFC3339)}
	if page.Version == "" {
		page.Version = "dev"
	}
	page.Uptime = time.Since(d.start).Truncate(time.Second).String()
	st, err := d.Stats(ctx)
	if _, reachable, reason, _ := d.bstate.get(); err == nil && d.backendIsRemote() && !reachable {
		err = errors.New(reason)
	}
	if err != nil {
		page.PoolError = err.Error()
	}
	page.PoolHealthy = err == nil
	page.PoolKnown = err == nil || st.Pool.CapacityBytes > 0
	page.Stats = st
	page.Engines = st.Engines
	if page.PoolKnown {
		if st.Pool.CapacityBytes > 0 {
			page.UsedPct = 100 * float64(st.Pool.UsedBytes) / float64(st.Pool.CapacityBytes)
		}
		page.Evicted = st.Pool.EvictedPass1 + st.Pool.EvictedPass2
	}
	var wall float64
	for _, p := range st.Loads.Phases {
		wall += p.WallSeconds
	}
	for p := stats.Phase(0); p < stats.NumPhases; p++ {
		ph := st.Loads.Phases[p.String()]
		row := phaseRow{Name: p.String(), Wall: ph.WallSeconds, CPU: ph.CPUSeconds}
		if wall > 0 {
			row.Share = 100 * ph.WallSeconds / wall
		}
		page.Phases = append(page.Phases, row)
	}
	samples := d.met.history.all()
	if now, ok := d.met.sampleNow(ctx); ok {
		samples = append(samples, now)
	}
	page.Chart, page.ChartSpan = occupancyChart(samples)
	if len(samples) >= 2 {
		a, b := samples[0], samples[len(samples)-1]
		h := statsapi.HitRatesJSON{Lookups: b.lookup - a.lookup, PromptTokens: b.prompt - a.prompt, LocalTokens: b.local - a.local, PoolTokens: b.pool - a.pool}
		if h.PromptTokens > 0 {
			p := float64(h.PromptTokens)
			h.Local, h.Pool, h.Total = float64(h.LocalTokens)/p, float64(h.PoolTokens)/p, float64(h.LocalTokens+h.PoolTokens)/p
			page.Recent = &h
		}
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := statusTemplate.Execute(w, page); err != nil {
		d.log.Warn("status page", "err", err)
	}
}

// occupancyChart draws pool occupancy over the samples as an inline SVG (no script): a filled
// line from 0 to 100 %, time left to right.
func occupancyChart(samples []sample) (template.HTML, string) {
	const w, h = 600.0, 120.0
	if len(samples) == 0 {
		return "", ""
	}
	t0, t1 := samples[0].at, samples[len(samples)-1].at
	span := t1.Sub(t0)
	var pts []string
	for i, s := range samples {
		x := w
		if span > 0 {
			x = w * float64(s.at.Sub(t0)) / float64(span)
		} else if len(samples) > 1 {
			x = w * float64(i) / float64(len(samples)-1)
		}
		pct := 0.0
		if s.capacity > 0 {
			pct = float64(s.used) / float64(s.capacity)
		}
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, h-h*pct))
	}
	if len(pts) == 1 {
		pts = append([]string{fmt.Sprintf("0,%s", strings.Split(pts[0], ",")[1])}, pts...)
	}
	area := "0," + strconv.FormatFloat(h, 'f', 1, 64) + " " + strings.Join(pts, " ") + " " + strconv.FormatFloat(w, 'f', 1, 64) + "," + strconv.FormatFloat(h, 'f', 1, 64)
	svg := fmt.Sprintf(`<svg id="occupancy-chart" viewBox="0 0 %.0f %.0f" preserveAspectRatio="none" role="img" aria-label="pool occupancy over the last %s">`+
		`<line x1="0" y1="%.1f" x2="%.0f" y2="%.1f" class="grid"/><line x1="0" y1="%.1f" x2="%.0f" y2="%.1f" class="grid"/>`+
		`<polygon points="%s" class="area"/><polyline points="%s" class="line"/></svg>`,
		w, h, spanText(span), h/2, w, h/2, h*0.1, w, h*0.1, area, strings.Join(pts, " "))
	return template.HTML(svg), spanText(span) //nolint:gosec // built from numbers only
}

func spanText(d time.Duration) string {
	if d < time.Minute {
		return fmt.Sprintf("%d s", int(d.Seconds()))
	}
	return fmt.Sprintf("%.1f min", d.Minutes())
}

// humanBytes is kvctl's one human size format (config.FormatSizeHuman).
func humanBytes(n int64) string { return config.FormatSizeHuman(n) }

var statusTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"bytes": humanBytes,
	"pct":   func(f float64) string { return strconv.FormatFloat(100*f, 'f', 1, 64) + " %" },
	"pct1":  func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) + " %" },
	"secs":  func(f float64) string { return strconv.FormatFloat(f, 'f', 3, 64) + " s" },
	"num":   func(n int64) string { return strconv.FormatInt(n, 10) },
	"f":     func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) },
	"ago":   func(t time.Time) string { return time.Since(t).Truncate(time.Second).String() },
	// barWidth is the occupancy bar's CSS width; its value is a number the page computed.
	"barWidth": func(pct float64) template.CSS {
		return template.CSS("width: " + strconv.FormatFloat(min(max(pct, 0), 100), 'f', 1, 64) + "%") //nolint:gosec // a number, not input
	},
}).Parse(statusHTML))

const statusHTML = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="refresh" content="{{.Refresh}}">
<title>kvctl serve — status</title>
<style>
:root { color-scheme: light dark; --fg: #1b1f24; --muted: #57606a; --bg: #fff; --card: #f6f8fa; --accent: #0969da; --ok: #1a7f37; --bad: #cf222e; }
@media (prefers-color-scheme: dark) { :root { --fg: #e6edf3; --muted: #8d96a0; --bg: #0d1117; --card: #161b22; --accent: #4493f8; --ok: #3fb950; --bad: #f85149; } }
* { box-sizing: border-box; }
body { margin: 0; padding: 12px; font: 15px/1.4 system-ui, sans-serif; color: var(--fg); background: var(--bg); }
h1 { font-size: 1.25rem; margin: 0 0 4px; }
h2 { font-size: 1rem; margin: 0 0 8px; }
.sub { color: var(--muted); font-size: .85rem; margin-bottom: 12px; }
.grid { display: grid; gap: 12px; grid-template-columns: repeat(auto-fit, minmax(280px, 1fr)); }
section { background: var(--card); border-radius: 8px; padding: 12px; }
table { width: 100%; border-collapse: collapse; font-variant-numeric: tabular-nums; }
td, th { padding: 3px 4px; text-align: left; }
td.n, th.n { text-align: right; }
th { color: var(--muted); font-weight: 600; font-size: .85rem; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: .8rem; font-weight: 600; color: #fff; }
.ok { background: var(--ok); } .bad { background: var(--bad); }
.bar { height: 10px; background: color-mix(in srgb, var(--muted) 25%, transparent); border-radius: 5px; overflow: hidden; }
.bar > span { display: block; height: 100%; background: var(--accent); }
svg { width: 100%; height: 120px; display: block; }
svg .area { fill: color-mix(in srgb, var(--accent) 25%, transparent); stroke: none; }
svg .line { fill: none; stroke: var(--accent); stroke-width: 2; vector-effect: non-scaling-stroke; }
svg .grid { stroke: var(--muted); stroke-width: 1; stroke-dasharray: 4 4; opacity: .5; vector-effect: non-scaling-stroke; }
.wide { grid-column: 1 / -1; }
.scroll { overflow-x: auto; }
</style>
</head>
<body>
<h1>kvctl serve {{.Version}}</h1>
<div class="sub">up <span id="uptime">{{.Uptime}}</span> · backend <b id="backend">{{.Backend}}</b>
 · <span id="ready" data-value="{{.Ready}}" class="badge {{if .Ready}}ok{{else}}bad{{end}}">{{if .Ready}}ready{{else}}not ready{{end}}</span>
 · <span id="pool-health" data-value="{{.PoolHealthy}}" class="badge {{if .PoolHealthy}}ok{{else}}bad{{end}}">{{if .PoolHealthy}}pool healthy{{else}}pool unreachable{{end}}</span>
 · refreshes every {{.Refresh}} s · {{.GeneratedAt}}</div>
{{if .PoolError}}<section class="wide"><b>pool error:</b> <span id="pool-error">{{.PoolError}}</span></section>{{end}}
<div class="grid">
<section>
<h2>Pool</h2>
<div class="bar" title="occupancy"><span id="occupancy-bar" style="{{barWidth .UsedPct}}"></span></div>
<table>
{{if .PoolKnown}}<tr><td>used</td><td class="n" id="pool-used" data-value="{{.Stats.Pool.UsedBytes}}">{{bytes .Stats.Pool.UsedBytes}} ({{pct1 .UsedPct}})</td></tr>
<tr><td>capacity</td><td class="n" id="pool-capacity" data-value="{{.Stats.Pool.CapacityBytes}}">{{bytes .Stats.Pool.CapacityBytes}}</td></tr>
<tr><td>objects</td><td class="n" id="pool-objects" data-value="{{.Stats.Pool.Objects}}">{{.Stats.Pool.Objects}}</td></tr>
<tr><td>evicted</td><td class="n" id="pool-evicted" data-value="{{.Evicted}}">{{.Evicted}}</td></tr>{{else}}<tr><td>used</td><td class="n" id="pool-used" data-value="">unknown</td></tr>
<tr><td>capacity</td><td class="n" id="pool-capacity" data-value="">unknown</td></tr>
<tr><td>objects</td><td class="n" id="pool-objects" data-value="">unknown</td></tr>
<tr><td>evicted</td><td class="n" id="pool-evicted" data-value="">unknown</td></tr>{{end}}
</table>
<h2 style="margin-top:10px">Occupancy, last {{if .ChartSpan}}{{.ChartSpan}}{{else}}minutes{{end}}</h2>
{{.Chart}}
</section>
<section>
<h2>Hit rates (share of prompt tokens)</h2>
<table>
<tr><th></th><th class="n">since start</th><th class="n">last {{.ChartSpan}}</th></tr>
<tr><td>local</td><td class="n" id="hit-local" data-value="{{f .Stats.HitRates.Local}}">{{pct .Stats.HitRates.Local}}</td><td class="n">{{if .Recent}}{{pct .Recent.Local}}{{else}}–{{end}}</td></tr>
<tr><td>pool</td><td class="n" id="hit-pool" data-value="{{f .Stats.HitRates.Pool}}">{{pct .Stats.HitRates.Pool}}</td><td class="n">{{if .Recent}}{{pct .Recent.Pool}}{{else}}–{{end}}</td></tr>
<tr><td>total</td><td class="n" id="hit-total" data-value="{{f .Stats.HitRates.Total}}">{{pct .Stats.HitRates.Total}}</td><td class="n">{{if .Recent}}{{pct .Recent.Total}}{{else}}–{{end}}</td></tr>
<tr><td>prompt tokens</td><td class="n" id="prompt-tokens" data-value="{{.Stats.HitRates.PromptTokens}}">{{.Stats.HitRates.PromptTokens}}</td><td></td></tr>
</table>
</section>
<section>
<h2>Prefix holes</h2>
<table>
<tr><td>lookups</td><td class="n" id="holes-lookups" data-value="{{.Stats.PrefixHoles.Lookups}}">{{.Stats.PrefixHoles.Lookups}}</td></tr>
<tr><td>hit blocks / looked up</td><td class="n" id="holes-hit-blocks" data-value="{{.Stats.PrefixHoles.HitBlocks}}">{{.Stats.PrefixHoles.HitBlocks}} / {{.Stats.PrefixHoles.LookedUpBlocks}}</td></tr>
<tr><td>holes</td><td class="n" id="holes-holes" data-value="{{.Stats.PrefixHoles.Holes}}">{{.Stats.PrefixHoles.Holes}}</td></tr>
<tr><td>hole blocks</td><td class="n" id="holes-hole-blocks" data-value="{{.Stats.PrefixHoles.HoleBlocks}}">{{.Stats.PrefixHoles.HoleBlocks}}</td></tr>
<tr><td>stored tokens recomputed</td><td class="n" id="holes-recomputed" data-value="{{.Stats.PrefixHoles.RecomputedStoredTokens}}">{{.Stats.PrefixHoles.RecomputedStoredTokens}}</td></tr>
</table>
</section>
<section>
<h2>Loads and saves</h2>
<table>
<tr><td>loads</td><td class="n" id="loads" data-value="{{.Stats.Loads.Loads}}">{{.Stats.Loads.Loads}}</td></tr>
<tr><td>pages loaded (failed)</td><td class="n" id="load-pages" data-value="{{.Stats.Loads.Pages}}">{{.Stats.Loads.Pages}} ({{.Stats.Loads.FailedPages}})</td></tr>
<tr><td>bytes loaded</td><td class="n" id="load-bytes" data-value="{{.Stats.Loads.LandedBytes}}">{{bytes .Stats.Loads.LandedBytes}}</td></tr>
<tr><td>saves (failed)</td><td class="n" id="saves" data-value="{{.Stats.Saves.Saves}}">{{.Stats.Saves.Saves}} ({{.Stats.Saves.FailedSaves}})</td></tr>
<tr><td>pages saved (skipped)</td><td class="n" id="save-pages" data-value="{{.Stats.Saves.PutPages}}">{{.Stats.Saves.PutPages}} ({{.Stats.Saves.SkippedPages}})</td></tr>
{{if .Stats.Saves.NotJoinedSaves}}<tr><td>saves before joining the pool (pages)</td><td class="n" id="saves-not-joined" data-value="{{.Stats.Saves.NotJoinedSaves}}">{{.Stats.Saves.NotJoinedSaves}} ({{.Stats.Saves.NotJoinedPages}})</td></tr>{{end}}
</table>
<h2 style="margin-top:10px">Load phases</h2>
<table id="phases">
<tr><th>phase</th><th class="n">wall</th><th class="n">cpu</th><th class="n">share</th></tr>
{{range .Phases}}<tr><td>{{.Name}}</td><td class="n" data-phase="{{.Name}}" data-value="{{f .Wall}}">{{secs .Wall}}</td><td class="n">{{secs .CPU}}</td><td class="n">{{pct1 .Share}}</td></tr>
{{end}}</table>
{{if or .Stats.Loads.GPUCopySeconds .Stats.Loads.GPUCheckSeconds}}<p id="gpu-time" data-copy="{{f .Stats.Loads.GPUCopySeconds}}" data-check="{{f .Stats.Loads.GPUCheckSeconds}}">GPU's own time on checked pages: {{secs .Stats.Loads.GPUCopySeconds}} copying, {{secs .Stats.Loads.GPUCheckSeconds}} checking after the copies</p>{{end}}
</section>
<section class="wide">
<h2>Engines (<span id="engine-count" data-value="{{len .Engines}}">{{len .Engines}}</span>)</h2>
<div class="scroll"><table id="engines">
<tr><th>engine</th><th>model</th><th class="n">rank</th><th>role</th><th class="n">hit blocks</th><th class="n">pages loaded</th><th>since</th></tr>
{{range .Engines}}<tr data-engine="{{.Engine}}" data-model="{{.ModelKey}}" data-rank="{{.Rank}}"><td>{{.Engine}}</td><td>{{.ModelKey}}</td><td class="n">{{.Rank}}</td><td>{{.Role}}{{if .Scheduler}} + scheduler{{end}}</td><td class="n">{{.PrefixHoles.HitBlocks}}</td><td class="n">{{.Loads.Pages}}</td><td>{{ago .RegisteredAt}}</td></tr>
{{else}}<tr><td colspan="7">no engine registered</td></tr>
{{end}}</table></div>
</section>
</div>
</body>
</html>
`
