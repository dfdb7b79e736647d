package engineapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// DefaultCallChannels is how many call channels Client.UseCallChannels opens at most when asked
// for 0: enough for an engine rank's scheduler, worker and asynchronous loads to call at once.
const DefaultCallChannels = 4

// ErrCallChannelsClosed is returned by a call made after CallChannels.Close.
var ErrCallChannelsClosed = errors.New("call channels closed")

// CallChannels is a pool of call channels (OpenCallChannel) of one gRPC connection to the
// daemon, and a grpc.ClientConnInterface: enginepb.NewEngineClient(pool) is a full Engine client
// whose calls go over an idle channel, one write and one read each, instead of an HTTP/2 stream.
// A call goes over the gRPC connection instead when every channel is busy and no more may be
// opened (so concurrent callers never wait behind a long StartLoad), when its request is above
// the daemon's bound for channel requests, or when the method has no channel number. Errors are
// status errors with the daemon's code and message, as over gRPC; a call's context deadline and
// cancellation are honoured, and a channel whose call was abandoned is closed, not reused.
// Methods are safe for concurrent use.
type CallChannels struct {
	cc     grpc.ClientConnInterface
	rpc    enginepb.EngineClient
	fdPath string
	trust  DaemonTrust // whom descriptors may go to; set by Client.UseCallChannels
	max    int

	ids atomic.Uint64

	mu     sync.Mutex
	idle   []*callConn
	open   int // idle and busy channels
	maxReq int // the daemon's max_message_bytes; 0 until a channel is open
	closed bool
	// noDialUntil holds back opening channels for a while after one could not be opened (the
	// daemon at its per-connection cap, say), so that calls meanwhile go straight over gRPC
	// instead of each paying a failed attempt.
	noDialUntil time.Time
	// opened counts the channels ever opened and fallbacks the calls that went over gRPC
	// because no channel was free or the request was too large (for tests and benchmarks).
	opened, fallbacks atomic.Int64
	// dialFailures counts the channels that could not be opened.
	dialFailures atomic.Int64
}

// NewCallChannels returns a pool of at most n channels (DefaultCallChannels when n <= 0)
// opened over cc, the engine's connection to the daemon, with descriptors sent to the daemon's
// side channel at fdPath (FDSocketPath of the engine socket). It opens none until a call needs
// one (see Open).
func NewCallChannels(cc grpc.ClientConnInterface, fdPath string, n int) *CallChannels {
	if n <= 0 {
		n = DefaultCallChannels
	}
	return &CallChannels{cc: cc, rpc: enginepb.NewEngineClient(cc), fdPath: fdPath, max: n}
}

// Open opens one channel now and keeps it idle, so that an error (a daemon without call
// channels answers Unimplemented) shows at once instead of sending calls over gRPC.
func (p *CallChannels) Open(ctx context.Context) error {
	c, err := p.dial(ctx)
	if err != nil {
		return err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.close()
		return ErrCallChannelsClosed
	}
	p.open++
	p.idle = append(p.idle, c)
	p.mu.Unlock()
	return nil
}

// Stats reports how many channels the pool has opened and how many calls went over gRPC because
// no channel was free or their request was above the daemon's bound.
func (p *CallChannels) Stats() (opened, fallbacks int64) { return p.opened.Load(), p.fallbacks.Load() }

// Close closes every idle channel and makes busy ones close when their call ends. Later calls
// fail with ErrCallChannelsClosed; the gRPC connection is the caller's.
func (p *CallChannels) Close() error {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.open -= len(idle)
	p.mu.Unlock()
	for _, c := range idle {
		c.close()
	}
	return nil
}

// NewStream opens a stream over the gRPC connection: channels carry unary calls only.
func (p *CallChannels) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return p.cc.NewStream(ctx, desc, method, opts...)
}

// Invoke makes a unary call over an idle channel, or over the gRPC connection when none is free
// (see CallChannels). Call options apply only to calls that go over gRPC.
func (p *CallChannels) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	m, ok := CallMethodOf(method)
	if !ok {
		return p.cc.Invoke(ctx, method, args, reply, opts...)
	}
	c, err := p.get(ctx)
	if err != nil {
		return err
	}
	if c == nil {
		p.fallbacks.Add(1)
		return p.cc.Invoke(ctx, method, args, reply, opts...)
	}
	c.msg, err = AppendCall(c.msg[:0], args)
	if err != nil {
		p.put(c)
		return status.Error(codes.Internal, err.Error())
	}
	if p.requestBound() < len(c.msg) {
		p.put(c)
		p.fallbacks.Add(1)
		return p.cc.Invoke(ctx, method, args, reply, opts...)
	}
	sent, err := c.call(ctx, m, p.ids.Add(1), reply)
	if err == nil || c.usable {
		p.put(c)
		return err
	}
	// The channel broke or its call was abandoned: it is not reused.
	c.close()
	p.mu.Lock()
	p.open--
	p.mu.Unlock()
	if !sent && ctx.Err() == nil {
		// Nothing reached the daemon: the call is safe to make over gRPC.
		p.fallbacks.Add(1)
		return p.cc.Invoke(ctx, method, args, reply, opts...)
	}
	return err
}

func (p *CallChannels) requestBound() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.maxReq
}

// get returns an idle channel, opens one when fewer than max are open, or returns nil when all
// are busy (or opening one failed: the call then goes over gRPC).
func (p *CallChannels) get(ctx context.Context) (*callConn, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, status.Error(codes.Canceled, ErrCallChannelsClosed.Error())
	}
	if n := len(p.idle); n > 0 {
		c := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return c, nil
	}
	if p.open >= p.max || time.Now().Before(p.noDialUntil) {
		p.mu.Unlock()
		return nil, nil
	}
	p.open++
	p.mu.Unlock()
	c, err := p.dial(ctx)
	if err != nil {
		p.dialFailures.Add(1)
		p.mu.Lock()
		p.open--
		if ctx.Err() == nil {
			p.noDialUntil = time.Now().Add(dialRetryAfter)
		}
		p.mu.Unlock()
		return nil, nil //nolint:nilerr // the call goes over gRPC, which reports its own errors
	}
	return c, nil
}

// dialRetryAfter is how long a pool sends its calls over gRPC after a channel could not be opened.
const dialRetryAfter = time.Second

// put returns c to the idle channels, or closes it when the pool was closed meanwhile.
func (p *CallChannels) put(c *callConn) {
	p.mu.Lock()
	if !p.closed {
		p.idle = append(p.idle, c)
		p.mu.Unlock()
		return
	}
	p.open--
	p.mu.Unlock()
	c.close()
}

// dial creates a socket pair, hands one end to the daemon and makes it a call channel of the
// gRPC connection.
func (p *CallChannels) dial(ctx context.Context) (*callConn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("call channel socket pair: %w", err)
	}
	tok, err := SendFDTrust(ctx, p.fdPath, fds[1], p.trust)
	_ = unix.Close(fds[1])
	if err != nil {
		_ = unix.Close(fds[0])
		return nil, err
	}
	resp, err := p.rpc.OpenCallChannel(ctx, &enginepb.CallChannelRequest{FdToken: tok})
	if err != nil {
		_ = unix.Close(fds[0])
		return nil, err
	}
	f := os.NewFile(uintptr(fds[0]), "kvctl-call-channel")
	nc, err := net.FileConn(f)
	_ = f.Close()
	if err != nil {
		return nil, fmt.Errorf("call channel: %w", err)
	}
	maxReq := int(min(resp.GetMaxMessageBytes(), MaxMessageBytes))
	p.mu.Lock()
	p.maxReq = maxReq
	p.mu.Unlock()
	p.opened.Add(1)
	return &callConn{
		conn: nc.(*net.UnixConn),
		rbuf: make([]byte, MaxCallFrameBytes+1),
		asm:  NewCallAssembler(MaxMessageBytes),
	}, nil
}

// callConn is one open channel, used by one call at a time.
type callConn struct {
	conn *net.UnixConn
	rbuf []byte // one frame read
	wbuf []byte // one frame written
	msg  []byte // the request being sent
	asm  *CallAssembler
	// usable is false once the channel may hold a half-sent request or an unread response.
	usable bool
}

func (c *callConn) close() { _ = c.conn.Close() }

// call sends c.msg as a request of method m with call id and reads its response into reply. sent
// reports whether any frame of the request may have reached the daemon.
func (c *callConn) call(ctx context.Context, m enginepb.CallChannelMethod, id uint64, reply any) (sent bool, err error) {
	c.usable = false
	if err = ctx.Err(); err != nil {
		c.usable = true
		return false, status.FromContextError(err).Err()
	}
	dl, hasDL := ctx.Deadline()
	if hasDL {
		_ = c.conn.SetDeadline(dl)
	}
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { _ = c.conn.SetDeadline(time.Unix(1, 0)) })
		defer func() {
			// Once the cancellation has begun to cut the channel's deadline short, the channel
			// cannot be trusted for the next call.
			if !stop() {
				c.usable = false
			}
		}()
	}
	fail := func(what string, err error) error {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return status.FromContextError(ctxErr).Err()
		}
		if errors.Is(err, os.ErrDeadlineExceeded) && hasDL {
			return status.Error(codes.DeadlineExceeded, context.DeadlineExceeded.Error())
		}
		return status.Errorf(codes.Unavailable, "call channel %s: %v", what, err)
	}
	c.wbuf, err = AppendCallFrames(c.wbuf[:0], CallHeader{Method: m, CallID: id}, c.msg, func(frame []byte) error {
		_, werr := c.conn.Write(frame)
		if werr == nil {
			sent = true
		}
		return werr
	})
	if cap(c.msg) > 1<<20 {
		c.msg = nil
	}
	if cap(c.wbuf) > 2*MaxCallFrameBytes {
		c.wbuf = nil
	}
	if err != nil {
		return sent, fail("write", err)
	}
	sent = true
	for {
		n, _, _, _, err := c.conn.ReadMsgUnix(c.rbuf, nil)
		if err != nil {
			return true, fail("read", err)
		}
		msg, h, err := c.asm.Add(c.rbuf[:n])
		if err != nil {
			return true, status.Errorf(codes.Internal, "call channel: response: %v", err)
		}
		if h.CallID != id || h.Method != m {
			return true, status.Errorf(codes.Internal, "call channel: a response to call %d (method %d) came for call %d (method %d)", h.CallID, h.Method, id, m)
		}
		if msg == nil {
			continue
		}
		if hasDL || ctx.Done() != nil {
			_ = c.conn.SetDeadline(time.Time{})
		}
		c.usable = true
		if msg.Header.Status != 0 {
			return true, status.Error(codes.Code(msg.Header.Status), string(msg.Body))
		}
		if err := UnmarshalCall(msg.Body, reply); err != nil {
			return true, status.Errorf(codes.Internal, "call channel: response does not decode: %v", err)
		}
		return true, nil
	}
}
