package connector

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/pool"
)

// fillBlocks saves every block of tokens into pool through a cold engine and returns the
// block hashes.
func fillBlocks(t *testing.T, pl testPool, opts Options, tokens []int64, slots int) []keys.Hash {
	t.Helper()
	cold := newEngine(t, pl, opts, 1, slots)
	cold.add("cold", tokens)
	cold.mustRun()
	c, err := keys.NewChain(keys.ChainConfig{TokensPerBlock: testT})
	if err != nil {
		t.Fatal(err)
	}
	hs, err := c.Extend(tokens)
	if err != nil {
		t.Fatal(err)
	}
	return hs
}

func newTestScheduler(t *testing.T, opts Options, pl pool.Pool, slots int) *Scheduler {
	t.Helper()
	s, err := NewScheduler(opts, pl)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RegisterLayout(testLayout(slots)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func pagesFrom(first, n int) [][]int {
	out := make([][]int, 2)
	for g := range out {
		for i := range n {
			out[g] = append(out[g], first+i)
		}
	}
	return out
}

// Seed commit 3: a dummy request in the scheduler output is skipped, whatever the parallel
// mode: it carries no prompt to load or save, and its id must not touch a real request.
func TestDummyRequestsSkippedInSchedulerOutput(t *testing.T) {
	pl := newMemPool()
	opts := baseOptions()
	tokens := prompt(40, 0, 29)
	fillBlocks(t, pl, opts, tokens, 64)
	s := newTestScheduler(t, opts, pl, 64)
	m, _, err := s.Lookup(context.Background(), Request{ID: "r", Tokens: tokens}, 0)
	if err != nil || m != 7*testT {
		t.Fatalf("lookup = %d, %v", m, err)
	}
	if err := s.UpdateStateAfterAlloc("r", pagesFrom(0, 8), m, false); err != nil {
		t.Fatal(err)
	}
	// A dummy carrying the real request's id and pages changes nothing.
	meta, err := s.BuildMeta(SchedulerOutput{NewRequests: []RequestData{{ID: "r", Dummy: true, NewBlockIDsByGroup: pagesFrom(10, 8), NumScheduledTokens: 29}}})
	if err != nil || len(meta.Loads)+len(meta.Saves)+len(meta.AsyncLoads) != 0 {
		t.Fatalf("a dummy produced %+v, %v", meta, err)
	}
	// The real request still loads its offer into its own pages.
	meta, err = s.BuildMeta(SchedulerOutput{NewRequests: []RequestData{{ID: "r", NewBlockIDsByGroup: pagesFrom(0, 8), NumScheduledTokens: 29 - m}}})
	if err != nil || len(meta.Loads) != 1 || len(meta.Loads[0].Pages) != 14 || meta.Loads[0].Pages[0].Page != 0 {
		t.Fatalf("after the dummy: %+v, %v", meta.Loads, err)
	}
}

// Seed commit 3: the allocation report, the finish and the reset carry the dummy flag, and
// the adapter skips a dummy because of the flag, not because its id has no state: a dummy
// carrying a live request's id neither settles that request's offer nor drops its state.
func TestDummyFlagSkipsAllocFinishAndReset(t *testing.T) {
	pl := newMemPool()
	opts := baseOptions()
	tokens := prompt(42, 0, 29)
	fillBlocks(t, pl, opts, tokens, 64)
	s := newTestScheduler(t, opts, pl, 64)
	m, _, err := s.Lookup(context.Background(), Request{ID: "r", Tokens: tokens}, 0)
	if err != nil || m != 7*testT {
		t.Fatalf("lookup = %d, %v", m, err)
	}
	// An honoured count that is no whole-block part of the offer: refused for the real
	// request, skipped for a dummy of the same id.
	if err := s.UpdateStateAfterAlloc("r", pagesFrom(10, 8), testT+1, true); err != nil {
		t.Fatalf("a dummy allocation report was checked against the real request: %v", err)
	}
	if err := s.UpdateStateAfterAlloc("r", pagesFrom(10, 8), testT+1, false); err == nil {
		t.Fatal("the same report without the flag was accepted")
	}
	// A dummy honouring nothing would have cancelled the whole offer; the real request's
	// offer is still whole.
	if err := s.UpdateStateAfterAlloc("r", pagesFrom(10, 8), 0, true); err != nil {
		t.Fatal(err)
	}
	if err := s.UpdateStateAfterAlloc("r", pagesFrom(0, 8), m, false); err != nil {
		t.Fatalf("the real report after the dummies: %v", err)
	}
	// The dummy's reset and finish leave the request; its load and saves are still emitted.
	s.RequestReset("r", true)
	if s.RequestFinished("r", true) {
		t.Fatal("a dummy's finish reported saves")
	}
	meta, err := s.BuildMeta(SchedulerOutput{NewRequests: []RequestData{{ID: "r", NewBlockIDsByGroup: pagesFrom(0, 8), NumScheduledTokens: 29 - m}}})
	if err != nil || len(meta.Loads) != 1 || len(meta.Loads[0].Pages) != 14 || len(meta.Saves) != 0 {
		t.Fatalf("after the dummy reset and finish: loads %+v saves %+v, %v", meta.Loads, meta.Saves, err)
	}
	// A request whose saves were emitted: a dummy's finish of its id neither reports them nor
	// forgets the request, the real finish does both.
	fresh := prompt(43, 0, 29)
	if _, _, err := s.Lookup(context.Background(), Request{ID: "w", Tokens: fresh}, 0); err != nil {
		t.Fatal(err)
	}
	meta, err = s.BuildMeta(SchedulerOutput{NewRequests: []RequestData{{ID: "w", NewBlockIDsByGroup: pagesFrom(20, 8), NumScheduledTokens: 29}}})
	if err != nil || len(meta.Saves) != 1 {
		t.Fatalf("saves of the fresh request: %+v, %v", meta.Saves, err)
	}
	if s.RequestFinished("w", true) || s.reqs["w"] == nil {
		t.Fatal("a dummy's finish reported or dropped the real request's saves")
	}
	if !s.RequestFinished("w", false) || s.reqs["w"] != nil {
		t.Fatal("the real finish did not report its saves and drop the request")
	}
}

// Seed commit 10: an honoured block without a destination page is an error, never a silent
// drop of the tail, because the runtime already counts those tokens as computed.
func TestHonouredBlockWithoutDestinationPage(t *testing.T) {
	pl := newMemPool()
	opts := baseOptions()
	tokens := prompt(41, 0, 29)
	fillBlocks(t, pl, opts, tokens, 64)
	for _, c := range []struct {
		name  string
		pages [][]int
		want  string
	}{
		{"missing page", pagesFrom(0, 5), "honoured block 5 has no destination page"},
		{"page -1", [][]int{{0, 1, 2, 3, 4, 5, 6, 7}, {0, 1, 2, -1, 4, 5, 6, 7}}, "honoured block 3 has no page in layer group 1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newTestScheduler(t, opts, pl, 64)
			m, _, err := s.Lookup(context.Background(), Request{ID: "r", Tokens: tokens}, 0)
			if err != nil || m != 7*testT {
				t.Fatalf("lookup = %d, %v", m, err)
			}
			if err := s.UpdateStateAfterAlloc("r", c.pages, m, false); err != nil {
				t.Fatal(err)
			}
			_, err = s.BuildMeta(SchedulerOutput{NewRequests: []RequestData{{ID: "r", NewBlockIDsByGroup: c.pages, NumScheduledTokens: 1}}})
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "already counted as computed") {
				t.Fatalf("BuildMeta = %v, want an error containing %q", err, c.want)
			}
		})
	}
}

// Seed commit 5: the backstop refuses, at build time, a new request that reached the scheduler
// output without a context-only lookup, before any state is recorded; a dummy is never refused
// and a capacity role is never refused.
func TestSpeculativePrefillBuildBackstop(t *testing.T) {
	pl := newMemPool()
	opts := baseOptions()
	opts.SpeculativePrefill, opts.PromptLookahead = true, 1
	s := newTestScheduler(t, opts, pl, 64)
	tokens := prompt(42, 0, 20)
	if _, _, err := s.Lookup(context.Background(), Request{ID: "ctx", Tokens: tokens, ContextOnly: true}, 0); err != nil {
		t.Fatal(err)
	}
	out := SchedulerOutput{
		NewRequests:    []RequestData{{ID: "ctx", NewBlockIDsByGroup: pagesFrom(0, 3), NumScheduledTokens: 20}, {ID: "gen", NumScheduledTokens: 5}},
		SubmittedSaves: []string{"ctx"},
	}
	_, err := s.BuildMeta(out)
	if !errors.Is(err, ErrNotContextOnly) || !strings.Contains(err.Error(), "request gen") {
		t.Fatalf("BuildMeta with a request that skipped the lookup = %v, want ErrNotContextOnly naming gen", err)
	}
	if st := s.reqs["ctx"]; st.pages != nil {
		t.Fatal("the refused build recorded page state for another request")
	}
	out.NewRequests[1].Dummy = true
	meta, err := s.BuildMeta(out)
	if err != nil || len(meta.Saves) != 1 {
		t.Fatalf("with the stray request a dummy: %+v, %v", meta.Saves, err)
	}
	co := opts
	co.Role = RoleCapacity
	cs := newTestScheduler(t, co, pl, 64)
	if _, err := cs.BuildMeta(SchedulerOutput{NewRequests: []RequestData{{ID: "gen", NumScheduledTokens: 5}}}); err != nil {
		t.Fatalf("a capacity role refused a request: %v", err)
	}
}

// Seed commit 17: an asynchronous offer honoured with no tokens still queues an empty
// transfer, because the runtime parks the request regardless; the worker finishes it at once.
func TestZeroTokenAsyncHonourQueuesEmptyTransfer(t *testing.T) {
	pl := newMemPool()
	opts := baseOptions()
	tokens := prompt(43, 0, 29)
	fillBlocks(t, pl, opts, tokens, 64)
	ao := opts
	ao.AsyncLoad, ao.AsyncLoadWorkers = true, 1
	s := newTestScheduler(t, ao, pl, 64)
	m, async, err := s.Lookup(context.Background(), Request{ID: "r", Tokens: tokens}, 0)
	if err != nil || m == 0 || !async {
		t.Fatalf("lookup = %d, %v, %v", m, async, err)
	}
	if err := s.UpdateStateAfterAlloc("r", pagesFrom(0, 8), 0, false); err != nil {
		t.Fatal(err)
	}
	meta, err := s.BuildMeta(SchedulerOutput{})
	if err != nil || len(meta.AsyncLoads) != 1 || meta.AsyncLoads[0].RequestID != "r" || len(meta.AsyncLoads[0].Pages) != 0 {
		t.Fatalf("async transfers %+v, %v; want one empty transfer for r", meta.AsyncLoads, err)
	}
	w := newTestWorker(t, ao, pl, 64)
	w.BindMeta(meta)
	_, fl, err := w.GetFinished(nil, []string{"r"})
	if err != nil || len(fl) != 1 || len(w.TakeFailedAsyncLoadRequests()) != 0 {
		t.Fatalf("empty transfer: finished %v, %v", fl, err)
	}
}

// scriptedPool answers BatchGet from an inner pool but shortens the result list of chosen
// calls, and records how many keys every call asked for.
type scriptedPool struct {
	pool.Pool
	mu    sync.Mutex
	calls []int
	short map[int]bool // call index -> answer with one result too few
}

func (p *scriptedPool) BatchGet(ctx context.Context, ks []string, bufs [][]byte) []int64 {
	p.mu.Lock()
	i := len(p.calls)
	p.calls = append(p.calls, len(ks))
	short := p.short[i]
	p.mu.Unlock()
	out := p.Pool.BatchGet(ctx, ks, bufs)
	if short {
		return out[:len(out)-1]
	}
	return out
}

// Seed commit 11: _load_pages semantics. A batch spans several pool calls; a result list of
// the wrong length fails every page of that call; a request that lost a page has its later
// pages skipped; only pages that landed are scattered.
func TestLoadPagesAcrossCallsAndShortResults(t *testing.T) {
	mem := newMemPool()
	opts := baseOptions()
	ta, tb := prompt(44, 0, 29), prompt(45, 0, 29)
	fillBlocks(t, mem, opts, ta, 64)
	fillBlocks(t, mem, opts, tb, 64)
	layout := testLayout(64)
	w, err := NewWorker(opts, mem, newHostMover(layout))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.RegisterLayout(layout); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })

	s := newTestScheduler(t, opts, mem, 64)
	var loads []RequestTransfers
	for i, tk := range [][]int64{ta, tb} {
		id := []string{"a", "b"}[i]
		m, _, err := s.Lookup(context.Background(), Request{ID: id, Tokens: tk}, 0)
		if err != nil || m != 7*testT {
			t.Fatalf("lookup %s = %d, %v", id, m, err)
		}
		pages := pagesFrom(i*8, 8)
		if err := s.UpdateStateAfterAlloc(id, pages, m, false); err != nil {
			t.Fatal(err)
		}
		meta, err := s.BuildMeta(SchedulerOutput{NewRequests: []RequestData{{ID: id, NewBlockIDsByGroup: pages, NumScheduledTokens: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		loads = append(loads, meta.Loads...)
	}
	var lists loadLists
	if err := w.resolveLoads(&lists, loads); err != nil {
		t.Fatal(err)
	}
	// a and b each have 7 blocks x (2 sharded + 1 replicated) = 21 values.
	if len(lists.items) != 42 {
		t.Fatalf("%d values to load, want 42", len(lists.items))
	}
	mover := newHostMover(layout)
	stage, err := mover.NewStaging(8, int(layout.MaxValueSize()))
	if err != nil {
		t.Fatal(err)
	}
	// Two slot sets of 4: calls of 4 keys. Call 1 (a's values 4..7) comes back short.
	pl := &scriptedPool{Pool: mem, short: map[int]bool{1: true}}
	res, err := loadPages(context.Background(), pl, nil, mover, stage, 64, &lists, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.failed[0] || res.failed[1] || len(res.failed) != 1 {
		t.Fatalf("failed requests %v, want only a (index 0)", res.failed)
	}
	// a: call 0 landed 4, call 1 failed 4, the remaining 13 were skipped (never asked for);
	// b: 21 values in 6 calls of at most 4.
	if res.failedPages != 4 || res.storeCalls != 2+6 {
		t.Fatalf("failed pages %d, store calls %d; want 4 and 8", res.failedPages, res.storeCalls)
	}
	asked := 0
	for _, n := range pl.calls {
		if n > 4 {
			t.Fatalf("a call asked for %d keys, more than a slot set holds", n)
		}
		asked += n
	}
	if asked != 8+21 {
		t.Fatalf("asked for %d values, want 29: a's pages after its failure must be skipped", asked)
	}
	items := lists.items
	var landed int64
	for _, it := range items[:4] {
		landed += int64(it.size)
	}
	for _, it := range items[21:] {
		landed += int64(it.size)
	}
	if res.landedBytes != landed {
		t.Fatalf("landed %d bytes, want %d", res.landedBytes, landed)
	}
	// The pages of a's failed call were never scattered: engine memory there is still zero.
	for _, it := range items[4:8] {
		buf := make([]byte, it.size)
		if err := mover.Gather(context.Background(), []kvmem.PageRef{it.ref}, [][]byte{buf}); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, make([]byte, it.size)) {
			t.Fatalf("page %+v of a failed call was written", it.ref)
		}
	}
	// And b's last value landed byte-identical to the pool's copy.
	last := items[len(items)-1]
	want, _ := mem.get(string(lists.key(&last)))
	buf := make([]byte, last.size)
	if err := mover.Gather(context.Background(), []kvmem.PageRef{last.ref}, [][]byte{buf}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, want) {
		t.Fatal("b's last page differs from the pool's copy")
	}
}

// Seed commits 16 and 17: Close skips the asynchronous loads still queued, and flushes the
// stats lines, whose load line carries failed_pages, wait_ms and the load workers' queue.
func TestCloseSkipsQueuedLoadsAndFlushesStats(t *testing.T) {
	pl := newMemPool()
	opts := baseOptions()
	tokens := prompt(46, 0, 29)
	fillBlocks(t, pl, opts, tokens, 64)
	var buf bytes.Buffer
	var logMu sync.Mutex
	ao := opts
	ao.AsyncLoad, ao.AsyncLoadWorkers = true, 1
	ao.StatsInterval = time.Hour
	ao.Logger = slog.New(slog.NewTextHandler(&lockedWriter{w: &buf, mu: &logMu}, nil))
	release := make(chan struct{})
	ao.Fence = func() Fence { return blockingFence{release: release} }
	s := newTestScheduler(t, ao, pl, 64)
	if m, async, err := s.Lookup(context.Background(), Request{ID: "a", Tokens: tokens}, 0); err != nil || !async || m != 7*testT {
		t.Fatalf("lookup = %d, %v, %v", m, async, err)
	}
	if err := s.UpdateStateAfterAlloc("a", pagesFrom(0, 8), 7*testT, false); err != nil {
		t.Fatal(err)
	}
	meta, err := s.BuildMeta(SchedulerOutput{})
	if err != nil || len(meta.AsyncLoads) != 1 {
		t.Fatalf("%+v, %v", meta.AsyncLoads, err)
	}
	w, err := NewWorker(ao, pl, newHostMover(testLayout(64)))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.RegisterLayout(testLayout(64)); err != nil {
		t.Fatal(err)
	}
	// Three parked loads for the one load worker: the first waits on its fence, two stay queued.
	for _, id := range []string{"a", "b", "c"} {
		if err := w.StartAsyncLoad(id, meta.AsyncLoads[0].Pages); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.mu.Lock()
		active, queued := w.asyncActive, w.asyncQueued
		w.mu.Unlock()
		if active == 1 && queued == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("load worker never took the first load: active %d, queued %d", active, queued)
		}
		time.Sleep(time.Millisecond)
	}
	closed := make(chan error, 1)
	go func() { closed <- w.Close(context.Background()) }()
	// Let Close skip the queue, then let the active load finish.
	for {
		logMu.Lock()
		skipped := strings.Contains(buf.String(), `msg="mooncake-store skipped queued asynchronous loads at shutdown" loads=2`)
		logMu.Unlock()
		if skipped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Close did not skip the two queued loads")
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	logMu.Lock()
	out := buf.String()
	logMu.Unlock()
	if got := strings.Count(out, `msg="load stats"`); got != 1 {
		t.Fatalf("%d load stats lines at shutdown, want 1:\n%s", got, out)
	}
	for _, field := range []string{"loads=1 ", "async_loads=1 ", "failed_pages=0 ", "wait_ms_mean=", "wait_ms_max=", "queue=", "active="} {
		if !strings.Contains(out, field) {
			t.Fatalf("the flushed load line lacks %q:\n%s", field, out)
		}
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
