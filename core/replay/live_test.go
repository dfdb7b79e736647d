package replay

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/daemon/daemontest"
	"github.com/kvctl/kvctl/core/probe"
	"github.com/kvctl/kvctl/pool/embedded"
)

// startDaemon runs a real kvctl serve daemon on a short socket path until the test ends.
func startDaemon(t *testing.T, poolBytes int64) string {
	t.Helper()
	po := embedded.DefaultOptions()
	po.Segments = []embedded.SegmentSpec{{Name: "live-test", Capacity: poolBytes}}
	return daemontest.Start(t, daemon.Config{Pool: po}).Info.Socket
}

func TestLiveMatchesOfflineAndIdeal(t *testing.T) {
	tr := readTrace(t, "testdata/conversation_head500.jsonl")
	p := DefaultParams()
	cfg := DefaultConfig()
	off, err := Offline(context.Background(), tr, p, []Config{cfg})
	if err != nil {
		t.Fatal(err)
	}
	var ideal int64
	for _, h := range idealHits(tr) {
		ideal += int64(h)
	}
	// Over call channels (the default) and over gRPC alone the engine makes the same calls.
	// Each on a fresh daemon, so that both start from an empty pool.
	for _, noChannels := range []bool{false, true} {
		sock := startDaemon(t, 64<<20)
		live, err := Live(context.Background(), tr, p, cfg, LiveOptions{Socket: sock, Engines: 1, AsFastAsPossible: true, NoCallChannels: noChannels})
		if err != nil {
			t.Fatal(err)
		}
		checkLive(t, tr, live, off, ideal)
	}
}

func checkLive(t *testing.T, tr *Trace, live, off *Report, ideal int64) {
	t.Helper()
	lr, or := live.Runs[0], off.Runs[0]
	if lr.Requests != len(tr.Requests) || lr.FailedRequests != 0 {
		t.Fatalf("live replay served %d of %d requests, %d failed", lr.Requests, len(tr.Requests), lr.FailedRequests)
	}
	if lr.Blocks != or.Blocks || lr.Tokens != or.Tokens {
		t.Fatalf("live %+v %+v, offline %+v %+v", lr.Blocks, lr.Tokens, or.Blocks, or.Tokens)
	}
	if hit := lr.Blocks.LocalHit + lr.Blocks.PoolHit; hit != ideal || lr.Blocks.PoolHit == 0 {
		t.Fatalf("live hit %d blocks (pool %d), ideal %d", hit, lr.Blocks.PoolHit, ideal)
	}
	if live.Live == nil || live.Live.RequestsPerSecond <= 0 || live.Mode != "live" {
		t.Fatalf("live info %+v", live.Live)
	}
}

func TestLiveSeveralEnginesAtTracePace(t *testing.T) {
	tr := readTrace(t, "testdata/conversation_head500.jsonl")
	tr.Requests = tr.Requests[:60]
	sock := startDaemon(t, 64<<20)
	p := DefaultParams()
	var last int
	p.Progress = func(done, total int) { last = done }
	cfg := DefaultConfig()
	cfg.SoftPinTTL = time.Minute
	cfg.GroupBlocks = true
	rep, err := Live(context.Background(), tr, p, cfg, LiveOptions{Socket: sock, Engines: 3, Speed: 1000})
	if err != nil {
		t.Fatal(err)
	}
	run := rep.Runs[0]
	if run.Requests != 60 || last != 60 || len(run.RankLoad) != 3 {
		t.Fatalf("requests %d, progress %d, ranks %d", run.Requests, last, len(run.RankLoad))
	}
	if run.Blocks.LocalHit+run.Blocks.PoolHit == 0 || run.Moved.SavedPages == 0 {
		t.Fatalf("no hits or saves: %+v %+v", run.Blocks, run.Moved)
	}
}

func TestLiveUnreachable(t *testing.T) {
	tr := readTrace(t, "testdata/conversation_head500.jsonl")
	dir, err := os.MkdirTemp("", "kv")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	_, err = Live(context.Background(), tr, DefaultParams(), DefaultConfig(), LiveOptions{Socket: filepath.Join(dir, "none.sock"), Engines: 1})
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("got %v, want ErrUnreachable", err)
	}
}

// replay --live with the pool-aware router asks the daemon's pool through its admin API, with
// the keys the engines' requests have, instead of falling back to the work-aware estimate
// without saying so; without an admin address it is refused.
func TestLivePoolAwareRouterAsksThePool(t *testing.T) {
	tr := readTrace(t, "testdata/conversation_head500.jsonl")
	tr.Requests = tr.Requests[:40]
	po := embedded.DefaultOptions()
	po.Segments = []embedded.SegmentSpec{{Name: "live-test", Capacity: 64 << 20}}
	d := daemontest.Start(t, daemon.Config{Pool: po})
	cfg := DefaultConfig()
	cfg.Router = "pool-aware"
	_, err := Live(context.Background(), tr, DefaultParams(), cfg, LiveOptions{Socket: d.Info.Socket, Engines: 2, AsFastAsPossible: true})
	if !errors.Is(err, ErrPoolAwareNeedsAdmin) {
		t.Fatalf("pool-aware without an admin address: %v", err)
	}
	rep, err := Live(context.Background(), tr, DefaultParams(), cfg, LiveOptions{Socket: d.Info.Socket, Engines: 2, Speed: 1000,
		Admin: d.Info.AdminAddr})
	if err != nil {
		t.Fatal(err)
	}
	run := rep.Runs[0]
	if run.Requests != 40 || run.FailedRequests != 0 || run.Router != "pool-aware" {
		t.Fatalf("requests %d, failed %d, router %q", run.Requests, run.FailedRequests, run.Router)
	}
	if rep.Live.PoolLookups != 40 || rep.Live.PoolLookupFallbacks != 0 {
		t.Fatalf("pool lookups %d, fallbacks %d: the router did not get the pool's answer", rep.Live.PoolLookups, rep.Live.PoolLookupFallbacks)
	}
	// The keys the router asks for are the daemon's: after the run the pool holds the first
	// request's saved blocks, and the router's estimate says so.
	target, err := probe.NewTarget(d.Info.AdminAddr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	q := tr.Requests[0]
	uncached, ok := poolUncachedOf(tr.Format, DefaultParams(), q, true, func(keys []string) ([]bool, error) {
		return target.Exists(context.Background(), keys, false)
	})
	if !ok || uncached >= q.InputLength {
		t.Fatalf("after the run the router estimates %d of %d prompt tokens uncached (ok %v)", uncached, q.InputLength, ok)
	}
}
