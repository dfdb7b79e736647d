package daemon_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/enginesim"
)

// GetFinished's wait_ms through kvctl serve: an engine that parks every pool hit and, with
// nothing else to run, waits in GetFinished instead of polling gets every request back loaded
// (every restored byte checked); a wait past the limit is refused with InvalidArgument naming
// wait_ms and the limit, and the engine goes on; a wait with nothing in flight answers at once
// with nothing. Half-MiB pages make loads long enough that the engine usually waits while one is
// in flight (not always: whether it does depends on the scheduling); the wait itself is
// connector.TestGetFinishedWait's.
func TestGetFinishedWaitThroughServe(t *testing.T) {
	r := start(t, 256<<20)
	ctx := context.Background()
	const T = 16
	cfg := enginesim.Config{Socket: r.Info.Socket, ModelKey: "wait", TokensPerBlock: T, Slots: 160, PageBytes: []int{512 << 10}, Chunk: 3*T + 5}
	reqs := prompts(21, 12, T, "wait")

	cfg.Name = "cold"
	runEngine(t, cfg, reqs)

	cfg.Name, cfg.AsyncLoad, cfg.AsyncLoadWorkers, cfg.AdmitPerPass, cfg.FinishedWait = "warm", true, 1, 2, 500*time.Millisecond
	warm, err := enginesim.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer warm.Close(ctx)
	res, err := warm.Run(ctx, reqs, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := fullBlocks(reqs, T); res.Parked != len(reqs) || res.LoadedBlocks != want || res.Restarts != 0 {
		t.Fatalf("warm run waiting in GetFinished: %+v, want %d parked requests and %d loaded blocks", res, len(reqs), want)
	}

	own, engine := warm.Client(0), "warm/rank0"
	_, err = own.GetFinished(ctx, &enginepb.GetFinishedRequest{Engine: engine, WaitMs: 1001})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "wait_ms 1001 is above the limit of 1000") {
		t.Fatalf("GetFinished with wait_ms 1001 = %v, want InvalidArgument naming wait_ms and the limit", err)
	}
	// Nothing in flight: answered with nothing, and not after the whole second it may wait.
	began := time.Now()
	resp, err := own.GetFinished(ctx, &enginepb.GetFinishedRequest{Engine: engine, WaitMs: 1000})
	if err != nil || len(resp.GetFinishedLoading())+len(resp.GetFinishedSaving()) != 0 {
		t.Fatalf("GetFinished with nothing in flight = %v, %v; want nothing reported", resp, err)
	}
	if took := time.Since(began); took >= time.Second {
		t.Fatalf("GetFinished with nothing in flight waited %v", took)
	}
	// The refused call left the engine usable.
	if _, err := warm.Run(ctx, prompts(22, 3, T, "after"), 0); err != nil {
		t.Fatalf("the engine after a refused wait: %v", err)
	}
}
