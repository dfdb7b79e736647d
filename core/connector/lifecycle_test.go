package connector

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/core/simkv"
	"github.com/kvctl/kvctl/core/stats"
)

// poolKeysOf returns every key a single-rank worker writes for the prompt's full blocks that
// have a hash (the last prompt token's block included when it is full).
func saveKeysOf(t *testing.T, opts Options, l kvmem.Layout, tokens []int64) []string {
	t.Helper()
	c, err := keys.NewChain(keys.ChainConfig{Format: opts.Format, TokensPerBlock: testT, PromptLookahead: opts.PromptLookahead})
	if err != nil {
		t.Fatal(err)
	}
	hs, err := c.Extend(tokens)
	if err != nil {
		t.Fatal(err)
	}
	g, err := newGeometry(l, opts.withDefaults())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, h := range hs {
		out = opts.Namespace.AppendSaveKeys(out, testT, g.groups, h)
	}
	return out
}

func TestColdRunSavesWarmRunLoadsByteIdentical(t *testing.T) {
	poolKinds(t, testColdRunSavesWarmRunLoadsByteIdentical)
}

func testColdRunSavesWarmRunLoadsByteIdentical(t *testing.T, newPool func() testPool) {
	pool := newPool()
	opts := baseOptions()
	prompts := map[string][]int64{
		"a": prompt(1, 40, 61), // 15 full blocks, shares 10 blocks with b
		"b": prompt(2, 40, 52), // 13 full blocks, the last one holds the last token
		"c": prompt(3, 0, 3),   // shorter than a block
	}
	cold := newEngine(t, pool, opts, 1, 256)
	for _, id := range []string{"a", "b", "c"} {
		cold.add(id, prompts[id])
	}
	cold.mustRun()
	if cold.loadedBlocks != 0 {
		t.Fatalf("cold run loaded %d blocks", cold.loadedBlocks)
	}
	// Every full block of every prompt is in the pool with the bytes the engine computed.
	for _, id := range []string{"a", "b"} {
		for _, k := range saveKeysOf(t, opts, cold.layout, prompts[id]) {
			if !pool.has(k) {
				t.Fatalf("cold run did not save %s", k)
			}
		}
	}
	if n := len(pool.keys()); n != (15+13-10)*3 {
		t.Fatalf("pool holds %d keys, want %d (3 page values per block)", n, (15+13-10)*3)
	}

	before := pool.written()
	warm := newEngine(t, pool, opts, 1, 256)
	for _, id := range []string{"a", "b", "c"} {
		warm.add(id, prompts[id])
	}
	warm.mustRun()
	// a: 60 of 61 tokens are offerable, all 15 blocks; b: (52-1)/4 = 12 blocks, the 13th holds
	// the last token and is computed.
	if warm.byID["a"].loaded != 15 || warm.byID["b"].loaded != 12 || warm.byID["c"].loaded != 0 {
		t.Fatalf("loaded blocks a=%d b=%d c=%d", warm.byID["a"].loaded, warm.byID["b"].loaded, warm.byID["c"].loaded)
	}
	if warm.computedBlocks != 1 {
		t.Fatalf("warm run computed %d full blocks, want 1", warm.computedBlocks)
	}
	if pool.written() != before {
		t.Fatalf("warm run wrote %d new objects into the pool", pool.written()-before)
	}
}

func TestChunkedPrefillSavesOnlyComputedBlocks(t *testing.T) {
	poolKinds(t, testChunkedPrefillSavesOnlyComputedBlocks)
}

func testChunkedPrefillSavesOnlyComputedBlocks(t *testing.T, newPool func() testPool) {
	pool := newPool()
	tokens := prompt(7, 0, 57) // 14 full blocks and a token
	// Cold: the first 33 tokens in chunks that end inside blocks.
	e := newEngine(t, pool, baseOptions(), 1, 64)
	e.chunk = 5
	savesFollowComputation(t, e, e.add("r", tokens[:33]), 0)
	if got, want := len(pool.keys()), 8*3; got != want {
		t.Fatalf("pool holds %d keys, want %d", got, want)
	}
	// Warm: the same 8 blocks and 6 more. The pass that restores the 8 cached blocks computes
	// a chunk too; its saves reach the block that chunk completes, since the bound counts the
	// honoured restore, which the runtime leaves out of the computed position.
	w := newEngine(t, pool, baseOptions(), 1, 64)
	w.chunk = 5
	r := w.add("r", tokens)
	savesFollowComputation(t, w, r, 8)
	if r.loaded != 8 {
		t.Fatalf("warm run restored %d blocks, want 8", r.loaded)
	}
	if got, want := len(pool.keys()), 14*3; got != want {
		t.Fatalf("pool holds %d keys, want %d", got, want)
	}
}

// savesFollowComputation steps e until r is done and checks every pass's saves: they never
// reach past the blocks computed by the pass's end, and with the earlier passes' saves they
// cover every block computed past the first restored ones.
func savesFollowComputation(t *testing.T, e *engine, r *simReq, restored int) {
	t.Helper()
	saved := restored
	for r.Phase != PhaseDone {
		if err := e.step(); err != nil {
			t.Fatal(err)
		}
		meta := e.metas[len(e.metas)-1]
		for _, s := range meta.Saves {
			last := savedBlocksOf(e, r, s)
			if last > r.Computed/testT {
				t.Fatalf("pass %d saved up to block %d with %d tokens computed", e.pass-1, last, r.Computed)
			}
			saved = max(saved, last)
		}
		if saved != r.Computed/testT {
			t.Fatalf("pass %d: %d tokens computed (%d blocks), but the saves so far reach block %d", e.pass-1, r.Computed, r.Computed/testT, saved)
		}
	}
}

// savedBlocksOf returns one past the highest block ordinal a save list names.
func savedBlocksOf(e *engine, r *simReq, s RequestTransfers) int {
	c, _ := keys.NewChain(keys.ChainConfig{TokensPerBlock: testT, PromptLookahead: e.opts.PromptLookahead})
	hs, _ := c.Extend(r.tokens)
	last := 0
	for _, p := range s.Pages {
		for b, h := range hs {
			if keys.PageHashOf(h) == p.Hash {
				last = max(last, b+1)
			}
		}
	}
	return last
}

func TestPartialHonour(t *testing.T) { poolKinds(t, testPartialHonour) }

func testPartialHonour(t *testing.T, newPool func() testPool) {
	pool := newPool()
	opts := baseOptions()
	tokens := prompt(4, 0, 41) // 10 full blocks
	cold := newEngine(t, pool, opts, 1, 64)
	cold.add("r", tokens)
	cold.mustRun()

	wo := opts
	rep, err := stats.NewReporter(stats.ReporterOptions{Interval: time.Hour, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	wo.Stats = rep
	warm := newEngine(t, pool, wo, 1, 64)
	warm.honour = func(r *simReq, m int) int { return (m / testT / 2) * testT }
	warm.add("r", tokens)
	warm.mustRun()
	if got := warm.byID["r"].loaded; got != 5 {
		t.Fatalf("loaded %d blocks, want 5 (half of the offer)", got)
	}
	// One synchronous pass loaded 5 blocks of 3 page values each, in one pool call.
	tot := rep.LoadTotals()
	if tot.Loads != 1 || tot.Pages != 15 || tot.StoreCalls != 1 || tot.LandedBytes != 5*(48+20+12) || tot.FailedPages != 0 {
		t.Fatalf("load stats %+v", tot)
	}
	if tot.Phases[stats.PhaseGet].Wall <= 0 || tot.Phases[stats.PhaseResolve].Wall <= 0 {
		t.Fatalf("phases not timed: %+v", tot.Phases)
	}
	if h := rep.HoleTotals(); h.Lookups != 1 || h.HitBlocks != 10 {
		t.Fatalf("hole stats %+v", h)
	}

	// A count that is not a whole-block part of the offer is refused.
	s, _ := NewScheduler(opts, pool)
	_ = s.RegisterLayout(testLayout(64))
	m, _, err := s.Lookup(context.Background(), Request{ID: "x", Tokens: tokens}, 0)
	if err != nil || m != 40 {
		t.Fatalf("lookup = %d, %v", m, err)
	}
	for _, h := range []int{3, 44, -4} {
		if err := s.UpdateStateAfterAlloc("x", nil, h, false); err == nil {
			t.Errorf("honouring %d tokens of a 40-token offer succeeded", h)
		}
	}
	if err := s.UpdateStateAfterAlloc("x", nil, 8, false); err != nil {
		t.Fatal(err)
	}
}

func TestCancelLoadHeadTailMiddle(t *testing.T) { poolKinds(t, testCancelLoadHeadTailMiddle) }

func testCancelLoadHeadTailMiddle(t *testing.T, newPool func() testPool) {
	pool := newPool()
	opts := baseOptions()
	tokens := prompt(5, 0, 41) // offer: blocks [0, 10)
	cold := newEngine(t, pool, opts, 1, 64)
	cold.add("r", tokens)
	cold.mustRun()

	s, _ := NewScheduler(opts, pool)
	_ = s.RegisterLayout(testLayout(64))
	offer := func() (int, int) { st := s.reqs["r"]; return st.offerFirst, st.offerBlocks }
	lookup := func() {
		if m, _, err := s.Lookup(context.Background(), Request{ID: "r", Tokens: tokens}, 0); err != nil || m != 40 {
			t.Fatalf("lookup = %d, %v", m, err)
		}
	}
	lookup()
	if err := s.CancelLoad("r", 0, 6); err != nil { // blocks 0 and 1 (6 rounds up)
		t.Fatal(err)
	}
	if f, n := offer(); f != 2 || n != 8 {
		t.Fatalf("after a head cut: offer (%d, %d), want (2, 8)", f, n)
	}
	lookup()
	if err := s.CancelLoad("r", 33, 41); err != nil { // blocks 8 and 9
		t.Fatal(err)
	}
	if f, n := offer(); f != 0 || n != 8 {
		t.Fatalf("after a tail cut: offer (%d, %d), want (0, 8)", f, n)
	}
	if err := s.CancelLoad("r", 100, 200); err != nil { // outside the offer: nothing
		t.Fatal(err)
	}
	if err := s.CancelLoad("r", 12, 16); err == nil {
		t.Fatal("a cut in the middle of the offer succeeded")
	}
	lookup()
	if err := s.CancelLoad("r", 0, 40); err != nil {
		t.Fatal(err)
	}
	if _, n := offer(); n != 0 {
		t.Fatalf("cancelling the whole offer left %d blocks", n)
	}

	// Through the engine: a tail cut is honoured and only the head is loaded.
	warm := newEngine(t, pool, opts, 1, 64)
	warm.afterAlloc = func(e *engine, r *simReq) {
		if err := e.sched.CancelLoad(r.id, 24, 40); err != nil {
			t.Fatal(err)
		}
	}
	warm.honour = func(r *simReq, m int) int { return 24 }
	warm.add("r", tokens)
	warm.mustRun()
	if got := warm.byID["r"].loaded; got != 6 {
		t.Fatalf("loaded %d blocks after a tail cut, want 6", got)
	}
}

func TestEvictedPageRestartsOnlyThatRequest(t *testing.T) {
	poolKinds(t, testEvictedPageRestartsOnlyThatRequest)
}

func testEvictedPageRestartsOnlyThatRequest(t *testing.T, newPool func() testPool) {
	pool := newPool()
	opts := baseOptions()
	// Each warm prompt restores its 8 cached blocks and computes blocks 8-11 in one pass, so
	// pass 0 binds saves for both requests.
	ta, tb := prompt(8, 0, 49), prompt(9, 0, 49)
	cold := newEngine(t, pool, opts, 1, 128)
	cold.add("a", ta[:33])
	cold.add("b", tb[:33])
	cold.mustRun()

	// Evict a's block 5 group-1 page between the lookup and the load.
	c, _ := keys.NewChain(keys.ChainConfig{TokensPerBlock: testT})
	ha, _ := c.Extend(ta)
	evicted := opts.Namespace.PageKey(1, testT, 20, ha[5])
	aKeys, bKeys := saveKeysOf(t, opts, testLayout(128), ta), saveKeysOf(t, opts, testLayout(128), tb)
	warm := newEngine(t, pool, opts, 1, 128)
	warm.chunk = 64
	var droppedChecked bool
	warm.beforeLoad = func(e *engine, meta Metadata) {
		if e.pass != 0 {
			return
		}
		if len(meta.Saves) != 2 {
			t.Fatalf("pass 0 binds saves for %d requests, want a and b", len(meta.Saves))
		}
		if !pool.evict(evicted) {
			t.Fatalf("key %s was not in the pool", evicted)
		}
	}
	warm.skipSave = func(pass int) bool {
		if pass == 0 {
			// The failed request's saves left the pass; the other request's stay.
			w := warm.ranks[0].w
			w.mu.Lock()
			var bound []string
			for _, s := range w.bound.Saves {
				bound = append(bound, s.RequestID)
			}
			w.mu.Unlock()
			if len(bound) != 1 || bound[0] != "b" {
				t.Errorf("saves bound for %v after a's load failed, want b's only", bound)
			}
			droppedChecked = true
		}
		return false
	}
	warm.add("a", ta)
	warm.add("b", tb)
	// Pass 0: lookup offers a and b 8 blocks each; a loses a page.
	if err := warm.step(); err != nil {
		t.Fatal(err)
	}
	if err := warm.ranks[0].w.WaitSaves(context.Background()); err != nil {
		t.Fatal(err)
	}
	a, b := warm.byID["a"], warm.byID["b"]
	if a.Restarts != 1 || b.Restarts != 0 {
		t.Fatalf("restarts a=%d b=%d", a.Restarts, b.Restarts)
	}
	if !droppedChecked {
		t.Fatal("save step not reached")
	}
	if pool.has(evicted) {
		t.Fatal("the evicted page was written back in the failing pass")
	}
	for _, k := range aKeys[8*3:] {
		if pool.has(k) {
			t.Fatalf("the failing pass wrote a's %s, computed over a prefix that never landed", k)
		}
	}
	for _, k := range bKeys[8*3:] {
		if !pool.has(k) {
			t.Fatalf("the failing pass did not write b's %s", k)
		}
	}
	warm.mustRun()
	// The restart looks up again: blocks 0..4 hit, 5 is recomputed and saved again.
	if a.loaded != 5 || b.loaded != 8 {
		t.Fatalf("loaded a=%d b=%d, want 5 and 8", a.loaded, b.loaded)
	}
	v, ok := pool.get(evicted)
	if !ok || !bytes.Equal(v, simkv.KVBytes(ta, 5, testT, 0, 0, 1, false, 20)) {
		t.Fatal("the recomputed page was not saved with its KV")
	}
	// Every block of both prompts holds its KV: a later engine restores all 12 of each.
	check := newEngine(t, pool, opts, 1, 128)
	ca, cb := check.add("a", ta), check.add("b", tb)
	check.mustRun()
	if ca.loaded != 12 || cb.loaded != 12 {
		t.Fatalf("a later engine loaded a=%d b=%d blocks, want 12 each", ca.loaded, cb.loaded)
	}
}

func TestTensorParallelMissingPageIsFatal(t *testing.T) {
	poolKinds(t, testTensorParallelMissingPageIsFatal)
}

func testTensorParallelMissingPageIsFatal(t *testing.T, newPool func() testPool) {
	pool := newPool()
	opts := baseOptions()
	tokens := prompt(10, 0, 29)
	cold := newEngine(t, pool, opts, 2, 64)
	cold.add("r", tokens)
	cold.mustRun()
	// Both shards and the replicated page (written by rank 0 only) are in the pool.
	if got := len(pool.keys()); got != 7*(2+2+1) {
		t.Fatalf("pool holds %d keys, want %d", got, 7*5)
	}

	c, _ := keys.NewChain(keys.ChainConfig{TokensPerBlock: testT})
	hs, _ := c.Extend(tokens)
	ns1 := opts.Namespace
	ns1.WorldSize, ns1.Rank = 2, 1
	evicted := ns1.PageKey(0, testT, 48, hs[3])
	warm := newEngine(t, pool, opts, 2, 64)
	warm.beforeLoad = func(e *engine, meta Metadata) {
		if e.pass == 0 {
			pool.evict(evicted)
		}
	}
	warm.add("r", tokens)
	err := warm.run()
	if !errors.Is(err, ErrLoadFailed) || !strings.Contains(err.Error(), "already reported as computed") {
		t.Fatalf("run error = %v", err)
	}
	w1 := warm.ranks[1].w
	if err2 := w1.StartLoad(context.Background()); !errors.Is(err2, ErrLoadFailed) {
		t.Fatalf("a later call returned %v, want the kept error", err2)
	}
	if _, _, err2 := w1.GetFinished(nil, nil); !errors.Is(err2, ErrLoadFailed) {
		t.Fatalf("GetFinished returned %v, want the kept error", err2)
	}
	if got := w1.TakeFailedLoadRequests(); len(got) != 0 {
		t.Fatalf("a tensor-parallel rank handed back %v", got)
	}
}
