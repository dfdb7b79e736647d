// Package serve implements `kvctl serve`, the connector daemon.
package serve

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/core/boundedio"
	"github.com/kvctl/kvctl/core/config"
	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/core/sysmem"
	"github.com/kvctl/kvctl/gpu"
	"github.com/kvctl/kvctl/pool"
)

// Options are the inputs of `kvctl serve`.
type Options struct {
	IO      *cmdutil.IOStreams
	Factory *cmdutil.Factory

	Socket           string
	AdminAddr        string
	AllowRemoteAdmin bool
	PoolBackend      string
	Pool             string
	PoolSize         string
	PoolPrefault     bool
	StagingBytes     string
	StatsInterval    time.Duration
	DrainTimeout     time.Duration
	MetricsAddr      string
	EngineMetricsTTL time.Duration
	CallChannelPoll  time.Duration
	// Cluster holds the mooncake backend's flags (cluster.go).
	Cluster config.ClusterKeys
	// Security holds the flags of security.go (--engine-group, --max-conns, ...).
	Security  config.ServeSecurity
	LogLevel  string
	LogFormat string
	// ConfigFile is the config file the flags were read from, if any; it is checked with the
	// validate-config loader before anything starts.
	ConfigFile string
	// DisaggConfig is TensorRT-LLM's disagg_config.yaml; when set, serve runs the disaggregated
	// front it describes instead of the connector daemon.
	DisaggConfig string
	// OtherKeys are the flag names of kvctl's other commands, which a shared config file may
	// hold: serve passes over them and still refuses any other unknown key.
	OtherKeys []string
	// CommandLine holds the flags given on the command line.
	CommandLine map[string]bool
	// Sources maps a flag set from the environment or the config file to where it came from,
	// so that a bad value is blamed on the right place.
	Sources map[string]string
	// Seams come from the Factory: MemAvailable reads available memory for the automatic pool
	// size (nil: the system's, from core/sysmem).
	cmdutil.Seams
	// Ready is called once the daemon accepts connections (tests use it).
	Ready func(daemon.Info)
}

// NewCmdServe returns `kvctl serve`. runF replaces the run function in tests.
func NewCmdServe(f *cmdutil.Factory, runF func(context.Context, *Options) error) *cobra.Command {
	opts := &Options{IO: f.IOStreams, Factory: f, Seams: f.Seams}
	def := config.DefaultServeConfig()
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the connector daemon: engines get prefix hits and KV pages over a local socket",
		Long: `Run kvctl's connector daemon. Inference engines register their KV layout and memory over a
unix socket (gRPC), ask it for prefix hits, and have it load and save KV pages between the pool
and their memory (GPU memory through pinned staging on a GPU host, shared memory elsewhere).

With no arguments it runs an embedded pool with the Mooncake master's semantics (leases,
watermark eviction, soft pins, groups), sized to a quarter of the available memory unless
--pool-size says otherwise. In a container the available memory is bounded by the cgroup
(v2 or v1) memory limit.

With --pool-backend mooncake it joins a Mooncake cluster instead: --master names the master's
RPC address and --metadata its HTTP metadata server; this host donates --pool-size of memory as
its segment, served to peers over TCP on --transfer-port and published under --host-address
(by default the local address of the route to the master). --mooncake-config reads those
settings from a TensorRT-LLM mooncake.json unchanged; flags win over it. Only protocol tcp is
spoken. Serve may start before its master: /readyz answers 503 until the segment is mounted,
and again while the master does not answer, with the reason in /v1/stats; every pool call an
engine waits for is bounded by --pool-timeout (a lookup past it answers miss).

An admin HTTP server (loopback only unless --allow-remote-admin) serves a status page at / (open
it in a browser: pool occupancy, hit rates, holes, load phases, engines), the Mooncake master's
read endpoints for the pool, /metrics (Prometheus), /v1/stats, /healthz and /readyz.
--metrics-addr opens a second listener, which may bind any address, serving only /metrics,
/healthz and /readyz: point Prometheus and kubelet probes there, never at the admin API.

With --disagg-config FILE it runs the disaggregated front instead of the daemon: an
OpenAI-compatible server (/v1/completions, /v1/chat/completions, /v1/messages, /v1/models,
/health, /metrics) that sends each request's context leg to a context server and its generation
leg to a generation server, as TensorRT-LLM's disagg_config.yaml describes them.

On SIGTERM or SIGINT it stops taking calls, flushes queued saves to the pool within
--drain-timeout, unmounts its segment (removing its metadata) and exits 0. An invalid config is refused before anything starts, with the
messages of kvctl validate-config.`,
		Example: `  # run on the embedded pool with the defaults
  kvctl serve

  # a 64 GiB pool, stats lines every 30 s, JSON logs
  kvctl serve --pool-size 64GiB --stats-interval 30s --log-format json

  # from a config file whose keys are these flag names
  kvctl serve --config /etc/kvctl/serve.yaml

  # join a Mooncake cluster, donating 64 GiB
  kvctl serve --pool-backend mooncake --master 10.0.0.5:50051 \
      --metadata http://10.0.0.5:8080/metadata --pool-size 64GiB --transfer-port 15000

  # the same from TensorRT-LLM's mooncake.json (protocol tcp, an HTTP metadata server)
  kvctl serve --pool-backend mooncake --mooncake-config /etc/trtllm/mooncake.json

  # the disaggregated OpenAI-compatible front for trtllm-serve context and generation servers
  kvctl serve --disagg-config disagg_config.yaml`,
		Args:        cobra.NoArgs,
		Annotations: map[string]string{cmdutil.OwnConfigCheck: "true"},
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.LogLevel, opts.LogFormat = f.LogLevel, f.LogFormat
			if f.Config != nil {
				opts.ConfigFile = f.Config.ConfigFileUsed()
			}
			opts.OtherKeys = cmdutil.AllFlagNames(cmd)
			opts.Sources = map[string]string{}
			opts.CommandLine = map[string]bool{}
			cmd.Flags().VisitAll(func(fl *pflag.Flag) {
				opts.CommandLine[fl.Name] = cmdutil.FromCommandLine(cmd, fl.Name)
				if src := cmdutil.FlagSource(cmd, fl.Name); src != "" {
					opts.Sources[fl.Name] = src
				}
			})
			if opts.Socket == "" {
				opts.Socket = engineapi.DefaultSocketPath(f.Getenv)
			} else if dir := filepath.Dir(opts.Socket); dir != "" {
				// An explicit socket's folder must exist: creating it silently would hide a typo.
				if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
					return cmdutil.ValidationErrorf("--socket %s: its folder %s does not exist; create it or pick another path", opts.Socket, dir)
				}
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return runServe(cmd.Context(), opts)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&opts.Socket, config.ServeKeySocket, "", "engine API unix socket (default $XDG_RUNTIME_DIR/kvctl/kvctl.sock, else /tmp/kvctl-UID/kvctl.sock)")
	fl.StringVar(&opts.AdminAddr, config.ServeKeyAdminAddr, def.AdminAddr, "admin HTTP `host:port`; empty turns it off")
	fl.BoolVar(&opts.AllowRemoteAdmin, config.ServeKeyAllowRemoteAdmin, false, "allow a non-loopback --admin-addr (the admin API has no authentication)")
	fl.StringVar(&opts.PoolBackend, config.ServeKeyPoolBackend, def.PoolBackend, "pool backend: embedded, or mooncake to join a Mooncake cluster")
	fl.StringVar(&opts.Pool, config.ServeKeyPool, "", "the pool of the mooncake backend: file://PATH/pool.json or host:port")
	fl.StringVar(&opts.PoolSize, config.ServeKeyPoolSize, "auto", "memory this host gives the pool (the embedded pool, or its Mooncake segment), e.g. 64GiB; auto is a quarter of available memory")
	fl.BoolVar(&opts.PoolPrefault, config.ServeKeyPoolPrefault, false, "make the embedded pool's memory resident at start, so that no save pays the first touch of pool memory (the pool then holds all of --pool-size from the start)")
	fl.StringVar(&opts.StagingBytes, config.ServeKeyStagingBufferBytes, config.FormatSize(def.StagingBufferBytes), "default pinned host staging per direction for an engine rank, split evenly over its async load workers; the node memory check counts it")
	cmdutil.DurationVar(fl, &opts.StatsInterval, config.ServeKeyStatsInterval, 0, "log prefix-hole and load stats at most this often (0 = off; metrics are always exported, but the CPU time of each load phase is only counted while this is set)")
	cmdutil.DurationVar(fl, &opts.DrainTimeout, config.ServeKeyDrainTimeout, def.DrainTimeout, "how long a shutdown waits for queued saves")
	fl.StringVar(&opts.MetricsAddr, config.ServeKeyMetricsAddr, "", "metrics and health listener `host:port` serving only /metrics, /healthz and /readyz (any address; empty turns it off)")
	cmdutil.DurationVar(fl, &opts.EngineMetricsTTL, config.ServeKeyEngineMetricsTTL, def.EngineMetricsRetention, "how long the per-rank metric series of an engine that left are still exported")
	cmdutil.DurationVar(fl, &opts.CallChannelPoll, config.ServeKeyCallChannelPoll, 0, "how long a call channel keeps polling for an engine's next call before it sleeps, so a burst of calls skips the kernel's wake-ups (0 = 200µs with 4 or more CPUs, else none; negative = none; at most 10ms)")
	fl.StringVar(&opts.DisaggConfig, FlagDisaggConfig, "", "run the disaggregated front described by TensorRT-LLM's disagg_config.yaml `FILE` instead of the daemon")
	addClusterFlags(fl, &opts.Cluster)
	addSecurityFlags(cmd, opts)
	_ = cmd.RegisterFlagCompletionFunc(config.ServeKeyPoolBackend, cobra.FixedCompletions(pool.Names(), cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// serveConfig gathers the effective settings in the config package's form, so that they are
// checked by the same rules as a config file.
func (o *Options) serveConfig() (config.ServeConfig, config.Diagnostics) {
	s := config.ServeConfig{
		Socket: o.Socket, AdminAddr: o.AdminAddr, AllowRemoteAdmin: o.AllowRemoteAdmin,
		PoolBackend: o.PoolBackend, Pool: o.Pool, PoolSize: o.PoolSize, PoolPrefault: o.PoolPrefault,
		LogLevel: o.LogLevel, LogFormat: o.LogFormat, StatsInterval: o.StatsInterval, DrainTimeout: o.DrainTimeout,
		MetricsAddr: o.MetricsAddr, EngineMetricsRetention: o.EngineMetricsTTL, CallChannelPoll: o.CallChannelPoll,
		ClusterKeys:   o.Cluster,
		ServeSecurity: o.Security,
	}
	var diags config.Diagnostics
	n, err := config.ParseSize(o.StagingBytes, true)
	if err != nil {
		diags = append(diags, config.Diagnostic{Path: config.ServeKeyStagingBufferBytes, Severity: config.SeverityError, Message: err.Error()})
	}
	s.StagingBufferBytes = n
	return s, diags
}

func report(opts *Options, diags config.Diagnostics) error {
	for _, d := range diags {
		if opts.LogFormat == "json" {
			lvl := slog.LevelWarn
			if d.Severity == config.SeverityError {
				lvl = slog.LevelError
			}
			opts.Factory.Logger().Log(context.Background(), lvl, "config: "+d.Message, "file", d.File, "line", d.Line, "column", d.Column, "key", d.Path, "hint", d.Hint)
			continue
		}
		fmt.Fprintf(opts.IO.ErrOut, "%s\n", d.String())
	}
	if diags.HasErrors() {
		return cmdutil.ValidationErrorf("invalid configuration (%d errors); nothing was started", len(diags.Errors()))
	}
	return nil
}

// runServe checks the configuration, starts the daemon and serves until ctx is cancelled.
func runServe(ctx context.Context, opts *Options) error {
	if opts.DisaggConfig != "" {
		return runDisagg(ctx, opts)
	}
	if opts.ConfigFile != "" {
		data, err := boundedio.ReadFile(ctx, opts.ConfigFile, boundedio.MaxConfigBytes)
		if err != nil {
			return err
		}
		_, diags := config.Load(opts.ConfigFile, data, config.LoadOptions{Kind: config.KindServe, OtherKeys: opts.OtherKeys})
		if err := report(opts, diags); err != nil {
			return err
		}
	}
	sc, diags := opts.serveConfig()
	memAvail, memSource := opts.MemAvailable, "test"
	if memAvail == nil {
		mi := sysmem.System()
		memAvail, memSource = mi.Available, mi.Source()
	}
	inv, _ := gpu.Discover()
	plan, pdiags := sc.Resolve(config.ResolveOptions{MemAvailable: memAvail, MemSource: memSource, GPUs: len(inv.GPUs)})
	diags = append(diags, pdiags...)
	for i, d := range diags {
		if src := opts.Sources[d.Path]; src != "" && d.File == "" {
			diags[i].Message += " (set by " + src + ")"
		}
	}
	if err := report(opts, diags); err != nil {
		return usageIfFlag(opts, diags, err)
	}
	log := opts.Factory.Logger()
	if sc.AllowRemoteAdmin && sc.AdminAddr != "" {
		log.Warn(config.RemoteAdminWarning, "admin_addr", sc.AdminAddr)
	}
	if plan.AutoSized {
		log.Debug("pool sized automatically", "pool", config.FormatSizeHuman(plan.PoolBytes),
			"available", config.FormatSizeHuman(int64(min(plan.MemAvailable, 1<<62))), "available_from", memSource)
	}
	for _, w := range plan.Warnings {
		log.Warn(w.Msg, w.Args...)
	}
	backend, err := buildBackend(ctx, plan, log)
	if err != nil {
		return err
	}
	d, err := daemon.New(daemon.Config{
		Socket:           sc.Socket,
		AdminAddr:        sc.AdminAddr,
		AllowRemoteAdmin: sc.AllowRemoteAdmin,
		MetricsAddr:      sc.MetricsAddr,
		Backend:          backend,
		PoolTimeout:      sc.PoolTimeout,
		Defaults: connector.Options{
			StagingBufferBytes: sc.StagingBufferBytes,
			StatsInterval:      sc.StatsInterval,
		},
		DrainTimeout:          sc.DrainTimeout,
		EngineSeriesRetention: sc.EngineMetricsRetention,
		Logger:                log,
		Version:               opts.Factory.Version,
		Commit:                opts.Factory.Commit,
		EngineGroup:           sc.EngineGroup,
		MaxConns:              sc.MaxConns,
		AdminGrantsLeases:     sc.AdminGrantsLeases,
		AdminLeaseRate:        sc.AdminLeaseRate,
		AdminPprof:            sc.AdminPprof,
		DescriptorTTL:         sc.DescriptorTTL,
		MaxTrackedTokens:      sc.MaxTrackedTokens,
		CallChannelPoll:       sc.CallChannelPoll,
		Device:                gpu.CUDA{},
	})
	if err != nil {
		if c, ok := backend.Pool.(io.Closer); ok {
			_ = c.Close()
		}
		return cmdutil.ValidationErrorf("%v", err)
	}
	err = d.Run(ctx, func(info daemon.Info) {
		banner(opts, info, inv)
		if opts.Ready != nil {
			opts.Ready(info)
		}
	})
	if err != nil {
		return err
	}
	return nil
}

// usageIfFlag makes err a usage error (exit 2) when a value given as a flag, or as the flag's
// KVCTL_* variable, is among the errors: a bad flag is a usage error in every command, a bad
// config file an invalid configuration (exit 3).
func usageIfFlag(opts *Options, diags config.Diagnostics, err error) error {
	for _, d := range diags.Errors() {
		if d.File == "" && (opts.CommandLine[d.Path] || strings.HasPrefix(opts.Sources[d.Path], cmdutil.EnvPrefix+"_")) {
			return &cmdutil.FlagError{Err: fmt.Errorf("invalid --%s: %s", d.Path, d.Message)}
		}
	}
	return err
}

func banner(opts *Options, info daemon.Info, inv gpu.Inventory) {
	version := opts.Factory.Version
	if version == "" {
		version = "dev"
	}
	gpus := "none"
	if len(inv.GPUs) > 0 {
		names := make([]string, 0, len(inv.GPUs))
		for _, g := range inv.GPUs {
			names = append(names, fmt.Sprintf("%d:%s", g.Index, g.Name))
		}
		gpus = strings.Join(names, ", ")
	} else if inv.NoGPUReason != "" {
		gpus = "none (" + inv.NoGPUReason + ")"
	}
	admin := info.AdminAddr
	if admin == "" {
		admin = "off"
	} else {
		admin = "http://" + admin
	}
	metrics := "off"
	if info.MetricsAddr != "" {
		metrics = "http://" + info.MetricsAddr + "/metrics"
	}
	if opts.LogFormat == "json" {
		// One record, so that every line on stderr is JSON.
		args := []any{"version", version, "pool_backend", info.Backend.Kind, "pool_bytes", info.PoolBytes,
			"gpus", gpus, "socket", info.Socket, "admin", admin, "metrics", metrics}
		if info.Backend.Kind == statsapi.BackendMooncake {
			args = append(args, "master", info.Backend.Master, "segment", info.Backend.Segment)
		}
		opts.Factory.Logger().Info("kvctl serve ready", args...)
		return
	}
	if info.Backend.Kind == statsapi.BackendMooncake {
		fmt.Fprintf(opts.IO.ErrOut, "kvctl serve %s\n%s  gpus     %s\n  socket   %s\n  admin    %s\n  metrics  %s\n%s",
			version, clusterBanner(info.Backend), gpus, info.Socket, admin, metrics, waitMessage(info.Backend))
		return
	}
	fmt.Fprintf(opts.IO.ErrOut, "kvctl serve %s\n  pool     embedded, %s\n  gpus     %s\n  socket   %s\n  admin    %s\n  metrics  %s\n  ready\n",
		version, config.FormatSize(info.PoolBytes), gpus, info.Socket, admin, metrics)
}
