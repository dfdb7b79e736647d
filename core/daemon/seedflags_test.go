package daemon_test

import (
	"context"
	"testing"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/daemon/daemontest"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/mooncake"
)

// Seed commit 3 over the engine API: AllocRequest and RequestRef carry the dummy flag, and a
// real `kvctl serve` skips a dummy because of it. A dummy that carries a live request's id
// neither settles that request's offer nor reports or drops its saves.
func TestDummyFlagOverTheEngineAPI(t *testing.T) {
	popts := mooncake.DefaultOptions()
	popts.Segments = []mooncake.SegmentSpec{{Name: "test", Capacity: 64 << 20}}
	r := daemontest.Start(t, daemon.Config{Pool: popts, Defaults: connector.Options{StagingBufferBytes: 8 << 20}})
	ctx := context.Background()
	e, err := enginesim.Start(ctx, enginesim.Config{Socket: r.Info.Socket, ModelKey: "m", Name: "dummies", Slots: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	c, engine := e.Client(0), "dummies/rank0"
	const T = 16
	toks := make([]int64, 4*T+3)
	for i := range toks {
		toks[i] = int64(1000 + i)
	}
	if _, err := c.Lookup(ctx, &enginepb.LookupRequest{Engine: engine, Request: &enginepb.Request{Id: "r", Tokens: toks}}); err != nil {
		t.Fatal(err)
	}
	// The request has no offer, so honouring a block is refused for it; a dummy of its id is
	// skipped whatever it honours.
	alloc := &enginepb.AllocRequest{Engine: engine, RequestId: "r", HonouredTokens: T, Dummy: true}
	if _, err := c.UpdateStateAfterAlloc(ctx, alloc); err != nil {
		t.Fatalf("a dummy allocation report reached the real request: %v", err)
	}
	alloc.Dummy = false
	if _, err := c.UpdateStateAfterAlloc(ctx, alloc); err == nil {
		t.Fatal("the same report without the dummy flag was accepted")
	}
	// Schedule the whole prompt: its four whole blocks are saved.
	pages := []int32{0, 1, 2, 3, 4}
	meta, err := c.BuildMeta(ctx, &enginepb.BuildMetaRequest{Engine: engine, NewRequests: []*enginepb.RequestData{{
		Id: "r", NewBlockIdsByGroup: []*enginepb.BlockIDs{{Ids: pages}}, NumScheduledTokens: int32(len(toks)),
	}}})
	if err != nil || len(meta.GetSaves()) != 1 || len(meta.GetSaves()[0].GetPages()) != 4 {
		t.Fatalf("build = %v, %v; want one request saving 4 pages", meta, err)
	}
	if _, err := c.RequestReset(ctx, &enginepb.RequestRef{Engine: engine, RequestId: "r", Dummy: true}); err != nil {
		t.Fatal(err)
	}
	fin, err := c.RequestFinished(ctx, &enginepb.RequestRef{Engine: engine, RequestId: "r", Dummy: true})
	if err != nil || fin.GetAsyncSaving() {
		t.Fatalf("a dummy's finish = %v, %v; want no saves reported", fin, err)
	}
	fin, err = c.RequestFinished(ctx, &enginepb.RequestRef{Engine: engine, RequestId: "r"})
	if err != nil || !fin.GetAsyncSaving() {
		t.Fatalf("the real finish after a dummy's reset and finish = %v, %v; want its saves reported", fin, err)
	}
}
