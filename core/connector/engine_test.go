package connector

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
)

// This file is a small engine that plays the runtime around the connector: it admits
// requests, asks for prefixes, allocates page slots per layer group for the whole prompt (so
// pages run ahead of computation, as they do in the runtime), honours offers, runs chunked
// prefill passes, calls the worker hooks in the runtime's order and writes deterministic KV
// bytes for every block it computes. Loaded pages are checked byte for byte against the bytes a
// cold run computes, and a page it finds in any other state fails the test.

const testT = 4 // tokens per block in the engine tests

// testLayout has two layer groups: group 0 with K and V regions, group 1 with one strided
// region (gaps between slots) and a replicated region.
func testLayout(slots int) kvmem.Layout {
	s := uint64(slots)
	off := uint64(0)
	k := kvmem.Region{Offset: off, Stride: 24, Size: 24}
	off += 24 * s
	v := kvmem.Region{Offset: off, Stride: 24, Size: 24}
	off += 24 * s
	g1 := kvmem.Region{Offset: off, Stride: 32, Size: 20}
	off += 32 * s
	r1 := kvmem.Region{Offset: off, Stride: 12, Size: 12}
	return kvmem.Layout{TokensPerBlock: testT, Groups: []kvmem.GroupLayout{
		{ID: 0, Slots: slots, Regions: []kvmem.Region{k, v}},
		{ID: 1, Slots: slots, Regions: []kvmem.Region{g1}, ReplicatedRegions: []kvmem.Region{r1}},
	}}
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func baseOptions() Options {
	return Options{
		Role:           RoleBoth,
		Namespace:      keys.Namespace{ModelKey: "test-model", WorldSize: 1},
		TokensPerBlock: testT,
		Logger:         quietLogger(),
	}
}

// kvBytes is the KV a computed page holds: a function of the tokens the block's KV depends on
// (its prefix plus the lookahead), the rank for sharded bytes, the group and the region set.
func kvBytes(tokens []int64, b, lookahead, rank, group int, replicated bool, n int) []byte {
	h := fnv.New64a()
	end := min(len(tokens), (b+1)*testT+lookahead)
	var w [8]byte
	for _, t := range tokens[:end] {
		binary.LittleEndian.PutUint64(w[:], uint64(t))
		h.Write(w[:])
	}
	if replicated {
		rank = -1
	}
	fmt.Fprintf(h, "|%d|%d|%t|%d", rank, group, replicated, b)
	x := h.Sum64()
	out := make([]byte, n)
	for i := range out {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		out[i] = byte(x)
	}
	return out
}

type reqPhase int

const (
	phaseWaiting reqPhase = iota
	phaseRunning
	phaseParked
	phaseSaving
	phaseDone
)

type simReq struct {
	id          string
	tokens      []int64
	contextOnly bool
	phase       reqPhase
	pages       [][]int
	sentPages   int
	computed    int // tokens computed or restored
	restore     int // honoured synchronous restore applied by the next forward pass
	matched     int
	written     int // blocks whose pages hold their KV
	loaded      int // blocks restored from the pool over the request's life
	restarts    int
	savedRanks  map[int]bool
	loadedRanks map[int]bool // ranks that reported the parked load finished
}

type simRank struct {
	w *Worker
	m *hostMover
}

type engine struct {
	t      testing.TB
	ctx    context.Context
	opts   Options
	layout kvmem.Layout
	pool   testPool
	sched  *Scheduler
	ranks  []*simRank
	free   [][]int
	chunk  int
	reqs   []*simReq
	byID   map[string]*simReq
	pass   int

	honour     func(r *simReq, matched int) int
	afterAlloc func(e *engine, r *simReq)
	beforeLoad func(e *engine, meta Metadata)
	skipSave   func(pass int) bool
	metas      []Metadata

	computedBlocks int
	loadedBlocks   int
}

// newEngine builds a scheduler for rank 0 and a worker per rank. world > 1 is tensor
// parallelism (the scheduler runs on rank 0 and its metadata reaches every rank).
func newEngine(t testing.TB, pool testPool, opts Options, world, slots int) *engine {
	t.Helper()
	layout := testLayout(slots)
	e := &engine{t: t, ctx: context.Background(), opts: opts, layout: layout, pool: pool, chunk: 3*testT + 1, byID: map[string]*simReq{}}
	so := opts
	if world > 1 {
		so.Namespace.WorldSize, so.Namespace.Rank = world, 0
	}
	s, err := NewScheduler(so, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RegisterLayout(layout); err != nil {
		t.Fatal(err)
	}
	e.sched = s
	for r := range world {
		o := opts
		if world > 1 {
			o.Namespace.WorldSize, o.Namespace.Rank = world, r
		}
		m := newHostMover(layout)
		w, err := NewWorker(o, pool, m)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.RegisterLayout(layout); err != nil {
			t.Fatal(err)
		}
		e.ranks = append(e.ranks, &simRank{w: w, m: m})
	}
	e.free = make([][]int, len(layout.Groups))
	for g := range e.free {
		for i := slots - 1; i >= 0; i-- {
			e.free[g] = append(e.free[g], i)
		}
	}
	t.Cleanup(func() {
		for _, r := range e.ranks {
			_ = r.w.Close(context.Background())
		}
	})
	return e
}

func (e *engine) add(id string, tokens []int64) *simReq {
	r := &simReq{id: id, tokens: tokens, contextOnly: true, savedRanks: map[int]bool{}}
	e.reqs = append(e.reqs, r)
	e.byID[id] = r
	return r
}

func (e *engine) lookahead() int { return e.opts.PromptLookahead }

func (e *engine) pageSize(g int, replicated bool) int {
	if replicated {
		return int(e.layout.Groups[g].ReplicatedBytesPerPage())
	}
	return int(e.layout.Groups[g].BytesPerPage())
}

// pageRefs lists every page value of block b of r: per group the sharded value and, where the
// group has one, the replicated value.
func (e *engine) pageRefs(r *simReq, b int) []kvmem.PageRef {
	var refs []kvmem.PageRef
	for g := range e.layout.Groups {
		refs = append(refs, kvmem.PageRef{Group: g, Slot: r.pages[g][b]})
		if e.layout.Groups[g].ReplicatedBytesPerPage() > 0 {
			refs = append(refs, kvmem.PageRef{Group: g, Slot: r.pages[g][b], Replicated: true})
		}
	}
	return refs
}

func (e *engine) expected(r *simReq, b, rank int, ref kvmem.PageRef) []byte {
	return kvBytes(r.tokens, b, e.lookahead(), rank, ref.Group, ref.Replicated, e.pageSize(ref.Group, ref.Replicated))
}

func (e *engine) read(rank int, ref kvmem.PageRef) []byte {
	buf := make([]byte, e.pageSize(ref.Group, ref.Replicated))
	if err := e.ranks[rank].m.Gather(e.ctx, []kvmem.PageRef{ref}, [][]byte{buf}); err != nil {
		e.t.Fatal(err)
	}
	return buf
}

func (e *engine) write(rank int, ref kvmem.PageRef, v []byte) {
	if err := e.ranks[rank].m.Scatter(e.ctx, [][]byte{v}, []kvmem.PageRef{ref}); err != nil {
		e.t.Fatal(err)
	}
}

// checkBlock fails unless every page of block b holds its KV on every rank.
func (e *engine) checkBlock(r *simReq, b int, what string) {
	e.t.Helper()
	for rank := range e.ranks {
		for _, ref := range e.pageRefs(r, b) {
			if got, want := e.read(rank, ref), e.expected(r, b, rank, ref); !bytes.Equal(got, want) {
				e.t.Fatalf("pass %d: %s: request %s block %d rank %d page %+v holds wrong bytes", e.pass, what, r.id, b, rank, ref)
			}
		}
	}
}

// checkNoWrongByte fails if any page of r holds bytes that are neither the poison it was
// allocated with nor its KV.
func (e *engine) checkNoWrongByte(r *simReq) {
	e.t.Helper()
	for b := range len(r.pages[0]) {
		for rank := range e.ranks {
			for _, ref := range e.pageRefs(r, b) {
				got := e.read(rank, ref)
				if !bytes.Equal(got, bytes.Repeat([]byte{0xEE}, len(got))) && !bytes.Equal(got, e.expected(r, b, rank, ref)) {
					e.t.Fatalf("pass %d: request %s block %d rank %d page %+v holds a wrong byte", e.pass, r.id, b, rank, ref)
				}
			}
		}
	}
}

func (e *engine) allocate(r *simReq) {
	blocks := (len(r.tokens) + testT - 1) / testT
	r.pages = make([][]int, len(e.layout.Groups))
	for g := range r.pages {
		if len(e.free[g]) < blocks {
			e.t.Fatalf("out of page slots")
		}
		n := len(e.free[g])
		r.pages[g] = slices.Clone(e.free[g][n-blocks:])
		slices.Reverse(r.pages[g])
		e.free[g] = e.free[g][:n-blocks]
	}
	for b := range blocks {
		for rank := range e.ranks {
			for _, ref := range e.pageRefs(r, b) {
				e.write(rank, ref, bytes.Repeat([]byte{0xEE}, e.pageSize(ref.Group, ref.Replicated)))
			}
		}
	}
}

func (e *engine) release(r *simReq) {
	for g := range r.pages {
		e.free[g] = append(e.free[g], r.pages[g]...)
	}
	r.pages = nil
}

// restart frees a request whose load failed and puts it back in the waiting queue.
func (e *engine) restart(r *simReq) {
	e.t.Helper()
	e.checkNoWrongByte(r)
	e.sched.RequestReset(r.id)
	e.release(r)
	*r = simReq{id: r.id, tokens: r.tokens, contextOnly: r.contextOnly, restarts: r.restarts + 1, loaded: r.loaded, savedRanks: map[int]bool{}}
}

// step runs one pass. It returns the first error a connector call returned.
func (e *engine) step() error {
	var started []string
	for _, r := range e.reqs {
		if r.phase != phaseWaiting {
			continue
		}
		m, async, err := e.sched.Lookup(e.ctx, Request{ID: r.id, Tokens: r.tokens, ContextOnly: r.contextOnly}, 0)
		if err != nil {
			return err
		}
		if async && m == 0 {
			e.t.Fatalf("lookup returned (0, async)")
		}
		h := m
		if e.honour != nil {
			h = e.honour(r, m)
		}
		e.allocate(r)
		if e.afterAlloc != nil {
			e.afterAlloc(e, r)
		}
		if err := e.sched.UpdateStateAfterAlloc(r.id, r.pages, h); err != nil {
			return err
		}
		r.matched = h
		if async {
			r.phase = phaseParked
			started = append(started, r.id)
		} else {
			r.phase, r.restore = phaseRunning, h
		}
	}

	var out SchedulerOutput
	sched := map[*simReq]int{}
	for _, r := range e.reqs {
		if r.phase != phaseRunning {
			continue
		}
		n := min(e.chunk, len(r.tokens)-r.computed-r.restore)
		rd := RequestData{ID: r.id, ComputedPosition: r.computed, NumScheduledTokens: n}
		for g := range r.pages {
			rd.NewBlockIDsByGroup = append(rd.NewBlockIDsByGroup, slices.Clone(r.pages[g][r.sentPages:]))
		}
		if r.sentPages == 0 {
			out.NewRequests = append(out.NewRequests, rd)
		} else {
			out.CachedRequests = append(out.CachedRequests, rd)
		}
		r.sentPages = len(r.pages[0])
		sched[r] = n
	}
	out.SubmittedSaves = e.ranks[0].w.TakeSubmittedSaves()
	for _, rk := range e.ranks[1:] {
		rk.w.TakeSubmittedSaves()
	}
	meta, err := e.sched.BuildMeta(out)
	if err != nil {
		return err
	}
	e.metas = append(e.metas, meta)
	if e.beforeLoad != nil {
		e.beforeLoad(e, meta)
	}
	failed := map[string]bool{}
	for _, rk := range e.ranks {
		rk.w.BindMeta(meta)
		if err := rk.w.StartLoad(e.ctx); err != nil {
			return err
		}
		for _, id := range rk.w.TakeFailedLoadRequests() {
			failed[id] = true
		}
	}
	for id := range failed {
		r := e.byID[id]
		delete(sched, r)
		e.restart(r)
	}

	var finishedGen []string
	for _, r := range e.reqs {
		n, ok := sched[r]
		if !ok {
			continue
		}
		if r.restore > 0 {
			first := r.computed / testT
			for b := first; b < (r.computed+r.restore)/testT; b++ {
				e.checkBlock(r, b, "after a synchronous load")
				e.loadedBlocks++
				r.loaded++
			}
			r.written = (r.computed + r.restore) / testT
		}
		r.computed += r.restore + n
		r.restore = 0
		for b := r.written; b < r.computed/testT; b++ {
			for rank := range e.ranks {
				for _, ref := range e.pageRefs(r, b) {
					e.write(rank, ref, e.expected(r, b, rank, ref))
				}
			}
			e.computedBlocks++
		}
		r.written = max(r.written, r.computed/testT)
		if r.computed == len(r.tokens) {
			for b := range len(r.tokens) / testT {
				e.checkBlock(r, b, "at finish")
			}
			if e.sched.RequestFinished(r.id) {
				r.phase = phaseSaving
				finishedGen = append(finishedGen, r.id)
			} else {
				r.phase = phaseDone
				e.release(r)
			}
		}
	}
	if e.skipSave == nil || !e.skipSave(e.pass) {
		for _, rk := range e.ranks {
			if err := rk.w.WaitForSave(e.ctx); err != nil {
				return err
			}
		}
	}
	// Under tensor parallelism the runtime acts on a parked request once every rank reported
	// its load finished (the intersection over ranks); a failure is handed back on rank 0 only,
	// since it is fatal on a tensor-parallel rank.
	failedAsync := map[string]bool{}
	var loadedEverywhere []string
	for i, rk := range e.ranks {
		fs, fl, err := rk.w.GetFinished(finishedGen, started)
		if err != nil {
			return err
		}
		for _, id := range fs {
			e.byID[id].savedRanks[i] = true
		}
		for _, id := range rk.w.TakeFailedAsyncLoadRequests() {
			failedAsync[id] = true
		}
		for _, id := range fl {
			r := e.byID[id]
			if r.loadedRanks == nil {
				r.loadedRanks = map[int]bool{}
			}
			r.loadedRanks[i] = true
			if len(r.loadedRanks) == len(e.ranks) {
				loadedEverywhere = append(loadedEverywhere, id)
			}
		}
	}
	for _, id := range loadedEverywhere {
		r := e.byID[id]
		r.loadedRanks = nil
		if failedAsync[id] {
			e.restart(r)
			continue
		}
		r.phase, r.computed, r.written = phaseRunning, r.matched, r.matched/testT
		for b := range r.written {
			e.checkBlock(r, b, "after an asynchronous load")
			e.loadedBlocks++
			r.loaded++
		}
	}
	for _, r := range e.reqs {
		if r.phase == phaseSaving && len(r.savedRanks) == len(e.ranks) {
			r.phase = phaseDone
			e.release(r)
		}
	}
	e.pass++
	return nil
}

// run steps until every request is done.
func (e *engine) run() error {
	for limit := 0; ; limit++ {
		done := true
		for _, r := range e.reqs {
			done = done && r.phase == phaseDone
		}
		if done {
			return nil
		}
		if limit > 200000 {
			e.t.Fatalf("engine did not finish")
		}
		if err := e.step(); err != nil {
			return err
		}
		if e.onlyWaiting() {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// onlyWaiting reports whether nothing can make progress this pass but background work.
func (e *engine) onlyWaiting() bool {
	for _, r := range e.reqs {
		if r.phase == phaseRunning || r.phase == phaseWaiting {
			return false
		}
	}
	return true
}

func (e *engine) mustRun() {
	e.t.Helper()
	if err := e.run(); err != nil {
		e.t.Fatal(err)
	}
}

// prompt returns n deterministic tokens starting with the shared prefix of length shared.
func prompt(seed int64, shared, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		if i < shared {
			out[i] = int64(1000 + i)
		} else {
			out[i] = seed*100000 + int64(i)
		}
	}
	return out
}
