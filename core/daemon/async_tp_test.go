package daemon_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/pool"
)

// Seed commit 17 through kvctl serve: a tensor-parallel engine of two ranks registered with
// async_load parks every pool hit while each rank's load workers fetch that rank's own shard;
// every restored byte is checked. Then a rank-1 page goes missing between a lookup and its
// asynchronous load, and rank 1 fails with the "already reported as computed" error.
func TestTensorParallelAsyncLoadsThroughServe(t *testing.T) {
	r := start(t, 256<<20)
	ctx := context.Background()
	const T = 16
	cfg := enginesim.Config{Socket: r.Info.Socket, ModelKey: "tp-async", World: 2, TokensPerBlock: T, Slots: 512,
		PageBytes: []int{2048, 1024}, ReplicatedBytes: []int{0, 256}, Chunk: 3*T + 5}
	reqs := prompts(11, 12, T, "tp")

	cfg.Name = "cold"
	cold, err := enginesim.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cold.Run(ctx, reqs, 4); err != nil {
		t.Fatal(err)
	}
	if err := cold.Close(ctx); err != nil {
		t.Fatal(err)
	}

	cfg.Name, cfg.AsyncLoad, cfg.AsyncLoadWorkers = "warm", true, 2
	warm, err := enginesim.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := warm.Run(ctx, reqs, 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Close(ctx); err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, q := range reqs {
		want += (len(q.Tokens) - 1) / T
	}
	if res.Parked != len(reqs) || res.LoadedBlocks != want || res.Restarts != 0 {
		t.Fatalf("warm async run: %+v, want %d parked requests and %d loaded blocks", res, len(reqs), want)
	}

	// A parked load on rank 1 finds its pages gone: rank 1 fails with the fatal error, since a
	// tensor-parallel rank cannot restart a request alone.
	mc, err := mooncake.NewAdminClient("http://"+r.Info.AdminAddr, nil)
	if err != nil {
		t.Fatal(err)
	}
	removed := 0
	cfg.Name = "fatal"
	cfg.AfterBuild = func(meta *enginepb.Metadata) {
		if len(meta.GetAsyncLoads()) == 0 || removed > 0 {
			return
		}
		keys, err := mc.AllKeys(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		for _, k := range keys {
			if strings.Contains(k, "/w2r1/") {
				if code := r.Daemon.Pool().Remove(ctx, k, true); code != pool.OK {
					t.Errorf("remove %s: %v", k, code)
				}
				removed++
			}
		}
	}
	fatal, err := enginesim.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer fatal.Close(ctx)
	_, err = fatal.Run(ctx, reqs[:1], 1)
	if removed == 0 {
		t.Fatal("no rank-1 shard was removed")
	}
	if status.Code(err) != codes.DataLoss || !strings.Contains(err.Error(), "already reported as computed") || !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("run with rank 1's pages gone = %v, want DataLoss naming rank 1 and the already-reported-as-computed error", err)
	}
}
