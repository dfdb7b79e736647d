package connector

import (
	"context"
	"fmt"
	"runtime/trace"
	"slices"
	"time"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/core/stats"
	"github.com/kvctl/kvctl/pool"
)

// pageIO is one pool value a save moves: its key and the engine page it comes from.
type pageIO struct {
	key  string
	ref  kvmem.PageRef
	size int
}

// loadItem is one pool value a load gets: the index of the request that owns it, its key
// (loadLists.key), and the engine page it lands in.
type loadItem struct {
	req     int
	at, end int // its key's place in loadLists.keyBuf
	ref     kvmem.PageRef
	size    int
}

// resolveLoads turns transfer lists into the values a load gets, into l (its lists, reused
// from load to load): every page's sharded value and, for a group with replicated regions, its
// replicated value, in l.items, each with its key in l.keyBuf. A key is made from the
// geometry's key prefix for its group and the hash's hex, made once per page (a StartLoad
// resolves a few hundred pages before its first copy can start).
func (w *Worker) resolveLoads(l *loadLists, ts []RequestTransfers) error {
	g := w.geom
	n, items := 0, 0
	for _, t := range ts {
		for _, p := range t.Pages {
			if err := g.checkPage(p.Group, p.Page); err != nil {
				return fmt.Errorf("request %s: %w", t.RequestID, err)
			}
			pre := &g.prefixes[p.Group]
			n += len(pre.sharded) + 2*p.Hash.Len()
			items++
			if pre.replicated != "" {
				n += len(pre.replicated) + 2*p.Hash.Len()
				items++
			}
		}
	}
	out := slices.Grow(l.items[:0], items)
	buf := slices.Grow(l.keyBuf[:0], n)
	var hex [2 * keys.MaxDigestSize]byte
	for ri, t := range ts {
		for _, p := range t.Pages {
			pre := &g.prefixes[p.Group]
			lg := &g.groups[p.Group]
			x := p.Hash.AppendHex(hex[:0])
			at := len(buf)
			buf = append(append(buf, pre.sharded...), x...)
			out = append(out, loadItem{req: ri, at: at, end: len(buf), ref: kvmem.PageRef{Group: p.Group, Slot: p.Page}, size: int(lg.BytesPerPage)})
			if pre.replicated != "" {
				at = len(buf)
				buf = append(append(buf, pre.replicated...), x...)
				out = append(out, loadItem{req: ri, at: at, end: len(buf), ref: kvmem.PageRef{Group: p.Group, Slot: p.Page, Replicated: true}, size: int(lg.ReplicatedBytesPerPage)})
			}
		}
	}
	l.items, l.keyBuf = out, buf
	return nil
}

// loadResult is what loadPages did.
type loadResult struct {
	failed       map[int]bool // request indices that lost a page; nil when none did
	failedPages  int
	firstMissing string
	landedBytes  int64
	storeCalls   int
}

// fail records that request req lost a page.
func (r *loadResult) fail(req int) {
	if r.failed == nil {
		r.failed = map[int]bool{}
	}
	r.failed[req] = true
}

// loadLists are the lists a load is made of: the values it resolves and their keys, and for each
// batch its keys, its pool view and what it scatters and checks. A worker keeps one set per
// goroutine that loads and reuses it from load to load (keepLoadLists), so a warm load allocates
// none of them. Each batch list is as long as the load's values, and a batch takes its lists
// from the index of its first value: a batch holds no more entries than the values it covers,
// so no two batches of a load share an element, and what a batch in flight still uses (a
// scatter, a check not read yet) is never written by the next. Every batch is done, its scatter
// and check read and its view released, before a load returns without an error.
type loadLists struct {
	items  []loadItem
	keyBuf []byte // every key of items, end to end

	keys     []string // for a pool that takes keys as strings: slices of one string per load
	keyBytes [][]byte // for one that takes them as bytes (pool.ReusingViewer): of keyBuf
	owners   []*loadItem
	bufs     [][]byte   // staging slots, for a load that does not read the pool in place
	dsts     [][]byte   // engine memory of every value, for a load that reads straight into it
	pieces   [][][]byte // for a load into values' pieces (pool.PieceCopier): each value's pieces
	segs     [][]byte   // a batch's pieces end to end, under pieces
	srcs     [][]byte
	refs     []kvmem.PageRef
	sums     []uint64
	idx      []int
	checked  []*loadItem
	views    []*pool.View // a load's views by batch, for pool.ReusingViewer
}

// key is the key of it, one of l.items.
func (l *loadLists) key(it *loadItem) []byte { return l.keyBuf[it.at:it.end] }

// maxKeptLoadLists is the most values (a page of a group with replicated regions is two) a
// worker's kept lists are sized for: the lists of a larger load are dropped once it is done, so
// one unusually large load does not leave them held for good.
const maxKeptLoadLists = 4096

// fit makes every batch list at least n long.
func (l *loadLists) fit(n int) {
	if len(l.keys) >= n {
		return
	}
	l.keys = make([]string, n)
	l.keyBytes = make([][]byte, n)
	l.owners = make([]*loadItem, n)
	l.bufs = make([][]byte, n)
	l.dsts = make([][]byte, n)
	l.pieces = make([][][]byte, n)
	l.srcs = make([][]byte, n)
	l.refs = make([]kvmem.PageRef, n)
	l.sums = make([]uint64, n)
	l.idx = make([]int, n)
	l.checked = make([]*loadItem, n)
}

// view returns the view of a load's batch b, kept for the next load.
func (l *loadLists) view(b int) *pool.View {
	for len(l.views) <= b {
		l.views = append(l.views, new(pool.View))
	}
	return l.views[b]
}

// keepLoadLists returns the lists of a load that returned err to be used again: nil when it
// failed (a view of one of its batches may not have been released) or when they have grown past
// maxKeptLoadLists (16 times that for the pieces of values split across regions).
func keepLoadLists(l *loadLists, err error) *loadLists {
	if l == nil || err != nil || cap(l.items) > maxKeptLoadLists || len(l.keys) > maxKeptLoadLists || cap(l.segs) > 16*maxKeptLoadLists {
		return nil
	}
	return l
}

// directBatchBytes is what one batch moves when pages are used in place: a load or save batch
// takes pages until it holds this many bytes, whatever transfer_batch_size says, since each
// mover call pays a fixed cost (about 40 µs on an H200) that 64 small pages do not cover
// (docs/perf/gpu.md) and large pages need no more to keep the link busy. Staged transfers are
// bounded by their slots instead. A variable so the GPU benchmarks can compare sizes.
var directBatchBytes = 64 << 20

// directCheckedBatchBytes is directBatchBytes for loads whose pages are checked on the GPU: the
// host does no work per page before the copy, so a load issues its copies in as few batches as
// this allows, and the copy engines are not left idle between batches.
var directCheckedBatchBytes = 256 << 20

// directSaveBatchBytes is directBatchBytes for saves: measured against 64 MiB on the H200,
// 32 MiB batches saved 64 KiB to 1 MiB pages 1–6 points of the link faster.
var directSaveBatchBytes = 32 << 20

// directBatchMaxPages bounds a batch of pages read in place, whatever their size.
const directBatchMaxPages = 8192

// loadPages gets pages from the pool and scatters the ones that landed into engine memory, batch
// by batch. Once a request loses a page its remaining pages are not fetched. A result list of
// the wrong length fails every page of the batch. The returned error is for what is not a page
// miss (the mover, a cancelled context); page misses are in the result.
//
// With view set, the pool's memory is registered with the mover: each batch is leased and
// verified in place (BatchView) and scattered straight from pool memory, and its view is
// released once that scatter is done. Otherwise the pool copies each batch into staging slots
// (BatchGet), used as two sets when there are two or more slots. Either way the scatter of one
// batch overlaps the get of the next, as a GPU copy on a stream overlaps the host: unstage
// records issuing a scatter and sync the wait for it. At most one scatter is in flight (a Mover
// is not safe for concurrent use), a staging set is written again only after its scatter is
// done, and every scatter is done before loadPages returns, so no write into a failed request's
// pages is in flight when it is reported.
//
// When the mover can check pages on the GPU (gpuPageChecks: a CUDA mover and a pool with
// deferred views), a batch is leased unchecked (BatchViewDeferred) and the mover checks each page
// against the checksum taken at put where it landed in engine memory. That check runs while the
// next batch is copied and is read once that copy is done (sync); a page that fails it fails its
// request as a missing page does, is counted by the pool as a checksum error, and is never
// reported loaded. Every check is read before loadPages returns.
//
// The values are lists.items (resolveLoads), and the batches' lists are taken from lists. A
// pool with deferred views that also takes keys as bytes into a View the caller reuses
// (pool.ReusingViewer) gets the keys' bytes, and views kept in lists; any other call gets
// the keys as slices of one string made for the load.
func loadPages(ctx context.Context, pl pool.Pool, view pool.Viewer, mover kvmem.Mover, stage kvmem.Staging, batch int, lists *loadLists, sample *stats.LoadSample) (res loadResult, err error) {
	l := pageLoader{ctx: ctx, pl: pl, view: view, mover: mover, stage: stage, lists: lists, sample: sample}
	l.plan(batch)
	// Deferred: however the load ends, no scatter is left in flight and every check is read.
	defer func() {
		err = l.finish(err)
		res = l.res
	}()
	err = l.run()
	return l.res, err
}

// pageLoader is one loadPages call: what it was handed, how it moves the pages (planned once by
// plan), the scatter in flight and the GPU checks not read yet, and what the load did so far
// (res). It lives on loadPages' stack; each phase of a batch is a method of it.
type pageLoader struct {
	ctx    context.Context
	pl     pool.Pool
	view   pool.Viewer
	mover  kvmem.Mover
	stage  kvmem.Staging
	lists  *loadLists
	sample *stats.LoadSample
	items  []loadItem // lists.items
	n      int        // a batch's lists run from its first value's index to at most here

	deferred  pool.DeferredViewer    // the pool's deferred views, when the mover checks pages
	checker   kvmem.PageChecker      // the mover's GPU page checks, when it checks pages
	into      pool.ReusingViewer     // deferred, when it takes keys as bytes into a reused View
	issuer    kvmem.AsyncPageChecker // checker, when it queues checked scatters (IssueChecked)
	keyString string                 // every key end to end, for a pool that takes keys as strings
	dst       [][]byte               // every value's engine memory, when the load reads straight into it
	copier    pool.PieceCopier       // the pool, when it copies values into their pieces of engine memory (hp)
	hp        kvmem.HostPages        // the mover, when the pool copies into pieces of its memory

	batch         int // values per batch when the pool copies them (no view)
	sets, set     int // staging slot sets, and the one the next batch uses
	target, later int // bytes the first batch read in place holds, and those after it

	// The device's own time on this load's checked scatters: what the mover's totals grew by
	// once every check is read (the mover is this load's alone until it returns).
	timer     kvmem.GPUTimer
	gpuBefore kvmem.GPUTime

	// The scatter in flight, if any, and what its pages are.
	inflight       chan scattered
	inflightOwners []*loadItem
	inflightView   *pool.View // released once its scatter is done
	inflightIdx    []int
	// GPU checks launched and not read yet, oldest first: a batch's check runs while the next
	// batch is copied, and is read once that copy is done.
	checks []pendingCheck

	res loadResult
}

// scattered is what came of a scatter in flight.
type scattered struct {
	err   error
	check func() ([]bool, error) // the GPU check of the batch, when the mover checks
}

// pendingCheck is a GPU check of a batch's pages, launched and not read yet.
type pendingCheck struct {
	wait    func() ([]bool, error)
	owners  []*loadItem
	view    *pool.View
	idx     []int // index in view of each checked page
	release bool  // release the view once read: a batch issued without waiting for its copies
}

// loadBatch is one batch of a load: its values (owners) with their keys and buffers, the pool's
// answer (got, and the view v when read in place), and the landed values the batch scatters
// (srcs into refs; with their checksums, their index in v and their values when checked on the
// GPU). Its lists are the load's lists from the index of its first value (start).
type loadBatch struct {
	start         int
	keys          []string
	keyBytes      [][]byte
	bufs          [][]byte
	pieces        [][][]byte // each value's pieces of engine memory, when the pool copies into them
	owners        []*loadItem
	got           []int64
	v             *pool.View
	srcs          [][]byte
	refs          []kvmem.PageRef
	checked       bool // a deferred view: the GPU checks what it copies
	sums          []uint64
	idx           []int
	checkedOwners []*loadItem
}

// plan decides how the load moves its pages: whether the mover checks them on the GPU, how the
// pool is handed their keys, whether they are read straight into engine memory, how many
// staging slot sets there are, and how large a batch is (batch values when the pool copies
// them, target and then later bytes when read in place).
func (l *pageLoader) plan(batch int) {
	l.items = l.lists.items
	l.lists.fit(len(l.items))
	l.n = len(l.items)
	// Straight into engine memory: a mover whose engine memory is host memory, and every value
	// one contiguous piece of it. The pool then copies each value there and checks it in the
	// same pass (BatchGet), even a pool whose memory could be read in place: checking a value
	// in place and then copying it reads it twice.
	l.dst = hostDestinations(l.mover, l.items, l.lists.dsts[:len(l.items)])
	if l.dst == nil {
		// Split across regions, into the pieces: a pool that copies a value into several
		// pieces in its checked pass (pool.PieceCopier).
		l.copier, l.hp = hostPieces(l.pl, l.mover, l.items)
	}
	direct := l.dst != nil || l.hp != nil
	if direct {
		l.view = nil
	}
	l.deferred, l.checker = gpuPageChecks(l.view, l.mover)
	l.into, _ = l.deferred.(pool.ReusingViewer)
	if l.into == nil {
		l.keyString = string(l.lists.keyBuf)
	}
	l.startGPUTimer()
	l.sets = 1
	if l.view != nil {
		l.sets = 2 // no slots to share: one batch is verified while the previous one is scattered
	} else if !direct {
		if l.stage.Slots() >= 2 {
			l.sets = 2
		}
		batch = max(1, min(batch, l.stage.Slots()/l.sets))
	}
	l.batch = max(1, batch)
	// In place, the first batch holds a quarter of directBatchBytes: its check on the host is
	// the one that no scatter overlaps, so the copy engines start sooner. Checked on the GPU,
	// a batch costs the host nothing before its copy, and fewer batches leave the copy engines
	// idle between them less often.
	l.target, l.later = directBatchBytes/4, directBatchBytes
	if l.deferred != nil {
		l.target, l.later = directCheckedBatchBytes, directCheckedBatchBytes
	}
	// Read straight into engine memory, no slots bound a batch either: it holds
	// directBatchBytes, as a save written in place holds directSaveBatchBytes. Each pool call
	// ends when its slowest transfer does, so a load in fewer calls leaves its transfers idle at
	// fewer call ends (a synchronous load of eight 64-page requests: one call instead of eight).
	if direct && !directHostBatchOff {
		l.target, l.later = directBatchBytes, directBatchBytes
	}
	// A mover that queues checked scatters without waiting for their copies (IssueChecked)
	// starts copying a first batch while the host prepares the rest (firstIssuedBatch). Such a
	// mover queues every checked batch, a single one too: waiting for its check, which runs
	// behind its copies, is then the load's only wait on the device.
	l.issuer, _ = l.checker.(kvmem.AsyncPageChecker)
	if l.deferred == nil {
		l.issuer = nil
	}
	if l.issuer != nil && !issuedFirstBatchOff {
		if first := firstIssuedBatch(l.items); first > 0 {
			l.target = min(l.later, first)
		}
	}
}

// startGPUTimer reads the mover's device time before the load, when the load is sampled and
// checked on the GPU by a mover that keeps it (kvmem.GPUTimer).
func (l *pageLoader) startGPUTimer() {
	if l.checker == nil || l.sample == nil {
		return
	}
	if l.timer, _ = l.mover.(kvmem.GPUTimer); l.timer != nil {
		l.gpuBefore = l.timer.GPUTime()
	}
}

// run loads the values batch by batch; finish waits for what it leaves in flight.
func (l *pageLoader) run() error {
	for b, next := 0, 0; next < len(l.items); b++ {
		if err := l.ctx.Err(); err != nil {
			return err
		}
		lb := loadBatch{start: next}
		next = l.describe(&lb)
		if len(lb.owners) == 0 {
			continue
		}
		l.get(&lb, b)
		l.land(&lb)
		if err := l.wait(); err != nil {
			if lb.v != nil {
				lb.v.Release()
			}
			return err
		}
		if err := l.scatter(&lb, next < len(l.items)); err != nil {
			return err
		}
		if l.sets == 2 {
			l.set ^= 1
		} else if err := l.wait(); err != nil {
			return err
		}
	}
	return nil
}

// full reports whether a batch of pages values and bytes bytes takes no more.
func (l *pageLoader) full(pages, bytes int) bool {
	if l.view == nil && ((l.dst == nil && l.hp == nil) || directHostBatchOff) {
		return pages >= l.batch
	}
	return pages >= directBatchMaxPages || bytes >= l.target
}

// describe fills lb with the values from lb.start on until it is full: their keys, their
// buffers (engine memory, staging slots of the current set, or none when read in place) and the
// values themselves, skipping those of a request that already lost a page. It returns the index
// of the first value it did not take.
func (l *pageLoader) describe(lb *loadBatch) int {
	m := l.sample.Start()
	lists, items, start, n := l.lists, l.items, lb.start, l.n
	lb.keys, lb.keyBytes = lists.keys[start:start:n], lists.keyBytes[start:start:n]
	if l.view == nil {
		lb.bufs = lists.bufs[start:start:n]
	}
	lb.owners = lists.owners[start:start:n]
	if l.hp != nil {
		// The previous batch's pieces were copied into before its get returned.
		lb.pieces, lists.segs = lists.pieces[start:start:n], lists.segs[:0]
	}
	next := start
	for bytes := 0; next < len(items) && !l.full(len(lb.owners), bytes) && (l.hp == nil || len(lb.owners) == 0 || len(lists.segs) < maxBatchPieces); next++ {
		it := &items[next]
		if l.res.failed[it.req] {
			continue
		}
		var pieces [][]byte
		if l.hp != nil {
			var ok bool
			if pieces, ok = l.valuePieces(it); !ok {
				l.lost(it)
				continue
			}
		}
		if l.into != nil {
			lb.keyBytes = append(lb.keyBytes, lists.key(it))
		} else {
			lb.keys = append(lb.keys, l.keyString[it.at:it.end])
		}
		switch {
		case l.dst != nil:
			lb.bufs = append(lb.bufs, l.dst[next])
		case l.hp != nil:
			lb.pieces = append(lb.pieces, pieces)
		case l.view == nil:
			lb.bufs = append(lb.bufs, l.stage.Slot(l.set*l.batch + len(lb.bufs))[:it.size])
		}
		lb.owners = append(lb.owners, it)
		bytes += it.size
	}
	l.sample.End(stats.PhaseDescribe, m)
	l.target = l.later
	return next
}

// get asks the pool for batch b's values (lb): leased in place, unchecked when the mover checks
// them (into the batch's kept view for a pool.ReusingViewer), or copied into the batch's buffers.
func (l *pageLoader) get(lb *loadBatch, b int) {
	m := l.sample.Start()
	getRegion := trace.StartRegion(l.ctx, "load.get")
	switch {
	case l.into != nil:
		lb.v = l.lists.view(b)
		l.into.BatchViewDeferredInto(l.ctx, lb.keyBytes, lb.v)
	case l.deferred != nil:
		lb.v = l.deferred.BatchViewDeferred(l.ctx, lb.keys)
	case l.view != nil:
		lb.v = l.view.BatchView(l.ctx, lb.keys)
	case l.hp != nil:
		lb.got = l.copier.BatchGetPieces(l.ctx, lb.keys, lb.pieces)
	default:
		lb.got = l.pl.BatchGet(l.ctx, lb.keys, lb.bufs)
	}
	if lb.v != nil {
		lb.got, lb.bufs = lb.v.Codes, lb.v.Bufs
	}
	l.sample.End(stats.PhaseGet, m)
	getRegion.End()
	l.res.storeCalls++
	if l.sample != nil {
		l.sample.Pages += int64(len(lb.owners))
		l.sample.StoreCalls++
	}
}

// land sorts lb's values by the pool's answer. One that came back whole has landed: read
// straight into engine memory it is done, otherwise it is listed for the batch's scatter (with
// its checksum, its index in the view and itself, when the GPU checks it). Any other fails its
// request.
func (l *pageLoader) land(lb *loadBatch) {
	lists, start, n := l.lists, lb.start, l.n
	lb.srcs = lists.srcs[start:start:n]
	lb.refs = lists.refs[start:start:n]
	lb.checked = lb.v != nil && lb.v.Sums != nil // a deferred view: the GPU checks what it copies
	if lb.checked {
		lb.sums, lb.idx, lb.checkedOwners = lists.sums[start:start:n], lists.idx[start:start:n], lists.checked[start:start:n]
	}
	got, bufs, owners := lb.got, lb.bufs, lb.owners
	for i, it := range owners {
		if len(got) != len(owners) || got[i] != int64(it.size) {
			l.lost(it)
			continue
		}
		if l.hp != nil { // landed in its pieces: nothing to scatter
			l.res.landedBytes += int64(it.size)
			continue
		}
		if len(bufs) != len(owners) || len(bufs[i]) != it.size {
			l.lost(it)
			continue
		}
		l.res.landedBytes += int64(it.size)
		if l.dst != nil { // landed where it belongs: nothing to scatter
			continue
		}
		lb.srcs = append(lb.srcs, bufs[i])
		lb.refs = append(lb.refs, it.ref)
		if lb.checked {
			lb.sums = append(lb.sums, lb.v.Sums[i])
			lb.idx = append(lb.idx, i)
			lb.checkedOwners = append(lb.checkedOwners, it)
		}
	}
}

// lost records that value it failed: its page is missing and its request failed.
func (l *pageLoader) lost(it *loadItem) {
	l.res.failedPages++
	l.missing(it)
	l.res.fail(it.req)
}

// missing records the key of the load's first value that failed.
func (l *pageLoader) missing(it *loadItem) {
	if l.res.firstMissing == "" {
		l.res.firstMissing = string(l.lists.key(it))
	}
}

// scatter moves lb's landed values into engine memory once the previous scatter is done:
// queued without waiting when the mover issues checked scatters (issue), otherwise in flight
// on another goroutine while the next batch is got, when there is one (more). A batch with
// nothing to scatter releases its view.
func (l *pageLoader) scatter(lb *loadBatch, more bool) error {
	switch {
	case len(lb.srcs) == 0:
		if lb.v != nil {
			lb.v.Release()
		}
		return nil
	case lb.checked && l.issuer != nil:
		return l.issue(lb)
	}
	m := l.sample.Start()
	done := make(chan scattered, 1)
	var checker kvmem.PageChecker
	if lb.checked {
		checker = l.checker
	}
	if more {
		go scatterBatch(l.ctx, l.mover, checker, lb.srcs, lb.refs, lb.sums, done) // overlaps the next batch's pool call
	} else {
		scatterBatch(l.ctx, l.mover, checker, lb.srcs, lb.refs, lb.sums, done) // the last batch: nothing to overlap, and no hand-off to another thread
	}
	l.inflight = done
	l.inflightOwners, l.inflightView, l.inflightIdx = lb.checkedOwners, lb.v, lb.idx
	l.sample.End(stats.PhaseUnstage, m)
	return nil
}

// scatterBatch scatters srcs into refs and sends what came of it on done: through checker's
// ScatterChecked against sums when checker is set, otherwise through mover's Scatter.
func scatterBatch(ctx context.Context, mover kvmem.Mover, checker kvmem.PageChecker, srcs [][]byte, refs []kvmem.PageRef, sums []uint64, done chan<- scattered) {
	defer trace.StartRegion(ctx, "load.scatter").End()
	if checker != nil {
		check, err := checker.ScatterChecked(ctx, srcs, refs, sums)
		done <- scattered{err: err, check: check}
	} else {
		done <- scattered{err: mover.Scatter(ctx, srcs, refs)}
	}
}

// issue queues lb's checked scatter through the mover without waiting for its copies
// (IssueChecked); the check is read, and the batch's view released, by collect.
func (l *pageLoader) issue(lb *loadBatch) error {
	m := l.sample.Start()
	r := trace.StartRegion(l.ctx, "load.issue")
	check, err := l.issuer.IssueChecked(l.ctx, lb.srcs, lb.refs, lb.sums)
	r.End()
	l.sample.End(stats.PhaseUnstage, m)
	if err != nil {
		lb.v.Release()
		return fmt.Errorf("scatter loaded pages: %w", err)
	}
	l.checks = append(l.checks, pendingCheck{wait: check, owners: lb.checkedOwners, view: lb.v, idx: lb.idx, release: true})
	// The mover keeps two checks in flight; reading the older ones here keeps their
	// views no longer than needed.
	return l.collect(2)
}

// wait waits for the scatter in flight, if any, and releases its view. A scatter checked on the
// GPU leaves its check pending; every check but the newest is then read (collect).
func (l *pageLoader) wait() error {
	if l.inflight == nil {
		return nil
	}
	m := l.sample.Start()
	out := <-l.inflight
	l.sample.End(stats.PhaseSync, m)
	l.inflight = nil
	if l.inflightView != nil {
		l.inflightView.Release()
	}
	if out.err != nil {
		return fmt.Errorf("scatter loaded pages: %w", out.err)
	}
	if out.check != nil {
		l.checks = append(l.checks, pendingCheck{wait: out.check, owners: l.inflightOwners, view: l.inflightView, idx: l.inflightIdx})
		return l.collect(1)
	}
	return nil
}

// collect reads the oldest pending checks until keep are left. A page that failed its check
// fails its request as a missing page does, takes its bytes off what landed, and is reported
// corrupt to the view it came from.
func (l *pageLoader) collect(keep int) error {
	for len(l.checks) > keep {
		c := l.checks[0]
		l.checks = l.checks[1:]
		m := l.sample.Start()
		checkRegion := trace.StartRegion(l.ctx, "load.check")
		bad, err := c.wait()
		checkRegion.End()
		l.sample.End(stats.PhaseSync, m)
		if c.release {
			releaseRegion := trace.StartRegion(l.ctx, "load.release")
			c.view.Release() // issued without waiting: the copies are done only now
			releaseRegion.End()
		}
		if err != nil {
			return fmt.Errorf("check loaded pages: %w", err)
		}
		for i, b := range bad {
			if !b {
				continue
			}
			it := c.owners[i]
			l.res.landedBytes -= int64(it.size)
			l.lost(it)
			c.view.Corrupt(c.idx[i])
		}
	}
	return nil
}

// finish ends a load that run left with err: it waits for the scatter in flight, reads every
// check left and adds what the load did to its sample. It returns err, or when err is nil the
// first error of those.
func (l *pageLoader) finish(err error) error {
	if werr := l.wait(); err == nil {
		err = werr
	}
	if cerr := l.collect(0); err == nil {
		err = cerr
	}
	if s := l.sample; s != nil {
		s.LandedBytes += l.res.landedBytes
		s.FailedPages += int64(l.res.failedPages)
		if l.timer != nil {
			g := l.timer.GPUTime()
			s.GPUCopy += g.Copy - l.gpuBefore.Copy
			s.GPUCheck += g.Check - l.gpuBefore.Check
		}
	}
	return err
}

// directHostBatchOff makes loads that read straight into engine memory take transfer_batch_size
// pages a pool call, as staged loads do, instead of directBatchBytes; the tests set it to compare.
var directHostBatchOff = false

// hostDestinationsOff makes loads stage every page, or read the pool in place, even where the
// pool could copy it straight into engine memory or its pieces; the benchmarks set it to compare.
var hostDestinationsOff = false

// hostDestinations returns, for a load that reads each value straight into engine memory, the
// engine memory of every value in items' order; nil when the load stages its pages or reads
// them in place. It does so when the mover's engine memory is host memory (kvmem.HostPages) and
// every value is one contiguous piece of it: a Mooncake cluster's Transfer Engine then reads a
// peer's page off the socket into it, and an in-process pool copies and checks each value in one
// pass. The list is out (as long as items), from the load's lists.
func hostDestinations(mover kvmem.Mover, items []loadItem, out [][]byte) [][]byte {
	if hostDestinationsOff {
		return nil
	}
	return pageMemory(mover, len(items), func(i int) (kvmem.PageRef, int) { return items[i].ref, items[i].size }, out)
}

// pageMemory fills out (n long) with the engine memory of each of n values, value i being page
// value(i) of its size, when the mover's engine memory is host memory (kvmem.HostPages) and
// every value is one contiguous piece of it; nil otherwise.
func pageMemory(mover kvmem.Mover, n int, value func(i int) (kvmem.PageRef, int), out [][]byte) [][]byte {
	hp, ok := mover.(kvmem.HostPages)
	if !ok || n == 0 {
		return nil
	}
	for i := range n {
		ref, size := value(i)
		mem, ok := hp.PageMemory(ref)
		if !ok || len(mem) != size {
			return nil
		}
		out[i] = mem
	}
	return out
}

// maxBatchPieces bounds the pieces of engine memory one pool call of a load or save through
// values' pieces (pool.PieceCopier) names: a layer group may have thousands of regions, and each
// is a piece of every page's value.
var maxBatchPieces = 1 << 16

// hostPieces returns, for a load whose values are split across regions of host engine memory,
// the pool as a pool.PieceCopier and the mover as kvmem.HostPages; nil when either cannot do
// that. The pool then copies each value into its pieces (valuePieces) in the pass that checks
// it, where reading it in place checks it and then copies it: one read of each value instead
// of two.
func hostPieces(pl pool.Pool, mover kvmem.Mover, items []loadItem) (pool.PieceCopier, kvmem.HostPages) {
	if hostDestinationsOff || len(items) == 0 {
		return nil, nil
	}
	return pieceCopier(pl, mover)
}

// pieceCopier returns the pool as a pool.PieceCopier and the mover as kvmem.HostPages when both
// are; nil otherwise.
func pieceCopier(pl pool.Pool, mover kvmem.Mover) (pool.PieceCopier, kvmem.HostPages) {
	pc, ok := pl.(pool.PieceCopier)
	if !ok {
		return nil, nil
	}
	hp, ok := mover.(kvmem.HostPages)
	if !ok {
		return nil, nil
	}
	return pc, hp
}

// valuePieces returns the pieces of engine memory value it occupies, appended to the batch's
// lists.segs; false when the mover has none that add up to its size.
func (l *pageLoader) valuePieces(it *loadItem) ([][]byte, bool) {
	start := len(l.lists.segs)
	segs, ok := l.hp.PageSegments(it.ref, l.lists.segs)
	n := 0
	for _, p := range segs[start:] {
		n += len(p)
	}
	if !ok || n != it.size {
		l.lists.segs = segs[:start]
		return nil, false
	}
	l.lists.segs = segs
	return segs[start:len(segs):len(segs)], true
}

// issuedFirstBatchOff makes checked loads issue their pages in one batch even where the mover
// can queue batches without waiting (kvmem.AsyncPageChecker); the GPU benchmarks set it to
// compare. See firstIssuedBatch for the others.
var (
	issuedFirstBatchOff   = false
	issuedFirstBatchMin   = 1 << 20
	issuedSplitMinPages   = 256
	issuedSplitSmallPages = 128
	issuedSplitSmallBytes = 128 << 10
)

// firstIssuedBatch returns how many bytes a checked load of items issued through a mover that
// queues its scatters (IssueChecked) puts in its first batch, so the GPU copies that batch while
// the host looks up and describes the rest, whose copies then queue right behind it; 0 issues
// the load in one batch. The first batch is a quarter of the load (at least
// issuedFirstBatchMin bytes). A load is split when it has issuedSplitMinPages pages or more, or
// issuedSplitSmallPages pages or more averaging at most issuedSplitSmallBytes: what the host does
// per page then weighs against the copies. On the H200 (docs/perf/serve-gpu.md): 768 pages of
// 64 KiB loaded 8–18 % faster (run 44); StartLoads of about 190 pages of 64 KiB into PyTorch
// reached 0.50–0.52 of the link split against 0.48 in one batch (run 66); 192 pages of 256 KiB
// were up to 5 % slower split, and 48 pages of 256 KiB 12–35 % slower, for the second batch's
// fixed cost (run 44).
func firstIssuedBatch(items []loadItem) int {
	if len(items) < min(issuedSplitMinPages, issuedSplitSmallPages) {
		return 0
	}
	var total int
	for i := range items {
		total += items[i].size
	}
	if len(items) < issuedSplitMinPages && total > issuedSplitSmallBytes*len(items) {
		return 0
	}
	return max(issuedFirstBatchMin, total/4)
}

// wakeDeviceOff makes loads leave the device alone until their first copy; the GPU benchmarks
// set it to compare.
var wakeDeviceOff = false

// wakeDevice wakes the mover's device, when it has one to wake (kvmem.DeviceWaker), and reports
// whether it did. On the H200 a GPU an engine's kernels used last takes 0.06–0.13 ms to switch to
// the daemon's context; woken before the load looks its pages up, it switches meanwhile instead
// of after the first copy (docs/perf/serve-gpu.md). The call itself (a kernel launch) costs the
// host 5–30 µs, so the daemon wakes the device once it has answered BindMeta, while the engine
// sends StartLoad (Worker.WakeForLoads), and a load wakes it only when that did not happen.
// A device that fails to wake fails the load's copies, which report it.
func wakeDevice(mover kvmem.Mover) bool {
	w, ok := mover.(kvmem.DeviceWaker)
	if !ok || wakeDeviceOff {
		return false
	}
	return w.WakeDevice() == nil
}

// wakeFresh is how long after WakeForLoads a StartLoad takes the device as still woken: an
// engine calls StartLoad right after BindMeta; after a longer gap its own kernels may have taken
// the GPU back.
const wakeFresh = 2 * time.Millisecond

// gpuPageChecksOff makes loads check pages on the host even where the mover could check them
// on the GPU; the GPU benchmarks set it to compare the two.
var gpuPageChecksOff = false

// gpuPageChecks returns the pool's deferred views and the mover's GPU page checks when a load
// can use both: the pool's values are read in place (view), the pool hands them out unchecked
// with their checksums, and the mover checks pages in engine memory after copying them
// (kvmem.PageChecker). Otherwise it returns nils and the pool checks every page on the host before
// it is copied.
func gpuPageChecks(view pool.Viewer, mover kvmem.Mover) (pool.DeferredViewer, kvmem.PageChecker) {
	if view == nil || gpuPageChecksOff {
		return nil, nil
	}
	dv, ok := view.(pool.DeferredViewer)
	if !ok {
		return nil, nil
	}
	pc, ok := mover.(kvmem.PageChecker)
	if !ok || pc.PageCheckError() != nil {
		return nil, nil
	}
	return dv, pc
}
