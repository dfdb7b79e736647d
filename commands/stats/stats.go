// Package stats implements `kvctl stats`: capacity, hits, evictions, prefix holes and load
// phases from kvctl serve, a Mooncake master, or a connector's log.
package stats

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/core/probe"
	corestats "github.com/kvctl/kvctl/core/stats"
	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/mooncake"
)

// Options are the inputs of `kvctl stats`.
type Options struct {
	IO           *cmdutil.IOStreams
	Pools        []string
	FromLog      []string
	Watch        int // seconds between reports; 0 reports once
	Timeout      time.Duration
	OutputFormat string

	// Now stamps watch headers.
	Now func() time.Time
	// Iterations stops a watch after that many reports (0: until the context is done).
	Iterations int
	// Sleep waits between two watch reports; nil waits on a timer.
	Sleep func(ctx context.Context, d time.Duration) error
}

// NewCmdStats returns `kvctl stats`. runF replaces the run function in tests.
func NewCmdStats(f *cmdutil.Factory, runF func(*Options) error) *cobra.Command {
	opts := &Options{IO: f.IOStreams, Now: f.Now}
	cmd := &cobra.Command{
		Use:   "stats (--pool URL... | --from-log FILE...)",
		Short: "Show a pool's capacity, hits, evictions, prefix holes and load phases",
		Long: `Report what a pool and its connectors are doing: capacity and use, hits and misses,
evictions (by pass where the pool tells them apart), soft-pinned and grouped objects, prefix-hole
stats and the load-phase breakdown.

--pool (repeatable) is a kvctl serve admin address, which gives all of these (/v1/stats,
/metrics, segments), or a Mooncake master's HTTP admin address (port 9003 by default), which
gives capacity, keys, hits and evictions (/metrics, /metrics/summary, /get_segments_detail). The
two are told apart by /v1/stats. Addresses are http://host:port or host:port.

--pool may also be a Mooncake master's RPC address (--rpc_port, 50051 by default), written
rpc://host:port, or host:port when that port does not answer HTTP. The master's RPC service has
no statistics calls: this reports whether it serves, its store protocol version and its storage
configuration (kind mooncake-master-rpc); ask its HTTP admin address for the figures.

--from-log FILE (repeatable) reads the "prefix-hole stats" and "load stats" lines a connector
logs once per stats interval: kvctl's own lines (slog text or JSON) and the seed connector's
lines (the same messages followed by key=value fields, under any logger prefix), as well as
TensorRT-LLM's "async-load stats" summary. The lines are summed into the same report; other
lines are skipped and counted. A file with no stats lines exits 3.

--watch N reports again every N seconds until interrupted, with each counter's change since the
previous report: on a terminal the report is redrawn in place, otherwise one follows another. A
pool that does not answer is reported on standard error and asked again at the next interval.`,
		Example: `  kvctl stats --pool 127.0.0.1:9480
  kvctl stats --pool 127.0.0.1:9480 --pool 10.0.0.5:9003 -o json
  kvctl stats --watch 5s --pool 127.0.0.1:9480
  kvctl stats --pool rpc://10.0.0.5:50051
  kvctl stats --from-log serve.log`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.OutputFormat = cmdutil.OutputFormat(cmd)
			if len(opts.Pools) == 0 && len(opts.FromLog) == 0 {
				return cmdutil.FlagErrorf("nothing to report on: give --pool URL or --from-log FILE")
			}
			if opts.Watch < 0 {
				return cmdutil.FlagErrorf("--watch %ds: want an interval of at least 1s", opts.Watch)
			}
			if opts.Timeout <= 0 {
				return cmdutil.FlagErrorf("--timeout %v: must be positive", opts.Timeout)
			}
			if runF != nil {
				return runF(opts)
			}
			return Run(cmd.Context(), opts)
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&opts.Pools, "pool", nil, "a kvctl serve or Mooncake master admin address, `URL` http://host:port, or a master's RPC address rpc://host:port (repeatable)")
	fl.StringArrayVar(&opts.FromLog, "from-log", nil, "read the connector's stats lines from `FILE` (repeatable)")
	cmdutil.SecondsVar(fl, &opts.Watch, "watch", 0, "report again at this interval (5s, 1m, or a number of seconds), with the change since the previous report")
	cmdutil.DurationVar(fl, &opts.Timeout, "timeout", probe.DefaultTimeout, "bound on each request to a pool")
	return cmd
}

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

// Gets are a pool's hits and misses.
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
	PrefixHoles *corestats.HoleStats    `json:"prefix_holes,omitempty"`
	Loads       *statsapi.LoadStatsJSON `json:"loads,omitempty"`
	// Backend is a kvctl serve's pool backend: its master, this host's segment and the
	// cluster's capacity (cluster.go).
	Backend *statsapi.BackendStatusJSON `json:"backend,omitempty"`
	Log     *LogLines                   `json:"log,omitempty"`
	// Delta is the change of the counters since the previous report of a watch.
	Delta *Counters `json:"delta,omitempty"`
}

// KindLog is the kind of a --from-log source.
const KindLog = "log"

// Result is the output of `kvctl stats`.
type Result struct {
	Sources []Source `json:"sources"`
}

// Run reports once, or every --watch seconds until ctx is done.
func Run(ctx context.Context, opts *Options) error {
	if ctx == nil {
		ctx = context.Background()
	}
	targets := make([]Pool, len(opts.Pools))
	for i, p := range opts.Pools {
		if addr, ok := probe.ExplicitRPC(p); ok {
			targets[i] = Pool{RPCAddr: addr, Timeout: opts.Timeout}
			continue
		}
		t, err := probe.NewTarget(p, opts.Timeout)
		if err != nil {
			return cmdutil.FlagErrorf("--pool: %v", err)
		}
		targets[i] = Pool{Target: t, Timeout: opts.Timeout}
	}
	if opts.Watch <= 0 {
		res, err := Gather(ctx, targets, opts.FromLog)
		if err != nil {
			return err
		}
		return cmdutil.Print(opts.IO, opts.OutputFormat, res, func() cmdutil.Table { return rows(res) })
	}
	return watch(ctx, opts, targets)
}

func watch(ctx context.Context, opts *Options, targets []Pool) error {
	sleep := opts.Sleep
	if sleep == nil {
		sleep = cmdutil.SleepContext
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	tty := opts.IO.IsStdoutTTY()
	var prev *Result
	printed := 0
	for n := 1; ; n++ {
		res, err := Gather(ctx, targets, opts.FromLog)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var ee *cmdutil.ExitError
		switch {
		case err != nil && errors.As(err, &ee) && ee.Code == cmdutil.ExitUnreachable:
			// A watch outlives a pool restart: say so and try again next interval.
			fmt.Fprintf(opts.IO.ErrOut, "%s: %v\n", now().Format(time.TimeOnly), err)
		case err != nil:
			return err
		default:
			if prev != nil {
				for i := range res.Sources {
					d := counters(res.Sources[i]).minus(counters(prev.Sources[i]))
					res.Sources[i].Delta = &d
				}
			}
			prev = res
			if tty {
				fmt.Fprint(opts.IO.Out, "\x1b[H\x1b[2J")
				fmt.Fprintf(opts.IO.Out, "every %ds  %s\n\n", opts.Watch, now().Format(time.DateTime))
			} else if printed > 0 {
				switch opts.OutputFormat {
				case cmdutil.FormatYAML:
					fmt.Fprint(opts.IO.Out, "---\n")
				case cmdutil.FormatJSON:
				default:
					fmt.Fprint(opts.IO.Out, "\n")
				}
			}
			if err := cmdutil.Print(opts.IO, opts.OutputFormat, res, func() cmdutil.Table { return rows(res) }); err != nil {
				return err
			}
			printed++
		}
		if opts.Iterations > 0 && n >= opts.Iterations {
			return nil
		}
		if err := sleep(ctx, time.Duration(opts.Watch)*time.Second); err != nil {
			return err
		}
	}
}

// Gather reads every pool and log once.
func Gather(ctx context.Context, targets []Pool, logs []string) (*Result, error) {
	res := &Result{Sources: []Source{}}
	for _, p := range targets {
		s, err := gatherAny(ctx, p)
		if err != nil {
			return nil, err
		}
		res.Sources = append(res.Sources, s)
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

func gatherPool(ctx context.Context, t *probe.Target) (Source, error) {
	kind, err := t.Kind(ctx)
	if err != nil {
		return Source{}, err
	}
	src := Source{Source: t.Addr(), Kind: kind}
	if kind == probe.KindServe {
		if done, err := gatherClusterServe(ctx, t, &src); done || err != nil {
			return src, err
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
	case probe.KindServe:
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
		holes, loads, backend := st.PrefixHoles, st.Loads, st.Backend
		src.PrefixHoles, src.Loads, src.Backend = &holes, &loads, &backend
	case probe.KindMaster:
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
	ls, err := probe.ParseLog(f)
	if err != nil {
		return Source{}, fmt.Errorf("%s: %w", name, err)
	}
	if ls.HoleLines+ls.LoadLines == 0 {
		msg := fmt.Sprintf("%s: no \"prefix-hole stats\" or \"load stats\" lines among %d lines; is stats_interval set on the connector?", name, ls.Lines)
		if ls.Malformed > 0 {
			msg = fmt.Sprintf("%s: no readable stats lines among %d lines (%d malformed, the first at line %d)", name, ls.Lines, ls.Malformed, ls.FirstMalformed)
		}
		return Source{}, cmdutil.ValidationErrorf("%s", msg)
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

func counters(s Source) Counters {
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
	return c
}

func (c Counters) minus(o Counters) Counters {
	return Counters{
		Hits: c.Hits - o.Hits, Misses: c.Misses - o.Misses,
		EvictionAttempts: c.EvictionAttempts - o.EvictionAttempts, EvictedKeys: c.EvictedKeys - o.EvictedKeys,
		Lookups: c.Lookups - o.Lookups, HitBlocks: c.HitBlocks - o.HitBlocks, Holes: c.Holes - o.Holes,
		HoleBlocks: c.HoleBlocks - o.HoleBlocks, RecomputedStoredTokens: c.RecomputedStoredTokens - o.RecomputedStoredTokens,
		Loads: c.Loads - o.Loads, LoadedPages: c.LoadedPages - o.LoadedPages, LandedBytes: c.LandedBytes - o.LandedBytes,
	}
}

// poolError gives a failed read the exit code and words the command documents: 4 with the
// address when nothing answered, 1 otherwise.
func poolError(t *probe.Target, err error) error {
	switch {
	case errors.Is(err, context.Canceled):
		return err
	case errors.Is(err, mooncake.ErrUnreachable):
		s := err.Error()
		if strings.Contains(s, "Timeout exceeded") || strings.Contains(s, "deadline exceeded") || strings.Contains(s, "i/o timeout") {
			return cmdutil.Unreachable(fmt.Errorf("pool %s did not answer within %s (--timeout): %w", t.Addr(), t.Timeout, err))
		}
		return cmdutil.Unreachable(cmdutil.Briefly(fmt.Sprintf("pool %s is unreachable", t.Addr()), err))
	case errors.Is(err, mooncake.ErrMalformedResponse):
		return fmt.Errorf("pool %s sent a response kvctl cannot read: %w", t.Addr(), err)
	}
	return cmdutil.Briefly(fmt.Sprintf("pool %s", t.Addr()), err)
}

func bytesHuman(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, u := float64(n)/unit, 0
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB"}
	for v >= unit && u < len(units)-1 {
		v /= unit
		u++
	}
	return fmt.Sprintf("%.2f %s", v, units[u])
}

func secs(v float64) string { return strconv.FormatFloat(v*1000, 'f', 3, 64) + " ms" }

func rows(res *Result) cmdutil.Table {
	t := cmdutil.Table{Header: []string{"SOURCE", "METRIC", "VALUE", "DELTA"}}
	for _, s := range res.Sources {
		var d Counters
		hasDelta := s.Delta != nil
		if hasDelta {
			d = *s.Delta
		}
		add := func(metric, value string, delta int64, counter bool) {
			ds := ""
			if hasDelta && counter {
				ds = fmt.Sprintf("%+d", delta)
			}
			t.Rows = append(t.Rows, []string{s.Source, metric, value, ds})
		}
		n := func(v int64) string { return strconv.FormatInt(v, 10) }
		add("kind", s.Kind, 0, false)
		for _, r := range backendRows(s.Backend) {
			add(r[0], r[1], 0, false)
		}
		if s.Version != "" {
			add("version", s.Version, 0, false)
		}
		if s.Role != "" {
			add("role", s.Role, 0, false)
		}
		if s.Ready != nil {
			add("ready", strconv.FormatBool(*s.Ready), 0, false)
		}
		if s.Engines != nil {
			add("engines", strconv.Itoa(*s.Engines), 0, false)
		}
		if u := s.Usage; u != nil {
			add("capacity", bytesHuman(u.CapacityBytes), 0, false)
			add("used", fmt.Sprintf("%s (%.1f%%)", bytesHuman(u.UsedBytes), u.UsedPercent), 0, false)
			add("objects", n(u.Objects), 0, false)
			add("soft-pinned objects", n(u.SoftPinnedObjects), 0, false)
			if u.HardPinnedObjects != nil {
				add("hard-pinned objects", n(*u.HardPinnedObjects), 0, false)
			}
			if u.GroupedObjects != nil {
				add("grouped objects", n(*u.GroupedObjects), 0, false)
			}
			for _, sg := range u.Segments {
				add("segment "+sg.Name, bytesHuman(sg.UsedBytes)+" / "+bytesHuman(sg.CapacityBytes), 0, false)
			}
		}
		if g := s.Gets; g != nil {
			add("hits", n(g.Hits), d.Hits, true)
			add("misses", n(g.Misses), d.Misses, true)
			add("hit ratio", fmt.Sprintf("%.3f", g.HitRatio), 0, false)
		}
		if e := s.Evictions; e != nil {
			add("eviction attempts", n(e.Attempts), d.EvictionAttempts, true)
			add("successful evictions", n(e.Successful), 0, false)
			add("evicted keys", n(e.EvictedKeys), d.EvictedKeys, true)
			add("evicted bytes", bytesHuman(e.EvictedBytes), 0, false)
			if p := e.ByPass; p != nil {
				add("evicted in pass 1", n(p.Pass1), 0, false)
				add("evicted in pass 2", n(p.Pass2), 0, false)
				add("evicted soft-pinned", n(p.SoftPinned), 0, false)
				add("evicted grouped", n(p.Grouped), 0, false)
				add("failed evictions", n(p.Failed), 0, false)
			}
		}
		if h := s.PrefixHoles; h != nil {
			add("prefix lookups", n(h.Lookups), d.Lookups, true)
			add("looked-up blocks", n(h.LookedUpBlocks), 0, false)
			add("hit blocks", n(h.HitBlocks), d.HitBlocks, true)
			add("holes", n(h.Holes), d.Holes, true)
			add("hole blocks", n(h.HoleBlocks), d.HoleBlocks, true)
			add("recomputed stored tokens", n(h.RecomputedStoredTokens), d.RecomputedStoredTokens, true)
		}
		if l := s.Loads; l != nil {
			add("loads", n(l.Loads), d.Loads, true)
			add("async loads", n(l.AsyncLoads), 0, false)
			add("loaded pages", n(l.Pages), d.LoadedPages, true)
			add("store calls", n(l.StoreCalls), 0, false)
			add("landed bytes", bytesHuman(l.LandedBytes), d.LandedBytes, true)
			add("failed pages", n(l.FailedPages), 0, false)
			add("transfer time", fmt.Sprintf("%s total, %s max", secs(l.TransferSeconds), secs(l.TransferMaxSecs)), 0, false)
			if l.AsyncLoads > 0 {
				add("async wait", fmt.Sprintf("%s total, %s max", secs(l.WaitSeconds), secs(l.WaitMaxSeconds)), 0, false)
			}
			for p := corestats.Phase(0); p < corestats.NumPhases; p++ {
				ph := l.Phases[p.String()]
				add("phase "+p.String(), fmt.Sprintf("%s wall, %s cpu", secs(ph.WallSeconds), secs(ph.CPUSeconds)), 0, false)
			}
		}
		if lg := s.Log; lg != nil {
			add("log lines", fmt.Sprintf("%d (%d prefix-hole, %d load, %d skipped, %d malformed)", lg.Lines, lg.HoleLines, lg.LoadLines, lg.Skipped, lg.Malformed), 0, false)
		}
	}
	return t
}
