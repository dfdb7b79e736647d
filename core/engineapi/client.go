package engineapi

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// MaxMessageBytes bounds one engine API message in either direction. A 1M-token prompt is
// about 10 MB on the wire; anything much larger is a bug or an attack and is refused.
const MaxMessageBytes = 64 << 20

// Client is an engine's connection to `kvctl serve`. It embeds the generated client, so every
// RPC of the Engine service is a method; RegisterSharedMemory adds the descriptor hand-over.
type Client struct {
	enginepb.EngineClient
	conn   *grpc.ClientConn
	socket string

	trust DaemonTrust

	mu     sync.Mutex
	arenas []*PromptArena // prompt arenas RemoteRanks over this client made; closed with it
	chans  *CallChannels  // set by UseCallChannels
}

// DefaultCallTimeout is the deadline a client call gets when its context has none, so that a
// daemon that accepts the connection and never answers fails the call instead of hanging it.
// No call of the engine API waits for longer than this on a healthy daemon.
const DefaultCallTimeout = 60 * time.Second

// callTimeout is DefaultCallTimeout; tests shorten it.
var callTimeout = DefaultCallTimeout

// deadlineConn gives every unary call without a deadline one of callTimeout.
type deadlineConn struct{ grpc.ClientConnInterface }

func (d deadlineConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, callTimeout)
		defer cancel()
	}
	return d.ClientConnInterface.Invoke(ctx, method, args, reply, opts...)
}

// TrustDaemonUID makes the client accept uid, besides its own and root, as the owner of the
// daemon's socket directory and of the listener its descriptors go to: for a daemon that runs as
// another user and admits this engine through --engine-group. Call it before the first call.
func (c *Client) TrustDaemonUID(uid int) { c.trust.DaemonUID = uid }

// Dial connects to the daemon's engine socket at path. It does not wait for the daemon: the
// first call fails with codes.Unavailable when nothing listens there. A call whose context has
// no deadline gets DefaultCallTimeout. Descriptors go only to a daemon the client trusts (see
// SendFDTrust and TrustDaemonUID).
func Dial(path string, opts ...grpc.DialOption) (*Client, error) {
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}
	all := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dialer),
	}, clientOptions()...)
	all = append(all, opts...)
	conn, err := grpc.NewClient("passthrough:///kvctl-engine", all...)
	if err != nil {
		return nil, fmt.Errorf("engine socket %s: %w", path, err)
	}
	return &Client{EngineClient: enginepb.NewEngineClient(deadlineConn{conn}), conn: conn, socket: path}, nil
}

// UseCallChannels makes the client's calls go over call channels of its connection (see
// CallChannels), at most n of them (DefaultCallChannels when n <= 0). It opens the first
// channel before it returns, so a daemon that cannot open one is an error here and the client
// keeps calling over gRPC. Call it before the client is shared: it replaces EngineClient.
func (c *Client) UseCallChannels(ctx context.Context, n int) error {
	p := NewCallChannels(deadlineConn{c.conn}, FDSocketPath(c.socket), n)
	p.trust = c.trust
	if err := p.Open(ctx); err != nil {
		_ = p.Close()
		return fmt.Errorf("call channels: %w", err)
	}
	c.mu.Lock()
	old := c.chans
	c.chans = p
	c.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
	c.EngineClient = enginepb.NewEngineClient(deadlineConn{p})
	return nil
}

// CallChannels is the pool UseCallChannels set up, nil when the client calls over gRPC only.
func (c *Client) CallChannels() *CallChannels {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.chans
}

// Close closes the connection and its call channels and releases the prompt arenas RemoteRanks
// made over it.
func (c *Client) Close() error {
	if p := c.CallChannels(); p != nil {
		_ = p.Close()
	}
	err := c.conn.Close()
	c.mu.Lock()
	arenas := c.arenas
	c.arenas = nil
	c.mu.Unlock()
	for _, a := range arenas {
		_ = a.Close()
	}
	return err
}

// adopt makes a's lifetime the connection's.
func (c *Client) adopt(a *PromptArena) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.arenas = append(c.arenas, a)
}

// RegisterPromptArena hands arena's descriptor to the daemon over the side channel and
// registers it as the prompt arena of engine, a rank registered over this client. Lookups of
// that rank may then name their prompt as a range of the arena (Request.tokens_arena).
func (c *Client) RegisterPromptArena(ctx context.Context, engine string, arena *PromptArena) error {
	tok, err := SendFDTrust(ctx, FDSocketPath(c.socket), arena.FD(), c.trust)
	if err != nil {
		return err
	}
	_, err = c.EngineClient.RegisterPromptArena(ctx, &enginepb.PromptArenaRequest{Engine: engine, FdToken: tok, Size: arena.Size()})
	return err
}

// Socket is the path the client dialled.
func (c *Client) Socket() string { return c.socket }

// RegisterSharedMemory hands the shared-memory file memFD (size bytes, see hostmem.NewSharedMemory)
// to the daemon over the descriptor side channel and registers the engine rank with it. The
// daemon gets its own copy of the descriptor; memFD stays the caller's.
func (c *Client) RegisterSharedMemory(ctx context.Context, req *enginepb.RegisterRequest, memFD int, size uint64) (*enginepb.RegisterResponse, error) {
	tok, err := SendFDTrust(ctx, FDSocketPath(c.socket), memFD, c.trust)
	if err != nil {
		return nil, err
	}
	req.Memory = &enginepb.RegisterRequest_SharedMemory{SharedMemory: &enginepb.SharedMemory{FdToken: tok, Size: size}}
	return c.Register(ctx, req)
}

// RegisterCUDAFD is RegisterSharedMemory for a CUDA virtual-memory allocation exported as a file
// descriptor.
func (c *Client) RegisterCUDAFD(ctx context.Context, req *enginepb.RegisterRequest, memFD int, size uint64, device int32) (*enginepb.RegisterResponse, error) {
	tok, err := SendFDTrust(ctx, FDSocketPath(c.socket), memFD, c.trust)
	if err != nil {
		return nil, err
	}
	req.Memory = &enginepb.RegisterRequest_CudaFd{CudaFd: &enginepb.CudaFD{FdToken: tok, Size: size, Device: device}}
	return c.Register(ctx, req)
}
