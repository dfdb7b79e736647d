// Package replay implements `kvctl replay`: request traces replayed through the real connector,
// KV cache manager and pool, offline in virtual time or live against a running kvctl serve.
package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/core/config"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/replay"
	"github.com/kvctl/kvctl/core/router"
)

// Options are the inputs of `kvctl replay`.
type Options struct {
	IO *cmdutil.IOStreams

	Trace    string
	Format   string
	SkipBad  bool
	Limit    int
	Sets     []string
	PoolSize string
	Ranks    int
	Router   string
	GPU      int

	TokensPerBlock    int
	PageSize          string
	SimPageSize       int
	LoadBandwidth     string
	SaveBandwidth     string
	PrefillRate       float64
	DecodeRate        float64
	MaxActiveRequests int
	Seed              uint64
	Plot              string

	Target  string
	Live    bool
	Engines int
	Pace    string
	Speed   float64
	// NoCallChannels keeps the live engines' calls on gRPC instead of call channels.
	NoCallChannels bool
	Admin          string

	OutputFormat string
}

// Live pacing.
const (
	PaceTrace = "trace"
	PaceMax   = "max"
)

// NewCmdReplay returns `kvctl replay`. runF replaces the run function in tests.
func NewCmdReplay(f *cmdutil.Factory, runF func(context.Context, *Options) error) *cobra.Command {
	opts := &Options{IO: f.IOStreams}
	p := replay.DefaultParams()
	c := replay.DefaultConfig()
	cmd := &cobra.Command{
		Use:   "replay TRACE",
		Short: "Replay a request trace through the connector, KV cache and pool and report hit rates",
		Long: `Replay a request trace through kvctl's real connector, a KV cache manager per engine rank and
a Mooncake pool, and report hit rates (local, pool, total), tokens recomputed, prefix holes,
bytes moved, modelled time per phase and rank balance.

Traces: the Mooncake FAST'25 JSONL ({timestamp, input_length, output_length, hash_ids}, 512-token
blocks) or kvctl's token trace, one JSON object per line:
  {"id": "r1", "conversation_id": "c1", "arrival_ms": 0, "tokens": [1, 2, 3],
   "output_length": 64, "cache_salt": "tenant-a", "lora_id": 3}
with "tokens_file" (relative to the trace) instead of "tokens" for long prompts. --format auto
picks by the first record. Malformed lines are reported with their line numbers (exit 3);
--skip-bad leaves them out and lists them in the report.

Offline (the default) runs in virtual time: each Mooncake block is --tokens-per-block synthesised
tokens, fixed per hash id and --seed, so shared prefixes stay shared; pages hold --sim-page-size
bytes, and bytes moved and transfer times are scaled to --page-size. The pool has --pool-size of
real pages (unlimited by default) and the master's eviction, ticked every 10 ms of trace time.
Requests are routed to --ranks attention-DP ranks by --router and replayed in arrival order.

--set KEY=V1,V2,... runs the trace once per combination of values (repeatable; the first --set
varies slowest), for example --set soft_pin_ttl_ms=0,600000 --set group_blocks=false,true.
Keys:
  ` + strings.Join(replay.SettingHelp(), "\n  ") + `

--set scheduler=true runs each rank's scheduling passes over its KV cache instead of serving
every request at once: a token budget (max_num_tokens) and request slots (max_batch_size) per
pass, chunked prefill, one token per generation request per pass, admissions in arrival order
with completion reservations (completion_reservation; only on a disaggregated server,
server=context or server=generation, as in TensorRT-LLM), connector queries at admission
(admission_query) with deferrals (max_offer_deferrals), asynchronous loads (async_load) and
uncharged parks (max_uncharged_parks). A request that finds no page preempts the most recently
admitted one that is not parked. The table gains ADMITTED, DEFERRED, WAITED, RESERVED_PEAK and
PREEMPTED; the JSON report a "scheduler" object per run. With async_load a parked request's
transfer queues behind its rank's load worker and reads the pool when it starts; a page evicted
while it waited (a lookup grants no read lease with exist_key_grant_lease=false, or its lease ran
out) fails the load, and the request restarts without the offer, as TensorRT-LLM restarts it:
failed_loads in the JSON report.

Live (--target SOCKET, or --live for kvctl serve's default socket) drives a running kvctl serve's engine API with --engines simulated
engines, at the trace's pace (--pace trace, scaled by --speed) or as fast as possible
(--pace max), and reports the same hit figures with requests per second; its bytes are the
bytes the daemon moved, pages of --sim-page-size. The engines call the daemon over call
channels (one SOCK_SEQPACKET write and read a call) unless --no-call-channels keeps them on gRPC.
A live replay reads the daemon's /v1/stats at --admin once its engines have registered and
again when their saves are done: it warns when the daemon is not ready, gives the table READY,
SAVES and FAILED_SAVES ("?" where the admin API did not answer) and the JSON report
live.daemon, and exits 3 when the daemon was not ready or saves failed, since its pool figures
then measure nothing of the pool.

--plot FILE.png draws hit rate (top) and pool occupancy (bottom) over trace time, with a title,
axes in seconds and percent, and a legend naming each run's --set combination; every run has a
colour and a dash pattern of its own. -o json carries the same timeline (runs[].timeline) for
plotting elsewhere. A progress bar goes to standard error when it is a terminal.`,
		Example: `  # the conversation trace with an unlimited pool
  kvctl replay conversation_trace.jsonl

  # a 2 TiB pool with and without soft pins and block groups, as JSON
  kvctl replay --pool-size 2TiB --set soft_pin_ttl_ms=0,600000 --set group_blocks=false,true -o json trace.jsonl

  # work-aware routing against prompt-length balancing on 4 ranks, with a plot
  kvctl replay --ranks 4 --set router=work-aware,prompt-length --plot hit.png trace.jsonl

  # live, against kvctl serve on its default socket, as fast as possible
  kvctl replay --live --engines 4 --pace max trace.jsonl

  # live, against a daemon on another socket
  kvctl replay --target /run/kvctl/engine.sock trace.jsonl`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return cmdutil.FlagErrorf("replay needs exactly one TRACE (- for stdin), got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Trace = args[0]
			opts.OutputFormat = cmdutil.OutputFormat(cmd)
			if opts.Live && opts.Target != "" {
				// What the command line says wins over the environment and the config file.
				switch live, target := cmdutil.FromCommandLine(cmd, "live"), cmdutil.FromCommandLine(cmd, "target"); {
				case live == target:
					return cmdutil.FlagErrorf("--live and --target both name the daemon; give one")
				case target:
					opts.Live = false
				default:
					opts.Target = ""
				}
			}
			if opts.Live {
				opts.Target = engineapi.DefaultSocketPath(f.Getenv)
			}
			if err := check(opts); err != nil {
				return err
			}
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			if runF != nil {
				return runF(ctx, opts)
			}
			return runReplay(ctx, opts)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&opts.Format, "format", replay.FormatAuto, "trace format: auto, mooncake or tokens")
	fl.BoolVar(&opts.SkipBad, "skip-bad", false, "leave malformed lines out instead of failing")
	fl.IntVar(&opts.Limit, "limit", 0, "replay only the first N requests (0: all)")
	fl.StringArrayVar(&opts.Sets, "set", nil, "run once per value: `KEY=V1,V2,...` (repeatable)")
	fl.StringVar(&opts.PoolSize, "pool-size", "unlimited", "pool capacity in real bytes (64GiB, 2TiB, ...) or unlimited")
	fl.IntVar(&opts.Ranks, "ranks", c.Ranks, "attention-DP ranks (engines) offline")
	fl.StringVar(&opts.Router, "router", c.Router, "rank placement: "+strings.Join(router.Policies, " or "))
	fl.IntVar(&opts.GPU, "gpu-blocks", c.GPUBlocks, "each rank's local KV cache, in blocks")
	fl.IntVar(&opts.TokensPerBlock, "tokens-per-block", 32, "replay block size: tokens per Mooncake block, or per block of a token trace (32, as kvctl hash and TensorRT-LLM)")
	fl.StringVar(&opts.PageSize, "page-size", "64MiB", "real bytes of one block's page")
	fl.IntVar(&opts.SimPageSize, "sim-page-size", p.SimPageBytes, "bytes a page actually holds (offline, and the live engines' registered page size)")
	fl.StringVar(&opts.LoadBandwidth, "load-bandwidth", "25GiB", "pool to engine bytes per second")
	fl.StringVar(&opts.SaveBandwidth, "save-bandwidth", "25GiB", "engine to pool bytes per second")
	fl.Float64Var(&opts.PrefillRate, "prefill-rate", p.PrefillTokensPerSecond, "a rank's prefill tokens per second")
	fl.Float64Var(&opts.DecodeRate, "decode-rate", p.DecodeTokensPerSecond, "a request's decode tokens per second")
	fl.IntVar(&opts.MaxActiveRequests, "max-active-requests", 0, "requests a rank may hold, for the router (0: no cap)")
	fl.Uint64Var(&opts.Seed, "seed", p.Seed, "seed of the synthesised token ids")
	fl.StringVar(&opts.Plot, "plot", "", "write hit rate and pool occupancy over time to `FILE.png`")
	fl.StringVar(&opts.Target, "target", "", "live mode: the engine socket of a running kvctl serve")
	fl.BoolVar(&opts.Live, "live", false, "live mode against kvctl serve on its default socket ($XDG_RUNTIME_DIR/kvctl/kvctl.sock, else /tmp/kvctl-UID/kvctl.sock)")
	fl.IntVar(&opts.Engines, "engines", 1, "live mode: simulated engines")
	fl.StringVar(&opts.Pace, "pace", PaceTrace, "live mode: trace (arrival times, scaled by --speed) or max")
	fl.Float64Var(&opts.Speed, "speed", 1, "live mode: arrival time speed-up under --pace trace")
	fl.BoolVar(&opts.NoCallChannels, "no-call-channels", false, "live mode: make the engines' calls over gRPC instead of call channels")
	fl.StringVar(&opts.Admin, "admin", "127.0.0.1:9480", "live mode: the kvctl serve admin address whose /v1/stats says whether the daemon was ready and its saves succeeded, and which the pool-aware router asks which keys the pool holds")
	_ = cmd.RegisterFlagCompletionFunc("format", cobra.FixedCompletions([]string{replay.FormatAuto, replay.FormatMooncake, replay.FormatTokens}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("router", cobra.FixedCompletions(router.Policies, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("pace", cobra.FixedCompletions([]string{PaceTrace, PaceMax}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("set", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		var s []string
		for _, k := range replay.SettingKeys() {
			s = append(s, k+"=")
		}
		return s, cobra.ShellCompDirectiveNoSpace | cobra.ShellCompDirectiveNoFileComp
	})
	return cmd
}

// check rejects flag values that cannot work, as usage errors.
func check(o *Options) error {
	switch o.Format {
	case replay.FormatAuto, replay.FormatMooncake, replay.FormatTokens:
	default:
		return cmdutil.FlagErrorf("invalid --format %q: want auto, mooncake or tokens", o.Format)
	}
	if o.Limit < 0 {
		return cmdutil.FlagErrorf("--limit %d is negative", o.Limit)
	}
	if o.Pace != PaceTrace && o.Pace != PaceMax {
		return cmdutil.FlagErrorf("invalid --pace %q: want trace or max", o.Pace)
	}
	// Every count is bounded here, before anything is allocated: a rank or an engine holds
	// engine memory, a block a page.
	for _, b := range []struct {
		flag   string
		v, min int
		max    int
	}{
		{"ranks", o.Ranks, 1, replay.MaxRanks},
		{"engines", o.Engines, 1, replay.MaxRanks},
		{"gpu-blocks", o.GPU, 1, replay.MaxGPUBlocks},
		{"tokens-per-block", o.TokensPerBlock, 1, 1 << 16},
		{"sim-page-size", o.SimPageSize, 1, 1 << 20},
		{"max-active-requests", o.MaxActiveRequests, 0, 1 << 20},
	} {
		if err := cmdutil.CheckCount(b.flag, b.v, b.min, b.max); err != nil {
			return err
		}
	}
	if !(o.Speed > 0) {
		return cmdutil.FlagErrorf("--speed must be positive, got %v", o.Speed)
	}
	if o.Target == "" && (o.Pace != PaceTrace || o.Engines != 1 || o.Speed != 1 || o.NoCallChannels) {
		return cmdutil.FlagErrorf("--engines, --pace, --speed and --no-call-channels need --target")
	}
	if o.Target != "" && len(o.Sets) > 0 {
		return cmdutil.FlagErrorf("--set varies offline configurations; a live replay runs the daemon's one configuration")
	}
	return nil
}

// params turns the flags into replay parameters and the base configuration.
func params(o *Options) (replay.Params, replay.Config, error) {
	p := replay.DefaultParams()
	c := replay.DefaultConfig()
	// Sizes and bandwidths are binary (64MiB, 25GiB a second) as everywhere in kvctl: a decimal
	// unit is refused, as serve's --pool-size refuses it.
	size := func(flag, v string) (int64, error) {
		n, err := config.ParseSize(v, true)
		if err != nil {
			return 0, cmdutil.FlagErrorf("invalid --%s: %v", flag, err)
		}
		if n <= 0 {
			return 0, cmdutil.FlagErrorf("invalid --%s %q: want a positive size such as 64MiB", flag, v)
		}
		return n, nil
	}
	var err error
	if p.PageBytes, err = size("page-size", o.PageSize); err != nil {
		return p, c, err
	}
	lb, err := size("load-bandwidth", o.LoadBandwidth)
	if err != nil {
		return p, c, err
	}
	sb, err := size("save-bandwidth", o.SaveBandwidth)
	if err != nil {
		return p, c, err
	}
	p.LoadBandwidth, p.SaveBandwidth = float64(lb), float64(sb)
	p.TokensPerBlock = o.TokensPerBlock
	p.SimPageBytes = o.SimPageSize
	p.PrefillTokensPerSecond = o.PrefillRate
	p.DecodeTokensPerSecond = o.DecodeRate
	p.MaxActiveRequests = o.MaxActiveRequests
	p.Seed = o.Seed
	if err = p.Validate(); err != nil {
		return p, c, cmdutil.FlagErrorf("%v", err)
	}
	if c.PoolBytes, err = replay.ParsePoolSize(o.PoolSize); err != nil {
		return p, c, cmdutil.FlagErrorf("invalid --pool-size %q: %v", o.PoolSize, err)
	}
	for key, v := range map[string]string{"ranks": strconv.Itoa(o.Ranks), "router": o.Router, "gpu_blocks": strconv.Itoa(o.GPU)} {
		if err := c.Set(key, v); err != nil {
			return p, c, cmdutil.FlagErrorf("--%s: %v", strings.ReplaceAll(key, "_", "-"), err)
		}
	}
	return p, c, nil
}

// runReplay replays the trace and prints the report.
func runReplay(ctx context.Context, opts *Options) error {
	p, base, err := params(opts)
	if err != nil {
		return err
	}
	cfgs, err := replay.Expand(base, opts.Sets)
	if err != nil {
		return cmdutil.FlagErrorf("%v", err)
	}
	tr, err := readTrace(ctx, opts)
	if err != nil {
		return err
	}
	for _, s := range tr.Skipped {
		fmt.Fprintf(opts.IO.ErrOut, "warning: %s: skipped %s\n", tr.Name, s)
	}
	if opts.Limit > 0 && opts.Limit < len(tr.Requests) {
		tr.Requests = tr.Requests[:opts.Limit]
	}
	bar := newProgress(opts.IO)
	p.Progress = bar.update
	var rep *replay.Report
	if opts.Target != "" {
		rep, err = runLive(ctx, opts, tr, p, base)
	} else {
		// An offline replay is one sequential loop: the connector's save goroutine only runs
		// while the loop waits for it, so a second processor adds wake-ups, not throughput
		// (measured in docs/perf/replay.md). It allocates far more than it keeps, so fewer
		// collections cost nothing. GOMAXPROCS in the environment still wins.
		if os.Getenv("GOMAXPROCS") == "" {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
		}
		defer debug.SetGCPercent(debug.SetGCPercent(400))
		rep, err = replay.Offline(ctx, tr, p, cfgs)
	}
	bar.done()
	if err != nil {
		return err
	}
	if opts.Plot != "" {
		if err := writePlot(opts.Plot, rep); err != nil {
			return err
		}
	}
	if err := cmdutil.Print(opts.IO, opts.OutputFormat, rep, func() cmdutil.Table { return rows(rep) }); err != nil {
		return err
	}
	return liveProblems(rep)
}

func readTrace(ctx context.Context, opts *Options) (*replay.Trace, error) {
	ro := replay.ReadOptions{Format: opts.Format, SkipBad: opts.SkipBad, Context: ctx}
	var tr *replay.Trace
	var err error
	if opts.Trace == "-" {
		tr, err = replay.ReadTrace("<stdin>", opts.IO.In, ro)
	} else {
		tr, err = replay.ReadTraceFile(opts.Trace, ro)
	}
	var te *replay.TraceError
	switch {
	case errors.As(err, &te):
		for _, l := range te.Lines {
			fmt.Fprintf(opts.IO.ErrOut, "%s: %s\n", te.Name, l)
		}
		return nil, cmdutil.ValidationErrorf("%s: %d malformed line(s); --skip-bad continues past them", te.Name, len(te.Lines))
	case errors.Is(err, replay.ErrMalformed):
		return nil, cmdutil.ValidationErrorf("%v", err)
	}
	return tr, err
}

func pct(f float64) string { return strconv.FormatFloat(100*f, 'f', 2, 64) + "%" }

func rows(rep *replay.Report) cmdutil.Table {
	if rep.Live != nil {
		return liveRows(rep)
	}
	t := cmdutil.Table{Header: []string{"RUN", "REQUESTS", "LOCAL", "POOL", "TOTAL", "RECOMPUTED", "HOLES", "EVICTED", "LOADED", "SAVED", "TTFT_P50", "BALANCE"}}
	for _, r := range rep.Runs {
		t.Rows = append(t.Rows, []string{
			r.Name, strconv.Itoa(r.Requests), pct(r.HitRate.Local), pct(r.HitRate.Pool), pct(r.HitRate.Total),
			strconv.FormatInt(r.Tokens.Recomputed, 10), strconv.FormatInt(r.Holes.Holes, 10),
			strconv.FormatInt(r.Pool.Evicted, 10), bytesText(r.Moved.LoadedBytes), bytesText(r.Moved.SavedBytes),
			strconv.FormatFloat(r.Latency.P50TTFTSec, 'f', 3, 64) + "s",
			strconv.FormatFloat(r.Balance.BusyMaxOverMean, 'f', 3, 64),
		})
	}
	return schedulerColumns(rep, t)
}

// schedulerColumns adds the scheduler model's counts when a run used it (--set scheduler=true).
func schedulerColumns(rep *replay.Report, t cmdutil.Table) cmdutil.Table {
	on := false
	for _, r := range rep.Runs {
		on = on || r.Scheduler != nil
	}
	if !on {
		return t
	}
	t.Header = append(t.Header, "ADMITTED", "DEFERRED", "WAITED", "RESERVED_PEAK", "PREEMPTED")
	for i, r := range rep.Runs {
		s := r.Scheduler
		if s == nil {
			t.Rows[i] = append(t.Rows[i], "-", "-", "-", "-", "-")
			continue
		}
		t.Rows[i] = append(t.Rows[i], strconv.FormatInt(s.Admissions, 10), strconv.FormatInt(s.Deferrals, 10),
			strconv.FormatInt(s.RequestsWaited, 10), strconv.FormatInt(s.PeakReservationsHeld, 10), strconv.FormatInt(s.Preemptions, 10))
	}
	return t
}

func liveRows(rep *replay.Report) cmdutil.Table {
	t := cmdutil.Table{Header: []string{"ENGINES", "REQUESTS", "LOCAL", "POOL", "TOTAL", "RECOMPUTED", "LOADED", "REQ/S", "P50", "P99", "READY", "SAVES", "FAILED_SAVES"}}
	d := rep.Live.Daemon
	// What the daemon's admin API could not tell is unknown, not 0.
	ready, saves, failed := "?", "?", "?"
	if d.Checked {
		ready, saves, failed = "yes", strconv.FormatInt(d.Saves, 10), strconv.FormatInt(d.FailedSaves, 10)
		if !d.ReadyAtStart || !d.ReadyAtEnd {
			ready = "no"
		}
	}
	for _, r := range rep.Runs {
		t.Rows = append(t.Rows, []string{
			strconv.Itoa(rep.Live.Engines), strconv.Itoa(r.Requests), pct(r.HitRate.Local), pct(r.HitRate.Pool), pct(r.HitRate.Total),
			strconv.FormatInt(r.Tokens.Recomputed, 10), bytesText(r.Moved.LoadedBytes),
			strconv.FormatFloat(rep.Live.RequestsPerSecond, 'f', 1, 64),
			strconv.FormatFloat(1000*rep.Live.P50RequestSec, 'f', 2, 64) + "ms",
			strconv.FormatFloat(1000*rep.Live.P99RequestSec, 'f', 2, 64) + "ms",
			ready, saves, failed,
		})
	}
	return t
}

func bytesText(n int64) string { return config.FormatSizeHuman(n) }

// progress draws a bar on standard error when it is a terminal.
type progress struct {
	w      io.Writer
	on     bool
	drawn  bool
	last   time.Time
	starts time.Time
}

func newProgress(s *cmdutil.IOStreams) *progress {
	return &progress{w: s.ErrOut, on: s.IsStderrTTY(), starts: time.Now()}
}

func (p *progress) update(done, total int) {
	if !p.on || total == 0 || (time.Since(p.last) < 100*time.Millisecond && done < total) {
		return
	}
	p.last = time.Now()
	const width = 30
	fill := done * width / total
	fmt.Fprintf(p.w, "\r[%s%s] %3d%% %d/%d requests %.1fs", strings.Repeat("=", fill), strings.Repeat(" ", width-fill),
		done*100/total, done, total, time.Since(p.starts).Seconds())
	p.drawn = true
}

func (p *progress) done() {
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
