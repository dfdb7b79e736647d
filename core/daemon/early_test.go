package daemon_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/core/statsapi"
)

// Early loads (engine API 1.4) through kvctl serve: engines registered with early_loads, one
// loading synchronously and one parking its hits, restore every page with the right bytes (the
// simulated engine checks each); over the wire, BuildMeta names a synchronous hit in
// early_loads instead of carrying its transfer, BindMeta refuses an id with no early load in
// flight, and Register refuses early_loads where the allocation report cannot start a load.
func TestEarlyLoadsThroughServe(t *testing.T) {
	r := start(t, 256<<20)
	ctx := context.Background()
	const T = 16
	cfg := enginesim.Config{Socket: r.Info.Socket, ModelKey: "early", TokensPerBlock: T, Slots: 160, PageBytes: []int{64 << 10}, Chunk: 3*T + 5}
	reqs := prompts(31, 8, T, "early")
	cfg.Name = "cold"
	runEngine(t, cfg, reqs)

	for _, async := range []bool{false, true} {
		c := cfg
		c.Name, c.EarlyLoads, c.AdmitPerPass = "warm-sync", true, 2
		if async {
			c.Name, c.AsyncLoad, c.AsyncLoadWorkers = "warm-async", true, 1
		}
		res := runEngine(t, c, reqs)
		parked := 0
		if async {
			parked = len(reqs)
		}
		if want := fullBlocks(reqs, T); res.LoadedBlocks != want || res.Restarts != 0 || res.Parked != parked {
			t.Fatalf("%s: %+v, want %d loaded blocks, %d parked, no restarts", c.Name, res, want, parked)
		}
	}

	c := cfg
	c.Name, c.EarlyLoads = "raw", true
	e, err := enginesim.Start(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	own, engine := e.Client(0), "raw/rank0"
	toks := reqs[0].Tokens
	lr, err := own.Lookup(ctx, &enginepb.LookupRequest{Engine: engine, Request: &enginepb.Request{Id: "q", Tokens: toks}})
	if err != nil {
		t.Fatal(err)
	}
	matched := int(lr.GetMatchedTokens())
	if want := (len(toks) - 1) / T * T; matched != want || lr.GetAsync() {
		t.Fatalf("lookup matched %d tokens (async %t), want %d synchronously", matched, lr.GetAsync(), want)
	}
	blocks := (len(toks) + T - 1) / T
	ids := make([]int32, blocks)
	for b := range ids {
		ids[b] = int32(100 + b)
	}
	pages := []*enginepb.BlockIDs{{Ids: ids}}
	if _, err := own.UpdateStateAfterAlloc(ctx, &enginepb.AllocRequest{Engine: engine, RequestId: "q", BlockIdsByGroup: pages, HonouredTokens: int32(matched)}); err != nil {
		t.Fatal(err)
	}
	meta, err := own.BuildMeta(ctx, &enginepb.BuildMetaRequest{Engine: engine, NewRequests: []*enginepb.RequestData{{
		Id: "q", NewBlockIdsByGroup: pages, NumScheduledTokens: int32(len(toks) - matched)}}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(meta.GetEarlyLoads(), []string{"q"}) || len(meta.GetLoads()) != 0 {
		t.Fatalf("BuildMeta after an early load: early_loads %v, %d loads; want [q] and none", meta.GetEarlyLoads(), len(meta.GetLoads()))
	}
	_, err = own.BindMeta(ctx, &enginepb.BindMetaRequest{Engine: engine, Metadata: &enginepb.Metadata{EarlyLoads: []string{"ghost"}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `"ghost"`) {
		t.Fatalf("BindMeta naming an early load that does not exist = %v, want InvalidArgument naming it", err)
	}
	if _, err := own.BindMeta(ctx, &enginepb.BindMetaRequest{Engine: engine, Metadata: meta}); err != nil {
		t.Fatal(err)
	}
	if _, err := own.StartLoad(ctx, &enginepb.EngineRef{Engine: engine}); err != nil {
		t.Fatal(err)
	}
	if failed, err := own.TakeFailedLoads(ctx, &enginepb.EngineRef{Engine: engine}); err != nil || len(failed.GetIds()) != 0 {
		t.Fatalf("TakeFailedLoads = %v, %v; want none", failed, err)
	}
	if _, err := own.RequestFinished(ctx, &enginepb.RequestRef{Engine: engine, RequestId: "q"}); err != nil {
		t.Fatal(err)
	}

	// An engine that vanishes with early loads in flight (reported, never bound) is released,
	// and the daemon goes on serving: a fresh engine loads every page.
	v := cfg
	v.Name, v.EarlyLoads = "vanish", true
	ve, err := enginesim.Start(ctx, v)
	if err != nil {
		t.Fatal(err)
	}
	vown, vname := ve.Client(0), "vanish/rank0"
	for i, q := range reqs[:4] {
		id := fmt.Sprint("v", i)
		lr, err := vown.Lookup(ctx, &enginepb.LookupRequest{Engine: vname, Request: &enginepb.Request{Id: id, Tokens: q.Tokens}})
		if err != nil {
			t.Fatal(err)
		}
		ids := make([]int32, (len(q.Tokens)+T-1)/T)
		for b := range ids {
			ids[b] = int32(20*i + b)
		}
		if _, err := vown.UpdateStateAfterAlloc(ctx, &enginepb.AllocRequest{Engine: vname, RequestId: id,
			BlockIdsByGroup: []*enginepb.BlockIDs{{Ids: ids}}, HonouredTokens: lr.GetMatchedTokens()}); err != nil {
			t.Fatal(err)
		}
	}
	ve.Abandon()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var st statsapi.StatsJSON
		getJSON(t, "http://"+r.Info.AdminAddr+"/v1/stats", &st)
		gone := true
		for _, en := range st.Engines {
			gone = gone && en.Engine != vname
		}
		if gone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the engine that vanished with early loads in flight is still registered")
		}
		time.Sleep(10 * time.Millisecond)
	}
	after := cfg
	after.Name, after.EarlyLoads = "after-vanish", true
	if res := runEngine(t, after, renamed(reqs, "after")); res.LoadedBlocks != fullBlocks(reqs, T) || res.Restarts != 0 {
		t.Fatalf("an engine after one vanished with early loads in flight: %+v", res)
	}

	raw, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	layout := &enginepb.Layout{TokensPerBlock: T, Groups: []*enginepb.LayerGroup{{Slots: 1, Regions: []*enginepb.Region{{Size: 8, Stride: 8}}}}}
	for _, tc := range []struct {
		name string
		req  *enginepb.RegisterRequest
		want string
	}{
		{"tensor-parallel", &enginepb.RegisterRequest{WorldSize: 2, Scheduler: true}, "early_loads: needs a single rank"},
		{"attention-dp", &enginepb.RegisterRequest{WorldSize: 2, AttentionDp: true, Scheduler: true}, "early_loads: needs a single rank"},
		{"no scheduler", &enginepb.RegisterRequest{}, "only the rank that registers the scheduler"},
		{"producer", &enginepb.RegisterRequest{Scheduler: true, Role: "producer"}, "role producer makes no loads"},
	} {
		tc.req.Engine, tc.req.ModelKey, tc.req.Layout, tc.req.EarlyLoads = "refused-"+tc.name, "m", layout, true
		_, err := raw.Register(ctx, tc.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Register with early_loads = %v, want InvalidArgument containing %q", tc.name, err, tc.want)
		}
	}
}
