package daemon_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/daemon/daemontest"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/pool/embedded"
)

// Seed commit 3 over the engine API: AllocRequest and RequestRef carry the dummy flag, and a
// real `kvctl serve` skips a dummy because of it. A dummy that carries a live request's id
// neither settles that request's offer nor reports or drops its saves.
func TestDummyFlagOverTheEngineAPI(t *testing.T) {
	popts := embedded.DefaultOptions()
	popts.Segments = []embedded.SegmentSpec{{Name: "test", Capacity: 64 << 20}}
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

// Seed commits 5 and 14 in `kvctl serve`: Register carries the drafter kind, and speculative
// prefill with a drafter TensorRT-LLM refuses is refused with InvalidArgument naming it, by the
// allow-list validate-config applies (config.CheckSpeculativePrefillDrafter), whatever the
// role. One-model MTP and EAGLE3 register; so does an engine that states no drafter (written
// before the field), and a drafter without speculative prefill is not checked.
func TestRegisterRefusesADrafterOutsideTheAllowList(t *testing.T) {
	r := start(t, 16<<20)
	c, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	layout := &enginepb.Layout{TokensPerBlock: 16, Groups: []*enginepb.LayerGroup{{Id: 0, Slots: 4, Regions: []*enginepb.Region{{Offset: 0, Stride: 64, Size: 64}}}}}
	for i, tc := range []struct {
		role, drafter string
		spec, ok      bool
	}{
		{"both", "eagle3-two-model", true, false},
		{"consumer", "ngram", true, false},
		{"producer", "draft_target", true, false},
		{"capacity", "mtp-two-model", true, false},
		{"capacity", "eagle3", true, true},
		{"capacity", "mtp", true, true},
		{"capacity", "", true, true},
		{"capacity", "ngram", false, true},
		{"both", strings.Repeat("x", 4096), true, false},
	} {
		name := fmt.Sprintf("drafter-%d", i)
		_, err := c.Register(ctx, &enginepb.RegisterRequest{Engine: name, ModelKey: "m", WorldSize: 1, Role: tc.role, Scheduler: true,
			Layout: layout, SpeculativePrefill: tc.spec, Drafter: tc.drafter})
		if tc.ok {
			if err != nil {
				t.Errorf("%s role with drafter %q (speculative prefill %v) was refused: %v", tc.role, tc.drafter, tc.spec, err)
			}
			continue
		}
		named := strconv.Quote(tc.drafter)
		if len(tc.drafter) > 64 {
			// A name longer than any drafter's is described by its length, not echoed.
			named = fmt.Sprintf("a drafter name of %d bytes", len(tc.drafter))
		}
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "one-model MTP or EAGLE3") || !strings.Contains(err.Error(), named) || len(err.Error()) > 512 {
			t.Errorf("%s role with drafter %q: %v; want InvalidArgument naming the drafter and the allow-list", tc.role, tc.drafter, err)
		}
	}
}

// Seed commit 16 through `kvctl serve`: with stats_interval longer than the run, an engine's
// lookups log no prefix-hole line while it runs, and its unregistration flushes the line once
// with its totals (the load line too), under the engine's name.
func TestStatsLinesFlushedWhenAnEngineLeaves(t *testing.T) {
	var logs syncBuffer
	popts := embedded.DefaultOptions()
	popts.Segments = []embedded.SegmentSpec{{Name: "test", Capacity: 64 << 20}}
	r := daemontest.Start(t, daemon.Config{Pool: popts, Defaults: connector.Options{StagingBufferBytes: 8 << 20, StatsInterval: time.Hour},
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := context.Background()
	e, err := enginesim.Start(ctx, enginesim.Config{Socket: r.Info.Socket, ModelKey: "m", Name: "holes", Slots: 512})
	if err != nil {
		t.Fatal(err)
	}
	reqs := prompts(21, 6, 16, "h")
	if _, err := e.Run(ctx, reqs, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Run(ctx, prompts(21, 6, 16, "again"), 2); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), `msg="prefix-hole stats"`) {
		t.Fatalf("a prefix-hole line was logged before the interval:\n%s", logs.String())
	}
	if err := e.Close(ctx); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if n := strings.Count(out, `msg="prefix-hole stats"`); n != 1 {
		t.Fatalf("%d prefix-hole lines after the engine left, want 1:\n%s", n, out)
	}
	line := out[strings.Index(out, `msg="prefix-hole stats"`):]
	line = line[:strings.IndexByte(line, '\n')]
	if !strings.Contains(line, "engine=holes/rank0") || !strings.Contains(line, "lookups=12 ") {
		t.Fatalf("the flushed line %q does not carry the engine and its 12 lookups", line)
	}
	if n := strings.Count(out, `msg="load stats"`); n != 1 {
		t.Fatalf("%d load lines after the engine left, want 1:\n%s", n, out)
	}
}
