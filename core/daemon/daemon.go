package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/core/stats"
	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/embedded"
)

// Config configures a Daemon. Zero values take the defaults noted.
type Config struct {
	// Socket is the engine socket's path (engineapi.DefaultSocketPath when empty).
	Socket string
	// AdminAddr is the admin HTTP listener's host:port; "" disables it. An address that is not
	// loopback is refused unless AllowRemoteAdmin is set.
	AdminAddr        string
	AllowRemoteAdmin bool
	// MetricsAddr is the metrics and health listener's host:port (any address); "" disables
	// it. It serves only /metrics, /healthz and /readyz.
	MetricsAddr string

	// Pool holds the embedded pool's options (embedded.DefaultOptions when zero); it is read
	// only when Backend is nil.
	Pool embedded.Options
	// Backend, when set, is the pool to serve from instead of an embedded one (a Mooncake
	// cluster). The daemon closes it on shutdown.
	Backend *Backend
	// PoolTimeout bounds every pool call an engine waits for (DefaultPoolTimeout when zero).
	PoolTimeout time.Duration
	// HealthInterval is how often a backend that can be pinged is (DefaultHealthInterval).
	HealthInterval time.Duration
	// MountRetry is the first wait between tries to mount the segment; it doubles up to 10 s
	// (DefaultMountRetry when zero).
	MountRetry time.Duration

	// Defaults fills the connector settings an engine leaves zero in Register.
	Defaults connector.Options

	// DrainTimeout bounds the drain on shutdown (30 s when zero).
	DrainTimeout time.Duration
	// Device opens engine memory on an accelerator (CUDA IPC handles and CUDA file
	// descriptors); the command that starts the daemon passes the gpu package's. Nil refuses
	// such memory at Register (kvmem.ErrNoDevice); shared memory needs nothing.
	Device kvmem.DeviceOpener

	Logger  *slog.Logger
	Version string
	// Commit is the VCS revision the binary was linked with (kvctl version's); it labels
	// kvctl_build_info. Empty takes the Go toolchain's stamp.
	Commit string

	// EngineSeriesRetention is how long the per-engine metric series of an engine that left
	// are still exported (DefaultEngineSeriesRetention when zero).
	EngineSeriesRetention time.Duration

	// Security settings (see limits.go and docs/SECURITY.md).

	// EngineGroup names a group (name or numeric id) whose members may use the engine socket and
	// the descriptor channel besides the daemon's own uid; "" admits only the daemon's uid.
	EngineGroup string
	// MaxConns caps the concurrent connections of each listener (DefaultMaxConns when zero).
	MaxConns int
	// AdminGrantsLeases lets the admin API's /query_key grant the read lease it grants on a
	// Mooncake master; off, /query_key answers without touching the pool's leases.
	AdminGrantsLeases bool
	// AdminLeaseRate bounds the /query_key lease grants per second when AdminGrantsLeases is on
	// (DefaultAdminLeaseRate when zero).
	AdminLeaseRate float64
	// AdminPprof serves Go's runtime profiles under /debug/pprof/ on the admin listener
	// (pprof.go); off, those paths answer 404 naming the flag.
	AdminPprof bool
	// DescriptorTTL is how long a descriptor sent over the side channel waits to be claimed
	// (engineapi.DefaultHeldFDTTL when zero).
	DescriptorTTL time.Duration
	// Limits bounds what one registration and one request may ask for (DefaultLimits when zero).
	Limits Limits
	// MaxTrackedTokens is the daemon-wide budget of tokens all scheduler ranks may track over
	// their unfinished requests (see budget.go); a connection may take half of it and a uid
	// three quarters. 0 derives it from the memory available at start.
	MaxTrackedTokens int64
	// CallChannelWriteTimeout bounds how long one reply on a call channel may wait for the
	// engine to read (DefaultCallChannelWriteTimeout when zero); past it the channel is closed.
	CallChannelWriteTimeout time.Duration
	// CallChannelPoll is how long a call channel's reader keeps polling its socket for the
	// engine's next request after a request arrived or a reply was written (and while a call
	// runs, for up to callPollBusyFactor times as long) before it sleeps until one comes:
	// DefaultCallChannelPoll when zero, no polling when negative.
	CallChannelPoll time.Duration
	// FaultLogInterval is the window over which repeated warnings are folded into one line with
	// a count (DefaultFaultLogInterval when zero).
	FaultLogInterval time.Duration
}

// DefaultDrainTimeout is how long a shutdown waits for queued saves.
const DefaultDrainTimeout = 30 * time.Second

// Info describes a running daemon, for the startup banner.
type Info struct {
	Socket    string
	FDSocket  string
	AdminAddr string
	// MetricsAddr is the metrics listener's address; "" when there is none.
	MetricsAddr string
	PoolBytes   int64
	// Backend describes the pool backend.
	Backend statsapi.BackendInfo
}

// Daemon is a running `kvctl serve`.
type Daemon struct {
	cfg   Config
	log   *slog.Logger
	pool  pool.Pool // the backend's pool behind the guard
	guard *guardedPool
	// backend is what the daemon serves from; bstate is what the supervisor knows of it.
	backend Backend
	bstate  backendState
	fds     *engineapi.FDRegistry
	reg     *prometheus.Registry
	start   time.Time

	mu      sync.RWMutex
	engines map[string]*engine
	// retired holds the stats of engines that have unregistered, so the daemon's totals
	// count every engine it ever served.
	retiredHoles stats.HoleStats
	retiredLoads stats.LoadTotals

	ready    atomic.Bool
	draining atomic.Bool
	calls    callCounters
	met      *daemonMetrics

	sec *security

	svc   *service
	chans *callChannels
}

// New builds a daemon and its embedded pool. It listens on nothing until Run.
func New(cfg Config) (*Daemon, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	sec, err := newSecurity(&cfg)
	if err != nil {
		return nil, err
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}
	if len(cfg.Pool.Segments) == 0 {
		cfg.Pool = embedded.DefaultOptions()
	}
	if cfg.AdminAddr != "" && !cfg.AllowRemoteAdmin {
		if err := checkLoopback(cfg.AdminAddr); err != nil {
			return nil, err
		}
	}
	if cfg.PoolTimeout <= 0 {
		cfg.PoolTimeout = DefaultPoolTimeout
	}
	if cfg.HealthInterval <= 0 {
		cfg.HealthInterval = DefaultHealthInterval
	}
	if cfg.MountRetry <= 0 {
		cfg.MountRetry = DefaultMountRetry
	}
	var backend Backend
	if cfg.Backend != nil {
		if cfg.Backend.Pool == nil {
			return nil, errors.New("backend without a pool")
		}
		backend = *cfg.Backend
	} else {
		pl, err := embedded.NewEmbedded(cfg.Pool)
		if err != nil {
			return nil, fmt.Errorf("embedded pool: %w", err)
		}
		backend = Backend{Pool: pl, Info: embedded.Info(cfg.Pool)}
	}
	d := &Daemon{
		cfg:     cfg,
		log:     cfg.Logger,
		backend: backend,
		fds:     engineapi.NewFDRegistryWith(engineapi.FDRegistryOptions{TTL: cfg.DescriptorTTL}),
		reg:     prometheus.NewRegistry(),
		start:   time.Now(),
		engines: map[string]*engine{},
		sec:     sec,
	}
	d.calls.register(d.reg)
	d.svc = &service{d: d}
	d.chans = newCallChannels(d, d.reg)
	d.guard = newGuardedPool(backend.Pool, cfg.PoolTimeout, d.reg)
	d.pool = d.guard
	d.reg.MustRegister(newHealthCollector(backend.Pool))
	d.met = newDaemonMetrics(d, cfg.EngineSeriesRetention)
	insp, _ := backend.Pool.(mooncake.Inspector)
	d.met.register(d.reg, insp, cfg.Version, cfg.Commit)
	return d, nil
}

// Pool is the daemon's embedded pool, or nil when it serves from another backend (see
// Backend).
func (d *Daemon) Pool() *embedded.Embedded {
	e, _ := d.backend.Pool.(*embedded.Embedded)
	return e
}

// Backend is the pool backend the daemon serves from, unwrapped.
func (d *Daemon) Backend() Backend { return d.backend }

func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("admin address %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("admin address %q is not loopback: the admin API has no authentication; pass --allow-remote-admin to serve it there anyway", addr)
	}
	return nil
}

// Run listens on the engine socket, its descriptor side channel and the admin address, calls
// ready once all three accept, and serves until ctx is done. Then it drains: new calls are
// refused, every engine's queued saves are flushed within DrainTimeout, and the pool is closed.
func (d *Daemon) Run(ctx context.Context, ready func(Info)) error {
	socket := d.cfg.Socket
	if socket == "" {
		return errors.New("no engine socket path")
	}
	// The folded warnings' last counts are written on the way out.
	defer d.sec.stop()
	b := d.sec.budget
	d.log.Debug("tracked request budget", "tokens", b.total, "per_connection", b.perConn, "per_uid", b.perUID, "from", b.derived)
	ln, fdln, adminLn, err := d.listen(ctx, socket)
	if err != nil {
		return err
	}

	metricsLn, err := d.listenMetrics(ctx)
	if err != nil {
		_ = ln.Close()
		_ = fdln.Close()
		if adminLn != nil {
			_ = adminLn.Close()
		}
		return err
	}

	gs := grpc.NewServer(append(engineapi.ServerOptions(),
		grpc.ConnectionTimeout(EngineHandshakeTimeout),
		grpc.Creds(peerCreds{}),
		grpc.ChainUnaryInterceptor(d.intercept),
		grpc.StatsHandler(&connTracker{ended: d.connEnded}),
	)...)
	enginepb.RegisterEngineServer(gs, d.svc)

	var wg sync.WaitGroup
	errc := make(chan error, 4)
	serveCtx, stopServe := context.WithCancel(context.Background())
	defer stopServe()
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := gs.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			errc <- fmt.Errorf("engine socket: %w", err)
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := d.fds.Serve(serveCtx, fdln); err != nil {
			errc <- err
		}
	}()
	var hs *http.Server
	if adminLn != nil {
		hs = d.adminServer()
		if g, ok := adminLn.(*guardedListener); ok {
			g.evictIdleHTTP(hs)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := hs.Serve(adminLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("admin http: %w", err)
			}
		}()
	}

	metricsSrv := d.serveMetricsListener(metricsLn, &wg, errc)
	wg.Add(1)
	go func() { defer wg.Done(); d.met.runHistory(serveCtx) }()

	info := Info{Socket: socket, FDSocket: engineapi.FDSocketPath(socket), PoolBytes: d.backend.Info.SegmentBytes, Backend: d.backend.Info}
	if adminLn != nil {
		info.AdminAddr = adminLn.Addr().String()
	}
	if metricsLn != nil {
		info.MetricsAddr = metricsLn.Addr().String()
	}
	// An embedded pool is ready at once; a remote one once its segment is mounted.
	superviseCtx, stopSupervise := context.WithCancel(ctx)
	defer stopSupervise()
	supervised := make(chan struct{})
	if d.backendIsRemote() {
		go func() { defer close(supervised); d.supervise(superviseCtx) }()
	} else {
		d.supervise(superviseCtx)
		close(supervised)
	}
	if ready != nil {
		ready(info)
	}

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	d.draining.Store(true)
	stopSupervise()
	<-supervised
	d.ready.Store(false)
	d.log.Info("draining", "engines", d.engineCount(), "deadline", d.cfg.DrainTimeout)

	drainCtx, cancel := context.WithTimeout(context.Background(), d.cfg.DrainTimeout)
	defer cancel()
	// Calls in flight finish first (GracefulStop waits for them, closeAll for those on call
	// channels), then the workers flush.
	d.chans.closeAll(drainCtx)
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-drainCtx.Done():
		gs.Stop()
	}
	drainErr := d.closeEngines(drainCtx)
	stopServe()
	d.fds.Close()
	if hs != nil {
		_ = hs.Shutdown(drainCtx)
	}
	if metricsSrv != nil {
		_ = metricsSrv.Shutdown(drainCtx)
	}
	wg.Wait()
	if err := d.unmount(drainCtx); err != nil {
		drainErr = errors.Join(drainErr, err)
	}
	if err := d.closeBackend(); err != nil && drainErr == nil {
		drainErr = err
	}
	if drainErr != nil {
		d.log.Error("drain incomplete", "err", drainErr)
	} else {
		d.log.Info("stopped cleanly")
	}
	return errors.Join(runErr, drainErr)
}

// backendIsRemote reports whether the backend has a segment to mount or a master to ping.
func (d *Daemon) backendIsRemote() bool {
	_, m := d.backend.Pool.(Mounter)
	_, p := d.backend.Pool.(Pinger)
	return m || p
}

func (d *Daemon) engineCount() int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return len(d.engines)
}

func (d *Daemon) closeEngines(ctx context.Context) error {
	d.mu.Lock()
	engines := d.engines
	d.engines = map[string]*engine{}
	d.mu.Unlock()
	var errs []error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, e := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.close(ctx); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("engine %s: %w", name, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// retire folds an engine's final stats into the daemon's totals.
func (d *Daemon) retire(e *engine) {
	d.met.retire(e)
	h, l := e.reporter.HoleTotals(), e.reporter.LoadTotals()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.retiredHoles.Add(h)
	d.retiredLoads.Merge(l)
}
