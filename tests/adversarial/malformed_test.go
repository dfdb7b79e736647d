package adversarial

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// TestMalformedCalls sends malformed calls of the engine API methods to a registered engine.
// Each must be refused with a client-side code (InvalidArgument, NotFound, FailedPrecondition,
// PermissionDenied, AlreadyExists, ResourceExhausted) and a message, never Internal or Unknown,
// and the daemon must keep serving.
func TestMalformedCalls(t *testing.T) {
	p := startServe(t, serveOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := engineapi.Dial(p.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	registerShm(t, ctx, c, "e", "m", "", 8)
	h16 := make([]byte, 16)
	page := func(g, pg int32, h []byte) []*enginepb.RequestTransfers {
		return []*enginepb.RequestTransfers{{RequestId: "r", Pages: []*enginepb.PageTransfer{{Hash: h, Group: g, Page: pg}}}}
	}
	lookup := func(r *enginepb.Request, computed int32) func() error {
		return func() error {
			_, err := c.Lookup(ctx, &enginepb.LookupRequest{Engine: "e", Request: r, NumComputedTokens: computed})
			return err
		}
	}
	bind := func(m *enginepb.Metadata) func() error {
		return func() error {
			_, err := c.BindMeta(ctx, &enginepb.BindMetaRequest{Engine: "e", Metadata: m})
			return err
		}
	}
	alloc := func(id string, ids []*enginepb.BlockIDs, honoured int32) func() error {
		return func() error {
			_, err := c.UpdateStateAfterAlloc(ctx, &enginepb.AllocRequest{Engine: "e", RequestId: id, BlockIdsByGroup: ids, HonouredTokens: honoured})
			return err
		}
	}
	build := func(req *enginepb.BuildMetaRequest) func() error {
		return func() error { req.Engine = "e"; _, err := c.BuildMeta(ctx, req); return err }
	}
	reg := func(r *enginepb.RegisterRequest) func() error {
		return func() error { _, err := c.Register(ctx, r); return err }
	}
	layout := smallLayout(8)
	toks := make([]int64, 64)
	cases := map[string]func() error{
		"register: no engine name":            reg(&enginepb.RegisterRequest{ModelKey: "m", Layout: layout}),
		"register: no layout":                 reg(&enginepb.RegisterRequest{Engine: "x1", ModelKey: "m"}),
		"register: no model key":              reg(&enginepb.RegisterRequest{Engine: "x2", Layout: layout}),
		"register: no groups":                 reg(&enginepb.RegisterRequest{Engine: "x3", ModelKey: "m", Layout: &enginepb.Layout{TokensPerBlock: 16}}),
		"register: zero tokens per block":     reg(&enginepb.RegisterRequest{Engine: "x4", ModelKey: "m", Layout: &enginepb.Layout{Groups: layout.Groups}}),
		"register: negative tokens per block": reg(&enginepb.RegisterRequest{Engine: "x5", ModelKey: "m", Layout: &enginepb.Layout{TokensPerBlock: -16, Groups: layout.Groups}}),
		"register: unknown role":              reg(&enginepb.RegisterRequest{Engine: "x6", ModelKey: "m", Role: "admin", Layout: layout}),
		"register: unknown format":            reg(&enginepb.RegisterRequest{Engine: "x7", ModelKey: "m", Format: "md5", Layout: layout}),
		"register: no memory":                 reg(&enginepb.RegisterRequest{Engine: "x8", ModelKey: "m", Layout: layout}),
		"register: bogus token":               reg(&enginepb.RegisterRequest{Engine: "x9", ModelKey: "m", Layout: layout, Memory: &enginepb.RegisterRequest_SharedMemory{SharedMemory: &enginepb.SharedMemory{FdToken: "zz", Size: 512}}}),
		"register: token of the right length": reg(&enginepb.RegisterRequest{Engine: "x10", ModelKey: "m", Layout: layout, Memory: &enginepb.RegisterRequest_SharedMemory{SharedMemory: &enginepb.SharedMemory{FdToken: strings.Repeat("0", 32), Size: 512}}}),
		"register: CUDA IPC without a GPU":    reg(&enginepb.RegisterRequest{Engine: "x11", ModelKey: "m", Layout: layout, Memory: &enginepb.RegisterRequest_CudaIpc{CudaIpc: &enginepb.CudaIPC{Handle: make([]byte, 64), Size: 512}}}),
		"register: CUDA IPC short handle":     reg(&enginepb.RegisterRequest{Engine: "x12", ModelKey: "m", Layout: layout, Memory: &enginepb.RegisterRequest_CudaIpc{CudaIpc: &enginepb.CudaIPC{Handle: []byte{1}, Size: 512}}}),
		"register: duplicate name":            reg(&enginepb.RegisterRequest{Engine: "e", ModelKey: "m", Role: "capacity", Layout: layout}),
		"register: dense ids violated":        reg(&enginepb.RegisterRequest{Engine: "x13", ModelKey: "m", Role: "capacity", Layout: &enginepb.Layout{TokensPerBlock: 16, Groups: []*enginepb.LayerGroup{{Id: 5, Slots: 1, Regions: layout.Groups[0].Regions}}}}),
		"register: zero slots":                reg(&enginepb.RegisterRequest{Engine: "x14", ModelKey: "m", Role: "capacity", Layout: &enginepb.Layout{TokensPerBlock: 16, Groups: []*enginepb.LayerGroup{{Slots: 0, Regions: layout.Groups[0].Regions}}}}),
		"register: negative slots":            reg(&enginepb.RegisterRequest{Engine: "x15", ModelKey: "m", Role: "capacity", Layout: &enginepb.Layout{TokensPerBlock: 16, Groups: []*enginepb.LayerGroup{{Slots: -4, Regions: layout.Groups[0].Regions}}}}),
		"register: region overflow":           reg(&enginepb.RegisterRequest{Engine: "x16", ModelKey: "m", Layout: &enginepb.Layout{TokensPerBlock: 16, Groups: []*enginepb.LayerGroup{{Slots: 8, Regions: []*enginepb.Region{{Offset: 1<<64 - 8, Size: 64, Stride: 64}}}}}}),
		"register: zero-size region":          reg(&enginepb.RegisterRequest{Engine: "x17", ModelKey: "m", Role: "capacity", Layout: &enginepb.Layout{TokensPerBlock: 16, Groups: []*enginepb.LayerGroup{{Slots: 2, Regions: []*enginepb.Region{{Size: 0, Stride: 8}}}}}}),
		"register: overlapping slots":         reg(&enginepb.RegisterRequest{Engine: "x18", ModelKey: "m", Role: "capacity", Layout: &enginepb.Layout{TokensPerBlock: 16, Groups: []*enginepb.LayerGroup{{Slots: 2, Regions: []*enginepb.Region{{Size: 64, Stride: 8}}}}}}),
		"register: staging of 2 TiB":          reg(&enginepb.RegisterRequest{Engine: "x19", ModelKey: "m", Role: "capacity", Layout: layout, StagingBufferBytes: 2 << 40}),
		"register: unknown reuse backoff":     reg(&enginepb.RegisterRequest{Engine: "x20", ModelKey: "m", Role: "capacity", Layout: layout, LocalReuseBackoff: "sometimes"}),
		"lookup: unknown engine": func() error {
			_, err := c.Lookup(ctx, &enginepb.LookupRequest{Engine: "nobody", Request: &enginepb.Request{Id: "r"}})
			return err
		},
		"lookup: no engine": func() error {
			_, err := c.Lookup(ctx, &enginepb.LookupRequest{Request: &enginepb.Request{Id: "r"}})
			return err
		},
		"lookup: no request":               lookup(nil, 0),
		"lookup: empty request id":         lookup(&enginepb.Request{Tokens: toks}, 0),
		"lookup: negative computed":        lookup(&enginepb.Request{Id: "r", Tokens: toks}, -16),
		"lookup: computed past the prompt": lookup(&enginepb.Request{Id: "r2", Tokens: toks}, 1000),
		"lookup: short multimodal digest":  lookup(&enginepb.Request{Id: "r3", Tokens: toks, MultimodalDigests: [][]byte{{1}}}, 0),
		"lookup: tokens shrank": func() error {
			_ = lookup(&enginepb.Request{Id: "r4", Tokens: toks}, 0)()
			return lookup(&enginepb.Request{Id: "r4", Tokens: toks[:16]}, 0)()
		},
		"cancel load: unknown request": func() error {
			_, err := c.CancelLoad(ctx, &enginepb.CancelLoadRequest{Engine: "e", RequestId: "nope", Start: 0, End: 16})
			return err
		},
		"cancel load: inverted range": func() error {
			_, err := c.CancelLoad(ctx, &enginepb.CancelLoadRequest{Engine: "e", RequestId: "r4", Start: 32, End: 0})
			return err
		},
		"alloc: unknown request":               alloc("nope", nil, 0),
		"alloc: negative honoured":             alloc("r4", []*enginepb.BlockIDs{{Ids: []int32{0}}}, -1),
		"alloc: negative block id":             alloc("r4", []*enginepb.BlockIDs{{Ids: []int32{-1}}}, 0),
		"alloc: block id past the slots":       alloc("r4", []*enginepb.BlockIDs{{Ids: []int32{100}}}, 0),
		"alloc: too many groups":               alloc("r4", []*enginepb.BlockIDs{{Ids: []int32{0}}, {Ids: []int32{1}}, {Ids: []int32{2}}}, 0),
		"build meta: request without id":       build(&enginepb.BuildMetaRequest{NewRequests: []*enginepb.RequestData{{NewTokens: toks}}}),
		"build meta: block id past the slots":  build(&enginepb.BuildMetaRequest{NewRequests: []*enginepb.RequestData{{Id: "b1", NewTokens: toks, NewBlockIdsByGroup: []*enginepb.BlockIDs{{Ids: []int32{1 << 20}}}, NumScheduledTokens: 64}}}),
		"build meta: negative scheduled":       build(&enginepb.BuildMetaRequest{NewRequests: []*enginepb.RequestData{{Id: "b2", NewTokens: toks, NumScheduledTokens: -5}}}),
		"build meta: computed past the tokens": build(&enginepb.BuildMetaRequest{CachedRequests: []*enginepb.RequestData{{Id: "b3", ComputedPosition: 1 << 30}}}),
		"build meta: 3M tokens":                build(&enginepb.BuildMetaRequest{NewRequests: []*enginepb.RequestData{{Id: "b4", NewTokens: make([]int64, 3<<20)}}}),
		"bind meta: short hash":                bind(&enginepb.Metadata{Loads: page(0, 0, []byte{1})}),
		"bind meta: page past the slots":       bind(&enginepb.Metadata{Loads: page(0, 8, h16)}),
		"bind meta: negative page":             bind(&enginepb.Metadata{Saves: page(0, -1, h16)}),
		"bind meta: group past the layout":     bind(&enginepb.Metadata{AsyncLoads: page(3, 0, h16)}),
		"bind meta: hash never offered":        bind(&enginepb.Metadata{Loads: page(0, 0, h16)}),
		"get finished: unknown engine":         func() error { _, err := c.GetFinished(ctx, &enginepb.GetFinishedRequest{Engine: "nobody"}); return err },
		"request finished: unknown engine": func() error {
			_, err := c.RequestFinished(ctx, &enginepb.RequestRef{Engine: "nobody", RequestId: "r"})
			return err
		},
		"unregister: unknown engine":              func() error { _, err := c.Unregister(ctx, &enginepb.EngineRef{Engine: "nobody"}); return err },
		"unregister: no engine":                   func() error { _, err := c.Unregister(ctx, &enginepb.EngineRef{}); return err },
		"drop bound saves: unknown engine":        func() error { _, err := c.DropBoundSaves(ctx, &enginepb.DropRequest{Engine: "nobody"}); return err },
		"take failed async loads: unknown engine": func() error { _, err := c.TakeFailedAsyncLoads(ctx, &enginepb.EngineRef{Engine: "nobody"}); return err },
		"take submitted saves: unknown engine":    func() error { _, err := c.TakeSubmittedSaves(ctx, &enginepb.EngineRef{Engine: "nobody"}); return err },
		"lookup: oversized message (transport)":   lookup(&enginepb.Request{Id: "huge", Tokens: make([]int64, engineapi.MaxMessageBytes/8+1024)}, 0),
	}
	// Calls naming a request the scheduler does not track are no-ops, as in TensorRT-LLM's
	// connector: OK is a fine answer to them, Internal or Unknown is not.
	noop := map[string]bool{"cancel load: unknown request": true, "alloc: unknown request": true, "build meta: computed past the tokens": true}
	refused := 0
	for name, call := range cases {
		err := call()
		code := status.Code(err)
		if code == codes.OK && noop[name] {
			continue
		}
		switch code {
		case codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition, codes.PermissionDenied, codes.AlreadyExists, codes.ResourceExhausted:
			refused++
			if msg := status.Convert(err).Message(); msg == "" {
				t.Errorf("%s: %v with no message", name, code)
			}
		default:
			t.Errorf("%s: %v, want a client-side refusal (never OK, Internal or Unknown)", name, err)
		}
	}
	t.Logf("%d malformed calls refused", refused)
	p.alive(t)
	// The engine registered before the barrage still works.
	if _, err := c.Lookup(ctx, &enginepb.LookupRequest{Engine: "e", Request: &enginepb.Request{Id: "fine", Tokens: toks}}); err != nil {
		t.Errorf("a good call after the malformed ones: %v", err)
	}
}
