package connector

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
)

// Seed commit 11: a failed request's saves leave the pass for a batch it was all of, too. The
// pass's only request restores an 8-block cached prefix and computes four more blocks in the
// same pass, so the pass binds saves of blocks 8-11 for it; one page of the prefix is gone at
// load time. Its bound saves are dropped: nothing is bound at the pass's save step and none of
// the blocks it would have computed over the missing prefix reaches the pool (the put never
// overwrites, so a page written then would stay wrong for every later reader). The restart
// recomputes and saves them, and a later engine loads every block byte for byte.
func TestFailedLoadDropsTheSavesOfAWholeBatch(t *testing.T) {
	pl := newEmbPool(t, embTestCapacity)
	opts := baseOptions()
	full := prompt(60, 0, 49) // 12 full blocks and a token
	cached := full[:33]       // its first 8 offerable blocks
	cold := newEngine(t, pl, opts, 1, 128)
	cold.add("c", cached)
	cold.mustRun()

	c, _ := keys.NewChain(keys.ChainConfig{TokensPerBlock: testT})
	h, _ := c.Extend(full)
	evicted := opts.Namespace.PageKey(1, testT, 20, h[5])
	all := saveKeysOf(t, opts, testLayout(128), full)
	fresh := all[8*3:] // blocks 8-11: three values per block, which only the warm pass computes
	for _, k := range fresh {
		if pl.has(k) {
			t.Fatalf("%s is in the pool before the warm run", k)
		}
	}

	warm := newEngine(t, pl, opts, 1, 128)
	warm.chunk = 64
	warm.beforeLoad = func(e *engine, meta Metadata) {
		if e.pass != 0 {
			return
		}
		// The pass binds a's saves of the four blocks it computes after its restore.
		if len(meta.Saves) != 1 || meta.Saves[0].RequestID != "a" || len(meta.Saves[0].Pages) != 4*2 {
			t.Fatalf("pass 0 saves %+v, want a's pages of blocks 8-11", meta.Saves)
		}
		if !pl.evict(evicted) {
			t.Fatalf("key %s was not in the pool", evicted)
		}
	}
	checked := false
	warm.skipSave = func(pass int) bool {
		if pass == 0 {
			w := warm.ranks[0].w
			w.mu.Lock()
			n := len(w.bound.Saves)
			w.mu.Unlock()
			if n != 0 {
				t.Errorf("%d save entries still bound after the batch's only request failed its load", n)
			}
			checked = true
		}
		return false
	}
	warm.add("a", full)
	if err := warm.step(); err != nil {
		t.Fatal(err)
	}
	if err := warm.ranks[0].w.WaitSaves(context.Background()); err != nil {
		t.Fatal(err)
	}
	if a := warm.byID["a"]; a.Restarts != 1 || !checked {
		t.Fatalf("restarts %d, save step reached %v", a.Restarts, checked)
	}
	for _, k := range append([]string{evicted}, fresh...) {
		if pl.has(k) {
			t.Fatalf("the failing pass wrote %s", k)
		}
	}
	warm.mustRun()
	for _, k := range all {
		if !pl.has(k) {
			t.Fatalf("the restart did not save %s", k)
		}
	}
	// Every block holds the KV a cold computation writes: a later engine restores all 12
	// offerable blocks, each checked byte for byte, and computes only the last token's block.
	check := newEngine(t, pl, opts, 1, 128)
	r := check.add("r", full)
	check.mustRun()
	if r.loaded != 12 || check.computedBlocks != 0 {
		t.Fatalf("a later engine loaded %d blocks and computed %d, want 12 and 0", r.loaded, check.computedBlocks)
	}
}

// asyncScheduler is a scheduler with asynchronous loads whose pool holds tokens' first 7 blocks.
func asyncScheduler(t *testing.T, tokens []int64) *Scheduler {
	t.Helper()
	pool := newEmbPool(t, embTestCapacity)
	opts := baseOptions()
	fillBlocks(t, pool, opts, tokens, 64)
	ao := opts
	ao.AsyncLoad, ao.AsyncLoadWorkers = true, 1
	return newTestScheduler(t, ao, pool, 64)
}

// Seed commit 17: the parked request's transfer is built when its allocation is reported, from
// its full page lists, and a missing or invalid destination page is refused; no transfer is
// queued for it.
func TestAsyncTransferRefusesAMissingDestinationPage(t *testing.T) {
	tokens := prompt(61, 0, 29)
	for _, c := range []struct {
		name  string
		pages [][]int
		want  string
	}{
		{"a page list too short", pagesFrom(0, 5), "honoured block 5 has no destination page in layer group 0"},
		{"page -1", [][]int{{0, 1, 2, 3, 4, 5, 6, 7}, {0, 1, -1, 3, 4, 5, 6, 7}}, "honoured block 2 has no destination page in layer group 1"},
		{"a layer group missing", pagesFrom(0, 8)[:1], "honoured block 0 has no destination page in layer group 1"},
		{"a page past the layout", [][]int{{0, 1, 2, 3, 4, 5, 6, 7}, {0, 1, 2, 3, 4, 5, 64, 7}}, "block 6"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := asyncScheduler(t, tokens)
			m, async, err := s.Lookup(context.Background(), Request{ID: "p", Tokens: tokens}, 0)
			if err != nil || !async || m != 7*testT {
				t.Fatalf("lookup = %d, %v, %v", m, async, err)
			}
			err = s.UpdateStateAfterAlloc("p", c.pages, m, false)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("allocation report = %v, want an error containing %q", err, c.want)
			}
			meta, err := s.BuildMeta(SchedulerOutput{})
			if err != nil || len(meta.AsyncLoads) != 0 {
				t.Fatalf("a refused transfer was queued: %+v, %v", meta.AsyncLoads, err)
			}
		})
	}
}

// Seed commit 17: the blocks an asynchronous transfer covers are never written back. The
// request's later passes save only the blocks past the restored ones.
func TestAsyncLoadedBlocksAreNeverSavedBack(t *testing.T) {
	tokens := prompt(62, 0, 33)
	s := asyncScheduler(t, tokens[:29])
	m, async, err := s.Lookup(context.Background(), Request{ID: "p", Tokens: tokens}, 0)
	if err != nil || !async || m != 7*testT {
		t.Fatalf("lookup = %d, %v, %v", m, async, err)
	}
	if err := s.UpdateStateAfterAlloc("p", pagesFrom(0, 9), m, false); err != nil {
		t.Fatal(err)
	}
	meta, err := s.BuildMeta(SchedulerOutput{})
	if err != nil || len(meta.AsyncLoads) != 1 || len(meta.AsyncLoads[0].Pages) != 14 {
		t.Fatalf("async transfer %+v, %v", meta.AsyncLoads, err)
	}
	// The parked request resumes and computes the rest of its prompt in one pass.
	meta, err = s.BuildMeta(SchedulerOutput{NewRequests: []RequestData{{ID: "p", NewBlockIDsByGroup: pagesFrom(0, 9), ComputedPosition: m, NumScheduledTokens: 33 - m}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(meta.Loads) != 0 {
		t.Fatalf("the restored blocks were loaded again synchronously: %+v", meta.Loads)
	}
	if len(meta.Saves) != 1 {
		t.Fatalf("saves %+v, want the new block's", meta.Saves)
	}
	var blocks []int
	for _, p := range meta.Saves[0].Pages {
		if !slices.Contains(blocks, p.Page) {
			blocks = append(blocks, p.Page)
		}
	}
	if !slices.Equal(blocks, []int{7}) {
		t.Fatalf("saved the pages of blocks %v, want block 7 only (blocks 0-6 were loaded)", blocks)
	}
}

// Seed commit 17: a reset drops an asynchronous transfer not yet handed out; another request's
// stays.
func TestResetDropsAPendingAsyncTransfer(t *testing.T) {
	tokens := prompt(63, 0, 29)
	s := asyncScheduler(t, tokens)
	for _, id := range []string{"p", "q"} {
		m, async, err := s.Lookup(context.Background(), Request{ID: id, Tokens: tokens}, 0)
		if err != nil || !async || m != 7*testT {
			t.Fatalf("%s: lookup = %d, %v, %v", id, m, async, err)
		}
		first := 0
		if id == "q" {
			first = 10
		}
		if err := s.UpdateStateAfterAlloc(id, pagesFrom(first, 8), m, false); err != nil {
			t.Fatal(err)
		}
	}
	s.RequestReset("p", false)
	meta, err := s.BuildMeta(SchedulerOutput{})
	if err != nil || len(meta.AsyncLoads) != 1 || meta.AsyncLoads[0].RequestID != "q" {
		t.Fatalf("after p's reset the transfers are %+v, %v; want q's only", meta.AsyncLoads, err)
	}
	// Once handed out, a transfer is the worker's: a reset no longer reaches it.
	s.RequestReset("q", false)
	if meta, _ := s.BuildMeta(SchedulerOutput{}); len(meta.AsyncLoads) != 0 {
		t.Fatalf("a handed-out transfer was emitted again: %+v", meta.AsyncLoads)
	}
}

// Seed commit 17: binding never fails (it runs outside the attention-DP failure vote); what
// cannot be queued, an asynchronous load on a worker without load workers, is kept and
// returned by the next StartLoad and GetFinished, naming the request.
func TestBindMetaNeverFails(t *testing.T) {
	w, err := NewWorker(baseOptions(), newEmbPool(t, embTestCapacity), newHostMover(testLayout(16)))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(context.Background())
	if err := w.RegisterLayout(testLayout(16)); err != nil {
		t.Fatal(err)
	}
	w.BindMeta(Metadata{AsyncLoads: []RequestTransfers{{RequestID: "p", Pages: []PageTransfer{{Hash: keys.PageHashOf(keys.Hash{1}), Page: 2}}}}})
	err = w.StartLoad(context.Background())
	if !errors.Is(err, ErrCannotTransfer) || !strings.Contains(err.Error(), "request p: asynchronous load queued but this worker has no load workers") {
		t.Fatalf("StartLoad after the bind = %v, want the kept error", err)
	}
	if _, _, err2 := w.GetFinished(nil, nil); err2 == nil || err2.Error() != err.Error() {
		t.Fatalf("GetFinished = %v, want the same kept error", err2)
	}
	// Binding again still returns nothing, and the error stays.
	w.BindMeta(Metadata{})
	if err3 := w.StartLoad(context.Background()); err3 == nil || err3.Error() != err.Error() {
		t.Fatalf("StartLoad after another bind = %v", err3)
	}
}

// Seed commit 17: StartLoad consumes the bound synchronous loads, so a second call on the same
// metadata starts nothing: no fence is taken and no page is copied.
func TestSecondStartLoadStartsNothing(t *testing.T) {
	pool := newEmbPool(t, embTestCapacity)
	opts := baseOptions()
	tokens := prompt(64, 0, 29)
	hashes := fillBlocks(t, pool, opts, tokens, 64)
	load := RequestTransfers{RequestID: "a"}
	for i, h := range hashes {
		for g := range 2 {
			load.Pages = append(load.Pages, PageTransfer{Hash: keys.PageHashOf(h), Group: g, Page: 30 + i})
		}
	}
	log := &orderLog{}
	fences := 0
	o := opts
	o.Fence = func() Fence { fences++; return hostFence{log: log} }
	w, err := NewWorker(o, pool, orderMover{hostMover: newHostMover(testLayout(64)), log: log})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(context.Background())
	if err := w.RegisterLayout(testLayout(64)); err != nil {
		t.Fatal(err)
	}
	w.BindMeta(Metadata{Loads: []RequestTransfers{load}})
	if err := w.StartLoad(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := log.take(); !slices.Contains(got, "scatter") || fences != 1 {
		t.Fatalf("the first StartLoad did %q with %d fences", got, fences)
	}
	if err := w.StartLoad(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := log.take(); len(got) != 0 || fences != 1 {
		t.Fatalf("the second StartLoad did %q and took %d fences in all, want nothing", got, fences)
	}
}

// Seed commit 16: the prefix-hole line is flushed at shutdown. With an interval longer than
// the run, no line is logged by lookups; Close logs the one line with the totals.
func TestPrefixHoleLineFlushedAtShutdown(t *testing.T) {
	pool := newEmbPool(t, embTestCapacity)
	opts := baseOptions()
	tokens := prompt(65, 0, 29)
	hashes := fillBlocks(t, pool, opts, tokens, 64)
	// A hole: block 2 is gone, so the offer stops at 2 blocks and 5 stored blocks are
	// recomputed.
	if !pool.evict(opts.Namespace.PageKey(0, testT, 48, hashes[2])) {
		t.Fatal("block 2 was not in the pool")
	}
	var buf bytes.Buffer
	var mu sync.Mutex
	o := opts
	o.StatsInterval = time.Hour
	o.Logger = slog.New(slog.NewTextHandler(&lockedWriter{w: &buf, mu: &mu}, nil))
	s, err := NewScheduler(o, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RegisterLayout(testLayout(64)); err != nil {
		t.Fatal(err)
	}
	if m, _, err := s.Lookup(context.Background(), Request{ID: "r", Tokens: tokens}, 0); err != nil || m != 2*testT {
		t.Fatalf("lookup = %d, %v; want the 2 blocks before the hole", m, err)
	}
	mu.Lock()
	early := strings.Contains(buf.String(), "prefix-hole stats")
	mu.Unlock()
	if early {
		t.Fatalf("a line was logged before the interval:\n%s", buf.String())
	}
	s.Close()
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	if n := strings.Count(out, `msg="prefix-hole stats"`); n != 1 {
		t.Fatalf("%d prefix-hole lines at shutdown, want 1:\n%s", n, out)
	}
	for _, f := range []string{"lookups=1 ", "holes=1 "} {
		if !strings.Contains(out, f) {
			t.Fatalf("the flushed line lacks %q:\n%s", f, out)
		}
	}
}

// Seed commit 17: an error on a load worker is kept and returned by every later StartLoad and
// GetFinished until shutdown, and the request it hit is not reported finished.
func TestLoadWorkerErrorIsKeptUntilShutdown(t *testing.T) {
	pool := newEmbPool(t, embTestCapacity)
	opts := baseOptions()
	tokens := prompt(66, 0, 29)
	hashes := fillBlocks(t, pool, opts, tokens, 64)
	o := opts
	o.AsyncLoad, o.AsyncLoadWorkers = true, 1
	o.Fence = func() Fence { return hostFence{log: &orderLog{}, err: errors.New("engine device lost")} }
	w, err := NewWorker(o, pool, newHostMover(testLayout(64)))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.RegisterLayout(testLayout(64)); err != nil {
		t.Fatal(err)
	}
	var pages []PageTransfer
	for i, h := range hashes {
		pages = append(pages, PageTransfer{Hash: keys.PageHashOf(h), Group: 0, Page: 30 + i}, PageTransfer{Hash: keys.PageHashOf(h), Group: 1, Page: 30 + i})
	}
	w.BindMeta(Metadata{AsyncLoads: []RequestTransfers{{RequestID: "p", Pages: pages}}})
	var kept error
	for deadline := time.Now().Add(10 * time.Second); kept == nil; time.Sleep(time.Millisecond) {
		var done []string
		_, done, kept = w.GetFinished(nil, []string{"p"})
		if slices.Contains(done, "p") {
			t.Fatal("a load whose fence failed was reported finished")
		}
		if time.Now().After(deadline) {
			t.Fatal("the load worker's error never surfaced")
		}
	}
	if !strings.Contains(kept.Error(), "request p: allocation fence: engine device lost") {
		t.Fatalf("GetFinished = %v, want the load worker's error", kept)
	}
	for range 2 {
		if err := w.StartLoad(context.Background()); err == nil || err.Error() != kept.Error() {
			t.Fatalf("a later StartLoad = %v, want the kept error", err)
		}
		if _, _, err := w.GetFinished(nil, nil); err == nil || err.Error() != kept.Error() {
			t.Fatalf("a later GetFinished = %v, want the kept error", err)
		}
	}
	if err := w.Close(context.Background()); err != nil {
		t.Fatalf("close after a kept error: %v", err)
	}
}

// Seed commit 17: GetFinished reports a parked request only once the engine announced it as
// loading and its pages landed. A load that landed but was never announced is not reported,
// however often GetFinished is called; once announced, it is reported, with its pages in place.
func TestAsyncLoadReportedOnlyOnceAnnounced(t *testing.T) {
	pl := newEmbPool(t, embTestCapacity)
	opts := baseOptions()
	tokens := prompt(67, 0, 29)
	hashes := fillBlocks(t, pl, opts, tokens, 64)
	o := opts
	o.AsyncLoad, o.AsyncLoadWorkers = true, 1
	mover := newHostMover(testLayout(64))
	w, err := NewWorker(o, pl, mover)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(context.Background())
	if err := w.RegisterLayout(testLayout(64)); err != nil {
		t.Fatal(err)
	}
	var pages []PageTransfer
	for i, h := range hashes[:7] {
		pages = append(pages, PageTransfer{Hash: keys.PageHashOf(h), Group: 0, Page: 30 + i}, PageTransfer{Hash: keys.PageHashOf(h), Group: 1, Page: 30 + i})
	}
	w.BindMeta(Metadata{AsyncLoads: []RequestTransfers{{RequestID: "p", Pages: pages}}})
	// The load worker's own record says the load is done.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		w.mu.Lock()
		done := w.async["p"] != nil && w.async["p"].done
		w.mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the asynchronous load never finished")
		}
	}
	for range 3 {
		if _, loaded, err := w.GetFinished(nil, nil); err != nil || len(loaded) != 0 {
			t.Fatalf("GetFinished before the announcement = %v, %v; want nothing reported", loaded, err)
		}
	}
	if _, loaded, err := w.GetFinished(nil, []string{"p"}); err != nil || !slices.Equal(loaded, []string{"p"}) {
		t.Fatalf("GetFinished announcing p = %v, %v; want p", loaded, err)
	}
	if failed := w.TakeFailedAsyncLoadRequests(); len(failed) != 0 {
		t.Fatalf("failed loads %v", failed)
	}
	if _, loaded, err := w.GetFinished(nil, nil); err != nil || len(loaded) != 0 {
		t.Fatalf("p was reported again: %v, %v", loaded, err)
	}
	want, ok := pl.get(opts.Namespace.PageKey(0, testT, 48, hashes[6]))
	if !ok {
		t.Fatal("block 6 is not in the pool")
	}
	got := make([]byte, len(want))
	if err := mover.Gather(context.Background(), []kvmem.PageRef{{Group: 0, Slot: 36}}, [][]byte{got}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("block 6's page did not land in slot 36")
	}
}
