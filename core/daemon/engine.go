package daemon

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/config"
	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/hostmem"
	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/core/stats"
)

// engine is one registered engine rank.
type engine struct {
	name      string
	modelKey  string
	shard     string
	role      connector.Role
	scheduler *connector.Scheduler // nil on a rank without the scheduler adapter
	worker    *connector.Worker
	mover     kvmem.Mover
	reporter  *stats.Reporter
	memFile   *os.File
	since     time.Time
	layout    kvmem.Layout
	conn      uint64 // the engine connection it registered over
	rank      int
	deploy    deployment
	offers    *offers // pages its BuildMeta calls offered (scheduler ranks)

	arenaMu     sync.Mutex
	arena       *promptArena // its prompt arena, nil when it registered none
	arenaClosed bool

	// order is the engine's CUDA event opened for stream ordering, nil when it registered none
	// (it then synchronises before its calls: docs/ENGINE_API.md, "Stream ordering").
	order kvmem.StreamOrder

	// attach holds the scheduler token and the connections attached to the scheduler
	// (attach.go); nil on a rank without the scheduler adapter.
	attach *schedulerAttachments
}

// checkTransfers refuses metadata that names a layer group or page slot outside the engine's
// registered layout, before it reaches the worker (whose errors are kept: a malformed call
// must not break the engine's later passes).
func (e *engine) checkTransfers(m connector.Metadata) error {
	for _, set := range [][]connector.RequestTransfers{m.Loads, m.Saves, m.AsyncLoads} {
		for _, t := range set {
			for _, p := range t.Pages {
				if p.Group < 0 || p.Group >= len(e.layout.Groups) {
					return fmt.Errorf("request %s: layer group %d is not in the registered layout (%d groups)", t.RequestID, p.Group, len(e.layout.Groups))
				}
				if slots := e.layout.Groups[p.Group].Slots; p.Page < 0 || p.Page >= slots {
					return fmt.Errorf("request %s: page %d of layer group %d is outside the registered %d slots", t.RequestID, p.Page, p.Group, slots)
				}
			}
		}
	}
	return nil
}

func (e *engine) close(ctx context.Context) error {
	var errs []error
	if e.worker != nil {
		errs = append(errs, e.worker.Close(ctx))
	}
	if e.scheduler != nil {
		e.scheduler.Close()
	}
	errs = append(errs, e.closeArena())
	e.reporter.Flush()
	e.reporter.Unregister()
	if e.mover != nil {
		errs = append(errs, e.mover.Close())
	}
	if e.memFile != nil {
		errs = append(errs, e.memFile.Close())
	}
	if e.order != nil {
		errs = append(errs, e.order.Close())
	}
	return errors.Join(errs...)
}

type callCounters struct {
	calls  *prometheus.CounterVec
	errors *prometheus.CounterVec
}

func (c *callCounters) register(r prometheus.Registerer) {
	c.calls = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvctl_engine_calls_total", Help: "Engine API calls by method."}, []string{"method"})
	c.errors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvctl_engine_call_errors_total", Help: "Engine API calls that returned an error, by method and code."}, []string{"method", "code"})
	r.MustRegister(c.calls, c.errors)
}

// intercept counts every call and refuses new ones while the daemon drains.
func (d *Daemon) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	method := info.FullMethod[strings.LastIndexByte(info.FullMethod, '/')+1:]
	d.calls.calls.WithLabelValues(method).Inc()
	began := time.Now()
	defer func() { d.met.callDur.WithLabelValues(method).Observe(time.Since(began).Seconds()) }()
	if d.draining.Load() {
		d.calls.errors.WithLabelValues(method, codes.Unavailable.String()).Inc()
		return nil, status.Error(codes.Unavailable, "kvctl serve is shutting down")
	}
	resp, err := h(ctx, req)
	if err != nil {
		d.calls.errors.WithLabelValues(method, status.Code(err).String()).Inc()
	}
	return resp, err
}

// statusOf maps connector and mover errors to gRPC status codes an engine can branch on.
func statusOf(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok && status.Code(err) != codes.Unknown {
		return err
	}
	code := codes.Internal
	switch {
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, connector.ErrNotContextOnly), errors.Is(err, connector.ErrNoLayout),
		errors.Is(err, connector.ErrMisreportedRequest), errors.Is(err, connector.ErrFailedLoadsNotTaken),
		errors.Is(err, connector.ErrCannotTransfer):
		code = codes.FailedPrecondition
	case errors.Is(err, connector.ErrLoadFailed):
		code = codes.DataLoss
	case errors.Is(err, connector.ErrClosed):
		code = codes.Unavailable
	case errors.Is(err, kvmem.ErrBadPage), errors.Is(err, keys.ErrTokensShrank), errors.Is(err, connector.ErrBadKeyInputs):
		code = codes.InvalidArgument
	}
	return status.Error(code, err.Error())
}

func (d *Daemon) lookupEngine(ctx context.Context, name string) (*engine, error) {
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "no engine named: call Register first and pass its engine")
	}
	d.mu.RLock()
	e := d.engines[name]
	d.mu.RUnlock()
	if e == nil {
		return nil, status.Errorf(codes.NotFound, "engine %q is not registered", name)
	}
	if err := e.mayUse(ctx); err != nil {
		return nil, err
	}
	return e, nil
}

func (d *Daemon) schedulerOf(ctx context.Context, name string) (*connector.Scheduler, error) {
	e, err := d.lookupEngine(scheduling(ctx), name)
	if err != nil {
		return nil, err
	}
	if e.scheduler == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "engine %q registered without the scheduler adapter (scheduler = false)", name)
	}
	return e.scheduler, nil
}

func (d *Daemon) workerOf(ctx context.Context, name string) (*connector.Worker, error) {
	e, err := d.lookupEngine(ctx, name)
	if err != nil {
		return nil, err
	}
	return e.worker, nil
}

// register builds the connector halves for one engine rank.
func (d *Daemon) register(ctx context.Context, req *enginepb.RegisterRequest) (_ *engine, err error) {
	defer func() {
		if err != nil {
			// A refused Register frees the descriptor it named at once (not after the TTL).
			d.fds.Release(memToken(req))
		}
	}()
	conn := connOf(ctx)
	if err = engineapi.CheckAPIVersion(req); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "register: %v", err)
	}
	if req.GetEngine() == "" {
		return nil, status.Error(codes.InvalidArgument, "register: engine name is empty")
	}
	if err = d.sec.limits.checkRegister(req); err != nil {
		return nil, err
	}
	if n := d.engineCount(); n >= d.sec.limits.MaxEngines {
		return nil, status.Errorf(codes.ResourceExhausted, "register: %v: %d, the limit", errTooManyEngines, n)
	}
	layout, err := engineapi.LayoutFromPB(req.GetLayout())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "register: %v", err)
	}
	opts, err := d.optionsFor(req, layout)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "register: %v", err)
	}
	if err = checkEngineEvent(req); err != nil {
		return nil, err
	}

	e := &engine{name: req.GetEngine(), modelKey: req.GetModelKey(), shard: opts.Namespace.Shard(), role: opts.Role, since: time.Now(), layout: layout, conn: conn,
		rank:   opts.Namespace.Rank,
		deploy: deployment{namespace: req.GetNamespace(), model: req.GetModelKey(), world: opts.Namespace.WorldSize, uid: uidOf(ctx)}, offers: &offers{}}
	ok := false
	defer func() {
		if !ok {
			_ = e.close(context.Background())
		}
	}()

	reporter, err := stats.NewReporter(stats.ReporterOptions{
		Interval: opts.StatsInterval,
		Logger:   d.log.With("engine", e.name),
		Observer: d.met,
	})
	if err != nil {
		return nil, status.Errorf(codes.AlreadyExists, "register: stats for engine %q: %v", e.name, err)
	}
	e.reporter = reporter
	opts.Stats = reporter
	opts.Logger = d.log.With("engine", e.name)

	if !opts.Role.Transfers() {
		// No memory to fit, but the layout still names the pages later calls may use.
		if err = layout.Validate(math.MaxUint64); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "register: %v", err)
		}
	}
	if opts.Role.Transfers() {
		if err = layout.Validate(memSize(req)); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "register: %v", err)
		}
		h, f, herr := d.handleFor(req)
		if herr != nil {
			return nil, herr
		}
		e.memFile = f
		if e.mover, err = d.openMover(h, layout); err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "register: open engine memory: %v", err)
		}
	}
	if ev := req.GetEngineEvent(); ev != nil {
		eo, canOpen := d.cfg.Device.(kvmem.EventOpener)
		if !canOpen {
			return nil, status.Error(codes.FailedPrecondition, "register: engine_event: the daemon's device backend cannot open CUDA interprocess events")
		}
		if e.order, err = eo.OpenStreamOrder(int(ev.GetDevice()), ev.GetHandle()); err != nil {
			code := codes.FailedPrecondition
			if errors.Is(err, kvmem.ErrBadEvent) {
				code = codes.InvalidArgument
			}
			return nil, status.Errorf(code, "register: engine_event: %v", err)
		}
		order := e.order
		opts.Fence = func() connector.Fence {
			f, ferr := order.Fence()
			if ferr != nil {
				return failedFence{ferr}
			}
			return f
		}
	}
	if e.worker, err = connector.NewWorker(opts, d.connectorPool(), e.mover); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "register: %v", err)
	}
	if err = e.worker.RegisterLayout(layout); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "register: %v", err)
	}
	if req.GetScheduler() {
		if e.scheduler, err = connector.NewScheduler(opts, d.pool); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "register: %v", err)
		}
		if err = e.scheduler.RegisterLayout(layout); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "register: %v", err)
		}
		if opts.EarlyLoads {
			if err = connector.LinkEarlyLoads(e.scheduler, e.worker); err != nil {
				return nil, status.Errorf(codes.Internal, "register: %v", err)
			}
		}
		if e.attach, err = newSchedulerAttachments(); err != nil {
			return nil, status.Errorf(codes.Internal, "register: scheduler token: %v", err)
		}
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	if _, dup := d.engines[e.name]; dup {
		return nil, status.Errorf(codes.AlreadyExists, "engine %q is already registered; unregister it first", e.name)
	}
	d.engines[e.name] = e
	d.met.track(e)
	ok = true
	return e, nil
}

// checkEngineEvent refuses an engine event the daemon cannot use, before any device work: one
// with engine memory that is not on a CUDA device, on another device than that memory, or of
// the wrong size.
func checkEngineEvent(req *enginepb.RegisterRequest) error {
	ev := req.GetEngineEvent()
	if ev == nil {
		return nil
	}
	var device int32
	switch m := req.GetMemory().(type) {
	case *enginepb.RegisterRequest_CudaIpc:
		device = m.CudaIpc.GetDevice()
	case *enginepb.RegisterRequest_CudaFd:
		device = m.CudaFd.GetDevice()
	case *enginepb.RegisterRequest_SharedMemory:
		return status.Error(codes.InvalidArgument, "register: engine_event: shared-memory engines are ordered by the host (every call returns with its copies done; docs/ENGINE_API.md, \"Stream ordering\"); send no engine_event")
	default:
		return status.Error(codes.InvalidArgument, "register: engine_event: needs engine memory on a CUDA device (cuda_ipc or cuda_fd)")
	}
	if ev.GetDevice() != device {
		return status.Errorf(codes.InvalidArgument, "register: engine_event: the event is on device %d but the engine memory on device %d; both must be on one device", ev.GetDevice(), device)
	}
	if err := kvmem.CheckEventHandle(ev.GetHandle()); err != nil {
		return status.Errorf(codes.InvalidArgument, "register: engine_event: %v", err)
	}
	return nil
}

// failedFence is a fence that could not be taken: passing it fails with why.
type failedFence struct{ err error }

func (f failedFence) Wait(context.Context) error { return f.err }

// memToken is the side-channel token a registration names, "" when it names none.
func memToken(req *enginepb.RegisterRequest) string {
	switch m := req.GetMemory().(type) {
	case *enginepb.RegisterRequest_SharedMemory:
		return m.SharedMemory.GetFdToken()
	case *enginepb.RegisterRequest_CudaFd:
		return m.CudaFd.GetFdToken()
	}
	return ""
}

func memSize(req *enginepb.RegisterRequest) uint64 {
	switch m := req.GetMemory().(type) {
	case *enginepb.RegisterRequest_SharedMemory:
		return m.SharedMemory.GetSize()
	case *enginepb.RegisterRequest_CudaIpc:
		return m.CudaIpc.GetSize()
	case *enginepb.RegisterRequest_CudaFd:
		return m.CudaFd.GetSize()
	}
	return 0
}

// handleFor resolves the engine memory of a registration, claiming a descriptor from the side
// channel where one was sent.
func (d *Daemon) handleFor(req *enginepb.RegisterRequest) (kvmem.EngineHandle, *os.File, error) {
	switch m := req.GetMemory().(type) {
	case *enginepb.RegisterRequest_SharedMemory:
		f, err := d.fds.Claim(m.SharedMemory.GetFdToken())
		if err != nil {
			return kvmem.EngineHandle{}, nil, status.Errorf(codes.InvalidArgument, "register: shared memory: %v", err)
		}
		if err := checkSharedMemory(f, m.SharedMemory.GetSize()); err != nil {
			_ = f.Close()
			return kvmem.EngineHandle{}, nil, status.Errorf(codes.InvalidArgument, "register: shared memory: %v", err)
		}
		return kvmem.EngineHandle{Kind: kvmem.HandleSharedMemory, FD: int(f.Fd()), Size: m.SharedMemory.GetSize()}, f, nil
	case *enginepb.RegisterRequest_CudaFd:
		f, err := d.fds.Claim(m.CudaFd.GetFdToken())
		if err != nil {
			return kvmem.EngineHandle{}, nil, status.Errorf(codes.InvalidArgument, "register: CUDA memory: %v", err)
		}
		return kvmem.EngineHandle{Kind: kvmem.HandleCUDAFD, FD: int(f.Fd()), Size: m.CudaFd.GetSize(), Device: int(m.CudaFd.GetDevice())}, f, nil
	case *enginepb.RegisterRequest_CudaIpc:
		// Checked here, before any device is opened, so that a daemon without a GPU names the
		// malformed handle rather than the missing driver.
		if n := len(m.CudaIpc.GetHandle()); n != engineapi.CUDAIPCHandleBytes && n != engineapi.CUDAIPCHandleBytes+2 {
			return kvmem.EngineHandle{}, nil, status.Errorf(codes.InvalidArgument, "register: CUDA IPC handle of %d bytes: want %d (cudaIpcMemHandle_t) or %d (PyTorch's)", n, engineapi.CUDAIPCHandleBytes, engineapi.CUDAIPCHandleBytes+2)
		}
		return kvmem.EngineHandle{Kind: kvmem.HandleCUDAIPC, IPC: m.CudaIpc.GetHandle(), Offset: m.CudaIpc.GetOffset(), Size: m.CudaIpc.GetSize(), Device: int(m.CudaIpc.GetDevice())}, nil, nil
	}
	return kvmem.EngineHandle{}, nil, status.Error(codes.InvalidArgument, "register: a role that transfers KV needs engine memory (shared_memory, cuda_ipc or cuda_fd)")
}

// openMover opens the engine memory h names: shared memory with the host backend, device
// memory through the configured device backend.
func (d *Daemon) openMover(h kvmem.EngineHandle, layout kvmem.Layout) (kvmem.Mover, error) {
	switch {
	case h.Kind == kvmem.HandleSharedMemory:
		if h.Size > 1<<62 {
			return nil, fmt.Errorf("engine memory of %d bytes", h.Size)
		}
		return hostmem.NewMover(h.FD, int64(h.Size), layout)
	case h.OnDevice() && d.cfg.Device == nil:
		return nil, kvmem.ErrNoDevice
	case h.OnDevice():
		return d.cfg.Device.OpenMover(h, layout)
	}
	return nil, fmt.Errorf("unknown engine memory kind %q", h.Kind)
}

// registeredRecipe is the key recipe an engine's registration states, with the registration's
// defaults for what it leaves out (format trtllm, world size 1), and, for a vLLM format, the
// rank's vLLM keys (its recipe then names only the rank's shard and deployment). Its layer
// groups come with the layout the connector registers.
func registeredRecipe(req *enginepb.RegisterRequest, tokensPerBlock int) (keys.Recipe, *keys.VLLMRank, error) {
	rec := keys.Recipe{Format: keys.FormatTRTLLM, TokensPerBlock: tokensPerBlock, PromptLookahead: int(req.GetPromptLookahead())}
	world := int(req.GetWorldSize())
	if world == 0 {
		world = 1
	}
	rec.Namespace = keys.Namespace{Namespace: req.GetNamespace(), ModelKey: req.GetModelKey(), WorldSize: world, Rank: int(req.GetRank()), AttentionDP: req.GetAttentionDp()}
	if err := rec.Namespace.Validate(); err != nil {
		return rec, nil, err
	}
	if keys.IsVLLMScheme(req.GetFormat()) {
		v, err := vllmRank(req, tokensPerBlock, world)
		return rec, v, err
	}
	if req.GetKeyParams() != nil {
		return rec, nil, fmt.Errorf("key_params are the inputs of vLLM's formats (%s), not of format %q", strings.Join(keys.VLLMRankSchemes, ", "), req.GetFormat())
	}
	if req.GetFormat() != "" {
		f, err := keys.ParseFormat(req.GetFormat())
		if err != nil {
			return rec, nil, fmt.Errorf("%w (or one of vLLM's: %s)", err, strings.Join(keys.VLLMRankSchemes, ", "))
		}
		rec.Format = f
	}
	return rec, nil, nil
}

// vllmRank is the vLLM keys of a registration with a vLLM format: its key_params, with the
// rank and world size as vLLM's tensor-parallel rank and size.
func vllmRank(req *enginepb.RegisterRequest, tokensPerBlock, world int) (*keys.VLLMRank, error) {
	kp := req.GetKeyParams()
	if kp == nil {
		kp = &enginepb.KeyParams{}
	}
	if req.GetAttentionDp() {
		return nil, fmt.Errorf("format %s: attention DP is TensorRT-LLM's; a vLLM rank registers its tensor-parallel rank", req.GetFormat())
	}
	p := keys.Params{
		TokensPerBlock: tokensPerBlock, HashBlockSize: int(kp.GetHashBlockSize()),
		Model: kp.GetModel(), CachePrefix: kp.GetCachePrefix(), StoreNamespace: kp.GetStoreNamespace(),
		TPRank: int(req.GetRank()), TPSize: world, NumKVHeads: int(kp.GetNumKvHeads()), MLA: kp.GetMla(),
		PPRank: int(kp.GetPpRank()), PPSize: int(kp.GetPpSize()), PCPRank: int(kp.GetPcpRank()), PCPSize: int(kp.GetPcpSize()),
		DCPRank: int(kp.GetDcpRank()), DCPSize: int(kp.GetDcpSize()), VLLMExtraKeys: kp.GetExtraKeys(),
	}
	if kp.PythonHashSeed != nil {
		seed := kp.GetPythonHashSeed()
		p.PythonHashSeed = &seed
	}
	return keys.NewVLLMRank(req.GetFormat(), p)
}

// optionsFor merges a registration over the daemon's defaults.
func (d *Daemon) optionsFor(req *enginepb.RegisterRequest, layout kvmem.Layout) (connector.Options, error) {
	o := d.cfg.Defaults
	role := connector.Role(req.GetRole())
	if role == "" {
		role = connector.RoleBoth
	}
	o.Role = role
	rec, vllm, err := registeredRecipe(req, layout.TokensPerBlock)
	if err != nil {
		return o, err
	}
	o.Format, o.Namespace, o.PromptLookahead, o.TokensPerBlock = rec.Format, rec.Namespace, rec.PromptLookahead, rec.TokensPerBlock
	o.VLLM = vllm
	if v := req.GetTransferBatchSize(); v > 0 {
		o.TransferBatchSize = int(v)
	}
	if req.GetAsyncLoad() {
		o.AsyncLoad = true
	}
	if v := req.GetAsyncLoadWorkers(); v > 0 {
		o.AsyncLoadWorkers = int(v)
	}
	if v := req.GetSoftPinTtlMs(); v > 0 {
		o.SoftPinTTL = time.Duration(v) * time.Millisecond
	}
	if req.GetGroupBlocks() {
		o.GroupBlocks = true
	}
	if v := req.GetLocalReuseBackoff(); v != "" {
		o.LocalReuseBackoff = connector.ReuseBackoff(v)
	}
	if req.GetEarlyLoads() {
		switch {
		case o.Namespace.WorldSize > 1 || o.Namespace.AttentionDP:
			return o, fmt.Errorf("early_loads: needs a single rank (world_size 1, no attention_dp), got world_size %d, attention_dp %t: the allocation report reaches only the scheduler rank", o.Namespace.WorldSize, o.Namespace.AttentionDP)
		case !req.GetScheduler():
			return o, errors.New("early_loads: only the rank that registers the scheduler (scheduler = true) reports allocations")
		case req.GetEngineEvent() != nil:
			return o, errors.New("early_loads: an engine that sends engine_event orders the daemon's copies on its stream at StartLoad; early loads order by the host")
		case !role.Loads():
			return o, fmt.Errorf("early_loads: role %s makes no loads", role)
		}
		o.EarlyLoads = true
	}
	if req.GetSpeculativePrefill() {
		// Seed commits 5 and 14: the drafter allow-list validate-config applies. An engine
		// written before the drafter field states none.
		if k := req.GetDrafter(); k != "" {
			if err := config.CheckSpeculativePrefillDrafter(k); err != nil {
				return o, err
			}
		}
		o.SpeculativePrefill = true
	}
	if v := req.GetStagingBufferBytes(); v > 0 {
		if v > 1<<40 {
			return o, fmt.Errorf("staging_buffer_bytes %d is not a sane size", v)
		}
		o.StagingBufferBytes = int64(v)
	}
	return o, o.Validate()
}
