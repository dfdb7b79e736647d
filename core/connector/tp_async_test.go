package connector

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
)

// Seed commit 17: under tensor parallelism every rank queues and loads its own shard of a
// parked request, and the loaded bytes are each rank's own.
func TestTensorParallelAsyncLoads(t *testing.T) { poolKinds(t, testTensorParallelAsyncLoads) }

func testTensorParallelAsyncLoads(t *testing.T, newPool func() testPool) {
	pool := newPool()
	opts := baseOptions()
	prompts := map[string][]int64{}
	cold := newEngine(t, pool, opts, 2, 256)
	for i := range 4 {
		id := fmt.Sprintf("r%d", i)
		prompts[id] = prompt(int64(30+i%2), 12, 33+i)
		cold.add(id, prompts[id])
	}
	cold.mustRun()

	ao := opts
	ao.AsyncLoad, ao.AsyncLoadWorkers = true, 2
	ao.StatsInterval = time.Hour
	warm := newEngine(t, pool, ao, 2, 256)
	for id, p := range prompts {
		warm.add(id, p)
	}
	warm.mustRun()
	for id, p := range prompts {
		r := warm.byID[id]
		if want := (len(p) - 1) / testT; r.loaded != want || r.Restarts != 0 {
			t.Fatalf("%s loaded %d blocks with %d restarts, want %d and none", id, r.loaded, r.Restarts, want)
		}
	}
	for i, rk := range warm.ranks {
		if tot := rk.w.stats.LoadTotals(); tot.AsyncLoads != int64(len(prompts)) {
			t.Fatalf("rank %d made %d asynchronous loads, want %d (every rank loads its own shard)", i, tot.AsyncLoads, len(prompts))
		}
	}
}

// Seed commit 17: a tensor-parallel rank whose parked load lost a page fails with the
// "already reported as computed" error; it cannot restart the request alone.
func TestTensorParallelAsyncMissingPageIsFatal(t *testing.T) {
	poolKinds(t, testTensorParallelAsyncMissingPageIsFatal)
}

func testTensorParallelAsyncMissingPageIsFatal(t *testing.T, newPool func() testPool) {
	pool := newPool()
	opts := baseOptions()
	tokens := prompt(13, 0, 29)
	cold := newEngine(t, pool, opts, 2, 64)
	cold.add("r", tokens)
	cold.mustRun()

	c, _ := keys.NewChain(keys.ChainConfig{TokensPerBlock: testT})
	hs, _ := c.Extend(tokens)
	ns1 := opts.Namespace
	ns1.WorldSize, ns1.Rank = 2, 1
	evicted := ns1.PageKey(0, testT, 48, hs[3])
	ao := opts
	ao.AsyncLoad, ao.AsyncLoadWorkers = true, 2
	warm := newEngine(t, pool, ao, 2, 64)
	warm.beforeLoad = func(e *engine, meta Metadata) {
		if e.pass == 0 {
			if len(meta.AsyncLoads) != 1 {
				t.Fatalf("pass 0 carries %d asynchronous transfers, want 1", len(meta.AsyncLoads))
			}
			pool.evict(evicted)
		}
	}
	warm.add("r", tokens)
	err := warm.run()
	if !errors.Is(err, ErrLoadFailed) || !strings.Contains(err.Error(), "already reported as computed") {
		t.Fatalf("run error = %v, want the fatal already-reported-as-computed error", err)
	}
	w0, w1 := warm.ranks[0].w, warm.ranks[1].w
	if w0.Err() != nil {
		t.Fatalf("rank 0 lost nothing but failed: %v", w0.Err())
	}
	if !errors.Is(w1.Err(), ErrLoadFailed) {
		t.Fatalf("rank 1 kept %v, want ErrLoadFailed", w1.Err())
	}
	if got := w1.TakeFailedAsyncLoadRequests(); len(got) != 0 {
		t.Fatalf("a tensor-parallel rank handed back %v", got)
	}
}
