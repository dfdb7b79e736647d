package connector

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
)

// With early loads a hit's load starts at its allocation report: by the time the pass's
// metadata is built (before BindMeta and StartLoad) it is queued or done, a synchronous one
// travels as an id in Metadata.EarlyLoads and never as a transfer, an asynchronous one never in
// Metadata.AsyncLoads, and every restored page holds the bytes the cold run computed.
func TestEarlyLoads(t *testing.T) {
	for _, async := range []bool{false, true} {
		name := "sync"
		if async {
			name = "async"
		}
		t.Run(name, func(t *testing.T) {
			poolKinds(t, func(t *testing.T, newPool func() testPool) { testEarlyLoads(t, newPool, async) })
		})
	}
}

func testEarlyLoads(t *testing.T, newPool func() testPool, async bool) {
	pl := newPool()
	opts := baseOptions()
	prompts := map[string][]int64{"a": prompt(11, 0, 49), "b": prompt(12, 0, 41), "c": prompt(13, 0, 37)}
	cold := newEngine(t, pl, opts, 1, 128)
	for _, id := range []string{"a", "b", "c"} {
		cold.add(id, prompts[id])
	}
	cold.mustRun()

	o := opts
	o.EarlyLoads = true
	if async {
		o.AsyncLoad, o.AsyncLoadWorkers = true, 1
	}
	warm := newEngine(t, pl, o, 1, 128)
	w := warm.ranks[0].w
	var early []string
	warm.beforeLoad = func(e *engine, meta Metadata) {
		if len(meta.Loads) > 0 || len(meta.AsyncLoads) > 0 {
			t.Errorf("pass %d: metadata carries %d loads and %d parked transfers; early loads travel in neither", e.pass, len(meta.Loads), len(meta.AsyncLoads))
		}
		for _, id := range meta.EarlyLoads {
			w.mu.Lock()
			ld := w.early[id]
			w.mu.Unlock()
			if ld == nil {
				t.Fatalf("pass %d: metadata names %s's early load, which the worker does not hold", e.pass, id)
			}
			// Nothing past this point starts it: the load began at the allocation report.
			select {
			case <-ld.done:
			case <-time.After(10 * time.Second):
				t.Fatalf("pass %d: %s's early load did not end before BindMeta and StartLoad", e.pass, id)
			}
		}
		early = append(early, meta.EarlyLoads...)
	}
	for _, id := range []string{"a", "b", "c"} {
		warm.add(id, prompts[id])
	}
	if async {
		// The parked loads are queued by the allocation reports of the first pass, before its
		// metadata exists.
		warm.beforeLoad = func(e *engine, meta Metadata) {
			if len(meta.Loads)+len(meta.AsyncLoads)+len(meta.EarlyLoads) > 0 {
				t.Errorf("pass %d: metadata carries loads %d, parked transfers %d, early ids %v; an asynchronous early load travels in none", e.pass, len(meta.Loads), len(meta.AsyncLoads), meta.EarlyLoads)
			}
			if e.pass != 0 {
				return
			}
			w.mu.Lock()
			var queued []string
			for id := range w.async {
				queued = append(queued, id)
			}
			w.mu.Unlock()
			slices.Sort(queued)
			if !slices.Equal(queued, []string{"a", "b", "c"}) {
				t.Errorf("before the first BindMeta the worker holds parked loads %v, want a, b and c", queued)
			}
		}
	}
	warm.mustRun()
	for id, toks := range prompts {
		r := warm.byID[id]
		if want := (len(toks) - 1) / testT; r.loaded != want || r.Restarts != 0 {
			t.Errorf("%s: loaded %d blocks with %d restarts, want %d and none", id, r.loaded, r.Restarts, want)
		}
	}
	if !async {
		slices.Sort(early)
		if !slices.Equal(early, []string{"a", "b", "c"}) {
			t.Errorf("metadata named early loads %v, want a, b and c once each", early)
		}
	}
	w.mu.Lock()
	left := len(w.early) + len(w.async)
	w.mu.Unlock()
	if left != 0 {
		t.Errorf("the worker still holds %d loads after every request finished", left)
	}
}

// An early load that loses a page hands its request back through TakeFailedLoadRequests as a
// synchronous load would: the request restarts once, looks up again, and every byte is right.
func TestEarlyLoadLostPage(t *testing.T) {
	poolKinds(t, func(t *testing.T, newPool func() testPool) {
		pl := newPool()
		opts := baseOptions()
		ta, tb := prompt(21, 0, 49), prompt(22, 0, 49)
		cold := newEngine(t, pl, opts, 1, 128)
		cold.add("a", ta)
		cold.add("b", tb)
		cold.mustRun()

		c, _ := keys.NewChain(keys.ChainConfig{TokensPerBlock: testT})
		ha, _ := c.Extend(ta)
		evicted := opts.Namespace.PageKey(1, testT, 20, ha[5])
		o := opts
		o.EarlyLoads = true
		warm := newEngine(t, pl, o, 1, 128)
		warm.afterAlloc = func(e *engine, r *simReq) {
			// Between a's lookup and its allocation report: the load the report starts misses.
			if e.pass == 0 && r.id == "a" && !pl.evict(evicted) {
				t.Fatalf("key %s was not in the pool", evicted)
			}
		}
		warm.add("a", ta)
		warm.add("b", tb)
		warm.mustRun()
		a, b := warm.byID["a"], warm.byID["b"]
		if a.Restarts != 1 || b.Restarts != 0 {
			t.Fatalf("restarts a=%d b=%d, want 1 and 0", a.Restarts, b.Restarts)
		}
		if a.loaded != 5 || b.loaded != 12 {
			t.Fatalf("loaded a=%d b=%d blocks, want 5 (the blocks before the lost page) and 12", a.loaded, b.loaded)
		}
	})
}

// Forgetting a request whose early load is in flight (RequestReset, RequestFinished) waits for
// the load to end: the engine gets its pages back only once nothing writes them.
func TestEarlyLoadForgetWaits(t *testing.T) {
	for _, async := range []bool{false, true} {
		pl := newMemPool()
		opts := baseOptions()
		tokens := prompt(31, 0, 41)
		fillBlocks(t, pl, opts, tokens, 64)
		gp := &gatedGets{testPool: pl, gate: make(chan struct{}), entered: make(chan struct{}, 16)}
		o := opts
		o.EarlyLoads, o.AsyncLoad, o.AsyncLoadWorkers = true, async, 1
		s := newTestScheduler(t, o, gp, 64)
		w, err := NewWorker(o, gp, newHostMover(testLayout(64)))
		if err != nil {
			t.Fatal(err)
		}
		if err := w.RegisterLayout(testLayout(64)); err != nil {
			t.Fatal(err)
		}
		if err := LinkEarlyLoads(s, w); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		n, gotAsync, err := s.Lookup(ctx, Request{ID: "r", Tokens: tokens}, 0)
		if err != nil || n != 40 || gotAsync != async {
			t.Fatalf("async %t: lookup = %d, %t, %v; want 40 tokens", async, n, gotAsync, err)
		}
		pages := [][]int{make([]int, 11), make([]int, 11)}
		for b := range 11 {
			pages[0][b], pages[1][b] = 20+b, 40+b
		}
		if err := s.UpdateStateAfterAlloc("r", pages, n, false); err != nil {
			t.Fatal(err)
		}
		select {
		case <-gp.entered:
		case <-time.After(10 * time.Second):
			t.Fatalf("async %t: the allocation report started no load", async)
		}
		// The request cannot change under the load.
		if _, _, err := s.Lookup(ctx, Request{ID: "r", Tokens: tokens}, 0); !async && !errors.Is(err, errEarlyInFlight) {
			t.Fatalf("a lookup of a request whose early load is in flight = %v, want refused", err)
		}
		if err := s.CancelLoad("r", 0, 4); !async && !errors.Is(err, errEarlyInFlight) {
			t.Fatalf("CancelLoad of a request whose early load is in flight = %v, want refused", err)
		}
		reset := make(chan struct{})
		go func() { s.RequestReset("r", false); close(reset) }()
		select {
		case <-reset:
			t.Fatalf("async %t: RequestReset returned while the request's load was held in the pool", async)
		case <-time.After(50 * time.Millisecond):
		}
		close(gp.gate)
		select {
		case <-reset:
		case <-time.After(10 * time.Second):
			t.Fatalf("async %t: RequestReset did not return once the load ended", async)
		}
		w.mu.Lock()
		left := len(w.early) + len(w.async)
		w.mu.Unlock()
		if left != 0 {
			t.Fatalf("async %t: the worker still holds %d loads of the reset request", async, left)
		}
		if err := w.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Early loads are refused where they cannot be right, and metadata that misnames them is
// refused before anything is bound.
func TestEarlyLoadsRefused(t *testing.T) {
	o := baseOptions()
	o.EarlyLoads = true
	for _, c := range []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"tensor-parallel", func(o *Options) { o.Namespace.WorldSize, o.Namespace.Rank = 2, 0 }, "early loads need a single rank"},
		{"attention-dp", func(o *Options) { o.Namespace.AttentionDP = true }, "early loads need a single rank"},
		{"fence", func(o *Options) { o.Fence = func() Fence { return nil } }, "early loads order by the host"},
	} {
		oo := o
		c.edit(&oo)
		if err := oo.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Validate = %v, want %q", c.name, err, c.want)
		}
	}
	if err := LinkEarlyLoads(nil, nil); err == nil {
		t.Error("LinkEarlyLoads(nil, nil) succeeded")
	}

	pl := newMemPool()
	tokens := prompt(41, 0, 41)
	fillBlocks(t, pl, baseOptions(), tokens, 64)
	s := newTestScheduler(t, o, pl, 64)
	w, err := NewWorker(o, pl, newHostMover(testLayout(64)))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(context.Background())
	if err := w.RegisterLayout(testLayout(64)); err != nil {
		t.Fatal(err)
	}
	plain, err := NewWorker(baseOptions(), pl, newHostMover(testLayout(64)))
	if err != nil {
		t.Fatal(err)
	}
	if err := LinkEarlyLoads(s, plain); err == nil {
		t.Error("LinkEarlyLoads joined a scheduler to a worker made without EarlyLoads")
	}
	if err := LinkEarlyLoads(s, w); err != nil {
		t.Fatal(err)
	}
	if err := w.CheckEarlyLoads([]string{"nobody"}); err == nil || !strings.Contains(err.Error(), `"nobody"`) {
		t.Errorf("CheckEarlyLoads of an unknown request = %v, want an error naming it", err)
	}

	ctx := context.Background()
	n, _, err := s.Lookup(ctx, Request{ID: "r", Tokens: tokens}, 0)
	if err != nil || n != 40 {
		t.Fatalf("lookup = %d, %v", n, err)
	}
	pages := [][]int{make([]int, 11), make([]int, 11)}
	for b := range 11 {
		pages[0][b], pages[1][b] = 20+b, 40+b
	}
	if err := s.UpdateStateAfterAlloc("r", pages, n, false); err != nil {
		t.Fatal(err)
	}
	if err := s.UpdateStateAfterAlloc("r", pages, n, false); err == nil {
		t.Error("a second allocation report while the first one's load is in flight was accepted")
	}
	if err := w.CheckEarlyLoads([]string{"r", "r"}); err == nil {
		t.Error("CheckEarlyLoads accepted the same request twice")
	}
	// The scheduler output names other pages for block 3 than the allocation report did.
	moved := [][]int{slices.Clone(pages[0]), slices.Clone(pages[1])}
	moved[1][3] = 60
	_, err = s.BuildMeta(SchedulerOutput{NewRequests: []RequestData{{ID: "r", NewBlockIDsByGroup: moved, NumScheduledTokens: 1, ComputedPosition: 0}}})
	if err == nil || !strings.Contains(err.Error(), "another page than the allocation report") {
		t.Fatalf("BuildMeta with pages other than the allocation report's = %v", err)
	}
}
