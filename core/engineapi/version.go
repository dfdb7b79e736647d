package engineapi

import (
	"context"
	"fmt"

	"google.golang.org/grpc"

	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// The engine API version this package speaks (RegisterRequest.api_version and
// RegisterResponse.api_version). A major version change breaks engines written for another; a
// minor version only adds fields and methods. docs/ENGINE_API.md describes the rules.
const (
	APIVersionMajor = 1
	APIVersionMinor = 4
)

// CUDAIPCHandleBytes is the size of a legacy CUDA IPC handle (cudaIpcMemHandle_t) in
// CudaIPC.handle; PyTorch's serialised form is 2 bytes longer, and both are accepted.
const CUDAIPCHandleBytes = 64

// APIVersion is the version this package speaks, as the message Register carries.
func APIVersion() *enginepb.ApiVersion {
	return &enginepb.ApiVersion{Major: APIVersionMajor, Minor: APIVersionMinor}
}

// RequestAPIVersion is the version a RegisterRequest declares: 1.0 when it declares none, what
// engines written before the field spoke.
func RequestAPIVersion(req *enginepb.RegisterRequest) (major, minor uint32) {
	v := req.GetApiVersion()
	if v == nil {
		return 1, 0
	}
	return v.GetMajor(), v.GetMinor()
}

// CheckAPIVersion refuses a registration that declares a major version other than
// APIVersionMajor, naming both versions. A newer minor version is accepted.
func CheckAPIVersion(req *enginepb.RegisterRequest) error {
	major, minor := RequestAPIVersion(req)
	if major != APIVersionMajor {
		return fmt.Errorf("engine API version %d.%d is not supported: this kvctl serve speaks %d.%d and accepts major version %d only; use an engine client of major version %d, or a kvctl serve that speaks %d.x",
			major, minor, APIVersionMajor, APIVersionMinor, APIVersionMajor, APIVersionMajor, major)
	}
	return nil
}

// Register registers an engine rank, declaring this package's API version when req declares
// none.
func (c *Client) Register(ctx context.Context, req *enginepb.RegisterRequest, opts ...grpc.CallOption) (*enginepb.RegisterResponse, error) {
	if req.GetApiVersion() == nil {
		req.ApiVersion = APIVersion()
	}
	return c.EngineClient.Register(ctx, req, opts...)
}
