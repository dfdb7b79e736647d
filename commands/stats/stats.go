// Package stats implements `kvctl stats`: capacity, hits, evictions, prefix holes and load
// phases from kvctl serve, a Mooncake master, or a connector's log.
package stats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/core/config"
	"github.com/kvctl/kvctl/core/probe"
	corestats "github.com/kvctl/kvctl/core/stats"
)

// Options are the inputs of `kvctl stats`.
type Options struct {
	IO           *cmdutil.IOStreams
	Pools        []string
	FromLog      []string
	Watch        int // seconds between reports; 0 reports once
	Timeout      time.Duration
	OutputFormat string

	// Seams come from the Factory: Now stamps watch headers, Sleep waits between two watch
	// reports.
	cmdutil.Seams
	// Iterations stops a watch after that many reports (0: until the context is done).
	Iterations int
}

// NewCmdStats returns `kvctl stats`. runF replaces the run function in tests.
func NewCmdStats(f *cmdutil.Factory, runF func(*Options) error) *cobra.Command {
	opts := &Options{IO: f.IOStreams, Seams: f.Seams}
	cmd := &cobra.Command{
		Use:   "stats (--pool URL... | --from-log FILE...)",
		Short: "Show a pool's capacity, hits, evictions, prefix holes and load phases",
		Long: `Report what a pool and its connectors are doing: capacity and use, the pool's own gets
(found or not: "gets found ratio", not a prefix hit rate), evictions (by pass where the pool tells
them apart), soft-pinned and grouped objects, prefix-hole stats and the load-phase breakdown; for
a kvctl serve also its prefix hit rate (prompt tokens its lookups found, locally and in the pool)
and its saves, failed saves and their pages.

--pool (repeatable) is a kvctl serve admin address, which gives all of these (/v1/stats,
/metrics, segments), or a Mooncake master's HTTP admin address (port 9003 by default), which
gives capacity, keys, hits and evictions (/metrics, /metrics/summary, /get_segments_detail). The
two are told apart by /v1/stats. Addresses are http://host:port or host:port.

--pool may also be a Mooncake master's RPC address (--rpc_port, 50051 by default), written
rpc://host:port, or host:port when that port does not answer HTTP. The master's RPC service has
no statistics calls: this reports whether it serves, its store protocol version and its storage
configuration (kind mooncake-master-rpc); ask its HTTP admin address for the figures.

--from-log FILE (repeatable) reads the "prefix-hole stats" and "load stats" lines a connector
logs once per stats interval: kvctl's own lines (slog text or JSON) and those of TensorRT-LLM's
mooncake_store connector with mooncake_store.stats_interval set
(https://github.com/NVIDIA/TensorRT-LLM/pull/21195: the same messages followed by key=value
fields, under any logger prefix), as well as TensorRT-LLM's "async-load stats" summary. The lines are summed into the same report; other
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
			return runStats(cmd.Context(), opts)
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&opts.Pools, "pool", nil, "a kvctl serve or Mooncake master admin address, `URL` http://host:port, or a master's RPC address rpc://host:port (repeatable)")
	fl.StringArrayVar(&opts.FromLog, "from-log", nil, "read the connector's stats lines from `FILE` (repeatable)")
	cmdutil.SecondsVar(fl, &opts.Watch, "watch", 0, "report again at this interval (5s, 1m, or a number of seconds), with the change since the previous report")
	cmdutil.DurationVar(fl, &opts.Timeout, "timeout", probe.DefaultTimeout, "bound on each request to a pool")
	return cmd
}

// runStats reports once, or every --watch seconds until ctx is done.
func runStats(ctx context.Context, opts *Options) error {
	targets := make([]probe.Pool, len(opts.Pools))
	for i, p := range opts.Pools {
		if addr, ok := probe.ExplicitRPC(p); ok {
			targets[i] = probe.Pool{RPCAddr: addr, Timeout: opts.Timeout}
			continue
		}
		t, err := probe.NewTarget(p, opts.Timeout)
		if err != nil {
			return cmdutil.FlagErrorf("--pool: %v", err)
		}
		targets[i] = probe.Pool{Target: t, Timeout: opts.Timeout}
	}
	if opts.Watch <= 0 {
		res, err := gather(ctx, targets, opts.FromLog)
		if res != nil {
			// Every target that answered, and an error row for each that did not; the exit code
			// is the worst one.
			if perr := cmdutil.Print(opts.IO, opts.OutputFormat, res, func() cmdutil.Table { return rows(res) }); perr != nil {
				return perr
			}
		}
		return err
	}
	var prev *probe.StatsReport
	w := cmdutil.Watch{IO: opts.IO, Every: opts.Watch, Format: opts.OutputFormat, Iterations: opts.Iterations, Seams: opts.Seams}
	return w.Run(ctx, func(ctx context.Context) (func() error, error) {
		res, err := gather(ctx, targets, opts.FromLog)
		if res == nil {
			return nil, err
		}
		res.SetDeltas(prev)
		prev = res
		return func() error {
			return cmdutil.Print(opts.IO, opts.OutputFormat, res, func() cmdutil.Table { return rows(res) })
		}, err
	})
}

// gather reads every pool and log once, with the exit codes the command documents.
func gather(ctx context.Context, targets []probe.Pool, logs []string) (*probe.StatsReport, error) {
	res, err := probe.Gather(ctx, targets, logs)
	if errors.Is(err, probe.ErrNoStatsLines) {
		return nil, &cmdutil.ExitError{Code: cmdutil.ExitValidation, Err: err}
	}
	if err != nil {
		err = worstPoolError(err)
		if res == nil || len(res.Sources) <= 1 {
			// Nothing answered: the error says it all.
			return nil, err
		}
		return res, err
	}
	return res, nil
}

// bytesHuman writes a byte count the way kvctl stats has always shown it ("64.00 MiB").
func bytesHuman(n int64) string { return config.FormatBytes(n, 2, " ") }

func secs(v float64) string { return strconv.FormatFloat(v*1000, 'f', 3, 64) + " ms" }

func rows(res *probe.StatsReport) cmdutil.Table {
	t := cmdutil.Table{Header: []string{"SOURCE", "METRIC", "VALUE", "DELTA"}}
	for _, s := range res.Sources {
		var d probe.Counters
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
		if s.Error != "" {
			add("error", s.Error, 0, false)
			continue
		}
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
			// The pool's own gets (the master's, or the embedded pool's): whether each found its
			// object. Not the prefix hit rate of engines' lookups, which has rows of its own.
			add("gets found", n(g.Hits), d.Hits, true)
			add("gets not found", n(g.Misses), d.Misses, true)
			add("gets found ratio", fmt.Sprintf("%.3f", g.HitRatio), 0, false)
		}
		if h := s.HitRates; h != nil {
			add("prefix hit rate", fmt.Sprintf("%.2f%% (%.2f%% local, %.2f%% pool) of %d prompt tokens", 100*h.Total, 100*h.Local, 100*h.Pool, h.PromptTokens), 0, false)
		}
		if sv := s.Saves; sv != nil {
			add("saves", n(sv.Saves), d.Saves, true)
			add("failed saves", n(sv.FailedSaves), d.FailedSaves, true)
			// Not failures: the host had not joined its cluster, so the pool was not asked.
			add("saves before joining the pool", fmt.Sprintf("%d (%d pages)", sv.NotJoinedSaves, sv.NotJoinedPages), 0, false)
			add("save pages", fmt.Sprintf("%d (%d stored, %d already in the pool, %d failed, %d refused)", sv.Pages, sv.PutPages, sv.SkippedPages, sv.FailedPages, sv.RefusedPages), 0, false)
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
			if l.GPUCopySeconds > 0 || l.GPUCheckSeconds > 0 {
				add("gpu time", fmt.Sprintf("%s copying, %s checking after the copies", secs(l.GPUCopySeconds), secs(l.GPUCheckSeconds)), 0, false)
			}
		}
		if lg := s.Log; lg != nil {
			add("log lines", fmt.Sprintf("%d (%d prefix-hole, %d load, %d skipped, %d malformed)", lg.Lines, lg.HoleLines, lg.LoadLines, lg.Skipped, lg.Malformed), 0, false)
		}
	}
	return t
}

// worstPoolError maps each pool's error to its exit code and returns them joined, with the
// worst (highest) code.
func worstPoolError(err error) error {
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return cmdutil.PoolError(err)
	}
	var errs []error
	code := cmdutil.ExitOK
	for _, e := range joined.Unwrap() {
		e = cmdutil.PoolError(e)
		errs = append(errs, e)
		code = max(code, cmdutil.ExitCode(e))
	}
	if len(errs) == 1 {
		return errs[0]
	}
	return &cmdutil.ExitError{Code: code, Err: errors.Join(errs...)}
}
