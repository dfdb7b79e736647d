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
	bufs     [][]byte // staging slots, for a load that does not read the pool in place
	dsts     [][]byte // engine memory of every value, for a load that reads straight into it
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
// maxKeptLoadLists.
func keepLoadLists(l *loadLists, err error) *loadLists {
	if l == nil || err != nil || cap(l.items) > maxKeptLoadLists || len(l.keys) > maxKeptLoadLists {
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
	items := lists.items
	lists.fit(len(items))
	n := len(items) // a batch's lists run from its first value's index to at most here
	deferred, checker := gpuPageChecks(view, mover)
	into, _ := deferred.(pool.ReusingViewer)
	var keyString string
	if into == nil {
		keyString = string(lists.keyBuf)
	}
	// missing records the key of the load's first value that failed.
	missing := func(it *loadItem) {
		if res.firstMissing == "" {
			res.firstMissing = string(lists.key(it))
		}
	}
	// The device's own time on this load's checked scatters: what the mover's totals grew by
	// once every check is read (the mover is this load's alone until it returns).
	var timer kvmem.GPUTimer
	var gpuBefore kvmem.GPUTime
	if checker != nil && sample != nil {
		if timer, _ = mover.(kvmem.GPUTimer); timer != nil {
			gpuBefore = timer.GPUTime()
		}
	}
	// Straight into engine memory: a pool that reads into the caller's buffers, a mover whose
	// engine memory is host memory, and every value one contiguous piece of it.
	dst := hostDestinations(view, mover, items, lists.dsts[:len(items)])
	sets := 1
	if view != nil {
		sets = 2 // no slots to share: one batch is verified while the previous one is scattered
	} else if dst == nil {
		if stage.Slots() >= 2 {
			sets = 2
		}
		batch = max(1, min(batch, stage.Slots()/sets))
	}
	batch = max(1, batch)

	// The scatter in flight, if any, and what its pages are.
	type scattered struct {
		err   error
		check func() ([]bool, error) // the GPU check of the batch, when the mover checks
	}
	var inflight chan scattered
	var inflightOwners []*loadItem
	var inflightView *pool.View // released once its scatter is done
	var inflightIdx []int
	// GPU checks launched and not read yet, oldest first: a batch's check runs while the next
	// batch is copied, and is read once that copy is done.
	type pendingCheck struct {
		wait    func() ([]bool, error)
		owners  []*loadItem
		view    *pool.View
		idx     []int // index in view of each checked page
		release bool  // release the view once read: a batch issued without waiting for its copies
	}
	var checks []pendingCheck
	collect := func(keep int) error {
		for len(checks) > keep {
			c := checks[0]
			checks = checks[1:]
			m := sample.Start()
			r := trace.StartRegion(ctx, "load.check")
			bad, err := c.wait()
			r.End()
			sample.End(stats.PhaseSync, m)
			if c.release {
				r := trace.StartRegion(ctx, "load.release")
				c.view.Release() // issued without waiting: the copies are done only now
				r.End()
			}
			if err != nil {
				return fmt.Errorf("check loaded pages: %w", err)
			}
			for i, b := range bad {
				if !b {
					continue
				}
				it := c.owners[i]
				res.failedPages++
				res.landedBytes -= int64(it.size)
				res.fail(it.req)
				missing(it)
				c.view.Corrupt(c.idx[i])
			}
		}
		return nil
	}
	wait := func() error {
		if inflight == nil {
			return nil
		}
		m := sample.Start()
		out := <-inflight
		sample.End(stats.PhaseSync, m)
		inflight = nil
		if inflightView != nil {
			inflightView.Release()
		}
		if out.err != nil {
			return fmt.Errorf("scatter loaded pages: %w", out.err)
		}
		if out.check != nil {
			checks = append(checks, pendingCheck{wait: out.check, owners: inflightOwners, view: inflightView, idx: inflightIdx})
			return collect(1)
		}
		return nil
	}
	defer func() {
		if werr := wait(); err == nil {
			err = werr
		}
		if cerr := collect(0); err == nil {
			err = cerr
		}
		if sample != nil {
			sample.LandedBytes += res.landedBytes
			sample.FailedPages += int64(res.failedPages)
			if timer != nil {
				g := timer.GPUTime()
				sample.GPUCopy += g.Copy - gpuBefore.Copy
				sample.GPUCheck += g.Check - gpuBefore.Check
			}
		}
	}()
	// In place, the first batch holds a quarter of directBatchBytes: its check on the host is
	// the one that no scatter overlaps, so the copy engines start sooner. Checked on the GPU,
	// a batch costs the host nothing before its copy, and fewer batches leave the copy engines
	// idle between them less often.
	target, later := directBatchBytes/4, directBatchBytes
	if deferred != nil {
		target, later = directCheckedBatchBytes, directCheckedBatchBytes
	}
	// A mover that queues checked scatters without waiting for their copies (IssueChecked)
	// starts copying a first batch while the host prepares the rest (firstIssuedBatch). Such a
	// mover queues every checked batch, a single one too: waiting for its check, which runs
	// behind its copies, is then the load's only wait on the device.
	issuer, _ := checker.(kvmem.AsyncPageChecker)
	if deferred == nil {
		issuer = nil
	}
	if issuer != nil && !issuedFirstBatchOff {
		if first := firstIssuedBatch(items); first > 0 {
			target = min(later, first)
		}
	}
	full := func(pages, bytes int) bool {
		if view == nil {
			return pages >= batch
		}
		return pages >= directBatchMaxPages || bytes >= target
	}
	set := 0
	for b, next := 0, 0; next < len(items); b++ {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		m := sample.Start()
		start := next
		keys, keyBytes := lists.keys[start:start:n], lists.keyBytes[start:start:n]
		var bufs [][]byte
		if view == nil {
			bufs = lists.bufs[start:start:n]
		}
		owners := lists.owners[start:start:n]
		for bytes := 0; next < len(items) && !full(len(owners), bytes); next++ {
			it := &items[next]
			if res.failed[it.req] {
				continue
			}
			if into != nil {
				keyBytes = append(keyBytes, lists.key(it))
			} else {
				keys = append(keys, keyString[it.at:it.end])
			}
			switch {
			case dst != nil:
				bufs = append(bufs, dst[next])
			case view == nil:
				bufs = append(bufs, stage.Slot(set*batch + len(bufs))[:it.size])
			}
			owners = append(owners, it)
			bytes += it.size
		}
		sample.End(stats.PhaseDescribe, m)
		target = later
		if len(owners) == 0 {
			continue
		}

		m = sample.Start()
		getRegion := trace.StartRegion(ctx, "load.get")
		var got []int64
		var v *pool.View
		switch {
		case into != nil:
			v = lists.view(b)
			into.BatchViewDeferredInto(ctx, keyBytes, v)
		case deferred != nil:
			v = deferred.BatchViewDeferred(ctx, keys)
		case view != nil:
			v = view.BatchView(ctx, keys)
		default:
			got = pl.BatchGet(ctx, keys, bufs)
		}
		if v != nil {
			got, bufs = v.Codes, v.Bufs
		}
		sample.End(stats.PhaseGet, m)
		getRegion.End()
		res.storeCalls++
		if sample != nil {
			sample.Pages += int64(len(owners))
			sample.StoreCalls++
		}

		srcs := lists.srcs[start:start:n]
		refs := lists.refs[start:start:n]
		checked := v != nil && v.Sums != nil // a deferred view: the GPU checks what it copies
		var sums []uint64
		var idx []int
		var scatteredOwners []*loadItem
		if checked {
			sums, idx, scatteredOwners = lists.sums[start:start:n], lists.idx[start:start:n], lists.checked[start:start:n]
		}
		for i, it := range owners {
			if len(got) == len(owners) && got[i] == int64(it.size) && len(bufs) == len(owners) && len(bufs[i]) == it.size {
				if dst != nil { // landed where it belongs: nothing to scatter
					res.landedBytes += int64(it.size)
					continue
				}
				srcs = append(srcs, bufs[i])
				refs = append(refs, it.ref)
				res.landedBytes += int64(it.size)
				if checked {
					sums = append(sums, v.Sums[i])
					idx = append(idx, i)
					scatteredOwners = append(scatteredOwners, it)
				}
				continue
			}
			res.failedPages++
			missing(it)
			res.fail(it.req)
		}
		if err := wait(); err != nil {
			if v != nil {
				v.Release()
			}
			return res, err
		}
		if len(srcs) > 0 && checked && issuer != nil {
			m = sample.Start()
			r := trace.StartRegion(ctx, "load.issue")
			check, err := issuer.IssueChecked(ctx, srcs, refs, sums)
			r.End()
			sample.End(stats.PhaseUnstage, m)
			if err != nil {
				v.Release()
				return res, fmt.Errorf("scatter loaded pages: %w", err)
			}
			checks = append(checks, pendingCheck{wait: check, owners: scatteredOwners, view: v, idx: idx, release: true})
			// The mover keeps two checks in flight; reading the older ones here keeps their
			// views no longer than needed.
			if err := collect(2); err != nil {
				return res, err
			}
		} else if len(srcs) > 0 {
			m = sample.Start()
			done := make(chan scattered, 1)
			scatter := func() {
				defer trace.StartRegion(ctx, "load.scatter").End()
				if checked {
					check, err := checker.ScatterChecked(ctx, srcs, refs, sums)
					done <- scattered{err: err, check: check}
				} else {
					done <- scattered{err: mover.Scatter(ctx, srcs, refs)}
				}
			}
			if next < len(items) {
				go scatter() // overlaps the next batch's pool call
			} else {
				scatter() // the last batch: nothing to overlap, and no hand-off to another thread
			}
			inflight = done
			inflightOwners, inflightView, inflightIdx = scatteredOwners, v, idx
			sample.End(stats.PhaseUnstage, m)
		} else if v != nil {
			v.Release()
		}
		if sets == 2 {
			set ^= 1
		}
		if sets == 1 {
			if err := wait(); err != nil {
				return res, err
			}
		}
	}
	return res, nil
}

// hostDestinationsOff makes loads stage every page even where they could read it straight into
// engine memory; the benchmarks set it to compare the two.
var hostDestinationsOff = false

// hostDestinations returns, for a load that reads each value straight into engine memory, the
// engine memory of every value in items' order; nil when the load stages its pages. It does so
// when the pool reads into the caller's buffers (no view: a Mooncake cluster, whose Transfer
// Engine reads a peer's page off the socket), the mover's engine memory is host memory
// (kvmem.HostPages) and every value is one contiguous piece of it. The list is out (as long as
// items), from the load's lists.
func hostDestinations(view pool.Viewer, mover kvmem.Mover, items []loadItem, out [][]byte) [][]byte {
	hp, ok := mover.(kvmem.HostPages)
	if view != nil || !ok || hostDestinationsOff || len(items) == 0 {
		return nil
	}
	for i := range items {
		mem, ok := hp.PageMemory(items[i].ref)
		if !ok || len(mem) != items[i].size {
			return nil
		}
		out[i] = mem
	}
	return out
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
