package daemon_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// TestRegisterAPIVersion pins the engine API's versioning contract: Register refuses a major
// version the daemon does not speak with FailedPrecondition naming both versions, accepts a
// newer minor version, reads an absent version as 1.0, and answers with its own version; the Go
// client declares its version without being told.
func TestRegisterAPIVersion(t *testing.T) {
	r := start(t, 16<<20)
	c, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	layout := &enginepb.Layout{TokensPerBlock: 16, Groups: []*enginepb.LayerGroup{{Id: 0, Slots: 4, Regions: []*enginepb.Region{{Offset: 0, Stride: 64, Size: 64}}}}}
	req := func(name string, v *enginepb.ApiVersion) *enginepb.RegisterRequest {
		return &enginepb.RegisterRequest{Engine: name, ModelKey: "m", WorldSize: 1, Role: "capacity", Scheduler: true, Layout: layout, ApiVersion: v}
	}

	// Through the generated client, so that nothing fills the version in.
	raw := c.EngineClient
	_, err = raw.Register(ctx, req("v2", &enginepb.ApiVersion{Major: 2, Minor: 5}))
	ours := fmt.Sprintf("%d.%d", engineapi.APIVersionMajor, engineapi.APIVersionMinor)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "2.5") || !strings.Contains(err.Error(), ours) {
		t.Errorf("Register declaring 2.5: %v; want FailedPrecondition naming 2.5 and %s", err, ours)
	}
	_, err = raw.Register(ctx, req("v0", &enginepb.ApiVersion{Major: 0, Minor: 9}))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "0.9") {
		t.Errorf("Register declaring 0.9: %v; want FailedPrecondition naming 0.9", err)
	}
	for _, c := range []struct {
		name string
		v    *enginepb.ApiVersion
	}{{"absent", nil}, {"newer-minor", &enginepb.ApiVersion{Major: engineapi.APIVersionMajor, Minor: engineapi.APIVersionMinor + 7}}} {
		resp, err := raw.Register(ctx, req(c.name, c.v))
		if err != nil {
			t.Errorf("Register with version %s: %v", c.name, err)
			continue
		}
		if v := resp.GetApiVersion(); v.GetMajor() != engineapi.APIVersionMajor || v.GetMinor() != engineapi.APIVersionMinor {
			t.Errorf("Register answered version %v, want %d.%d", v, engineapi.APIVersionMajor, engineapi.APIVersionMinor)
		}
	}

	// The Go client's Register declares the package's version.
	in := req("client", nil)
	if _, err := c.Register(ctx, in); err != nil {
		t.Fatal(err)
	}
	if v := in.GetApiVersion(); v.GetMajor() != engineapi.APIVersionMajor || v.GetMinor() != engineapi.APIVersionMinor {
		t.Errorf("the client declared %v", v)
	}
}

// TestRegisterCUDAIPCHandleSize checks that a CUDA IPC handle of the wrong size is refused as
// an invalid argument naming its size, before the daemon opens a device (this one has none).
func TestRegisterCUDAIPCHandleSize(t *testing.T) {
	r := start(t, 16<<20)
	c, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := &enginepb.RegisterRequest{Engine: "ipc", ModelKey: "m", WorldSize: 1, Role: "both", Scheduler: true,
		Layout: &enginepb.Layout{TokensPerBlock: 16, Groups: []*enginepb.LayerGroup{{Id: 0, Slots: 4, Regions: []*enginepb.Region{{Offset: 0, Stride: 64, Size: 64}}}}},
		Memory: &enginepb.RegisterRequest_CudaIpc{CudaIpc: &enginepb.CudaIPC{Handle: make([]byte, 10), Size: 256}}}
	_, err = c.Register(ctx, req)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "handle of 10 bytes") {
		t.Errorf("Register with a 10-byte handle: %v; want InvalidArgument naming the size", err)
	}
}
