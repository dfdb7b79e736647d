package connector

// Early loads (Options.EarlyLoads, engine API 1.4).
//
// Without them a request's load starts when the engine asks for it: a synchronous offer's at
// StartLoad, after every admission of the pass; an asynchronous offer's at the BindMeta that
// carries its parked transfer. An engine that admits several requests a pass therefore runs
// its admissions (lookups and allocation reports, one master round trip each on a Mooncake
// cluster) before its first load, one after another. With early loads the Scheduler hands the
// request's transfer to the Worker at the allocation report, so the admissions that follow
// overlap its load:
//
//   - An asynchronous offer's transfer is queued for the load workers at once (Worker
//     StartAsyncLoad) instead of travelling in the next Metadata.AsyncLoads; the engine parks
//     and announces the request as before.
//   - A synchronous offer's transfer is queued for the worker's early-load goroutine, which
//     loads one request at a time through the synchronous loads' staging. BuildMeta then emits
//     the request's id in Metadata.EarlyLoads instead of its transfer in Metadata.Loads, and
//     StartLoad waits for it as for its own loads; a failed one is handed back through
//     TakeFailedLoadRequests, as a synchronous load's would be.
//
// The engine promises that pages it reports allocated are free of its own work from the report
// on. A request forgotten before its early load was waited for (RequestFinished, RequestReset)
// waits for the load to end first, so the engine never gets back pages the worker still
// writes. Early loads need a single rank (the allocation report reaches only the scheduler
// rank, and every rank would have to load) and host ordering (an engine fence is taken at
// StartLoad), which Options.Validate checks.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvctl/kvctl/core/stats"
)

// errEarlyInFlight refuses a change to an offer whose load began at its allocation report.
var errEarlyInFlight = errors.New("the load of its allocation report is in flight into the pages reported then; reset the request first")

// earlyLoad is one synchronous offer's load started at its allocation report.
type earlyLoad struct {
	id       string
	pages    []PageTransfer
	enqueued time.Time
	done     chan struct{} // closed once the load ended; failed and err are set before
	failed   bool          // a page was missing or lost: the request restarts
	err      error         // the load itself failed (the pool, the mover): fatal for the worker
	bound    bool          // a bound Metadata names it; StartLoad will wait for it
}

// LinkEarlyLoads joins a rank's scheduler adapter to its worker for early loads: from now on
// the scheduler starts a request's load at its allocation report. Both must have been made
// with Options.EarlyLoads and must be the same rank's.
func LinkEarlyLoads(s *Scheduler, w *Worker) error {
	if s == nil || w == nil {
		return errors.New("early loads need the rank's scheduler adapter and worker")
	}
	if !s.opts.EarlyLoads || !w.opts.EarlyLoads {
		return errors.New("early loads: the scheduler and the worker must both be made with EarlyLoads")
	}
	if s.opts.Namespace != w.opts.Namespace {
		return errors.New("early loads: the scheduler and the worker belong to different ranks")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.early = w
	return nil
}

// startEarly starts a request's load at its allocation report: a parked request's on the
// asynchronous load workers, a synchronous one's on the early-load goroutine.
func (w *Worker) startEarly(reqID string, pages []PageTransfer, async bool) error {
	if async {
		return w.StartAsyncLoad(reqID, pages)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.usableLocked(); err != nil {
		return err
	}
	if w.loadStage == nil {
		return fmt.Errorf("request %s: early load but this worker makes no synchronous loads (role %s, async_load %t): %w", reqID, w.opts.Role, w.opts.AsyncLoad, ErrCannotTransfer)
	}
	if w.early[reqID] != nil {
		return fmt.Errorf("request %s: an early load of it is already in flight", reqID)
	}
	if w.earlyQ == nil {
		w.earlyQ = newFIFO[*earlyLoad]()
		w.backgroundWG.Add(1)
		go w.earlyLoop()
	}
	ld := &earlyLoad{id: reqID, pages: pages, enqueued: w.opts.Clock(), done: make(chan struct{})}
	w.early[reqID] = ld
	w.earlyQ.push(ld)
	return nil
}

// earlyLoop loads the early loads one at a time, in the order the allocations were reported.
func (w *Worker) earlyLoop() {
	defer w.backgroundWG.Done()
	var lists *loadLists
	for {
		ld, ok := w.earlyQ.pop()
		if !ok {
			return
		}
		if lists == nil {
			lists = new(loadLists)
		}
		failed, err := w.loadEarly(ld, lists)
		lists = keepLoadLists(lists, err)
		w.mu.Lock()
		ld.failed, ld.err = failed || err != nil, err
		close(ld.done)
		w.signalLocked()
		w.mu.Unlock()
	}
}

func (w *Worker) loadEarly(ld *earlyLoad, lists *loadLists) (failed bool, err error) {
	var sample *stats.LoadSample
	if w.stats.Enabled() {
		sample = &stats.LoadSample{Wait: w.opts.Clock().Sub(ld.enqueued)}
		defer w.stats.RecordLoad(sample)
	}
	began := time.Now()
	// The synchronous loads' staging is one set of buffers: StartLoad's own loads and these
	// take turns.
	w.stageMu.Lock()
	defer w.stageMu.Unlock()
	wakeDevice(w.mover)
	m := sample.Start()
	err = w.resolveLoads(lists, []RequestTransfers{{RequestID: ld.id, Pages: ld.pages}})
	sample.End(stats.PhaseResolve, m)
	if err != nil {
		return true, fmt.Errorf("request %s: early load: %w", ld.id, err)
	}
	values := len(lists.items)
	res, err := loadPages(w.ctx, w.pool, w.direct, w.mover, w.loadStage, w.opts.TransferBatchSize, lists, sample)
	if sample != nil {
		sample.Transfer = time.Since(began)
	}
	if err != nil {
		return true, fmt.Errorf("request %s: early load: %w", ld.id, err)
	}
	w.log.Debug("mooncake-store loaded pages at the allocation report", "rank", w.opts.Namespace.Rank, "pages", values-res.failedPages, "request", ld.id)
	if len(res.failed) > 0 {
		w.log.Warn("mooncake-store failed to load pages at the allocation report; the request is restarted without the offered prefix",
			"rank", w.opts.Namespace.Rank, "failed_pages", res.failedPages, "request", ld.id, "first_failure", res.firstMissing)
		return true, nil
	}
	return false, nil
}

// CheckEarlyLoads refuses metadata that names a request with no early load of this worker in
// flight, or one already bound, before BindMeta binds it.
func (w *Worker) CheckEarlyLoads(ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		ld := w.early[id]
		switch {
		case ld == nil:
			return fmt.Errorf("early load of request %q: none is in flight for this engine", id)
		case ld.bound || seen[id]:
			return fmt.Errorf("early load of request %q: already bound by an earlier pass", id)
		}
		seen[id] = true
	}
	return nil
}

// awaitEarly waits for the bound early loads ids and forgets them; it returns the requests
// that lost a page. A load that failed outright is kept as the worker's error.
func (w *Worker) awaitEarly(ctx context.Context, ids []string) (failed []string, err error) {
	for _, id := range ids {
		w.mu.Lock()
		ld := w.early[id]
		w.mu.Unlock()
		if ld == nil {
			// Forgotten since BindMeta (the request was reset or finished meanwhile): nothing
			// of it is still written.
			continue
		}
		select {
		case <-ld.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		w.mu.Lock()
		if w.early[id] == ld {
			delete(w.early, id)
		}
		w.mu.Unlock()
		if ld.err != nil && !w.shutdownCancelled(ld.err) {
			return nil, w.keep(fmt.Errorf("load: %w", ld.err))
		}
		if ld.failed {
			failed = append(failed, id)
		}
	}
	return failed, nil
}

// dropEarly waits for a forgotten request's early load to end and forgets it, so the engine
// gets its pages back only once nothing writes them. A parked request's load is forgotten
// with it, unless GetFinished already reported it.
func (w *Worker) dropEarly(reqID string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ld := w.early[reqID]; ld != nil {
		w.mu.Unlock()
		<-ld.done
		w.mu.Lock()
		if w.early[reqID] == ld {
			delete(w.early, reqID)
		}
		return
	}
	for {
		a := w.async[reqID]
		if a == nil {
			return
		}
		if a.done || w.closed {
			delete(w.async, reqID)
			delete(w.announced, reqID)
			w.failedAsync = slices.DeleteFunc(w.failedAsync, func(id string) bool { return id == reqID })
			return
		}
		changed := w.changed
		w.mu.Unlock()
		<-changed
		w.mu.Lock()
	}
}

// errNoDestination: an allocation report leaves an honoured block without a page.
var errNoDestination = errors.New("has no destination page")

// honouredTransfer builds the transfer of a request's honoured offer from its allocation report
// (blockIDsByGroup[g][b] is the page of block b in group g): every honoured block's page in every
// layer group. A block without a page is an error wrapping errNoDestination.
func (s *Scheduler) honouredTransfer(reqID string, st *reqState, blockIDsByGroup [][]int) (RequestTransfers, error) {
	t := RequestTransfers{RequestID: reqID}
	for b := st.offerFirst; b < st.offerFirst+st.offerBlocks; b++ {
		h := st.chain.At(b)
		for g := range s.geom.groups {
			if g >= len(blockIDsByGroup) || b >= len(blockIDsByGroup[g]) || blockIDsByGroup[g][b] < 0 {
				return t, fmt.Errorf("request %s: honoured block %d %w in layer group %d", reqID, b, errNoDestination, g)
			}
			page := blockIDsByGroup[g][b]
			if err := s.geom.checkPage(g, page); err != nil {
				return t, fmt.Errorf("request %s: block %d: %w", reqID, b, err)
			}
			t.Pages = append(t.Pages, PageTransfer{Hash: h, Group: g, Page: page})
		}
	}
	return t, nil
}
