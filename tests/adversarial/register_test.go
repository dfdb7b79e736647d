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

// TestRegisterBounds: every Register field an engine controls is bounded; a value over a limit
// is refused with InvalidArgument naming the limit, before anything is allocated, and the
// daemon's memory does not grow (the attacks were world_size=2147483647, which made one Lookup
// allocate 64 GiB, and async_load_workers=20000, which exhausted threads).
func TestRegisterBounds(t *testing.T) {
	p := startServe(t, serveOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := engineapi.Dial(p.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rss0, _, _ := procStats(p.cmd.Process.Pid)
	base := func() *enginepb.RegisterRequest {
		return &enginepb.RegisterRequest{Engine: "e", ModelKey: "m", Role: "capacity", Scheduler: true, Layout: smallLayout(8)}
	}
	manyGroups := func(n int) *enginepb.Layout {
		l := &enginepb.Layout{TokensPerBlock: 16}
		for i := range n {
			l.Groups = append(l.Groups, &enginepb.LayerGroup{Id: int32(i), Slots: 1, Regions: []*enginepb.Region{{Size: 8, Stride: 8}}})
		}
		return l
	}
	manyRegions := &enginepb.Layout{TokensPerBlock: 16, Groups: []*enginepb.LayerGroup{{Slots: 1}}}
	for range 5000 {
		manyRegions.Groups[0].Regions = append(manyRegions.Groups[0].Regions, &enginepb.Region{Size: 8, Stride: 8})
	}
	cases := []struct {
		name  string
		edit  func(r *enginepb.RegisterRequest)
		want  string
		limit bool
	}{
		{"world size 2147483647", func(r *enginepb.RegisterRequest) { r.WorldSize = 2147483647 }, "world_size 2147483647 is above the limit of 256", true},
		{"negative world size", func(r *enginepb.RegisterRequest) { r.WorldSize = -1 }, "world_size -1 is negative", false},
		{"negative rank", func(r *enginepb.RegisterRequest) { r.Rank = -3 }, "rank -3 is negative", false},
		{"rank past the world", func(r *enginepb.RegisterRequest) { r.WorldSize, r.Rank = 2, 2 }, "rank 2", false},
		{"async load workers 20000", func(r *enginepb.RegisterRequest) { r.AsyncLoad, r.AsyncLoadWorkers = true, 20000 }, "async_load_workers 20000 is above the limit of 64", true},
		{"model key of 5000 bytes", func(r *enginepb.RegisterRequest) { r.ModelKey = strings.Repeat("m", 5000) }, "model_key is 5000 bytes, above the limit of 256", true},
		{"model key with a newline", func(r *enginepb.RegisterRequest) { r.ModelKey = "m\nINFO forged" }, "model_key has byte 0x0a", false},
		{"model key with a space", func(r *enginepb.RegisterRequest) { r.ModelKey = "m x" }, "model_key has byte 0x20", false},
		{"namespace of 1000 bytes", func(r *enginepb.RegisterRequest) { r.Namespace = strings.Repeat("n", 1000) }, "namespace is 1000 bytes, above the limit of 128", true},
		{"engine name of 10000 bytes", func(r *enginepb.RegisterRequest) { r.Engine = strings.Repeat("e", 10000) }, "engine name length 10000 is above the limit of 256", true},
		{"engine name with an escape", func(r *enginepb.RegisterRequest) { r.Engine = "e\x1b[2J" }, "control byte 0x1b", false},
		{"100 layer groups", func(r *enginepb.RegisterRequest) { r.Layout = manyGroups(100) }, "layer groups 100 is above the limit of 64", true},
		{"keys per block", func(r *enginepb.RegisterRequest) { r.Layout, r.WorldSize = manyGroups(16), 256 }, "above the limit of 1024", true},
		{"5000 regions", func(r *enginepb.RegisterRequest) { r.Layout = manyRegions }, "regions of layer group 0 5000 is above the limit of 4096", true},
		{"2^30 slots", func(r *enginepb.RegisterRequest) { r.Layout.Groups[0].Slots = 1 << 30 }, "slots of layer group 0 1073741824 is above the limit of 16777216", true},
		{"tokens per block 2^20", func(r *enginepb.RegisterRequest) { r.Layout.TokensPerBlock = 1 << 20 }, "tokens_per_block 1048576 is above the limit of 65536", true},
		{"prompt lookahead 2^20", func(r *enginepb.RegisterRequest) { r.PromptLookahead = 1 << 20 }, "prompt_lookahead 1048576 is above the limit of 65536", true},
		{"transfer batch 2^30", func(r *enginepb.RegisterRequest) { r.TransferBatchSize = 1 << 30 }, "transfer_batch_size 1073741824 is above the limit of 65536", true},
		{"staging of 64 GiB", func(r *enginepb.RegisterRequest) { r.StagingBufferBytes = 64 << 30 }, "staging_buffer_bytes 68719476736 is above the limit of 4294967296", true},
		{"page of 2 GiB", func(r *enginepb.RegisterRequest) {
			r.Layout.Groups[0].Regions[0] = &enginepb.Region{Size: 2 << 30, Stride: 2 << 30}
		}, "page bytes of layer group 0 2147483648 is above the limit of 1073741824", true},
	}
	for _, tc := range cases {
		r := base()
		tc.edit(r)
		_, err := c.Register(ctx, r)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want InvalidArgument containing %q", tc.name, err, tc.want)
		}
	}

	// Within the limits, a request whose tokens are over the per-request limit is refused too.
	r := base()
	r.WorldSize = 256
	if _, err := c.Register(ctx, r); err != nil {
		t.Fatal(err)
	}
	huge := make([]int64, 3<<20)
	_, err = c.Lookup(ctx, &enginepb.LookupRequest{Engine: "e", Request: &enginepb.Request{Id: "big", Tokens: huge}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "above the limit") {
		t.Errorf("lookup of %d tokens: %v, want InvalidArgument naming the limit", len(huge), err)
	}
	// 1M tokens at 257 keys per block would be 16M pool keys: over the per-lookup key limit.
	mid := make([]int64, 1<<20)
	_, err = c.Lookup(ctx, &enginepb.LookupRequest{Engine: "e", Request: &enginepb.Request{Id: "keys", Tokens: mid}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "pool keys") {
		t.Errorf("lookup of 16M pool keys: %v, want InvalidArgument naming the key limit", err)
	}
	_, err = c.Lookup(ctx, &enginepb.LookupRequest{Engine: "e", Request: &enginepb.Request{Id: strings.Repeat("i", 5000), Tokens: []int64{1}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "request id length") {
		t.Errorf("lookup with a 5000-byte request id: %v", err)
	}
	rss1, _, _ := procStats(p.cmd.Process.Pid)
	if rss1-rss0 > 512<<10 {
		t.Errorf("daemon RSS grew by %d MiB over refused registrations", (rss1-rss0)>>10)
	}
	p.alive(t)
}
