package connector

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"runtime/trace"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/core/stats"
	"github.com/kvctl/kvctl/pool"
)

// Worker is the connector half on one engine rank: it makes the loads and saves the metadata
// names, through the pool and the rank's Mover. Synchronous loads run on the caller's goroutine
// with the Mover it was given; saves run on one goroutine and asynchronous loads on
// AsyncLoadWorkers goroutines, each with a Clone of the Mover and its own staging. Its methods
// are safe for concurrent use, though an engine calls them from its executor in pass order.
//
// An error from a background goroutine, or a fatal load failure, is kept: every later
// StartLoad, WaitForSave and GetFinished returns it.
type Worker struct {
	opts    Options
	pool    pool.Pool
	mover   kvmem.Mover
	log     *slog.Logger
	stats   *stats.Reporter
	own     bool
	recover bool

	ctx    context.Context // cancelled when Close gives up waiting
	cancel context.CancelFunc

	mu        sync.Mutex
	geom      *geometry
	loadStage kvmem.Staging // synchronous loads
	// wokenAt is when WakeForLoads last woke the device (Unix nanoseconds), 0 once a StartLoad
	// took it.
	wokenAt atomic.Int64
	// syncLists are the synchronous loads' lists, kept between StartLoads (loadLists); a
	// StartLoad takes them, so one running beside another makes its own.
	syncLists   atomic.Pointer[loadLists]
	bound       Metadata
	failedSync  []string
	failedAsync []string
	submitted   []string
	outstanding map[string]int // request -> save jobs queued and not done
	// changed is closed (and replaced) each time a save job or an asynchronous load is done,
	// and when the worker keeps an error or closes: what WaitSaves and GetFinishedWait wait on.
	changed   chan struct{}
	closedGen map[string]bool // finished requests waiting for their saves
	announced map[string]bool // parked requests the engine said it started loading
	async     map[string]*asyncLoad
	protocol  protocolState
	kept      error
	closed    bool
	warnedTTL bool

	saveQ     *fifo[saveJob]
	saveMover kvmem.Mover
	saveStage kvmem.Staging

	// direct is the pool read in place by loads and directPut the pool saves write into in
	// place (nil: through staging); regs hold the registrations of its memory with the
	// mover's device, released by Close.
	direct    pool.Viewer
	directPut pool.Reserver
	regs      []io.Closer
	// keptStaging is staging whose unregistration failed at Close (seed commit 17): held, never
	// freed, since the device may still address it.
	keptStaging []kvmem.Staging

	asyncQ       *fifo[*asyncLoad]
	asyncMovers  []kvmem.Mover
	asyncStages  []kvmem.Staging
	asyncQueued  int
	asyncActive  int
	backgroundWG sync.WaitGroup

	// early holds the synchronous offers' loads started at their allocation report (early.go)
	// until StartLoad waits for them or the scheduler forgets the request; earlyQ feeds the
	// goroutine that makes them, started with the first. stageMu takes loadStage in turn
	// between StartLoad's own loads and those.
	early   map[string]*earlyLoad
	earlyQ  *fifo[*earlyLoad]
	stageMu sync.Mutex
}

type saveJob struct {
	fence Fence
	saves []RequestTransfers
}

// asyncLoad is one parked request's load.
type asyncLoad struct {
	id       string
	pages    []PageTransfer
	fence    Fence
	enqueued time.Time
	done     bool
	failed   bool
}

// NewWorker returns a worker over pool that copies pages with mover. mover may be nil for a
// role that transfers nothing. The worker does nothing until RegisterLayout.
func NewWorker(opts Options, pl pool.Pool, mover kvmem.Mover) (*Worker, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("connector options: %w", err)
	}
	opts = opts.withDefaults()
	if opts.Role.Transfers() && (pl == nil || mover == nil) {
		return nil, fmt.Errorf("a %s role needs a pool and a mover", opts.Role)
	}
	w := &Worker{
		opts:        opts,
		pool:        pl,
		mover:       mover,
		log:         opts.Logger,
		recover:     opts.recoverFailedLoads(),
		outstanding: map[string]int{},
		changed:     make(chan struct{}),
		closedGen:   map[string]bool{},
		announced:   map[string]bool{},
		async:       map[string]*asyncLoad{},
		early:       map[string]*earlyLoad{},
		protocol:    newProtocolState(),
	}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	if opts.Role.Loads() {
		r, own, err := reporterFor(opts)
		if err != nil {
			return nil, err
		}
		w.stats, w.own = r, own
	}
	return w, nil
}

// Declarations returns what the worker declares (the same as the scheduler's).
func (w *Worker) Declarations() Declarations { return declarations(w.opts) }

// RegisterLayout registers the engine's KV layout, allocates staging and starts the save and
// load goroutines the role needs. A capacity role registers nothing. Staging per direction is
// StagingBufferBytes; with asynchronous loads each load goroutine gets an even share of the
// load direction's budget and no synchronous load staging is made. A pool call never moves more
// pages than its staging has slots.
func (w *Worker) RegisterLayout(l kvmem.Layout) error {
	if !w.opts.Role.Transfers() {
		return nil
	}
	g, err := newGeometry(l, w.opts)
	if err != nil {
		return fmt.Errorf("register layout: %w", err)
	}
	ml := w.mover.Layout()
	if len(ml.Groups) != len(l.Groups) {
		return fmt.Errorf("register layout: %d layer groups, the mover's memory has %d", len(l.Groups), len(ml.Groups))
	}
	for i := range l.Groups {
		if ml.Groups[i].BytesPerPage() != l.Groups[i].BytesPerPage() || ml.Groups[i].ReplicatedBytesPerPage() != l.Groups[i].ReplicatedBytesPerPage() {
			return fmt.Errorf("register layout: layer group %d page size differs from the mover's memory", i)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	if w.geom != nil {
		return errors.New("register layout: a layout is already registered")
	}
	w.geom = g
	var cleanup []func()
	fail := func(err error) error {
		for _, f := range slices.Backward(cleanup) {
			f()
		}
		w.geom = nil
		return fmt.Errorf("register layout: %w", err)
	}
	// Staging geometry is kvmem.PlanStaging's (TensorRT-LLM's mooncake_store/staging.py, with the
	// asynchronous workers' shares of docs/SEED.md commit 17), so the
	// connector and the node budget agree on what is pinned.
	plan := func(label string, workers int) (kvmem.StagingPlan, error) {
		p, err := kvmem.PlanStaging(l, w.opts.TransferBatchSize, w.opts.StagingBufferBytes, workers)
		if err != nil {
			return p, fmt.Errorf("%s staging: %w", label, err)
		}
		for _, warn := range p.Warnings {
			w.log.Warn("mooncake-store " + label + " staging: " + warn)
		}
		return p, nil
	}
	staging := func(label string, m kvmem.Mover, p kvmem.StagingPlan) (kvmem.Staging, error) {
		st, err := m.NewStaging(p.SlotsPerWorker, int(p.SlotBytes))
		if err != nil {
			return nil, fmt.Errorf("%s staging: %w", label, err)
		}
		w.log.Info("mooncake-store staging", "direction", label, "slots", p.SlotsPerWorker, "slot_bytes", p.SlotBytes, "bytes", p.BytesPerWorker)
		cleanup = append(cleanup, func() { _ = st.Close() })
		return st, nil
	}
	clone := func() (kvmem.Mover, error) {
		m, err := w.mover.Clone()
		if err != nil {
			return nil, fmt.Errorf("clone mover: %w", err)
		}
		cleanup = append(cleanup, func() { _ = m.Close() })
		return m, nil
	}

	var loadStage, saveStage kvmem.Staging
	var saveMover kvmem.Mover
	var asyncMovers []kvmem.Mover
	var asyncStages []kvmem.Staging
	if w.opts.Role.Loads() {
		if w.opts.AsyncLoad {
			n := w.opts.AsyncLoadWorkers
			p, err := plan("async load", n)
			if err != nil {
				return fail(err)
			}
			for i := range n {
				m, err := clone()
				if err != nil {
					return fail(err)
				}
				st, err := staging(fmt.Sprintf("async load worker %d", i), m, p)
				if err != nil {
					return fail(err)
				}
				asyncMovers, asyncStages = append(asyncMovers, m), append(asyncStages, st)
			}
		} else {
			p, err := plan("load", 1)
			if err != nil {
				return fail(err)
			}
			if loadStage, err = staging("load", w.mover, p); err != nil {
				return fail(err)
			}
		}
	}
	if w.opts.Role.Saves() {
		p, err := plan("save", 1)
		if err != nil {
			return fail(err)
		}
		if saveMover, err = clone(); err != nil {
			return fail(err)
		}
		if saveStage, err = staging("save", saveMover, p); err != nil {
			return fail(err)
		}
	}

	if !w.opts.StagedTransfers {
		if regs, v := w.registerPoolMemory(); v != nil {
			w.direct, w.directPut, w.regs = v, v.(pool.Reserver), regs
		}
	}
	w.loadStage = loadStage
	if saveMover != nil {
		w.saveMover, w.saveStage, w.saveQ = saveMover, saveStage, newFIFO[saveJob]()
		w.backgroundWG.Add(1)
		go w.saveLoop()
	}
	if len(asyncMovers) > 0 {
		w.asyncMovers, w.asyncStages, w.asyncQ = asyncMovers, asyncStages, newFIFO[*asyncLoad]()
		for i := range asyncMovers {
			w.backgroundWG.Add(1)
			go w.asyncLoop(i)
		}
	}
	return nil
}

// registerPoolMemory registers every region of an in-process pool with the mover, so loads can
// copy pages straight from pool memory. It returns nil when the pool or the mover cannot do
// that, or when a registration fails (the failure is logged and loads use staging).
func (w *Worker) registerPoolMemory() ([]io.Closer, pool.Viewer) {
	v, ok := w.pool.(pool.Viewer)
	if !ok {
		return nil, nil
	}
	if _, ok = w.pool.(pool.Reserver); !ok {
		return nil, nil
	}
	r, ok := w.mover.(kvmem.HostRegistrar)
	if !ok {
		return nil, nil
	}
	var regs []io.Closer
	var total int
	for _, mem := range v.MemoryRegions() {
		c, err := r.RegisterHost(mem)
		if err != nil {
			for _, c := range regs {
				_ = c.Close()
			}
			w.log.Warn("mooncake-store transfers copy through staging: registering pool memory with the device failed", "err", err)
			return nil, nil
		}
		regs = append(regs, c)
		total += len(mem)
	}
	checks := "host"
	if _, pc := gpuPageChecks(v, w.mover); pc != nil {
		checks = "gpu"
	} else if pc, ok := w.mover.(kvmem.PageChecker); ok && pc.PageCheckError() != nil {
		w.log.Info("mooncake-store loads check pages on the host", "reason", pc.PageCheckError())
	}
	if _, host := w.mover.(kvmem.HostPages); host {
		if _, pieces := v.(pool.PieceCopier); pieces && !hostDestinationsOff && !hostSourcesOff {
			// Engine memory is host memory: the pool copies each page between its memory and the
			// engine's in its checked pass (hostDestinations, hostPieces, hostSources), so no
			// transfer reads pool memory in place.
			w.log.Info("mooncake-store transfers copy each page between pool and engine memory in one checked pass", "regions", len(regs))
			return regs, v
		}
	}
	w.log.Info("mooncake-store transfers use pool memory in place", "regions", len(regs), "registered_bytes", total, "page_checks", checks)
	return regs, v
}

// keep records err as the worker's error if it has none yet, and returns the kept error.
func (w *Worker) keep(err error) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.keepLocked(err)
}

func (w *Worker) keepLocked(err error) error {
	if w.kept == nil && err != nil {
		w.kept = err
		w.signalLocked()
	}
	return w.kept
}

// signalLocked wakes every waiter on w.changed.
func (w *Worker) signalLocked() {
	close(w.changed)
	w.changed = make(chan struct{})
}

// shutdownCancelled reports whether err is only the cancellation of work that Close gave up
// waiting for; it is not kept as a worker error.
func (w *Worker) shutdownCancelled(err error) bool {
	return errors.Is(err, context.Canceled) && w.ctx.Err() != nil
}

// Err returns the kept worker error, if any.
func (w *Worker) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.kept
}

// BindMeta binds one pass's metadata and queues its asynchronous loads. It never fails: what
// cannot be queued is kept for the next StartLoad or GetFinished to return.
func (w *Worker) BindMeta(meta Metadata) {
	w.mu.Lock()
	w.bound = Metadata{Loads: slices.Clone(meta.Loads), Saves: slices.Clone(meta.Saves), EarlyLoads: slices.Clone(meta.EarlyLoads)}
	for _, id := range meta.EarlyLoads {
		if ld := w.early[id]; ld != nil {
			ld.bound = true
		}
	}
	w.protocol.bind(meta)
	w.mu.Unlock()
	for _, t := range meta.AsyncLoads {
		_ = w.StartAsyncLoad(t.RequestID, t.Pages)
	}
}

// WakeForLoads wakes the mover's device (kvmem.DeviceWaker) when synchronous loads are bound,
// so that it switches to this process while the engine sends StartLoad; the next StartLoad, if
// it comes within wakeFresh, then does not wake it again. The daemon calls it once it has
// answered BindMeta. It does nothing for a worker that is closed or failed, or has no loads bound.
func (w *Worker) WakeForLoads() {
	w.mu.Lock()
	ok := w.usableLocked() == nil && len(w.bound.Loads)+len(w.bound.EarlyLoads) > 0 && w.loadStage != nil
	mover := w.mover
	w.mu.Unlock()
	if ok && wakeDevice(mover) {
		w.wokenAt.Store(time.Now().UnixNano())
	}
}

// DropBoundSaves removes the given requests' saves from the bound metadata, so a request whose
// load failed does not publish pages it never computed. It is idempotent. A request that is
// neither in the bound pass nor handed back by TakeFailedLoadRequests or
// TakeFailedAsyncLoadRequests since is a misreported id: nothing is dropped and a fail-stop
// error wrapping ErrMisreportedRequest is kept and returned.
func (w *Worker) DropBoundSaves(ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.usableLocked(); err != nil {
		return err
	}
	if err := w.protocol.checkDrop(ids); err != nil {
		return w.keepLocked(err)
	}
	w.dropBoundSavesLocked(ids)
	return nil
}

func (w *Worker) dropBoundSavesLocked(ids []string) {
	before := len(w.bound.Saves)
	var entries int
	w.bound.Saves = slices.DeleteFunc(w.bound.Saves, func(t RequestTransfers) bool {
		if slices.Contains(ids, t.RequestID) {
			entries += len(t.Pages)
			return true
		}
		return false
	})
	if len(w.bound.Saves) != before {
		w.log.Debug("mooncake-store dropped saves from this pass", "requests", ids, "entries", entries)
	}
}

// StartLoad makes the bound synchronous loads and waits for the bound early loads (early.go); a
// second call on the same metadata starts nothing. On a single rank or an attention-DP owner,
// a request that lost a page is handed back through TakeFailedLoadRequests and its bound saves
// are dropped; under tensor parallelism a lost page is fatal, since the engine already counts
// those tokens as computed.
func (w *Worker) StartLoad(ctx context.Context) error {
	w.mu.Lock()
	if err := w.usableLocked(); err != nil {
		w.mu.Unlock()
		return err
	}
	if len(w.failedSync) > 0 {
		err := w.keepLocked(fmt.Errorf("%w: StartLoad called again while requests %v, handed back by the previous StartLoad, were never taken; an engine that reads reports_failed_loads must call TakeFailedLoadRequests after every StartLoad",
			ErrFailedLoadsNotTaken, w.failedSync))
		w.mu.Unlock()
		return err
	}
	loads, early := w.bound.Loads, w.bound.EarlyLoads
	w.bound.Loads, w.bound.EarlyLoads = nil, nil
	geom, stage := w.geom, w.loadStage
	w.mu.Unlock()
	if len(loads)+len(early) == 0 {
		return nil
	}
	if geom == nil {
		return ErrNoLayout
	}
	if stage == nil {
		return w.keep(fmt.Errorf("%d synchronous loads bound but this worker makes no synchronous loads (role %s, async_load %t): %w", len(loads)+len(early), w.opts.Role, w.opts.AsyncLoad, ErrCannotTransfer))
	}
	var ids []string
	if len(loads) > 0 {
		var err error
		if ids, err = w.syncLoads(ctx, loads, stage); err != nil {
			return err
		}
	}
	if len(early) > 0 {
		failed, err := w.awaitEarly(ctx, early)
		if err != nil {
			return err
		}
		ids = append(ids, failed...)
	}
	if len(ids) == 0 {
		return nil
	}
	slices.Sort(ids)
	w.mu.Lock()
	w.failedSync = append(w.failedSync, ids...)
	w.dropBoundSavesLocked(ids)
	w.mu.Unlock()
	return nil
}

// syncLoads makes StartLoad's own loads and returns the requests that lost a page (a lost page
// is fatal where requests cannot restart).
func (w *Worker) syncLoads(ctx context.Context, loads []RequestTransfers, stage kvmem.Staging) ([]string, error) {
	var sample *stats.LoadSample
	if w.stats.Enabled() {
		// Thread CPU per phase only when the stats line that reports it is on: pinning the
		// goroutine to its thread costs a hand-off each time a load blocks on the pool.
		sample = &stats.LoadSample{ThreadCPU: w.opts.StatsInterval > 0}
		if sample.ThreadCPU {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
		}
	}
	began := time.Now()
	defer trace.StartRegion(ctx, "load").End()
	// The allocation fence: the engine's work issued before this call (a kernel still using
	// the destination pages) must be done before the first copy lands in them. It is taken now
	// and passed only once the pool is resolved, so the lookups overlap that work.
	var fence Fence
	if w.opts.Fence != nil {
		fence = w.opts.Fence()
	}
	if woke := w.wokenAt.Swap(0); woke == 0 || time.Since(time.Unix(0, woke)) > wakeFresh {
		wakeDevice(w.mover)
	}
	lists := w.syncLists.Swap(nil)
	if lists == nil {
		lists = new(loadLists)
	}
	m := sample.Start()
	err := w.resolveLoads(lists, loads)
	sample.End(stats.PhaseResolve, m)
	if err != nil {
		releaseFence(fence)
		return nil, w.keep(err)
	}
	if fence != nil {
		m := sample.Start()
		err = passFence(ctx, fence, w.mover)
		sample.End(stats.PhaseFence, m)
		if err != nil {
			return nil, w.keep(fmt.Errorf("load: allocation fence: %w", err))
		}
	}
	values := len(lists.items)
	w.stageMu.Lock()
	res, err := loadPages(ctx, w.pool, w.direct, w.mover, stage, w.opts.TransferBatchSize, lists, sample)
	w.stageMu.Unlock()
	w.syncLists.Store(keepLoadLists(lists, err))
	if sample != nil {
		sample.Transfer = time.Since(began)
		w.stats.RecordLoad(sample)
	}
	if err != nil {
		return nil, w.keep(fmt.Errorf("load: %w", err))
	}
	w.log.Debug("mooncake-store loaded pages", "rank", w.opts.Namespace.Rank, "pages", values-res.failedPages)
	if len(res.failed) == 0 {
		return nil, nil
	}
	ids := make([]string, 0, len(res.failed))
	for ri := range res.failed {
		ids = append(ids, loads[ri].RequestID)
	}
	if !w.recover {
		return nil, w.keep(w.fatalLoadError(res, len(ids)))
	}
	w.log.Warn("mooncake-store failed to load pages; the requests are restarted without the offered prefix",
		"rank", w.opts.Namespace.Rank, "failed_pages", res.failedPages, "requests", len(ids), "first_failure", res.firstMissing)
	return ids, nil
}

func (w *Worker) fatalLoadError(res loadResult, requests int) error {
	return fmt.Errorf("%w: mooncake-store rank %d failed to load %d page(s) of %d request(s) (first missing %q); their tokens were already reported as computed, and a tensor-parallel rank cannot restart a request alone",
		ErrLoadFailed, w.opts.Namespace.Rank, res.failedPages, requests, res.firstMissing)
}

// usableLocked returns the kept error, or ErrClosed after Close.
func (w *Worker) usableLocked() error {
	if w.kept != nil {
		return w.kept
	}
	if w.closed {
		return ErrClosed
	}
	return nil
}

// TakeFailedLoadRequests returns, and forgets, the requests whose synchronous load lost a page
// since the previous call. The engine frees their allocation and re-admits them.
func (w *Worker) TakeFailedLoadRequests() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := w.failedSync
	w.failedSync = nil
	w.protocol.handBack(ids)
	return ids
}

// TakeFailedAsyncLoadRequests returns, and forgets, the parked requests that GetFinished
// reported finished loading but whose load failed.
func (w *Worker) TakeFailedAsyncLoadRequests() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := w.failedAsync
	w.failedAsync = nil
	w.protocol.handBack(ids)
	return ids
}

// TakeSubmittedSaves returns, and forgets, the requests whose saves WaitForSave queued since
// the previous call: the save-confirmation report the scheduler's next BuildMeta takes.
func (w *Worker) TakeSubmittedSaves() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := w.submitted
	w.submitted = nil
	return ids
}

// WaitForSave queues the bound saves behind a fence on the engine's stream and returns; the
// save goroutine writes them once the fence is passed. Existing keys are skipped, never
// overwritten. It never blocks, so it has no use for a context; it takes one to match
// Rank.WaitForSave, whose remote form is a call.
func (w *Worker) WaitForSave(_ context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.usableLocked(); err != nil {
		return err
	}
	saves := w.bound.Saves
	w.bound.Saves = nil
	if len(saves) == 0 {
		return nil
	}
	if w.saveQ == nil {
		return w.keepLocked(fmt.Errorf("%d saves bound but this worker saves nothing (role %s): %w", len(saves), w.opts.Role, ErrCannotTransfer))
	}
	var fence Fence
	if w.opts.Fence != nil {
		fence = w.opts.Fence()
	}
	for _, t := range saves {
		w.outstanding[t.RequestID]++
		w.submitted = append(w.submitted, t.RequestID)
	}
	w.saveQ.push(saveJob{fence: fence, saves: saves})
	return nil
}

// WaitSaves returns once every save queued so far has been written or has failed, or when ctx
// ends. An engine never needs it (GetFinished reports each finished request's saves); a
// simulation in virtual time (replay's scheduler model) waits for saves before it lets time
// pass, so that what the pool holds at each eviction tick does not depend on how the save
// goroutine was scheduled.
func (w *Worker) WaitSaves(ctx context.Context) error {
	for {
		w.mu.Lock()
		n, changed := len(w.outstanding), w.changed
		w.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (w *Worker) saveLoop() {
	defer w.backgroundWG.Done()
	for {
		job, ok := w.saveQ.pop()
		if !ok {
			return
		}
		if err := w.save(job); err != nil && !w.shutdownCancelled(err) {
			_ = w.keep(fmt.Errorf("save: %w", err))
		}
		w.mu.Lock()
		for _, t := range job.saves {
			if w.outstanding[t.RequestID]--; w.outstanding[t.RequestID] <= 0 {
				delete(w.outstanding, t.RequestID)
			}
		}
		w.signalLocked()
		w.mu.Unlock()
	}
}

// save writes one job: per batch, the keys not yet in the pool are gathered into staging slots
// and put with the rank's ReplicateConfig, or, when the pool's memory is registered, reserved in
// the pool, gathered straight into it and committed.
func (w *Worker) save(job saveJob) (err error) {
	ctx := w.ctx
	if job.fence != nil {
		if err = passFence(ctx, job.fence, w.saveMover); err != nil {
			return fmt.Errorf("save fence: %w", err)
		}
	}
	s := pageSaver{w: w, ctx: ctx}
	began := time.Now()
	defer func() {
		s.sample.Duration = time.Since(began)
		s.sample.Err = err != nil
		w.stats.RecordSave(s.sample)
	}()
	if err = s.list(job.saves); err != nil {
		return err
	}
	s.plan()
	defer s.settle()
	s.sample.Pages = int64(len(s.items))
	for start := 0; start < len(s.items); start += s.batch {
		if err = s.saveBatch(start); err != nil {
			return err
		}
	}
	s.settle()
	s.warn()
	return nil
}

// pageSaver is one save job: its values and their group keys, how they are batched, the put in
// flight and what the job did so far (sample, and the counts it warns about).
type pageSaver struct {
	w      *Worker
	ctx    context.Context
	items  []pageIO
	groups []string // each value's group key (GroupBlocks), "" without

	sets, set int // staging slot sets, and the one the next batch gathers into
	batch     int // values per batch
	// src is the engine memory of every value, in items' order, when the pool is handed the
	// engine's own pages (hostSources); nil when a save gathers them first. For values split
	// across regions, copier and hp are the pool and the mover when the pool is handed each
	// value's pieces of engine memory instead (hostSourcePieces).
	src    [][]byte
	copier pool.PieceCopier
	hp     kvmem.HostPages

	sample                        stats.SaveSample
	failed, attempted, refusedTTL int

	// The put in flight, if any: its codes come on inflight, for inflightN values of
	// inflightSizes bytes.
	inflight      chan []pool.Code
	inflightN     int
	inflightSizes []int
}

// list makes the job's values: every page's sharded value where this rank writes them
// (writesSharded) and, on attention rank 0 of a group with replicated regions, its replicated
// value, each with its group key.
func (s *pageSaver) list(saves []RequestTransfers) error {
	w := s.w
	g := w.geom
	ns := w.opts.Namespace
	writeReplicated := ns.AttentionRank() == 0
	writeSharded := w.opts.writesSharded()
	var buf []byte
	for _, t := range saves {
		for _, p := range t.Pages {
			if err := g.checkPage(p.Group, p.Page); err != nil {
				return fmt.Errorf("request %s: %w", t.RequestID, err)
			}
			lg := g.groups[p.Group]
			pre := &g.prefixes[p.Group]
			gk := ""
			if w.opts.GroupBlocks {
				h, ok := p.Hash.Hash()
				if !ok {
					return fmt.Errorf("request %s: a block group needs TensorRT-LLM's 16-byte hashes, got %d bytes", t.RequestID, p.Hash.Len())
				}
				gk = ns.GroupKey(h)
			}
			if writeSharded {
				buf = p.Hash.AppendHex(append(buf[:0], pre.sharded...))
				s.items = append(s.items, pageIO{key: string(buf), ref: kvmem.PageRef{Group: p.Group, Slot: p.Page}, size: int(lg.BytesPerPage)})
				s.groups = append(s.groups, gk)
			}
			if lg.ReplicatedBytesPerPage > 0 && writeReplicated {
				buf = p.Hash.AppendHex(append(buf[:0], pre.replicated...))
				s.items = append(s.items, pageIO{key: string(buf), ref: kvmem.PageRef{Group: p.Group, Slot: p.Page, Replicated: true}, size: int(lg.ReplicatedBytesPerPage)})
				s.groups = append(s.groups, gk)
			}
		}
	}
	return nil
}

// plan sizes the job's batches and its staging slot sets.
func (s *pageSaver) plan() {
	w := s.w
	// Two slot sets let the put of one batch overlap the existence check and gather of the
	// next; one put is in flight at most, and a set is gathered into again only after its put.
	s.sets = 1
	if w.saveStage.Slots() >= 2 {
		s.sets = 2
	}
	s.batch = max(1, min(w.opts.TransferBatchSize, w.saveStage.Slots()/s.sets))
	s.src = hostSources(w.saveMover, s.items)
	if s.src == nil {
		s.copier, s.hp = hostSourcePieces(w.pool, w.saveMover, s.items)
	}
	if w.directPut != nil || s.src != nil || s.hp != nil {
		// Written in place, or put from engine memory: no slots bound the batch, which holds
		// directSaveBatchBytes, and the next batch's existence check (and gather) always
		// overlaps the last put.
		s.sets = 2
		largest := 1
		for _, it := range s.items {
			largest = max(largest, it.size)
		}
		s.batch = min(directBatchMaxPages, max(1, directSaveBatchBytes/largest))
	}
	if s.hp != nil {
		// Each value is as many pieces as its group has regions: a batch names at most
		// maxBatchPieces of them.
		regions := 1
		for _, g := range w.geom.layout.Groups {
			regions = max(regions, len(g.Regions), len(g.ReplicatedRegions))
		}
		s.batch = max(1, min(s.batch, maxBatchPieces/regions))
	}
}

// hostSourcesOff makes saves gather every page even where the pool could be handed the
// engine's own pages or their pieces; the benchmarks set it to compare.
var hostSourcesOff = false

// hostSources returns the engine memory of every value of items, in their order, when the
// mover's engine memory is host memory (kvmem.HostPages) and every value is one contiguous
// piece of it; nil otherwise. A save then hands the pool the engine's own pages: an in-process
// pool copies and checksums each value in one pass (BatchPut), where a gather into staging or
// into reserved pool memory copies it and the checksum reads it again, and a Mooncake client
// sends it from there. The engine writes none of a save's pages until GetFinished reports the
// save (docs/ENGINE_API.md), so the pages stay as they were for the whole put.
func hostSources(mover kvmem.Mover, items []pageIO) [][]byte {
	if _, host := mover.(kvmem.HostPages); !host || hostSourcesOff {
		return nil
	}
	return pageMemory(mover, len(items), func(i int) (kvmem.PageRef, int) { return items[i].ref, items[i].size }, make([][]byte, len(items)))
}

// hostSourcePieces returns, for a save whose values are split across regions of host engine
// memory, the pool as a pool.PieceCopier and the mover as kvmem.HostPages; nil when either
// cannot do that. The pool then copies each value out of its pieces of engine memory in the pass
// that checksums it, where a gather into reserved pool memory copies it and the checksum reads
// it again.
func hostSourcePieces(pl pool.Pool, mover kvmem.Mover, items []pageIO) (pool.PieceCopier, kvmem.HostPages) {
	if hostSourcesOff || len(items) == 0 {
		return nil, nil
	}
	return pieceCopier(pl, mover)
}

// settle waits for the put in flight, if any, and counts its values by the pool's answer.
func (s *pageSaver) settle() {
	if s.inflight == nil {
		return
	}
	codes := <-s.inflight
	s.inflight = nil
	s.attempted += s.inflightN
	for j := range s.inflightN {
		if len(codes) != s.inflightN {
			s.failed++
			s.sample.FailedPages++
			continue
		}
		switch c := codes[j]; {
		case c == pool.ErrObjectAlreadyExists:
			s.sample.SkippedPages++
		case c == pool.ErrNotJoined:
			s.sample.NotJoinedPages++
		case c == pool.ErrInvalidParams:
			s.failed++
			s.refusedTTL++
			s.sample.RefusedPages++
		case c < 0:
			s.failed++
			s.sample.FailedPages++
		default:
			s.sample.PutPages++
			s.sample.PutBytes += int64(s.inflightSizes[j])
		}
	}
}

// saveBatch saves the batch of values from start on: those not in the pool yet are gathered
// and put, and the put is left in flight (waited for at once with a single slot set).
func (s *pageSaver) saveBatch(start int) error {
	w := s.w
	chunk := s.items[start:min(start+s.batch, len(s.items))]
	chunkGroups := s.groups[start : start+len(chunk)]
	todo := s.absent(chunk)
	if len(todo) == 0 {
		return nil
	}
	putKeys := make([]string, len(todo))
	bufs := make([][]byte, len(todo))
	var pieces [][][]byte
	var segs [][]byte // the batch's pieces end to end: its put may still read them once the next batch is made
	if s.hp != nil {
		pieces = make([][][]byte, len(todo))
	}
	refs := make([]kvmem.PageRef, len(todo))
	var gids []string
	if w.opts.GroupBlocks {
		gids = make([]string, len(todo))
	}
	for j, i := range todo {
		putKeys[j] = chunk[i].key
		switch {
		case s.src != nil:
			bufs[j] = s.src[start+i]
		case s.hp != nil:
			at := len(segs)
			var ok bool
			if segs, ok = s.hp.PageSegments(chunk[i].ref, segs); !ok {
				return fmt.Errorf("gather pages: no engine memory for page %+v", chunk[i].ref)
			}
			pieces[j] = segs[at:len(segs):len(segs)]
		case w.directPut == nil: // in place, the pool's reservation is the buffer
			bufs[j] = w.saveStage.Slot(s.set*s.batch + j)[:chunk[i].size]
		}
		refs[j] = chunk[i].ref
		if gids != nil {
			gids[j] = chunkGroups[i]
		}
	}
	cfg := w.replicateConfig()
	cfg.GroupIDs = gids
	done := make(chan []pool.Code, 1)
	var err error
	switch {
	case s.src != nil:
		s.put(putKeys, bufs, cfg, done) // the engine's own pages
	case s.hp != nil:
		s.settle()
		ctx, pc := s.ctx, s.copier
		go func() { done <- pc.BatchPutPieces(ctx, putKeys, pieces, cfg) }()
	case w.directPut != nil:
		err = s.putInPlace(chunk, todo, putKeys, refs, cfg, done)
	default:
		err = s.putStaged(putKeys, refs, bufs, cfg, done)
	}
	if err != nil {
		return err
	}
	sizes := make([]int, len(todo))
	for j, i := range todo {
		sizes[j] = chunk[i].size
	}
	s.inflight, s.inflightN, s.inflightSizes = done, len(todo), sizes
	if s.sets == 2 {
		s.set ^= 1
	} else {
		s.settle()
	}
	return nil
}

// absent returns the indices in chunk of the values the pool does not hold yet (all of them
// when its answer is not one per value), and counts the others as skipped.
func (s *pageSaver) absent(chunk []pageIO) []int {
	keys := make([]string, 0, len(chunk))
	for _, it := range chunk {
		keys = append(keys, it.key)
	}
	exist := s.w.pool.BatchIsExist(s.ctx, keys)
	var todo []int
	for i := range chunk {
		if len(exist) != len(chunk) || exist[i] != 1 {
			todo = append(todo, i)
		}
	}
	s.sample.SkippedPages += int64(len(chunk) - len(todo))
	return todo
}

// putInPlace reserves pool memory for the values todo of chunk (keys, from engine pages refs),
// gathers them straight into it once the previous put is settled, and leaves the commit
// (End) in flight on done.
func (s *pageSaver) putInPlace(chunk []pageIO, todo []int, keys []string, refs []kvmem.PageRef, cfg pool.ReplicateConfig, done chan<- []pool.Code) error {
	// Gather straight into the pool memory reserved for the keys; End takes the
	// checksums there and makes the values readable.
	sizes := make([]int64, len(todo))
	for j, i := range todo {
		sizes[j] = int64(chunk[i].size)
	}
	r := s.w.directPut.BatchPutStart(s.ctx, keys, sizes, cfg)
	var gRefs []kvmem.PageRef
	var gBufs [][]byte
	for j := range todo {
		if r.Bufs[j] != nil {
			gRefs, gBufs = append(gRefs, refs[j]), append(gBufs, r.Bufs[j])
		}
	}
	if len(gRefs) > 0 {
		if err := s.w.saveMover.Gather(s.ctx, gRefs, gBufs); err != nil {
			r.Revoke()
			return fmt.Errorf("gather pages: %w", err)
		}
	}
	s.settle()
	go func() { done <- r.End() }()
	return nil
}

// putStaged gathers engine pages refs into the staging slots bufs and, once the previous put is
// settled, leaves their put under keys in flight on done.
func (s *pageSaver) putStaged(keys []string, refs []kvmem.PageRef, bufs [][]byte, cfg pool.ReplicateConfig, done chan<- []pool.Code) error {
	if err := s.w.saveMover.Gather(s.ctx, refs, bufs); err != nil {
		return fmt.Errorf("gather pages: %w", err)
	}
	s.put(keys, bufs, cfg, done)
	return nil
}

// put settles the previous put and leaves the put of bufs under keys in flight on done.
func (s *pageSaver) put(keys []string, bufs [][]byte, cfg pool.ReplicateConfig, done chan<- []pool.Code) {
	s.settle()
	ctx, pl := s.ctx, s.w.pool
	go func() { done <- pl.BatchPut(ctx, keys, bufs, cfg) }()
}

// warn logs a job that lost pages, and, once per worker, one whose every page the pool refused
// under a soft-pin TTL.
func (s *pageSaver) warn() {
	w := s.w
	if s.failed > 0 {
		w.log.Warn("mooncake-store failed to save pages", "rank", w.opts.Namespace.Rank, "failed_pages", s.failed, "attempted_pages", s.attempted)
	}
	if w.opts.SoftPinTTL > 0 && s.attempted > 0 && s.refusedTTL == s.attempted {
		w.mu.Lock()
		warn := !w.warnedTTL
		w.warnedTTL = true
		w.mu.Unlock()
		if warn {
			w.log.Warn("mooncake-store: the pool refused every page of a save under soft_pin_ttl; a TTL above the master's max_kv_soft_pin_ttl (24 h by default) makes it refuse every put",
				"soft_pin_ttl", w.opts.SoftPinTTL)
		}
	}
}

// replicateConfig is the per-put configuration: a soft pin for SoftPinTTL when set.
func (w *Worker) replicateConfig() pool.ReplicateConfig {
	if w.opts.SoftPinTTL > 0 {
		return pool.ReplicateConfig{SoftPinAction: pool.SoftPinEnable, SoftPinTTL: w.opts.SoftPinTTL}
	}
	return pool.ReplicateConfig{}
}

// StartAsyncLoad queues a parked request's load for the asynchronous load workers, behind the
// engine's allocation fence. An empty transfer is done at once. What cannot be queued is kept
// as the worker error and returned.
func (w *Worker) StartAsyncLoad(reqID string, pages []PageTransfer) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.usableLocked(); err != nil {
		return err
	}
	if w.asyncQ == nil {
		return w.keepLocked(fmt.Errorf("request %s: asynchronous load queued but this worker has no load workers (role %s, async_load %t): %w", reqID, w.opts.Role, w.opts.AsyncLoad, ErrCannotTransfer))
	}
	a := &asyncLoad{id: reqID, pages: pages, enqueued: w.opts.Clock()}
	w.async[reqID] = a
	w.protocol.finished.remove(reqID)
	if len(pages) == 0 {
		a.done = true
		return nil
	}
	if w.opts.Fence != nil {
		a.fence = w.opts.Fence()
	}
	w.asyncQueued++
	w.stats.SetLoadQueue(w.asyncQueued, w.asyncActive)
	w.asyncQ.push(a)
	return nil
}

func (w *Worker) asyncLoop(i int) {
	defer w.backgroundWG.Done()
	// Thread CPU per phase only when the stats line that reports it is on, as for synchronous
	// loads: pinned to its thread, the goroutine pays a thread hand-off each time it blocks on
	// the pool (the master's replica lists, the transfers it waits for, each read of the one it
	// makes itself). A GPU mover makes its context current on every call (gpu.cudaCaller).
	cpu := w.stats.Enabled() && w.opts.StatsInterval > 0
	if cpu {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	mover, stage := w.asyncMovers[i], w.asyncStages[i]
	var lists *loadLists // this goroutine's, kept between its loads
	for {
		a, ok := w.asyncQ.pop()
		if !ok {
			return
		}
		w.mu.Lock()
		w.asyncQueued--
		w.asyncActive++
		w.stats.SetLoadQueue(w.asyncQueued, w.asyncActive)
		w.mu.Unlock()

		if lists == nil {
			lists = new(loadLists)
		}
		failed, err := w.loadParked(i, a, mover, stage, lists, cpu)
		lists = keepLoadLists(lists, err)

		w.mu.Lock()
		w.asyncActive--
		w.stats.SetLoadQueue(w.asyncQueued, w.asyncActive)
		a.done, a.failed = true, failed || err != nil
		if err != nil && !w.shutdownCancelled(err) {
			_ = w.keepLocked(err)
		}
		w.signalLocked()
		w.mu.Unlock()
	}
}

func (w *Worker) loadParked(i int, a *asyncLoad, mover kvmem.Mover, stage kvmem.Staging, lists *loadLists, cpu bool) (failed bool, err error) {
	var sample *stats.LoadSample
	if w.stats.Enabled() {
		sample = &stats.LoadSample{Async: true, Wait: w.opts.Clock().Sub(a.enqueued), ThreadCPU: cpu}
		defer w.stats.RecordLoad(sample)
	}
	began := time.Now()
	if a.fence != nil {
		m := sample.Start()
		err = passFence(w.ctx, a.fence, mover)
		sample.End(stats.PhaseFence, m)
		if err != nil {
			return true, fmt.Errorf("request %s: allocation fence: %w", a.id, err)
		}
	}
	wakeDevice(mover)
	m := sample.Start()
	err = w.resolveLoads(lists, []RequestTransfers{{RequestID: a.id, Pages: a.pages}})
	sample.End(stats.PhaseResolve, m)
	if err != nil {
		return true, err
	}
	values := len(lists.items)
	res, err := loadPages(w.ctx, w.pool, w.direct, mover, stage, w.opts.TransferBatchSize, lists, sample)
	if sample != nil {
		sample.Transfer = time.Since(began)
	}
	if err != nil {
		return true, fmt.Errorf("request %s: asynchronous load: %w", a.id, err)
	}
	w.log.Debug("mooncake-store loaded pages for a parked request", "rank", w.opts.Namespace.Rank, "load_worker", i, "pages", values-res.failedPages, "request", a.id)
	if len(res.failed) == 0 {
		return false, nil
	}
	if !w.recover {
		return true, w.fatalLoadError(res, 1)
	}
	w.log.Warn("mooncake-store failed to load pages for a parked request; it is restarted without the offered prefix",
		"rank", w.opts.Namespace.Rank, "failed_pages", res.failedPages, "request", a.id, "first_failure", res.firstMissing)
	return true, nil
}

// GetFinished reports the finished requests whose saves are all done (finishedSaving) and the
// parked requests whose asynchronous load is done (finishedLoading). A finished request is
// reported only once it was passed in finishedGen, a parked one only once it was announced in
// startedLoading. A failed load is then handed out by TakeFailedAsyncLoadRequests, which the
// engine must call before the next GetFinished. Announcing a request with no asynchronous load
// queued, or one an earlier GetFinished already reported finished, is a misreported id: the
// call fails with a fail-stop error wrapping ErrMisreportedRequest rather than act on the wrong
// request.
func (w *Worker) GetFinished(finishedGen, startedLoading []string) (finishedSaving, finishedLoading []string, err error) {
	defer w.stats.TickLoads()
	finishedSaving, finishedLoading, _, err = w.getFinished(finishedGen, startedLoading)
	return finishedSaving, finishedLoading, err
}

// MaxFinishedWait bounds GetFinishedWait's wait.
const MaxFinishedWait = time.Second

// GetFinishedWait is GetFinished for an engine with nothing else to do: when there is nothing
// to report yet but a finished request's saves or an announced request's asynchronous load are
// still in flight, it waits for one of them to finish, up to wait (at most MaxFinishedWait), and
// reports what is done then. It answers at once when it has something to report, when nothing
// it could report is in flight, or when wait is not positive; it answers with nothing reported
// when the wait ends first and with ctx's error when ctx ends first (for an engine whose
// connection ended). finishedGen and startedLoading are taken once, as GetFinished takes them.
func (w *Worker) GetFinishedWait(ctx context.Context, finishedGen, startedLoading []string, wait time.Duration) (finishedSaving, finishedLoading []string, err error) {
	defer w.stats.TickLoads()
	finishedSaving, finishedLoading, changed, err := w.getFinished(finishedGen, startedLoading)
	if err != nil || wait <= 0 || changed == nil {
		return finishedSaving, finishedLoading, err
	}
	timer := time.NewTimer(min(wait, MaxFinishedWait))
	defer timer.Stop()
	for {
		select {
		case <-changed:
		case <-timer.C:
			return nil, nil, nil
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		if finishedSaving, finishedLoading, changed, err = w.getFinished(nil, nil); err != nil || changed == nil {
			return finishedSaving, finishedLoading, err
		}
	}
}

// getFinished is one look of GetFinished. changed is non-nil only when nothing was reported
// and something the engine could be told of later is still in flight: it is closed when that
// may have changed.
func (w *Worker) getFinished(finishedGen, startedLoading []string) (finishedSaving, finishedLoading []string, changed <-chan struct{}, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.usableLocked(); err != nil {
		return nil, nil, nil, err
	}
	if len(w.failedAsync) > 0 {
		return nil, nil, nil, w.keepLocked(fmt.Errorf("%w: GetFinished called again while parked requests %v, whose asynchronous loads failed, were never taken; an engine that reads reports_failed_loads must call TakeFailedAsyncLoadRequests after every GetFinished",
			ErrFailedLoadsNotTaken, w.failedAsync))
	}
	for _, id := range startedLoading {
		if w.async[id] != nil {
			continue
		}
		why := "no asynchronous load was queued for it"
		if w.protocol.finished.has(id) {
			why = "an earlier GetFinished already reported its load finished"
		}
		return nil, nil, nil, w.keepLocked(fmt.Errorf("%w: the engine announced request %q as loading asynchronously, but %s", ErrMisreportedRequest, id, why))
	}
	for _, id := range finishedGen {
		w.closedGen[id] = true
	}
	for id := range w.closedGen {
		if w.outstanding[id] == 0 {
			finishedSaving = append(finishedSaving, id)
			delete(w.closedGen, id)
		}
	}
	for _, id := range startedLoading {
		w.announced[id] = true
	}
	for id := range w.announced {
		a := w.async[id]
		if a == nil || !a.done {
			continue
		}
		finishedLoading = append(finishedLoading, id)
		if a.failed {
			w.failedAsync = append(w.failedAsync, id)
		}
		delete(w.async, id)
		w.protocol.finished.add(id)
		delete(w.announced, id)
	}
	slices.Sort(finishedSaving)
	slices.Sort(finishedLoading)
	slices.Sort(w.failedAsync)
	if len(finishedSaving)+len(finishedLoading) == 0 && len(w.closedGen)+len(w.announced) > 0 {
		changed = w.changed
	}
	return finishedSaving, finishedLoading, changed, nil
}

// Close stops the worker: queued saves are still written, queued asynchronous loads are
// skipped, and the save and load goroutines are joined against one deadline (ctx's, or
// DefaultCloseTimeout). Staging is released only once they have all stopped; past the deadline
// it is deliberately kept, since a goroutine may still be writing into it, and an error says
// so. Staging whose release (its unregistration from the device) fails is kept too, with its
// mover, as the seed keeps such a pool. The stats lines are flushed either way.
func (w *Worker) Close(ctx context.Context) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	w.signalLocked()
	saveQ, asyncQ, earlyQ := w.saveQ, w.asyncQ, w.earlyQ
	w.mu.Unlock()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultCloseTimeout)
		defer cancel()
	}
	if saveQ != nil {
		saveQ.close(true)
	}
	if asyncQ != nil {
		if skipped := asyncQ.close(false); len(skipped) > 0 {
			w.mu.Lock()
			for _, a := range skipped {
				releaseFence(a.fence)
				a.done, a.failed = true, true
			}
			w.signalLocked()
			w.mu.Unlock()
			w.log.Info("mooncake-store skipped queued asynchronous loads at shutdown", "loads", len(skipped))
		}
	}
	if earlyQ != nil {
		if skipped := earlyQ.close(false); len(skipped) > 0 {
			w.mu.Lock()
			for _, ld := range skipped {
				ld.failed, ld.err = true, ErrClosed
				close(ld.done)
			}
			w.mu.Unlock()
			w.log.Info("mooncake-store skipped queued early loads at shutdown", "loads", len(skipped))
		}
	}
	joined := make(chan struct{})
	go func() { w.backgroundWG.Wait(); close(joined) }()
	defer func() {
		if w.own {
			w.stats.Flush()
		}
	}()
	select {
	case <-joined:
	case <-ctx.Done():
		w.cancel()
		return fmt.Errorf("close: save and load goroutines still running at the deadline (%w); their staging is kept", ctx.Err())
	}
	w.cancel()
	// Seed commit 17: every staging pool is unregistered before the pool's memory is, and one
	// whose unregistration failed is kept, with the mover it was made by: its memory may still
	// be registered with the device, so it is neither freed nor reused, and the error says so.
	var errs []error
	stages := append([]kvmem.Staging{w.loadStage, w.saveStage}, w.asyncStages...)
	owners := append([]kvmem.Mover{nil, w.saveMover}, w.asyncMovers...)
	keepMover := map[int]bool{}
	for i, st := range stages {
		if st == nil {
			continue
		}
		if err := st.Close(); err != nil {
			w.keptStaging = append(w.keptStaging, st)
			keepMover[i] = true
			errs = append(errs, fmt.Errorf("release staging: %w; the staging is kept", err))
		}
	}
	for i, m := range owners {
		if m != nil && !keepMover[i] {
			if err := m.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close mover: %w", err))
			}
		}
	}
	var keptRegs []io.Closer
	for _, r := range w.regs {
		if err := r.Close(); err != nil {
			keptRegs = append(keptRegs, r)
			errs = append(errs, fmt.Errorf("unregister pool memory: %w; the registration is kept", err))
		}
	}
	w.regs = keptRegs
	if len(w.keptStaging) > 0 {
		w.log.Warn("mooncake-store kept staging whose unregistration failed at shutdown", "staging", len(w.keptStaging))
	}
	return errors.Join(errs...)
}

// passFence makes the mover's next copies come after the engine's work before f. A fence on the
// engine's device that the mover can wait for there (kvmem.DeviceFence, kvmem.FenceWaiter) is
// handed to the mover and the host goes on at once; any other fence is waited for here.
func passFence(ctx context.Context, f Fence, mover kvmem.Mover) error {
	if df, ok := f.(kvmem.DeviceFence); ok {
		if fw, ok := mover.(kvmem.FenceWaiter); ok && fw.WaitFence(df) == nil {
			return nil
		}
	}
	return f.Wait(ctx)
}

// releaseFence frees a fence that will not be passed (a device fence holds an event).
func releaseFence(f Fence) {
	if df, ok := f.(kvmem.DeviceFence); ok {
		df.Release()
	}
}
