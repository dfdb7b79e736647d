package connector

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// newTestWorker returns a worker over pool with a host mover of slots pages per group, its
// layout registered, closed when the test ends.
func newTestWorker(t *testing.T, opts Options, pool testPool, slots int) *Worker {
	t.Helper()
	w, err := NewWorker(opts, pool, newHostMover(testLayout(slots)))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.RegisterLayout(testLayout(slots)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	return w
}

func newAsyncWorker(t *testing.T) *Worker {
	t.Helper()
	opts := baseOptions()
	opts.AsyncLoad = true
	return newTestWorker(t, opts, newMemPool(), 8)
}

// Seed commit 4: a misreported request id is fail-stop. An engine announcing an asynchronous
// load the worker never queued gets a clear error naming the request, never a finished and
// failed report about a request the worker knows nothing of, and every later call fails too.
func TestAnnouncedLoadNeverQueuedIsMisreported(t *testing.T) {
	w := newAsyncWorker(t)
	_, fl, err := w.GetFinished(nil, []string{"ghost"})
	if !errors.Is(err, ErrMisreportedRequest) || !strings.Contains(err.Error(), `"ghost"`) || !strings.Contains(err.Error(), "no asynchronous load was queued") {
		t.Fatalf("GetFinished(ghost) = %v, %v; want ErrMisreportedRequest naming ghost", fl, err)
	}
	if got := w.TakeFailedAsyncLoadRequests(); len(got) != 0 {
		t.Fatalf("a misreported id was handed back as failed: %v", got)
	}
	if _, _, err := w.GetFinished(nil, nil); !errors.Is(err, ErrMisreportedRequest) {
		t.Fatalf("later GetFinished = %v, want the kept fail-stop error", err)
	}
	if err := w.StartLoad(context.Background()); !errors.Is(err, ErrMisreportedRequest) {
		t.Fatalf("later StartLoad = %v, want the kept fail-stop error", err)
	}
}

// A zero-token asynchronous honour queues an empty transfer, done at once; announcing it again
// after GetFinished reported it finished is a misreported id.
func TestAnnouncedLoadAlreadyFinishedIsMisreported(t *testing.T) {
	w := newAsyncWorker(t)
	w.BindMeta(Metadata{AsyncLoads: []RequestTransfers{{RequestID: "empty"}}})
	_, fl, err := w.GetFinished(nil, []string{"empty"})
	if err != nil || len(fl) != 1 || fl[0] != "empty" {
		t.Fatalf("GetFinished(empty) = %v, %v; want it finished at once", fl, err)
	}
	if got := w.TakeFailedAsyncLoadRequests(); len(got) != 0 {
		t.Fatalf("an empty transfer failed: %v", got)
	}
	_, _, err = w.GetFinished(nil, []string{"empty"})
	if !errors.Is(err, ErrMisreportedRequest) || !strings.Contains(err.Error(), "already reported its load finished") {
		t.Fatalf("second announcement = %v, want ErrMisreportedRequest (already finished)", err)
	}
}

// A request parked again after its load finished is announced legitimately.
func TestRequeuedAsyncLoadIsNotMisreported(t *testing.T) {
	w := newAsyncWorker(t)
	for pass := range 3 {
		w.BindMeta(Metadata{AsyncLoads: []RequestTransfers{{RequestID: "r"}}})
		if _, fl, err := w.GetFinished(nil, []string{"r"}); err != nil || len(fl) != 1 {
			t.Fatalf("pass %d: GetFinished = %v, %v", pass, fl, err)
		}
	}
}

// Save drops name requests of the bound pass or requests handed back for a restart; any other
// id is misreported, and nothing is dropped for it.
func TestDropBoundSavesOutsideTheBatchIsMisreported(t *testing.T) {
	opts := baseOptions()
	w := newTestWorker(t, opts, newMemPool(), 8)
	meta := Metadata{Saves: []RequestTransfers{{RequestID: "a", Pages: []PageTransfer{{Page: 1}}}, {RequestID: "b", Pages: []PageTransfer{{Page: 2}}}}}
	w.BindMeta(meta)
	if err := w.DropBoundSaves([]string{"a"}); err != nil {
		t.Fatal(err)
	}
	if err := w.DropBoundSaves([]string{"a"}); err != nil {
		t.Fatalf("a repeated drop is idempotent, got %v", err)
	}
	err := w.DropBoundSaves([]string{"b", "stranger"})
	if !errors.Is(err, ErrMisreportedRequest) || !strings.Contains(err.Error(), `"stranger"`) {
		t.Fatalf("DropBoundSaves(stranger) = %v, want ErrMisreportedRequest naming it", err)
	}
	w.mu.Lock()
	left := len(w.bound.Saves)
	w.mu.Unlock()
	if left != 1 {
		t.Fatalf("%d saves left bound, want b's: a misreported drop must change nothing", left)
	}
	if err := w.WaitForSave(context.Background()); !errors.Is(err, ErrMisreportedRequest) {
		t.Fatalf("WaitForSave after a misreported id = %v, want the kept fail-stop error", err)
	}
}

// An engine that reads reports_failed_loads must take the failed requests after every
// StartLoad; going on without taking them is refused, since it would compute the request over
// pages that never landed.
func TestFailedLoadsMustBeTaken(t *testing.T) { poolKinds(t, testFailedLoadsMustBeTaken) }

func testFailedLoadsMustBeTaken(t *testing.T, newPool func() testPool) {
	pool := newPool()
	opts := baseOptions()
	tokens := prompt(21, 0, 29)
	cold := newEngine(t, pool, opts, 1, 64)
	cold.add("a", tokens)
	cold.mustRun()
	for _, k := range pool.keys() {
		pool.evict(k)
	}

	w := newTestWorker(t, opts, pool, 64)
	ks := cold.metas[0].Saves[0].Pages
	w.BindMeta(Metadata{Loads: []RequestTransfers{{RequestID: "a", Pages: ks}}})
	if err := w.StartLoad(context.Background()); err != nil {
		t.Fatal(err)
	}
	w.BindMeta(Metadata{})
	err := w.StartLoad(context.Background())
	if !errors.Is(err, ErrFailedLoadsNotTaken) || !strings.Contains(err.Error(), "[a]") {
		t.Fatalf("StartLoad without taking the failed load = %v, want ErrFailedLoadsNotTaken naming a", err)
	}
}

// The same for asynchronous loads: the failed parked requests GetFinished reported must be
// taken before the next GetFinished.
func TestFailedAsyncLoadsMustBeTaken(t *testing.T) { poolKinds(t, testFailedAsyncLoadsMustBeTaken) }

func testFailedAsyncLoadsMustBeTaken(t *testing.T, newPool func() testPool) {
	pool := newPool()
	opts := baseOptions()
	tokens := prompt(22, 0, 29)
	cold := newEngine(t, pool, opts, 1, 64)
	cold.add("a", tokens)
	cold.mustRun()
	for _, k := range pool.keys() {
		pool.evict(k)
	}
	ao := opts
	ao.AsyncLoad, ao.AsyncLoadWorkers = true, 1
	w := newTestWorker(t, ao, pool, 64)
	w.BindMeta(Metadata{AsyncLoads: []RequestTransfers{{RequestID: "a", Pages: cold.metas[0].Saves[0].Pages}}})
	announce := []string{"a"}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, fl, err := w.GetFinished(nil, announce)
		if err != nil {
			t.Fatal(err)
		}
		announce = nil
		if len(fl) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the parked load never finished")
		}
		time.Sleep(time.Millisecond)
	}
	_, _, err := w.GetFinished(nil, nil)
	if !errors.Is(err, ErrFailedLoadsNotTaken) || !strings.Contains(err.Error(), fmt.Sprint([]string{"a"})) {
		t.Fatalf("GetFinished without taking the failed async load = %v, want ErrFailedLoadsNotTaken naming a", err)
	}
}

func TestRecentSetIsBounded(t *testing.T) {
	r := newRecentSet(3)
	for _, id := range []string{"a", "b", "c", "d"} {
		r.add(id)
	}
	if r.has("a") || !r.has("b") || !r.has("d") || r.len() != 3 {
		t.Fatalf("after 4 adds into 3: a=%v b=%v d=%v len=%d", r.has("a"), r.has("b"), r.has("d"), r.len())
	}
	r.remove("c")
	r.add("c")
	r.add("e") // evicts b's slot
	if r.has("b") || !r.has("c") || !r.has("e") || r.len() != 3 {
		t.Fatalf("after remove and re-add: b=%v c=%v e=%v len=%d", r.has("b"), r.has("c"), r.has("e"), r.len())
	}
}
