package connector

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Phase is where a request a Driver runs stands.
type Phase uint8

// A driven request moves Waiting → Running (or Parked → Running) → Saving → Done; a failed
// load sends it back to Waiting, and the Admit hook may drop it instead of admitting it.
const (
	// PhaseWaiting: not admitted yet, or restarted after a failed load.
	PhaseWaiting Phase = iota
	// PhaseRunning: admitted; every pass computes up to a chunk of its prompt.
	PhaseRunning
	// PhaseParked: out of the batch until every rank reported its asynchronous load.
	PhaseParked
	// PhaseSaving: its prompt is computed and its saves are in flight; it keeps its pages.
	PhaseSaving
	// PhaseDone: computed and saved; its pages were released.
	PhaseDone
	// PhaseDropped: the Admit hook gave up on it.
	PhaseDropped
)

// Admission is the Admit hook's answer for a waiting request.
type Admission uint8

const (
	// Admit looks the request up and admits it in this pass.
	Admit Admission = iota
	// Wait leaves it waiting for a later pass.
	Wait
	// Drop gives up on it: it ends in PhaseDropped without a lookup.
	Drop
)

// DrivenRequest is one request a Driver runs. Hooks read it and set Pages; the driver keeps
// the rest.
type DrivenRequest struct {
	Request
	// Phase is where the request stands.
	Phase Phase
	// Pages holds, per layer group, the page slot of every block of the prompt. The Allocate
	// hook sets it; the Release hook may reuse the slots.
	Pages [][]int
	// Computed is the number of prompt tokens computed or restored so far.
	Computed int
	// Matched is the number of tokens the current admission honoured from the pool.
	Matched int
	// LoadedPages and SavePages count the page transfers the current admission's metadata
	// named for it: loads (synchronous and parked), and saves offered to the pool.
	LoadedPages int
	SavePages   int
	// AsyncSaving is RequestFinished's answer: saves were emitted for the request.
	AsyncSaving bool
	// Restarts counts failed loads the request restarted after.
	Restarts int

	sentPages  int
	restore    int // honoured synchronous restore applied by the next pass
	written    int // blocks whose pages hold their KV
	savedRanks []bool
	loadedOn   []bool // ranks that reported the parked load finished
	loadFailed bool   // a rank handed the parked load back as failed
}

func (r *DrivenRequest) reset(ranks int) {
	*r = DrivenRequest{Request: r.Request, Restarts: r.Restarts + 1, savedRanks: make([]bool, ranks)}
}

// DriverHooks are what differs between the engines that drive the connector: how pages are
// allocated, what computing and restoring a block means (KV bytes or a model), and what a
// request's end frees. Every hook is optional unless it says otherwise.
type DriverHooks struct {
	// Admit is called for a waiting request before its lookup. It returns the tokens the
	// engine already holds for the request (the lookup's numComputedTokens) and whether to admit
	// it now. Without it every request is admitted with none.
	Admit func(ctx context.Context, r *DrivenRequest) (numComputed int, a Admission, err error)
	// Allocate is required: it sets r.Pages after the lookup offered matched tokens (async:
	// loaded asynchronously) and returns the tokens the engine honours, a whole-block part of
	// the offer.
	Allocate func(ctx context.Context, r *DrivenRequest, matched int, async bool) (honoured int, err error)
	// Built sees every pass's metadata after it is built and before any rank binds it.
	Built func(ctx context.Context, meta Metadata) error
	// Restored is told that blocks [first, end) of r were restored from the pool.
	Restored func(ctx context.Context, r *DrivenRequest, first, end int) error
	// Computed is told that this pass computed blocks [first, end) of r.
	Computed func(ctx context.Context, r *DrivenRequest, first, end int) error
	// Finished is called once r's whole prompt is computed, before the connector is told.
	Finished func(ctx context.Context, r *DrivenRequest) error
	// Restarted is called when a failed load sends r back to waiting, after the scheduler
	// adapter forgot it and before its pages are released.
	Restarted func(ctx context.Context, r *DrivenRequest) error
	// Release is called when r's pages may be reused: done, or restarted.
	Release func(r *DrivenRequest)
	// HoldSaves, when it returns true, skips the pass's WaitForSave on every rank, as an
	// engine whose save fence is not yet passed would.
	HoldSaves func(pass int) bool
}

// DriverOptions configure a Driver.
type DriverOptions struct {
	// TokensPerBlock is the block size the ranks registered.
	TokensPerBlock int
	// Chunk is the most prompt tokens a request computes per pass; 0 computes the rest of the
	// prompt at once.
	Chunk int
	// MaxRunning caps the requests admitted and not done at once; 0 is no cap.
	MaxRunning int
	// MaxAdmitPerPass caps the requests one pass admits, as an engine's per-step token budget
	// lets only so many new prompts in; 0 is no cap. With asynchronous loads the next pass's
	// admissions then run while the earlier requests load.
	MaxAdmitPerPass int
	// Hooks are the engine's side of the sequence.
	Hooks DriverHooks
}

// DriverStats counts what a Driver did.
type DriverStats struct {
	// Passes is the passes run.
	Passes int
	// MatchedTokens is the pool tokens honoured by admissions that did not restart.
	MatchedTokens int
	// Parked counts admissions parked for an asynchronous load.
	Parked int
	// Restarts counts requests restarted after a failed load.
	Restarts int
	// Admit, Load and Rest are the wall time of the passes' parts: admission (lookups,
	// allocations and their reports), the metadata and loads (BuildMeta to
	// TakeFailedLoadRequests), and the compute, saves and completions.
	Admit, Load, Rest time.Duration
}

// Driver runs requests through a set of engine ranks in the order the engine's runtime calls
// its connector, pass by pass: admission (Lookup, the allocation, UpdateStateAfterAlloc), the
// pass's metadata (TakeSubmittedSaves on every rank, BuildMeta on rank 0), the loads (BindMeta,
// StartLoad, TakeFailedLoadRequests on every rank, RequestReset of what failed), the compute
// (hooks; RequestFinished for a finished prompt), then the saves and completions (WaitForSave,
// GetFinished, TakeFailedAsyncLoadRequests on every rank). Rank 0 runs the scheduler adapter;
// more ranks are tensor-parallel peers that receive the same metadata.
//
// A Driver is not safe for concurrent use.
type Driver struct {
	ranks []Rank
	opts  DriverOptions
	reqs  []*DrivenRequest // in the order they were added
	byID  map[string]*DrivenRequest
	stats DriverStats
}

// NewDriver returns a driver over ranks.
func NewDriver(ranks []Rank, opts DriverOptions) (*Driver, error) {
	if len(ranks) == 0 {
		return nil, errors.New("driver: no ranks")
	}
	if opts.TokensPerBlock < 1 {
		return nil, fmt.Errorf("driver: tokens per block %d: must be positive", opts.TokensPerBlock)
	}
	if opts.Hooks.Allocate == nil {
		return nil, errors.New("driver: no Allocate hook")
	}
	return &Driver{ranks: ranks, opts: opts, byID: map[string]*DrivenRequest{}}, nil
}

// Add queues req; it is admitted by a later Step.
func (d *Driver) Add(req Request) *DrivenRequest {
	r := &DrivenRequest{Request: req, savedRanks: make([]bool, len(d.ranks))}
	d.reqs = append(d.reqs, r)
	d.byID[req.ID] = r
	return r
}

// Stats returns what the driver did so far.
func (d *Driver) Stats() DriverStats { return d.stats }

// Pass is the number of passes run so far.
func (d *Driver) Pass() int { return d.stats.Passes }

// Pending is the number of requests not yet done or dropped.
func (d *Driver) Pending() int { return len(d.reqs) }

// Busy reports whether a pass can make progress other than waiting for background transfers:
// a request is waiting or running.
func (d *Driver) Busy() bool {
	for _, r := range d.reqs {
		if r.Phase == PhaseWaiting || r.Phase == PhaseRunning {
			return true
		}
	}
	return false
}

// Saving reports whether a request's saves are in flight.
func (d *Driver) Saving() bool {
	for _, r := range d.reqs {
		if r.Phase == PhaseSaving {
			return true
		}
	}
	return false
}

func (d *Driver) find(id string) *DrivenRequest { return d.byID[id] }

// Step runs one pass.
func (d *Driver) Step(ctx context.Context) error {
	defer d.forget()
	d.stats.Passes++
	t0 := time.Now()
	started, err := d.admit(ctx)
	if err != nil {
		return err
	}
	t1 := time.Now()
	d.stats.Admit += t1.Sub(t0)
	scheduled, err := d.load(ctx)
	if err != nil {
		return err
	}
	t2 := time.Now()
	d.stats.Load += t2.Sub(t1)
	defer func() { d.stats.Rest += time.Since(t2) }()
	finishedGen, err := d.compute(ctx, scheduled)
	if err != nil {
		return err
	}
	if d.opts.Hooks.HoldSaves == nil || !d.opts.Hooks.HoldSaves(d.stats.Passes-1) {
		for _, rk := range d.ranks {
			if err := rk.WaitForSave(ctx); err != nil {
				return fmt.Errorf("wait for save on %s: %w", rk.Name(), err)
			}
		}
	}
	return d.collect(ctx, finishedGen, started)
}

// WaitIdle is what an engine does between passes while Busy is false: with a single rank that
// can wait (FinishedWaiter), it asks that rank for finished loads and saves, waiting up to wait
// for one to finish, and collects them as the end of a pass does; with several ranks, or one that
// cannot wait, or when that rank answered with nothing sooner than poll (a daemon that does not
// wait), it sleeps for poll. It returns at once when the driver is busy or nothing is parked or
// saving.
func (d *Driver) WaitIdle(ctx context.Context, wait, poll time.Duration) error {
	if d.Busy() || d.Pending() == 0 {
		return nil
	}
	fw, ok := d.ranks[0].(FinishedWaiter)
	if !ok || len(d.ranks) > 1 || wait <= 0 {
		return sleepCtx(ctx, poll)
	}
	defer d.forget()
	began := time.Now()
	saving, loading, err := fw.GetFinishedWait(ctx, nil, nil, wait)
	if err != nil {
		return err
	}
	if len(saving)+len(loading) == 0 {
		return sleepCtx(ctx, poll-time.Since(began))
	}
	return d.apply(ctx, 0, d.ranks[0], saving, loading)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Drain asks every rank for finished saves, calling wait between rounds, until no request's
// saves are in flight.
func (d *Driver) Drain(ctx context.Context, wait func(context.Context) error) error {
	defer d.forget()
	for {
		if err := d.collect(ctx, nil, nil); err != nil {
			return err
		}
		if !d.Saving() {
			return nil
		}
		if err := wait(ctx); err != nil {
			return err
		}
	}
}

// forget drops the requests that are done or dropped.
func (d *Driver) forget() {
	d.reqs = slices.DeleteFunc(d.reqs, func(r *DrivenRequest) bool {
		if r.Phase != PhaseDone && r.Phase != PhaseDropped {
			return false
		}
		if d.byID[r.ID] == r {
			delete(d.byID, r.ID)
		}
		return true
	})
}

// admit looks up and allocates the waiting requests, in the order they were added, and
// returns the ones parked for an asynchronous load.
func (d *Driver) admit(ctx context.Context) ([]string, error) {
	sched, h := d.ranks[0], d.opts.Hooks
	running := 0
	for _, r := range d.reqs {
		if r.Phase == PhaseRunning || r.Phase == PhaseSaving || r.Phase == PhaseParked {
			running++
		}
	}
	var started []string
	admitted := 0
	for _, r := range d.reqs {
		if d.opts.MaxAdmitPerPass > 0 && admitted >= d.opts.MaxAdmitPerPass {
			break
		}
		if r.Phase != PhaseWaiting || (d.opts.MaxRunning > 0 && running >= d.opts.MaxRunning) {
			continue
		}
		computed := 0
		if h.Admit != nil {
			n, a, err := h.Admit(ctx, r)
			if err != nil {
				return nil, err
			}
			if a == Wait {
				continue
			}
			if a == Drop {
				r.Phase = PhaseDropped
				continue
			}
			computed = n
		}
		m, async, err := sched.Lookup(ctx, r.Request, computed)
		if err != nil {
			return nil, fmt.Errorf("lookup %s: %w", r.ID, err)
		}
		honoured, err := h.Allocate(ctx, r, m, async)
		if err != nil {
			return nil, err
		}
		if err := sched.UpdateStateAfterAlloc(ctx, r.ID, r.Pages, honoured); err != nil {
			return nil, fmt.Errorf("allocation report %s: %w", r.ID, err)
		}
		r.Computed, r.Matched = computed, honoured
		d.stats.MatchedTokens += honoured
		if async {
			r.Phase, r.loadedOn = PhaseParked, make([]bool, len(d.ranks))
			started = append(started, r.ID)
			d.stats.Parked++
		} else {
			r.Phase, r.restore = PhaseRunning, honoured
		}
		running++
		admitted++
	}
	return started, nil
}

// load builds the pass's metadata, binds it on every rank and makes its synchronous loads. It
// returns the tokens each request computes in this pass; a request whose load failed is
// restarted and left out.
func (d *Driver) load(ctx context.Context) (map[*DrivenRequest]int, error) {
	sched := d.ranks[0]
	var out SchedulerOutput
	scheduled := map[*DrivenRequest]int{}
	for _, r := range d.reqs {
		if r.Phase != PhaseRunning {
			continue
		}
		n := len(r.Tokens) - r.Computed - r.restore
		if d.opts.Chunk > 0 {
			n = min(d.opts.Chunk, n)
		}
		rd := RequestData{ID: r.ID, ComputedPosition: r.Computed, NumScheduledTokens: n, NewBlockIDsByGroup: make([][]int, len(r.Pages))}
		for g, p := range r.Pages {
			rd.NewBlockIDsByGroup[g] = p[min(r.sentPages, len(p)):]
		}
		if r.sentPages == 0 {
			out.NewRequests = append(out.NewRequests, rd)
		} else {
			out.CachedRequests = append(out.CachedRequests, rd)
		}
		if len(r.Pages) > 0 {
			r.sentPages = len(r.Pages[0])
		}
		scheduled[r] = n
	}
	// Every rank's report is taken so that none piles up; under tensor parallelism the
	// scheduler rank's stands for all.
	for i, rk := range d.ranks {
		ids, err := rk.TakeSubmittedSaves(ctx)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			out.SubmittedSaves = ids
		}
	}
	meta, err := sched.BuildMeta(ctx, out)
	if err != nil {
		return nil, fmt.Errorf("build metadata: %w", err)
	}
	d.count(meta)
	if d.opts.Hooks.Built != nil {
		if err := d.opts.Hooks.Built(ctx, meta); err != nil {
			return nil, err
		}
	}
	var failed []string
	for _, rk := range d.ranks {
		if err := rk.BindMeta(ctx, meta); err != nil {
			return nil, err
		}
		if err := rk.StartLoad(ctx); err != nil {
			return nil, fmt.Errorf("start load on %s: %w", rk.Name(), err)
		}
		ids, err := rk.TakeFailedLoadRequests(ctx)
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			if !slices.Contains(failed, id) {
				failed = append(failed, id)
			}
		}
	}
	slices.Sort(failed)
	for _, id := range failed {
		r := d.find(id)
		if r == nil {
			continue
		}
		delete(scheduled, r)
		if err := d.restart(ctx, r); err != nil {
			return nil, err
		}
	}
	return scheduled, nil
}

// count adds the page transfers meta names to each request's counts.
func (d *Driver) count(meta Metadata) {
	for _, set := range [][]RequestTransfers{meta.Loads, meta.AsyncLoads} {
		for _, t := range set {
			if r := d.find(t.RequestID); r != nil {
				r.LoadedPages += len(t.Pages)
			}
		}
	}
	for _, t := range meta.Saves {
		if r := d.find(t.RequestID); r != nil {
			r.SavePages += len(t.Pages)
		}
	}
}

// compute applies the pass's restores and computes to the scheduled requests and tells the
// scheduler adapter of the prompts finished; it returns those whose saves are in flight.
func (d *Driver) compute(ctx context.Context, scheduled map[*DrivenRequest]int) ([]string, error) {
	h, T := d.opts.Hooks, d.opts.TokensPerBlock
	var finishedGen []string
	for _, r := range d.reqs {
		n, ok := scheduled[r]
		if !ok {
			continue
		}
		if r.restore > 0 {
			if err := d.restored(ctx, r, r.Computed/T, (r.Computed+r.restore)/T); err != nil {
				return nil, err
			}
			r.written = (r.Computed + r.restore) / T
		}
		r.Computed += r.restore + n
		r.restore = 0
		if end := r.Computed / T; r.written < end {
			if h.Computed != nil {
				if err := h.Computed(ctx, r, r.written, end); err != nil {
					return nil, err
				}
			}
			r.written = end
		}
		if r.Computed < len(r.Tokens) {
			continue
		}
		if h.Finished != nil {
			if err := h.Finished(ctx, r); err != nil {
				return nil, err
			}
		}
		saving, err := d.ranks[0].RequestFinished(ctx, r.ID)
		if err != nil {
			return nil, err
		}
		r.AsyncSaving = saving
		if saving {
			r.Phase = PhaseSaving
			finishedGen = append(finishedGen, r.ID)
		} else {
			d.done(r)
		}
	}
	return finishedGen, nil
}

func (d *Driver) restored(ctx context.Context, r *DrivenRequest, first, end int) error {
	if d.opts.Hooks.Restored == nil || first >= end {
		return nil
	}
	return d.opts.Hooks.Restored(ctx, r, first, end)
}

// collect asks every rank for finished saves and loads, resumes the parked requests every
// rank finished loading (or restarts them, when a rank failed theirs) and ends the requests
// every rank finished saving.
func (d *Driver) collect(ctx context.Context, finishedGen, started []string) error {
	for i, rk := range d.ranks {
		saving, loading, err := rk.GetFinished(ctx, finishedGen, started)
		if err != nil {
			return err
		}
		if err := d.note(ctx, i, rk, saving, loading); err != nil {
			return err
		}
	}
	return d.settle(ctx)
}

// apply takes what one rank reported finished, as collect does, and settles the requests.
func (d *Driver) apply(ctx context.Context, i int, rk Rank, saving, loading []string) error {
	if err := d.note(ctx, i, rk, saving, loading); err != nil {
		return err
	}
	return d.settle(ctx)
}

// note records what rank i reported finished, and takes its failed asynchronous loads, as the
// engine API asks after every GetFinished.
func (d *Driver) note(ctx context.Context, i int, rk Rank, saving, loading []string) error {
	for _, id := range saving {
		if r := d.find(id); r != nil {
			r.savedRanks[i] = true
		}
	}
	failed, err := rk.TakeFailedAsyncLoadRequests(ctx)
	if err != nil {
		return err
	}
	for _, id := range failed {
		if r := d.find(id); r != nil {
			r.loadFailed = true
		}
	}
	for _, id := range loading {
		if r := d.find(id); r != nil && r.Phase == PhaseParked {
			r.loadedOn[i] = true
		}
	}
	return nil
}

// settle resumes the parked requests every rank finished loading (or restarts them, when a rank
// failed theirs) and ends the requests every rank finished saving.
func (d *Driver) settle(ctx context.Context) error {
	// A parked request resumes once every rank reported its load: under tensor parallelism the
	// runtime acts on the intersection over ranks.
	T := d.opts.TokensPerBlock
	for _, r := range d.reqs {
		if r.Phase != PhaseParked || slices.Contains(r.loadedOn, false) {
			continue
		}
		if r.loadFailed {
			if err := d.restart(ctx, r); err != nil {
				return err
			}
			continue
		}
		if err := d.restored(ctx, r, r.Computed/T, (r.Computed+r.Matched)/T); err != nil {
			return err
		}
		r.Computed += r.Matched
		r.written = r.Computed / T
		r.Phase, r.loadedOn = PhaseRunning, nil
	}
	for _, r := range d.reqs {
		if r.Phase == PhaseSaving && !slices.Contains(r.savedRanks, false) {
			d.done(r)
		}
	}
	return nil
}

func (d *Driver) done(r *DrivenRequest) {
	r.Phase = PhaseDone
	if d.opts.Hooks.Release != nil {
		d.opts.Hooks.Release(r)
	}
}

// restart sends r back to waiting after a failed load: the scheduler adapter forgets it, the
// engine releases its pages, and its next admission looks it up afresh.
func (d *Driver) restart(ctx context.Context, r *DrivenRequest) error {
	if err := d.ranks[0].RequestReset(ctx, r.ID); err != nil {
		return err
	}
	if d.opts.Hooks.Restarted != nil {
		if err := d.opts.Hooks.Restarted(ctx, r); err != nil {
			return err
		}
	}
	if d.opts.Hooks.Release != nil {
		d.opts.Hooks.Release(r)
	}
	d.stats.MatchedTokens -= r.Matched
	d.stats.Restarts++
	r.reset(len(d.ranks))
	return nil
}
