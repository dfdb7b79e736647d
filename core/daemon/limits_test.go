package daemon_test

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/daemon/daemontest"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/hostmem"
	"github.com/kvctl/kvctl/pool/embedded"
)

// TestLiveRequestLimits: an engine that looks requests up and never finishes them is stopped at
// the live-request and tracked-token limits with ResourceExhausted; finishing one makes room.
func TestLiveRequestLimits(t *testing.T) {
	popts := embedded.DefaultOptions()
	popts.Segments = []embedded.SegmentSpec{{Name: "t", Capacity: 16 << 20}}
	r := daemontest.Start(t, daemon.Config{Pool: popts, Limits: daemon.Limits{MaxLiveRequests: 4, MaxTrackedTokens: 1000}})
	ctx := context.Background()
	c, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mem, err := hostmem.NewSharedMemory(64)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	if _, err := c.RegisterSharedMemory(ctx, &enginepb.RegisterRequest{Engine: "e", ModelKey: "m", Scheduler: true,
		Layout: &enginepb.Layout{TokensPerBlock: 16, Groups: []*enginepb.LayerGroup{{Slots: 8, Regions: []*enginepb.Region{{Size: 8, Stride: 8}}}}}}, mem.FD, 64); err != nil {
		t.Fatal(err)
	}
	lookup := func(id string, n int) error {
		_, err := c.Lookup(ctx, &enginepb.LookupRequest{Engine: "e", Request: &enginepb.Request{Id: id, Tokens: make([]int64, n)}})
		return err
	}
	for i := range 4 {
		if err := lookup(fmt.Sprint("r", i), 100); err != nil {
			t.Fatal(err)
		}
	}
	if err := lookup("r4", 100); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a fifth live request: %v, want ResourceExhausted", err)
	}
	if err := lookup("r0", 100); err != nil {
		t.Errorf("a tracked request looked up again: %v", err)
	}
	if _, err := c.RequestFinished(ctx, &enginepb.RequestRef{Engine: "e", RequestId: "r3"}); err != nil {
		t.Fatal(err)
	}
	if err := lookup("r4", 100); err != nil {
		t.Errorf("after one finished: %v", err)
	}
	if err := lookup("r1", 900); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("tokens past the tracked limit: %v, want ResourceExhausted", err)
	}
}
