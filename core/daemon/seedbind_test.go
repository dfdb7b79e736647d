package daemon_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/hostmem"
	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
)

const bindT = 16 // tokens per block in these tests

// bindLayout is one layer group of 64 slots of 256-byte pages.
func bindLayout() (kvmem.Layout, int64) {
	return kvmem.Layout{TokensPerBlock: bindT, Groups: []kvmem.GroupLayout{
		{ID: 0, Slots: 64, Regions: []kvmem.Region{{Offset: 0, Stride: 256, Size: 256}}},
	}}, 64 * 256
}

// registerRank registers one rank in shared memory over c and returns it as a connector.Rank.
func registerRank(t *testing.T, c *engineapi.Client, req *enginepb.RegisterRequest) *engineapi.RemoteRank {
	t.Helper()
	layout, size := bindLayout()
	mem, err := hostmem.NewSharedMemory(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mem.Close() })
	req.ModelKey, req.Format, req.Layout = "bind", string(keys.FormatTRTLLM), engineapi.LayoutToPB(layout)
	if req.Role == "" {
		req.Role = string(connector.RoleBoth)
	}
	resp, err := c.RegisterSharedMemory(context.Background(), req, mem.FD, uint64(size))
	if err != nil {
		t.Fatalf("register %s: %v", req.GetEngine(), err)
	}
	t.Cleanup(func() { _, _ = c.Unregister(context.Background(), &enginepb.EngineRef{Engine: req.GetEngine()}) })
	return engineapi.NewRemoteRank(c, resp, connector.Role(req.GetRole()))
}

// bindPrompt is four whole blocks and three tokens.
func bindPrompt() []int64 {
	toks := make([]int64, 4*bindT+3)
	for i := range toks {
		toks[i] = int64(7000 + i)
	}
	return toks
}

func slotsFor(n int) [][]int {
	out := []int{}
	for i := range n {
		out = append(out, i)
	}
	return [][]int{out}
}

// Seed commit 17 over the engine API: binding never fails for the metadata the scheduler
// builds; what a rank cannot queue is kept for its next StartLoad and GetFinished. A
// tensor-parallel deployment of two ranks whose scheduler rank registered with async_load and
// whose rank 1 did not: the scheduler's metadata parks a pool hit, both ranks bind it (rank 1
// too, and again after it kept the error), rank 1's StartLoad and GetFinished then fail with
// FAILED_PRECONDITION naming the request and the reason, and rank 0 loads its shard.
func TestBindMetaNeverFailsOverTheEngineAPI(t *testing.T) {
	r := start(t, 64<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	toks := bindPrompt()

	// A cold run of the same deployment saves the prompt's four blocks, a shard per rank.
	cold := []connector.Rank{
		registerRank(t, c, &enginepb.RegisterRequest{Engine: "bind-cold/rank0", WorldSize: 2, Rank: 0, Scheduler: true}),
		registerRank(t, c, &enginepb.RegisterRequest{Engine: "bind-cold/rank1", WorldSize: 2, Rank: 1}),
	}
	drv, err := connector.NewDriver(cold, connector.DriverOptions{TokensPerBlock: bindT, Hooks: connector.DriverHooks{
		Allocate: func(_ context.Context, d *connector.DrivenRequest, matched int, _ bool) (int, error) {
			d.Pages = slotsFor(5)
			return matched, nil
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	drv.Add(connector.Request{ID: "cold", Tokens: toks, ContextOnly: true})
	for drv.Pending() > 0 {
		if err := drv.Step(ctx); err != nil {
			t.Fatal(err)
		}
		if !drv.Busy() {
			time.Sleep(time.Millisecond)
		}
	}

	sched := registerRank(t, c, &enginepb.RegisterRequest{Engine: "bind/rank0", WorldSize: 2, Rank: 0, Scheduler: true, AsyncLoad: true, AsyncLoadWorkers: 1})
	other := registerRank(t, c, &enginepb.RegisterRequest{Engine: "bind/rank1", WorldSize: 2, Rank: 1})
	m, async, err := sched.Lookup(ctx, connector.Request{ID: "r", Tokens: toks, ContextOnly: true}, 0)
	if err != nil || m != 4*bindT || !async {
		t.Fatalf("lookup = %d, %v, %v; want the 4 cached blocks, asynchronously", m, async, err)
	}
	if err := sched.UpdateStateAfterAlloc(ctx, "r", slotsFor(5), m); err != nil {
		t.Fatal(err)
	}
	meta, err := sched.BuildMeta(ctx, connector.SchedulerOutput{NewRequests: []connector.RequestData{{ID: "r", NewBlockIDsByGroup: slotsFor(5)}}})
	if err != nil || len(meta.AsyncLoads) != 1 || len(meta.AsyncLoads[0].Pages) != 4 {
		t.Fatalf("metadata %+v, %v; want r's transfer of 4 pages", meta, err)
	}
	for _, rk := range []connector.Rank{sched, other} {
		if err := rk.BindMeta(ctx, meta); err != nil {
			t.Fatalf("%s: binding the scheduler's metadata failed: %v", rk.Name(), err)
		}
	}
	const reason = "request r: asynchronous load queued but this worker has no load workers"
	kept := func(call string, err error) {
		t.Helper()
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), reason) {
			t.Fatalf("rank 1's %s = %v, want FAILED_PRECONDITION containing %q", call, err, reason)
		}
	}
	kept("StartLoad", other.StartLoad(ctx))
	_, _, err = other.GetFinished(ctx, nil, []string{"r"})
	kept("GetFinished", err)
	if err := other.BindMeta(ctx, meta); err != nil {
		t.Fatalf("binding again after rank 1 kept its error failed: %v", err)
	}
	kept("StartLoad after binding again", other.StartLoad(ctx))

	// Rank 0 loads its shard and reports r once it is announced.
	if err := sched.StartLoad(ctx); err != nil {
		t.Fatal(err)
	}
	announce := []string{"r"}
	for {
		_, loaded, err := sched.GetFinished(ctx, nil, announce)
		if err != nil {
			t.Fatal(err)
		}
		announce = nil
		failed, err := sched.TakeFailedAsyncLoadRequests(ctx)
		if err != nil || len(failed) != 0 {
			t.Fatalf("rank 0's failed loads %v, %v", failed, err)
		}
		if slices.Contains(loaded, "r") {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("rank 0 never finished r's load")
		}
		time.Sleep(time.Millisecond)
	}
}

// Seed commit 5 over the engine API: on a speculative-prefill rank a request that is not
// context-only is refused at lookup with FAILED_PRECONDITION naming it, and again by BuildMeta
// (the backstop for a request that skipped the lookup) before any state is recorded; a
// context-only request is looked up and built.
func TestNotContextOnlyIsFailedPreconditionOverTheEngineAPI(t *testing.T) {
	r := start(t, 16<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rk := registerRank(t, c, &enginepb.RegisterRequest{Engine: "spec/rank0", WorldSize: 1, Scheduler: true,
		SpeculativePrefill: true, Drafter: "mtp", PromptLookahead: 1})
	toks := bindPrompt()
	notContextOnly := func(call string, err error, id string) {
		t.Helper()
		want := connector.ErrNotContextOnly.Error()
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "request "+id) {
			t.Fatalf("%s = %v, want FAILED_PRECONDITION naming request %s and %q", call, err, id, want)
		}
	}
	_, _, err = rk.Lookup(ctx, connector.Request{ID: "gen", Tokens: toks}, 0)
	notContextOnly("Lookup of a request that is not context-only", err, "gen")
	_, err = rk.BuildMeta(ctx, connector.SchedulerOutput{NewRequests: []connector.RequestData{{ID: "gen", NewBlockIDsByGroup: slotsFor(5), NumScheduledTokens: len(toks)}}})
	notContextOnly("BuildMeta of the refused request", err, "gen")

	if _, _, err := rk.Lookup(ctx, connector.Request{ID: "ctx", Tokens: toks, ContextOnly: true}, 0); err != nil {
		t.Fatalf("a context-only lookup failed: %v", err)
	}
	meta, err := rk.BuildMeta(ctx, connector.SchedulerOutput{NewRequests: []connector.RequestData{{ID: "ctx", NewBlockIDsByGroup: slotsFor(5), NumScheduledTokens: len(toks)}}})
	if err != nil || len(meta.Saves) != 1 {
		t.Fatalf("a context-only request's build = %+v, %v; want its saves", meta, err)
	}
}
