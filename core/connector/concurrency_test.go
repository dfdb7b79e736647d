package connector

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/pool"
)

// A remote pool answers after a network round trip. These tests put the embedded pool behind
// wrappers that hold calls inside the pool, and check that no engine call waits for another
// one's pool call.

// guard bounds how long a test waits for something that must happen; reaching it is a failure
// (a call blocked behind another's pool call), never a timing measurement.
const guard = 20 * time.Second

// gatedPool holds every BatchIsExist inside the pool until the gate opens, and reports each
// arrival.
type gatedPool struct {
	*embPool
	arrived chan struct{}
	gate    chan struct{}
}

func (p *gatedPool) BatchIsExist(ctx context.Context, keys []string) []int {
	p.arrived <- struct{}{}
	<-p.gate
	return p.embPool.BatchIsExist(ctx, keys)
}

// latencyPool adds a fixed delay to every data call, as a remote pool's round trip does, and
// records how many calls were inside the pool at once.
type latencyPool struct {
	*embPool
	delay    time.Duration
	inflight atomic.Int64
	peak     atomic.Int64
}

func (p *latencyPool) enter() func() {
	n := p.inflight.Add(1)
	for {
		m := p.peak.Load()
		if n <= m || p.peak.CompareAndSwap(m, n) {
			break
		}
	}
	time.Sleep(p.delay)
	return func() { p.inflight.Add(-1) }
}

func (p *latencyPool) BatchIsExist(ctx context.Context, keys []string) []int {
	defer p.enter()()
	return p.embPool.BatchIsExist(ctx, keys)
}

func (p *latencyPool) BatchGet(ctx context.Context, keys []string, bufs [][]byte) []int64 {
	defer p.enter()()
	return p.embPool.BatchGet(ctx, keys, bufs)
}

func (p *latencyPool) BatchPut(ctx context.Context, keys []string, bufs [][]byte, cfg pool.ReplicateConfig) []pool.Code {
	defer p.enter()()
	return p.embPool.BatchPut(ctx, keys, bufs, cfg)
}

// schedulerOver is a scheduler adapter over pool with the test layout of slots page slots.
func schedulerOver(t *testing.T, pl pool.Pool, slots int) *Scheduler {
	t.Helper()
	s, err := NewScheduler(baseOptions(), pl)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RegisterLayout(testLayout(slots)); err != nil {
		t.Fatal(err)
	}
	return s
}

// waitOrFail runs f and fails the test when it has not returned within guard.
func waitOrFail(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(guard):
		t.Fatalf("%s did not return while another lookup's pool call was in flight: the scheduler holds its lock across the pool call", what)
	}
}

// TestSchedulerCallsProceedDuringLookupPoolCall parks one lookup inside the pool and checks
// that the same engine's other scheduler calls, on other requests, still return.
func TestSchedulerCallsProceedDuringLookupPoolCall(t *testing.T) {
	pl := &gatedPool{embPool: newEmbPool(t, embTestCapacity), arrived: make(chan struct{}, 16), gate: make(chan struct{})}
	// A warm pool: request "b" finds its blocks.
	warmup := newEngine(t, pl.embPool, baseOptions(), 1, 64)
	warmup.add("b", prompt(2, 0, 21))
	warmup.mustRun()

	s := schedulerOver(t, pl, 64)
	slow := make(chan error, 1)
	go func() {
		_, _, err := s.Lookup(context.Background(), Request{ID: "a", Tokens: prompt(1, 0, 21), ContextOnly: true}, 0)
		slow <- err
	}()
	select {
	case <-pl.arrived:
	case <-time.After(guard):
		t.Fatal("the first lookup never reached the pool")
	}
	// "a" is now inside the pool. Request "c" has no full block to look up, so it never calls
	// the pool; its lookup, allocation, metadata and finish must not wait for "a".
	waitOrFail(t, "Lookup of another request", func() {
		if _, _, err := s.Lookup(context.Background(), Request{ID: "c", Tokens: prompt(3, 0, 3), ContextOnly: true}, 0); err != nil {
			t.Error(err)
		}
	})
	waitOrFail(t, "UpdateStateAfterAlloc", func() {
		if err := s.UpdateStateAfterAlloc("c", [][]int{{0}, {0}}, 0, false); err != nil {
			t.Error(err)
		}
	})
	waitOrFail(t, "BuildMeta", func() {
		if _, err := s.BuildMeta(SchedulerOutput{}); err != nil {
			t.Error(err)
		}
	})
	waitOrFail(t, "RequestFinished", func() { s.RequestFinished("c", false) })
	close(pl.gate)
	if err := <-slow; err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentLookupsMeetInsidePool has n lookups of one scheduler inside the pool at the same
// time: the pool releases none of them until all n have arrived, so a scheduler that serialised
// its pool calls would never get past the first.
func TestConcurrentLookupsMeetInsidePool(t *testing.T) {
	const n = 8
	pl := &gatedPool{embPool: newEmbPool(t, embTestCapacity), arrived: make(chan struct{}, n), gate: make(chan struct{})}
	warmup := newEngine(t, pl.embPool, baseOptions(), 1, 256)
	for i := range n {
		warmup.add(fmt.Sprint("w", i), prompt(int64(i+1), 8, 17))
	}
	warmup.mustRun()

	s := schedulerOver(t, pl, 256)
	var wg sync.WaitGroup
	matched := make([]int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, _, err := s.Lookup(context.Background(), Request{ID: fmt.Sprint("r", i), Tokens: prompt(int64(i+1), 8, 17), ContextOnly: true}, 0)
			if err != nil {
				t.Error(err)
			}
			matched[i] = m
		}()
	}
	for i := range n {
		select {
		case <-pl.arrived:
		case <-time.After(guard):
			t.Fatalf("only %d of %d concurrent lookups reached the pool: lookups are serialised", i, n)
		}
	}
	close(pl.gate)
	wg.Wait()
	for i, m := range matched {
		if m != 16 {
			t.Errorf("lookup %d matched %d tokens, want 16 (4 full blocks)", i, m)
		}
	}
}

// TestSupersededLookupLeavesNewerOffer checks the one ordering the unlocked pool call opens: an
// older lookup of a request that returns after a newer one must not overwrite the newer offer.
func TestSupersededLookupLeavesNewerOffer(t *testing.T) {
	pl := &gatedPool{embPool: newEmbPool(t, embTestCapacity), arrived: make(chan struct{}, 4), gate: make(chan struct{})}
	warmup := newEngine(t, pl.embPool, baseOptions(), 1, 64)
	warmup.add("w", prompt(1, 0, 21))
	warmup.mustRun()
	s := schedulerOver(t, pl, 64)
	req := Request{ID: "a", Tokens: prompt(1, 0, 21), ContextOnly: true}
	older := make(chan int, 1)
	go func() {
		m, _, _ := s.Lookup(context.Background(), req, 0)
		older <- m
	}()
	<-pl.arrived
	// The newer lookup starts after 4 computed tokens, so its offer begins at block 1.
	newer := make(chan int, 1)
	go func() {
		m, _, _ := s.Lookup(context.Background(), req, 4)
		newer <- m
	}()
	<-pl.arrived
	close(pl.gate)
	if m := <-newer; m != 16 {
		t.Fatalf("newer lookup matched %d tokens, want 16", m)
	}
	<-older
	s.mu.Lock()
	first, blocks := s.reqs["a"].offerFirst, s.reqs["a"].offerBlocks
	s.mu.Unlock()
	if first != 1 || blocks != 4 {
		t.Fatalf("offer is blocks [%d, %d), want the newer lookup's [1, 5)", first, first+blocks)
	}
}

// TestManyEnginesAgainstSlowPool runs four engines at once on one pool that answers every call
// after a delay: each runs cold, then warm, and every loaded page is checked byte for byte by
// the engine harness. Run with -race.
func TestManyEnginesAgainstSlowPool(t *testing.T) {
	pl := &latencyPool{embPool: newEmbPool(t, 256<<10), delay: 500 * time.Microsecond}
	t.Run("group", func(t *testing.T) {
		for i := range 4 {
			t.Run(fmt.Sprint("engine-", i), func(t *testing.T) {
				t.Parallel()
				cold := newEngine(t, pl, baseOptions(), 1, 256)
				for j := range 4 {
					cold.add(fmt.Sprint("c", j), prompt(int64(10*i+j+1), 12, 29))
				}
				cold.mustRun()
				warm := newEngine(t, pl, baseOptions(), 1, 256)
				for j := range 4 {
					warm.add(fmt.Sprint("w", j), prompt(int64(10*i+j+1), 12, 29))
				}
				warm.mustRun()
				if warm.loadedBlocks != 4*7 {
					t.Errorf("warm engine %d loaded %d blocks, want %d", i, warm.loadedBlocks, 4*7)
				}
			})
		}
	})
	t.Logf("peak pool calls in flight at once: %d", pl.peak.Load())
}

// putGatedPool holds every BatchPut inside the pool until the gate opens.
type putGatedPool struct {
	*embPool
	gate chan struct{}
}

func (p *putGatedPool) BatchPut(ctx context.Context, keys []string, bufs [][]byte, cfg pool.ReplicateConfig) []pool.Code {
	<-p.gate
	return p.embPool.BatchPut(ctx, keys, bufs, cfg)
}

// TestWaitSavesReturnsOnceQueuedSavesAreWritten: WaitSaves does not return while a queued save
// is still inside the pool (it ends with the context instead), and returns once the save is
// written, with the pages readable.
func TestWaitSavesReturnsOnceQueuedSavesAreWritten(t *testing.T) {
	pl := &putGatedPool{embPool: newEmbPool(t, 1<<20), gate: make(chan struct{})}
	l := testLayout(8)
	m := newHostMover(l)
	for i := range m.mem {
		m.mem[i] = byte(i)
	}
	w := registeredWorker(t, pl, m, l)
	if err := w.WaitSaves(context.Background()); err != nil {
		t.Fatalf("nothing queued: %v", err)
	}
	w.BindMeta(Metadata{Saves: []RequestTransfers{{RequestID: "r", Pages: []PageTransfer{{Hash: keys.PageHashOf(directHash(1)), Group: 0, Page: 1}}}}})
	if err := w.WaitForSave(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := w.WaitSaves(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitSaves with the save held in the pool = %v, want the context's deadline", err)
	}
	close(pl.gate)
	done := make(chan error, 1)
	go func() { done <- w.WaitSaves(context.Background()) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(guard):
		t.Fatal("WaitSaves did not return after the save was written")
	}
	key := baseOptions().Namespace.PageKey(0, testT, l.Groups[0].BytesPerPage(), directHash(1))
	if got := pl.BatchIsExist(context.Background(), []string{key}); got[0] != 1 {
		t.Fatalf("page not in the pool when WaitSaves returned: %v", got)
	}
}
