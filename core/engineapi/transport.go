package engineapi

import (
	"math/bits"
	"runtime"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"
)

// WindowBytes is the HTTP/2 flow-control window, per stream and per connection, that both ends
// of the engine socket grant: 1 MiB, so that a 32k-token prompt (256 KiB packed) goes out in
// one burst instead of waiting for window updates after every 64 KiB, and the daemon buffers at
// most 1 MiB of unread data per connection.
const WindowBytes = 1 << 20

// ioBufferBytes is the socket read and write buffer of each engine connection.
const ioBufferBytes = 256 << 10

// ServerOptions are the gRPC server options `kvctl serve` uses on its engine socket: message
// bounds, flow-control windows, a buffer pool that does not zero buffers it hands out, and a
// fixed set of goroutines that run calls (one per CPU), whose stacks stay grown from one call
// to the next instead of a new goroutine's growing through a lookup's deep stack every call
// (0.06-0.07 ms of a 32k-token lookup's 0.8 ms round trip on the development VM; gRPC still
// starts a goroutine for a call that finds every worker busy).
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxMessageBytes),
		grpc.MaxSendMsgSize(MaxMessageBytes),
		grpc.InitialWindowSize(WindowBytes),
		grpc.InitialConnWindowSize(WindowBytes),
		grpc.ReadBufferSize(ioBufferBytes),
		grpc.WriteBufferSize(ioBufferBytes),
		experimental.BufferPool(bufferPool),
		grpc.ForceServerCodecV2(codec{}),
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
	}
}

// idleTimeout is the client's gRPC idle timeout: 0, never idle. gRPC's default (30 minutes)
// closes a connection that made no call for that long, and the daemon releases every
// registration of a connection that ends, so an engine whose calls all go over call channels, or
// that is merely quiet for half an hour, would lose its registration. Tests shorten it.
var idleTimeout time.Duration

// clientOptions are the matching dial options of Dial.
func clientOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithIdleTimeout(idleTimeout),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes),
			grpc.ForceCodecV2(codec{})),
		grpc.WithInitialWindowSize(WindowBytes),
		grpc.WithInitialConnWindowSize(WindowBytes),
		grpc.WithReadBufferSize(ioBufferBytes),
		grpc.WithWriteBufferSize(ioBufferBytes),
		experimental.WithBufferPool(bufferPool),
	}
}

// bufferPool is shared by the daemon and every client in the process. gRPC writes every byte of
// a buffer it gets before reading it (a frame read in full, a message marshalled or copied in),
// so clearing it first, as gRPC's default pool does, only costs time: for a 256 KiB prompt it
// was 6 % of the daemon's CPU.
var bufferPool mem.BufferPool = newDirtyPool()

// Buffers up to 1<<maxPooledShift bytes are pooled in power-of-two classes; larger ones are
// allocated and left to the garbage collector.
const (
	minPooledShift = 8
	maxPooledShift = 24
)

type dirtyPool struct {
	classes [maxPooledShift - minPooledShift + 1]sync.Pool
}

func newDirtyPool() *dirtyPool { return &dirtyPool{} }

// class is the index of the smallest class holding size bytes, or -1 when none does.
func class(size int) int {
	if size <= 1<<minPooledShift {
		return 0
	}
	s := bits.Len(uint(size - 1))
	if s > maxPooledShift {
		return -1
	}
	return s - minPooledShift
}

// Get returns a buffer of length size whose contents are unspecified.
func (p *dirtyPool) Get(size int) *[]byte {
	c := class(size)
	if c < 0 {
		b := make([]byte, size)
		return &b
	}
	if bp, ok := p.classes[c].Get().(*[]byte); ok {
		*bp = (*bp)[:size]
		return bp
	}
	b := make([]byte, size, 1<<(c+minPooledShift))
	return &b
}

// Put returns a buffer from Get to its class.
func (p *dirtyPool) Put(bp *[]byte) {
	c := cap(*bp)
	if c < 1<<minPooledShift || c&(c-1) != 0 || c > 1<<maxPooledShift {
		return
	}
	p.classes[bits.Len(uint(c))-1-minPooledShift].Put(bp)
}
