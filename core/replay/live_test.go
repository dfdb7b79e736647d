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
	"github.com/kvctl/kvctl/mooncake"
)

// startDaemon runs a real kvctl serve daemon on a short socket path until the test ends.
func startDaemon(t *testing.T, poolBytes int64) string {
	t.Helper()
	po := mooncake.DefaultOptions()
	po.Segments = []mooncake.SegmentSpec{{Name: "live-test", Capacity: poolBytes}}
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
