package connector

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/core/simkv"
)

// This file is a small engine that plays the runtime around the connector through the
// connector's own Driver and LocalRank: it admits requests, asks for prefixes, allocates page
// slots per layer group for the whole prompt, honours offers, runs chunked prefill passes and
// writes deterministic KV bytes (simkv) for every block it computes. Loaded pages are checked
// byte for byte against the bytes a cold run computes, and a page it finds in any other state
// fails the test.

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

type simReq struct {
	*DrivenRequest
	id     string
	tokens []int64
	loaded int // blocks restored from the pool over the request's life
}

type simRank struct {
	w *Worker
	m *hostMover
}

// engine runs the connector's Driver over a scheduler on rank 0 and a worker per rank, in
// process, with simkv's KV pages.
type engine struct {
	t      testing.TB
	ctx    context.Context
	opts   Options
	layout kvmem.Layout
	pool   testPool
	sched  *Scheduler
	ranks  []*simRank
	slots  *simkv.Slots
	mem    *simkv.Memory
	drv    *Driver
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
	e.mem = &simkv.Memory{Layout: layout, Lookahead: opts.PromptLookahead}
	var ranks []Rank
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
		e.mem.Ranks = append(e.mem.Ranks, m)
		var rs *Scheduler
		if r == 0 {
			rs = s
		}
		ranks = append(ranks, NewLocalRank(fmt.Sprintf("rank%d", r), rs, w))
	}
	e.slots = simkv.NewSlots(len(layout.Groups), slots)
	e.drv, err = NewDriver(ranks, DriverOptions{TokensPerBlock: testT, Hooks: e.hooks()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, r := range e.ranks {
			_ = r.w.Close(context.Background())
		}
	})
	return e
}

// hooks are the runtime's side of the driver: page slots per layer group for the whole prompt
// (so pages run ahead of computation, as they do in the runtime), honoured offers, KV written
// for every computed block and checked for every restored one.
func (e *engine) hooks() DriverHooks {
	return DriverHooks{
		Allocate: func(ctx context.Context, d *DrivenRequest, m int, async bool) (int, error) {
			r := e.byID[d.ID]
			if async && m == 0 {
				e.t.Fatalf("lookup returned (0, async)")
			}
			h := m
			if e.honour != nil {
				h = e.honour(r, m)
			}
			blocks := (len(r.tokens) + testT - 1) / testT
			pages, err := e.slots.Take(blocks)
			if err != nil {
				return 0, err
			}
			d.Pages = pages
			if err := e.mem.Poison(ctx, pages, blocks); err != nil {
				return 0, err
			}
			if e.afterAlloc != nil {
				e.afterAlloc(e, r)
			}
			return h, nil
		},
		Built: func(_ context.Context, meta Metadata) error {
			e.metas = append(e.metas, meta)
			if e.beforeLoad != nil {
				e.beforeLoad(e, meta)
			}
			return nil
		},
		Restored: func(ctx context.Context, d *DrivenRequest, first, end int) error {
			if err := e.mem.Check(ctx, d.ID, d.Tokens, d.Pages, first, end); err != nil {
				return fmt.Errorf("pass %d: after a load: %w", e.pass, err)
			}
			e.loadedBlocks += end - first
			e.byID[d.ID].loaded += end - first
			return nil
		},
		Computed: func(ctx context.Context, d *DrivenRequest, first, end int) error {
			e.computedBlocks += end - first
			return e.mem.Write(ctx, d.Tokens, d.Pages, first, end)
		},
		Finished: func(ctx context.Context, d *DrivenRequest) error {
			if err := e.mem.Check(ctx, d.ID, d.Tokens, d.Pages, 0, len(d.Tokens)/testT); err != nil {
				return fmt.Errorf("pass %d: at finish: %w", e.pass, err)
			}
			return nil
		},
		Restarted: func(ctx context.Context, d *DrivenRequest) error {
			return e.mem.CheckNoWrongByte(ctx, d.ID, d.Tokens, d.Pages, len(d.Pages[0]))
		},
		Release: func(d *DrivenRequest) {
			e.slots.Put(d.Pages)
			d.Pages = nil
		},
		HoldSaves: func(pass int) bool { return e.skipSave != nil && e.skipSave(pass) },
	}
}

func (e *engine) add(id string, tokens []int64) *simReq {
	r := &simReq{id: id, tokens: tokens}
	r.DrivenRequest = e.drv.Add(Request{ID: id, Tokens: tokens, ContextOnly: true})
	e.reqs = append(e.reqs, r)
	e.byID[id] = r
	return r
}

func (e *engine) pageSize(g int, replicated bool) int {
	if replicated {
		return int(e.layout.Groups[g].ReplicatedBytesPerPage())
	}
	return int(e.layout.Groups[g].BytesPerPage())
}

// step runs one pass. It returns the first error a connector call or a page check returned.
func (e *engine) step() error {
	e.drv.opts.Chunk = e.chunk
	err := e.drv.Step(e.ctx)
	e.pass++
	return err
}

// run steps until every request is done.
func (e *engine) run() error {
	for limit := 0; e.drv.Pending() > 0; limit++ {
		if limit > 200000 {
			e.t.Fatalf("engine did not finish")
		}
		if err := e.step(); err != nil {
			return err
		}
		if !e.drv.Busy() {
			time.Sleep(20 * time.Microsecond)
		}
	}
	return nil
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
