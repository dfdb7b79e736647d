package embedded

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/pool"
)

// ErrClosed is returned by Segments and Stats after Close.
var ErrClosed = errors.New("pool is closed")

// segment is one mounted memory region and its allocator.
type segment struct {
	name  string
	mem   []byte
	alloc *offsetAllocator
	// base is the address the admin API reports for offset 0; the embedded pool has no
	// transfer engine, so it is a stable synthetic value rather than a real pointer.
	base uint64
}

// object is one stored page. Every field is guarded by Embedded.mu.
type object struct {
	key  string
	seq  uint64 // put order, the tie-break between equal lease deadlines
	seg  *segment
	off  int64
	size int64
	sum  keys.Checksum

	complete bool      // the copy finished and the object is readable
	lease    time.Time // lease_timeout: leased while it is after now
	softPin  time.Time // soft-pin deadline; pinned while it is after now
	hardPin  bool
	group    *group

	idx     int  // position in Embedded.list
	refcnt  int  // readers copying out of the object's memory right now
	removed bool // gone from the index; memory is released when refcnt drops to 0
}

type group struct {
	id           string
	members      map[*object]struct{}
	needsRefresh bool
}

// Embedded is an in-process pool with the Mooncake master's semantics (reference §2): leases,
// the high watermark and eviction ratio, the two eviction passes on object counts, soft and
// hard pins, eviction groups and put-never-overwrites. It implements Pool and Inspector and is
// safe for concurrent use.
//
// Memory: each segment is one []byte; puts copy the caller's bytes in once and gets copy them
// out once. A reader holds a reference on the object during its copy, so neither Remove nor
// eviction can reuse that memory until the copy is done.
type Embedded struct {
	opts  Options
	clock Clock
	start time.Time

	mu        sync.Mutex
	objs      map[string]*object
	list      []*object // the same objects densely, for the eviction census
	cands     []cand    // reused candidate buffer of the eviction census
	groups    map[string]*group
	segs      []*segment
	capacity  int64
	used      int64 // allocated bytes, pending puts included (the master counts from PutStart)
	seq       uint64
	rr        int
	needEvict bool
	closed    bool
	hist      valueSizeHistogram

	onEvict atomic.Pointer[func(EvictionRound)]
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}

	c counters
}

// counters are the pool's monotonic counters, readable without the lock.
type counters struct {
	hits, misses, puts, skipped, putFailures, bytesIn, bytesOut, checksumErrors       atomic.Int64
	rounds, successfulRounds, evictedPass1, evictedPass2, evictedSoft, evictedGrouped atomic.Int64
	evictedBytes, existProbes, existCalls, allocFailures                              atomic.Int64
	putCalls, getCalls, getItems, removeCalls, removeFailures, queryKey, queryKeyFail atomic.Int64
	existFailedItems, getFailedItems, putFailedItems                                  atomic.Int64
}

// EvictedObject is one object an eviction round removed.
type EvictedObject struct {
	Key        string
	Size       int64
	Pass       int // 1 or 2
	SoftPinned bool
	Group      string // "" when ungrouped
	// Refill marks an object pass 1 took from outside its oldest frontier to make up a
	// shortfall (the frontier held objects it could not evict), in shard order.
	Refill bool
}

// EvictionRound reports one run of the eviction algorithm (the master's EVICT-TRIGGER /
// EVICT-RESULT log lines).
type EvictionRound struct {
	At              time.Time
	MemoryRatio     float64
	NeedMemEviction bool
	Base            int
	Target          float64
	LowerBound      float64
	Evicted         []EvictedObject
}

// NewEmbedded validates opts and mounts its segments. When opts.EvictionPeriod is positive an
// eviction goroutine runs until Close.
func NewEmbedded(opts Options) (*Embedded, error) {
	if opts.Clock == nil {
		opts.Clock = realClock{}
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	e := &Embedded{
		opts:   opts,
		clock:  opts.Clock,
		objs:   make(map[string]*object),
		groups: make(map[string]*group),
		wake:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	e.start = e.clock.Now()
	var maps [][]byte
	for i, s := range opts.Segments {
		mem, err := mapSegment(s.Capacity)
		if err != nil {
			for _, m := range maps {
				_ = unix.Munmap(m)
			}
			return nil, fmt.Errorf("segment %s: %w", s.Name, err)
		}
		maps = append(maps, mem)
		if opts.Prefault {
			if err := prefault(mem, runtime.GOMAXPROCS(0)); err != nil {
				for _, m := range maps {
					_ = unix.Munmap(m)
				}
				return nil, fmt.Errorf("segment %s: %w", s.Name, err)
			}
		}
		e.segs = append(e.segs, &segment{
			name:  s.Name,
			mem:   mem,
			alloc: newOffsetAllocator(s.Capacity),
			base:  0x7f0000000000 + uint64(i)<<36,
		})
		e.capacity += s.Capacity
	}
	// The segments live outside the Go heap (a heap-allocated pool would let the collector
	// wait for a pool's worth of garbage before it runs). They are unmapped once the pool is
	// unreachable, which is also after every copy in or out of them has returned.
	runtime.AddCleanup(e, func(maps [][]byte) {
		for _, m := range maps {
			_ = unix.Munmap(m)
		}
	}, maps)
	if opts.EvictionPeriod > 0 {
		go e.evictLoop()
	} else {
		close(e.done)
	}
	return e, nil
}

// Options returns the options the pool runs with.
func (e *Embedded) Options() Options { return e.opts }

// SetEvictionHook installs fn to be called after every eviction round that ran (nil removes
// it). fn runs on the goroutine that ran the round, without the pool's lock held.
func (e *Embedded) SetEvictionHook(fn func(EvictionRound)) {
	if fn == nil {
		e.onEvict.Store(nil)
		return
	}
	e.onEvict.Store(&fn)
}

// Close stops the eviction goroutine; afterwards Segments, Stats and Metrics return ErrClosed.
// Stored pages stay readable until the pool is garbage collected.
func (e *Embedded) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	e.mu.Unlock()
	if e.opts.EvictionPeriod > 0 {
		close(e.stop)
	}
	<-e.done
	return nil
}

func (e *Embedded) evictLoop() {
	defer close(e.done)
	t := time.NewTicker(e.opts.EvictionPeriod)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		case <-e.wake:
		}
		e.EvictNow()
	}
}

// EvictNow checks the eviction trigger on the pool's clock and, when it fires, runs one round
// synchronously. It is one tick of the master's eviction thread; ran is false when the trigger
// did not fire.
func (e *Embedded) EvictNow() (round EvictionRound, ran bool) {
	e.mu.Lock()
	round, ran = e.evictLocked(e.clock.Now())
	e.mu.Unlock()
	if ran {
		if fn := e.onEvict.Load(); fn != nil {
			(*fn)(round)
		}
	}
	return round, ran
}

func (e *Embedded) validKey(k string) bool {
	return k != "" && len(k) <= e.opts.MaxKeyLength
}

// grantLease renews o's read lease to deadline, now+TTL (never shortening it), and refreshes
// its group. A call that grants many leases at one now computes the deadline once.
func (e *Embedded) grantLease(o *object, now, deadline time.Time) {
	ttl := e.opts.LeaseTTL
	if g := o.group; g != nil {
		refresh := g.needsRefresh || !e.opts.GroupRefreshHalfTTL || o.lease.Sub(now) < ttl/2
		if refresh {
			for m := range g.members {
				if m.complete && m.lease.Before(deadline) {
					m.lease = deadline
				}
			}
			g.needsRefresh = false
		}
	}
	if o.lease.Before(deadline) {
		o.lease = deadline
	}
}

// BatchIsExist implements Pool. With Options.ExistRenewsLease (the master's behaviour) a hit
// grants a read lease, refreshing the object's group too.
func (e *Embedded) BatchIsExist(ctx context.Context, ks []string) []int {
	out := make([]int, len(ks))
	e.c.existCalls.Add(1)
	e.c.existProbes.Add(int64(len(ks)))
	if err := ctx.Err(); err != nil {
		for i := range out {
			out[i] = int(pool.ErrRPCFail)
		}
		e.c.existFailedItems.Add(int64(len(ks)))
		return out
	}
	e.mu.Lock()
	now := e.clock.Now()
	deadline := now.Add(e.opts.LeaseTTL)
	var failed int64
	for i, k := range ks {
		if !e.validKey(k) {
			out[i] = int(pool.ErrInvalidParams)
			failed++
			continue
		}
		o := e.objs[k]
		if o == nil || !o.complete {
			continue
		}
		out[i] = 1
		if e.opts.ExistRenewsLease {
			e.grantLease(o, now, deadline)
		}
	}
	e.mu.Unlock()
	e.c.existFailedItems.Add(failed)
	return out
}

// BatchPut implements Pool. The bytes of every new key are copied into pool memory and hashed
// outside the lock; an object becomes readable, with its lease set to now, only when its copy
// is done (the master's PutEnd). A key that is already stored, or whose put is in flight, is
// OK without a write, as the master's -705 is for the Mooncake client.
func (e *Embedded) BatchPut(ctx context.Context, ks []string, bufs [][]byte, cfg pool.ReplicateConfig) []pool.Code {
	return e.put(ctx, ks, len(bufs), func(i int) int64 { return int64(len(bufs[i])) }, func(dst []byte, i int) keys.Checksum {
		return keys.CopyChecksum(dst, bufs[i])
	}, cfg)
}

// BatchPutPieces implements pool.PieceCopier: BatchPut of values each given as pieces, copied
// into pool memory and hashed in one pass (keys.GatherChecksum).
func (e *Embedded) BatchPutPieces(ctx context.Context, ks []string, srcs [][][]byte, cfg pool.ReplicateConfig) []pool.Code {
	return e.put(ctx, ks, len(srcs), func(i int) int64 { return piecesLen(srcs[i]) }, func(dst []byte, i int) keys.Checksum {
		return keys.GatherChecksum(dst, srcs[i])
	}, cfg)
}

// put stores n values under ks (n must be len(ks)): value i is size(i) bytes, and copyIn(dst, i)
// copies it into its pool memory dst and returns the checksum of what it copied.
func (e *Embedded) put(ctx context.Context, ks []string, n int, size func(i int) int64, copyIn func(dst []byte, i int) keys.Checksum, cfg pool.ReplicateConfig) []pool.Code {
	if n != len(ks) {
		e.c.putCalls.Add(1)
		return e.failPut(make([]pool.Code, len(ks)), pool.ErrInvalidParams)
	}
	r := e.reserve(ctx, ks, size, cfg)
	// Each object's memory belongs to this call until it is marked complete, so the copies run
	// without the lock, spread over the CPUs for large batches.
	forEach(len(r.work), r.bytes, func(j int) {
		o := r.work[j].o
		o.sum = copyIn(o.seg.mem[o.off:o.off+o.size], r.work[j].i)
	})
	return r.commit()
}

// piecesLen is the bytes of pieces together.
func piecesLen(pieces [][]byte) int64 {
	var n int64
	for _, p := range pieces {
		n += int64(len(p))
	}
	return n
}

// pendingPut is one new object of a put: the key's index in the call and the object.
type pendingPut struct {
	i int
	o *object
}

// reservation is the first half of a put (the master's PutStart): memory allocated, objects in
// the index but not readable.
type reservation struct {
	e       *Embedded
	out     []pool.Code
	work    []pendingPut
	bytes   int64
	softTTL time.Duration
}

func (e *Embedded) failPut(out []pool.Code, c pool.Code) []pool.Code {
	for i := range out {
		out[i] = c
	}
	e.c.putFailures.Add(int64(len(out)))
	e.c.putFailedItems.Add(int64(len(out)))
	return out
}

// reserve validates a put and allocates memory for every new key of ks (size(i) bytes each).
// Keys already stored or in flight are OK and get no memory; keys that failed have their code
// in out. When the whole call fails, work is empty and the failure already counted.
func (e *Embedded) reserve(ctx context.Context, ks []string, size func(i int) int64, cfg pool.ReplicateConfig) *reservation {
	r := &reservation{e: e, out: make([]pool.Code, len(ks))}
	e.c.putCalls.Add(1)
	if cfg.GroupIDs != nil && len(cfg.GroupIDs) != len(ks) {
		e.failPut(r.out, pool.ErrInvalidParams)
		return r
	}
	softTTL, code := e.softPinTTL(cfg)
	if code != pool.OK {
		e.failPut(r.out, code)
		return r
	}
	r.softTTL = softTTL
	if ctx.Err() != nil {
		e.failPut(r.out, pool.ErrRPCFail)
		return r
	}
	out := r.out
	work := make([]pendingPut, 0, len(ks))
	var evictRetried, allocFailed bool

	e.mu.Lock()
	for i, k := range ks {
		size := size(i)
		if !e.validKey(k) || size <= 0 {
			out[i] = pool.ErrInvalidParams
			continue
		}
		if _, ok := e.objs[k]; ok {
			out[i] = pool.OK
			e.c.skipped.Add(1)
			continue
		}
		seg, off, ok := e.allocLocked(size)
		if !ok && e.opts.SyncEvictOnAllocFailure && !evictRetried {
			evictRetried = true
			e.needEvict = true
			round, ran := e.evictLocked(e.clock.Now())
			if ran {
				if fn := e.onEvict.Load(); fn != nil {
					e.mu.Unlock()
					(*fn)(round)
					e.mu.Lock()
				}
			}
			if _, stored := e.objs[k]; stored { // another put stored it while the lock was free
				out[i] = pool.OK
				e.c.skipped.Add(1)
				continue
			}
			seg, off, ok = e.allocLocked(size)
		}
		if !ok {
			out[i] = pool.ErrNoAvailableHandle
			e.needEvict = true
			allocFailed = true
			e.c.allocFailures.Add(1)
			continue
		}
		e.seq++
		o := &object{key: k, seq: e.seq, seg: seg, off: off, size: size, hardPin: cfg.HardPin}
		if cfg.GroupIDs != nil && cfg.GroupIDs[i] != "" {
			o.group = e.joinGroup(cfg.GroupIDs[i], o)
		}
		e.objs[k] = o
		o.idx = len(e.list)
		e.list = append(e.list, o)
		e.hist.observe(size)
		work = append(work, pendingPut{i, o})
		r.bytes += size
	}
	e.mu.Unlock()
	if allocFailed {
		// The master flags need_mem_eviction and lets its thread act on the next tick; the
		// goroutine is woken at once instead of waiting for its period.
		select {
		case e.wake <- struct{}{}:
		default:
		}
	}
	r.work = work
	return r
}

// commit makes every reserved object readable (the master's PutEnd), its lease set to now; the
// checksums must be set. It returns the call's codes.
func (r *reservation) commit() []pool.Code {
	e, out := r.e, r.out
	if len(r.work) > 0 {
		e.mu.Lock()
		now := e.clock.Now()
		for _, w := range r.work {
			o := w.o
			if o.removed { // force-removed while the copy ran
				out[w.i] = pool.OK
				continue
			}
			o.complete = true
			o.lease = now
			if r.softTTL > 0 {
				o.softPin = now.Add(r.softTTL)
			}
			out[w.i] = pool.OK
		}
		e.mu.Unlock()
	}
	var failed int64
	for _, c := range out {
		if c != pool.OK {
			failed++
		}
	}
	e.c.puts.Add(int64(len(r.work)))
	e.c.bytesIn.Add(r.bytes)
	e.c.putFailures.Add(failed)
	e.c.putFailedItems.Add(failed)
	return out
}

// revoke gives a reservation's memory back (the master's PutRevoke): the objects leave the
// index unread and their keys count as failed puts.
func (r *reservation) revoke() []pool.Code {
	e, out := r.e, r.out
	e.mu.Lock()
	for _, w := range r.work {
		e.unlinkLocked(w.o)
		out[w.i] = pool.ErrRPCFail
	}
	e.mu.Unlock()
	var failed int64
	for _, c := range out {
		if c != pool.OK {
			failed++
		}
	}
	e.c.putFailures.Add(failed)
	e.c.putFailedItems.Add(failed)
	return out
}

// parallelMinBytes is the batch size from which forEach spreads work over the CPUs; below it
// the goroutine start-up costs more than it saves.
const parallelMinBytes = 512 << 10

// forEach calls fn(0..n-1), on up to GOMAXPROCS goroutines when the batch moves at least
// parallelMinBytes. Each index is handled once; fn must only touch state owned by its index.
func forEach(n int, bytes int64, fn func(i int)) {
	forEachOn(runtime.GOMAXPROCS(0), n, bytes, fn)
}

// forEachBeside is forEach leaving one CPU free, for the in-place calls (BatchView,
// PutReservation.End) that run while the caller's GPU copy of the previous batch is being
// issued: with every CPU hashing, the goroutine that issues that copy waited for the whole
// batch's hashing, and the copy and the check ran one after the other (docs/perf/serve-gpu.md).
func (e *Embedded) forEachBeside(n int, bytes int64, fn func(i int)) {
	w := e.opts.InPlaceWorkers
	if w <= 0 {
		w = max(1, runtime.GOMAXPROCS(0)-1)
	}
	forEachOn(w, n, bytes, fn)
}

func forEachOn(workers, n int, bytes int64, fn func(i int)) {
	if workers > n {
		workers = n
	}
	if workers <= 1 || bytes < parallelMinBytes {
		for i := 0; i < n; i++ {
			fn(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	wg.Add(workers)
	for w := 0; w < workers; w++ {
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				fn(i)
			}
		}()
	}
	wg.Wait()
}

// softPinTTL resolves the soft-pin lifetime a put asks for (0 for none), enforcing the master's
// rules: a TTL only with SoftPinEnable, none above MaxSoftPinTTL.
func (e *Embedded) softPinTTL(cfg pool.ReplicateConfig) (time.Duration, pool.Code) {
	switch cfg.SoftPinAction {
	case pool.SoftPinPreserve, pool.SoftPinDisable:
		if cfg.SoftPinTTL != 0 {
			return 0, pool.ErrInvalidParams
		}
		return 0, pool.OK
	case pool.SoftPinEnable:
		ttl := cfg.SoftPinTTL
		if ttl < 0 || ttl > e.opts.MaxSoftPinTTL {
			return 0, pool.ErrInvalidParams
		}
		if ttl == 0 {
			ttl = e.opts.SoftPinTTL
		}
		return ttl, pool.OK
	default:
		return 0, pool.ErrInvalidParams
	}
}

func (e *Embedded) joinGroup(id string, o *object) *group {
	g := e.groups[id]
	if g == nil {
		g = &group{id: id, members: make(map[*object]struct{})}
		e.groups[id] = g
	}
	g.members[o] = struct{}{}
	g.needsRefresh = true
	return g
}

// allocLocked finds room for size bytes, trying segments round-robin.
func (e *Embedded) allocLocked(size int64) (*segment, int64, bool) {
	n := len(e.segs)
	for j := 0; j < n; j++ {
		s := e.segs[(e.rr+j)%n]
		if off, ok := s.alloc.alloc(size); ok {
			e.rr = (e.rr + j + 1) % n
			e.used += size
			return s, off, true
		}
	}
	return nil, 0, false
}

// unlinkLocked removes o from the index and its group and releases its memory unless a reader
// still copies out of it.
func (e *Embedded) unlinkLocked(o *object) {
	if o.removed {
		return
	}
	o.removed = true
	// An object that is not removed is the one its key maps to: puts never replace a key.
	{
		delete(e.objs, o.key)
		last := e.list[len(e.list)-1]
		e.list[o.idx] = last
		last.idx = o.idx
		e.list[len(e.list)-1] = nil
		e.list = e.list[:len(e.list)-1]
	}
	if g := o.group; g != nil {
		delete(g.members, o)
		if len(g.members) == 0 {
			delete(e.groups, g.id)
		}
	}
	if o.refcnt == 0 {
		e.releaseLocked(o)
	}
}

func (e *Embedded) releaseLocked(o *object) {
	o.seg.alloc.release(o.off, o.size)
	e.used -= o.size
}

// BatchGet implements Pool. A hit grants a read lease (the master's GetReplicaList), then the
// bytes are copied into bufs[i] outside the lock and verified against the checksum taken at
// put; a mismatch returns ErrChecksumMismatch and the caller must not use bufs[i]. The check
// hashes the copy (keys.CopyChecksum), so a fault in the copy itself is caught too.
func (e *Embedded) BatchGet(ctx context.Context, ks []string, bufs [][]byte) []int64 {
	return e.get(ctx, ks, len(bufs), func(i int) int64 { return int64(len(bufs[i])) }, func(i int, src []byte) keys.Checksum {
		return keys.CopyChecksum(bufs[i], src)
	})
}

// BatchGetPieces implements pool.PieceCopier: BatchGet into destinations given as pieces, each
// value copied and its copy's source hashed in one pass (keys.ScatterChecksum). A value whose
// stored bytes fail the check is ErrChecksumMismatch, and may have been copied in part or whole.
func (e *Embedded) BatchGetPieces(ctx context.Context, ks []string, dsts [][][]byte) []int64 {
	return e.get(ctx, ks, len(dsts), func(i int) int64 { return piecesLen(dsts[i]) }, func(i int, src []byte) keys.Checksum {
		return keys.ScatterChecksum(dsts[i], src)
	})
}

// get copies the values of ks into n destinations (n must be len(ks)): destination i takes
// room(i) bytes, and copyOut(i, src) copies value src into it and returns the checksum it took.
// A value whose checksum differs from the one taken at put is ErrChecksumMismatch.
func (e *Embedded) get(ctx context.Context, ks []string, n int, room func(i int) int64, copyOut func(i int, src []byte) keys.Checksum) []int64 {
	if n != len(ks) {
		e.c.getCalls.Add(1)
		e.c.getItems.Add(int64(len(ks)))
		out := make([]int64, len(ks))
		for i := range out {
			out[i] = int64(pool.ErrInvalidParams)
		}
		e.c.getFailedItems.Add(int64(len(ks)))
		return out
	}
	out, held, misses := e.acquire(ctx, ks, room)
	var total int64
	for _, o := range held {
		if o != nil {
			total += o.size
		}
	}
	// The references taken above keep each object's memory in place while it is copied.
	forEach(len(held), total, func(i int) {
		o := held[i]
		if o == nil {
			return
		}
		if copyOut(i, o.seg.mem[o.off:o.off+o.size]) != o.sum {
			out[i] = int64(pool.ErrChecksumMismatch)
			return
		}
		out[i] = o.size
	})
	e.finishGet(out, held, misses)
	e.releaseRefs(held)
	return out
}

// acquire looks ks up for a get: every readable hit gets a read lease and a reference that keeps
// its memory in place until releaseRefs. room(i) is how many bytes the caller can take for key
// i (negative for no limit). out holds the codes of the keys that failed; held the objects of
// the others.
func (e *Embedded) acquire(ctx context.Context, ks []string, room func(i int) int64) (out []int64, held []*object, misses int64) {
	out = make([]int64, len(ks))
	held = make([]*object, len(ks))
	return out, held, acquireInto(ctx, e, ks, room, out, held)
}

// acquireInto is acquire into out and held, len(ks) long and zero, for keys given as strings or
// as bytes (a key's bytes are only read).
func acquireInto[K string | []byte](ctx context.Context, e *Embedded, ks []K, room func(i int) int64, out []int64, held []*object) (misses int64) {
	e.c.getCalls.Add(1)
	e.c.getItems.Add(int64(len(ks)))
	if ctx.Err() != nil {
		for i := range out {
			out[i] = int64(pool.ErrRPCFail)
		}
		return 0
	}
	e.mu.Lock()
	now := e.clock.Now()
	deadline := now.Add(e.opts.LeaseTTL)
	for i, k := range ks {
		if len(k) == 0 || len(k) > e.opts.MaxKeyLength { // validKey
			out[i] = int64(pool.ErrInvalidParams)
			continue
		}
		o := e.objs[string(k)]
		switch {
		case o == nil:
			out[i] = int64(pool.ErrObjectNotFound)
			misses++
			continue
		case !o.complete:
			out[i] = int64(pool.ErrReplicaNotReady)
			continue
		case room != nil && room(i) >= 0 && room(i) < o.size:
			out[i] = int64(pool.ErrInvalidParams)
			continue
		}
		e.grantLease(o, now, deadline)
		o.refcnt++
		held[i] = o
	}
	e.mu.Unlock()
	return misses
}

// finishGet counts a get whose copies or checks are done: out[i] is the size delivered or a
// negative code.
func (e *Embedded) finishGet(out []int64, held []*object, misses int64) {
	var hits, bytesOut, bad, failed int64
	for i, o := range held {
		switch {
		case o == nil:
		case out[i] == int64(pool.ErrChecksumMismatch):
			bad++
		default:
			hits++
			bytesOut += out[i]
		}
	}
	for _, v := range out {
		if v < 0 {
			failed++
		}
	}
	e.c.hits.Add(hits)
	e.c.misses.Add(misses)
	e.c.bytesOut.Add(bytesOut)
	e.c.checksumErrors.Add(bad)
	e.c.getFailedItems.Add(failed)
}

// releaseRefs drops the references acquire took; memory of an object removed meanwhile is
// released with the last one.
func (e *Embedded) releaseRefs(held []*object) {
	e.mu.Lock()
	for _, o := range held {
		if o == nil {
			continue
		}
		o.refcnt--
		if o.refcnt == 0 && o.removed {
			e.releaseLocked(o)
		}
	}
	e.mu.Unlock()
}

// Remove implements Pool. Without force, an object under a read lease is kept and
// ErrObjectHasLease returned; an object whose put is still copying gives ErrReplicaNotReady.
// Pins do not block Remove: a hard pin keeps an object from eviction only, as on the master
// (Mooncake 0.3.13 removes a hard-pinned object whose lease ran out without force; the
// differential test's case "hard pin does not block remove" pins it).
func (e *Embedded) Remove(ctx context.Context, key string, force bool) pool.Code {
	e.c.removeCalls.Add(1)
	code := e.remove(ctx, key, force)
	if code != pool.OK {
		e.c.removeFailures.Add(1)
	}
	return code
}

func (e *Embedded) remove(ctx context.Context, key string, force bool) pool.Code {
	if ctx.Err() != nil {
		return pool.ErrRPCFail
	}
	if !e.validKey(key) {
		return pool.ErrInvalidParams
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	o := e.objs[key]
	if o == nil {
		return pool.ErrObjectNotFound
	}
	if !o.complete {
		return pool.ErrReplicaNotReady
	}
	if !force && o.lease.After(e.clock.Now()) {
		return pool.ErrObjectHasLease
	}
	e.unlinkLocked(o)
	return pool.OK
}

// Segments implements Pool.
func (e *Embedded) Segments(ctx context.Context) ([]pool.Segment, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, ErrClosed
	}
	out := make([]pool.Segment, len(e.segs))
	for i, s := range e.segs {
		out[i] = pool.Segment{Name: s.name, Capacity: int64(len(s.mem)), Used: s.alloc.used}
	}
	return out, nil
}

// Stats implements pool.Pool: the counters and occupancy every backend reports, and the
// embedded pool's own figures in Detail (keys DetailSoftPinned and the rest, StatsDetail).
// It walks the index, so it costs O(objects).
func (e *Embedded) Stats(ctx context.Context) (pool.Stats, error) {
	if err := ctx.Err(); err != nil {
		return pool.Stats{}, err
	}
	var softPinned, hardPinned, grouped, pending, freeExtents, largestFree, fragmented int64
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return pool.Stats{}, ErrClosed
	}
	now := e.clock.Now()
	st := pool.Stats{CapacityBytes: e.capacity, UsedBytes: e.used}
	for _, o := range e.objs {
		if !o.complete {
			pending++
			continue
		}
		st.Objects++
		if o.softPin.After(now) {
			softPinned++
		}
		if o.hardPin {
			hardPinned++
		}
		if o.group != nil {
			grouped++
		}
	}
	for _, s := range e.segs {
		var free, largest int64
		for _, x := range s.alloc.free {
			free += x.size
			if x.size > largest {
				largest = x.size
			}
		}
		freeExtents += int64(len(s.alloc.free))
		largestFree = max(largestFree, largest)
		fragmented += free - largest
	}
	e.mu.Unlock()

	c := &e.c
	st.Hits = c.hits.Load()
	st.Misses = c.misses.Load()
	st.Puts = c.puts.Load()
	st.SkippedExisting = c.skipped.Load()
	st.PutFailures = c.putFailures.Load()
	st.BytesIn = c.bytesIn.Load()
	st.BytesOut = c.bytesOut.Load()
	st.ChecksumErrors = c.checksumErrors.Load()
	st.AllocFailures = c.allocFailures.Load()
	pass1, pass2 := c.evictedPass1.Load(), c.evictedPass2.Load()
	st.Evicted = pass1 + pass2
	rounds := c.rounds.Load()
	st.Detail = map[string]int64{
		DetailSoftPinned: softPinned, DetailHardPinned: hardPinned, DetailGrouped: grouped,
		DetailEvictionRounds: rounds, DetailEvictedPass1: pass1, DetailEvictedPass2: pass2,
		DetailEvictedSoftPinned: c.evictedSoft.Load(), DetailEvictedGrouped: c.evictedGrouped.Load(),
		DetailFailedEvictions: rounds - c.successfulRounds.Load(), DetailExistProbes: c.existProbes.Load(),
		DetailPendingObjects: pending, DetailFreeExtents: freeExtents, DetailLargestFreeBytes: largestFree,
		DetailFragmentedBytes: fragmented,
	}
	return st, nil
}

// CorruptForTest flips one byte of a stored object so tests can check that BatchGet refuses
// it. It reports false when the key is not stored.
func (e *Embedded) CorruptForTest(key string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	o := e.objs[key]
	if o == nil || !o.complete {
		return false
	}
	o.seg.mem[o.off] ^= 0xff
	return true
}

// LeaseDeadline returns the lease deadline of a stored object (the master's lease_timeout).
func (e *Embedded) LeaseDeadline(key string) (time.Time, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	o := e.objs[key]
	if o == nil {
		return time.Time{}, false
	}
	return o.lease, true
}

func (e *Embedded) String() string {
	return fmt.Sprintf("embedded pool (%d segments, %d bytes)", len(e.segs), e.capacity)
}

var (
	_ pool.Pool          = (*Embedded)(nil)
	_ mooncake.Inspector = (*Embedded)(nil)
)

// mapSegment reserves size bytes of anonymous memory. Pages become resident as they are first
// written, so a large pool costs nothing until it fills.
func mapSegment(size int64) ([]byte, error) {
	if size <= 0 || size > 1<<46 {
		return nil, fmt.Errorf("segment size %d out of range", size)
	}
	mem, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("map %d bytes: %w", size, err)
	}
	// Transparent huge pages make the first write into a fresh segment one fault per 2 MiB
	// rather than per 4 KiB (docs/perf/pool.md). A kernel without them refuses the advice,
	// which only costs that speed.
	_ = unix.Madvise(mem, unix.MADV_HUGEPAGE)
	return mem, nil
}
