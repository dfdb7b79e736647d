package daemon

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/trace"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// A call channel (OpenCallChannel in engine.proto, frames in engineapi/callframe.go) is one end
// of a unix SOCK_SEQPACKET socket pair that an engine hands over the descriptor side channel. A
// call made over it is a call of the gRPC connection that opened it: it runs through the same
// generated handler and interceptor as the gRPC call (so the same ownership checks, limits,
// status codes, metrics and draining), with the opening connection's id and peer in its
// context. Each channel has two goroutines: a reader that joins frames into messages (bounded by
// Limits.MaxCallRequestBytes) and a worker that runs one call at a time and writes its response.
// The reader keeps reading while a call runs, so an engine that goes away cancels the call at
// once; a message it joins meanwhile waits for the worker, which is all the buffering a channel
// does. The worker gets a copy of each request's body (in one of two buffers the reader uses in
// turn), so the reader goes back to reading without waiting for the call to decode. Every reply
// is written under a deadline: an engine that never reads its replies loses its channel,
// nothing else.

// DefaultCallChannelWriteTimeout bounds how long the daemon waits to write one reply on a call
// channel before it closes the channel.
const DefaultCallChannelWriteTimeout = 5 * time.Second

// DefaultCallChannelPoll is how long a call channel's reader polls for the next request after
// one arrived or was answered (Config.CallChannelPoll) on a host with callPollMinCPUs or more
// CPUs; on a smaller one it does not poll. An engine makes its calls in bursts (a scheduler
// step's lookups, metadata, StartLoad, TakeFailedLoads): a reader that sleeps between them is
// woken by the kernel for each, which on the H200 host made a call right after a StartLoad take
// 120-180 µs against 30-40 µs for the same call back to back (docs/perf/serve-gpu.md). A reader
// that polls answers the burst's next call without that wake-up, for a core busy at most this
// long after each call.
const DefaultCallChannelPoll = 200 * time.Microsecond

// callPollMinCPUs is the fewest CPUs (GOMAXPROCS) on which call channels poll by default.
// callPollBusyFactor bounds the polling while a call runs: for at most this many times the
// poll window from the call's start, so a StartLoad's reply is followed by the next call at
// once, but a call that waits long (WaitForSave) does not keep a core busy.
const (
	callPollMinCPUs    = 4
	callPollBusyFactor = 25
)

// afterReplyKey is the context key of a call channel call's afterReplyHook.
type afterReplyKey struct{}

// afterReplyHook holds what a call made over a call channel leaves to run once its reply is
// written, on the channel's worker before it takes the next call.
type afterReplyHook struct{ f func() }

// afterReply has f run once the reply of the call ctx belongs to is written, when the call came
// over a call channel; it reports whether it will. A gRPC call has no such hook: its reply is
// written by gRPC after the handler returns.
func afterReply(ctx context.Context, f func()) bool {
	h, ok := ctx.Value(afterReplyKey{}).(*afterReplyHook)
	if ok {
		h.f = f
	}
	return ok
}

// callPollEpoch is the origin of the channels' activity times (monotonic nanoseconds).
var callPollEpoch = time.Now()

func callPollNow() int64 { return int64(time.Since(callPollEpoch)) }

// Reasons a call channel refused a frame or a message (the reason label of
// kvctl_engine_call_channel_refused_frames_total).
const (
	refusedShort          = "short"
	refusedMagic          = "magic"
	refusedFlags          = "flags"
	refusedFrameTooLarge  = "frame_too_large"
	refusedInterleaved    = "interleaved"
	refusedMessageTooLong = "message_too_large"
	refusedUnknownMethod  = "unknown_method"
	refusedUndecodable    = "undecodable"
)

var refusedReasons = []string{refusedShort, refusedMagic, refusedFlags, refusedFrameTooLarge, refusedInterleaved,
	refusedMessageTooLong, refusedUnknownMethod, refusedUndecodable}

// callHandlers maps each channel method number to the generated gRPC handler of its method.
var callHandlers = func() map[enginepb.CallChannelMethod]grpc.MethodHandler {
	out := map[enginepb.CallChannelMethod]grpc.MethodHandler{}
	for _, md := range enginepb.Engine_ServiceDesc.Methods {
		full := "/" + enginepb.Engine_ServiceDesc.ServiceName + "/" + md.MethodName
		if m, ok := engineapi.CallMethodOf(full); ok {
			out[m] = md.Handler
		}
	}
	return out
}()

// callChannels is the daemon's set of open call channels, by the connection that opened them.
type callChannels struct {
	d       *Daemon
	open    prometheus.Gauge
	refused *prometheus.CounterVec

	mu     sync.Mutex
	byConn map[uint64]map[*callChannel]struct{}
	closed bool
}

func newCallChannels(d *Daemon, reg prometheus.Registerer) *callChannels {
	s := &callChannels{
		d:       d,
		byConn:  map[uint64]map[*callChannel]struct{}{},
		open:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvctl_engine_call_channels", Help: "Call channels open on the engine socket's connections."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvctl_engine_call_channel_refused_frames_total", Help: "Frames and messages refused on call channels, by reason."}, []string{"reason"}),
	}
	for _, r := range refusedReasons {
		s.refused.WithLabelValues(r)
	}
	reg.MustRegister(s.open, s.refused)
	return s
}

// add makes c one of connection id's channels, within the per-connection cap.
func (s *callChannels) add(id uint64, c *callChannel) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return status.Error(codes.Unavailable, "kvctl serve is shutting down")
	}
	set := s.byConn[id]
	if limit := s.d.sec.limits.MaxCallChannelsPerConn; len(set) >= limit {
		return status.Errorf(codes.ResourceExhausted, "open call channel: this connection has %d call channels open, the limit (max call channels per connection); close one first", len(set))
	}
	if set == nil {
		set = map[*callChannel]struct{}{}
		s.byConn[id] = set
	}
	set[c] = struct{}{}
	s.open.Inc()
	return nil
}

// remove forgets c; it reports whether c was there.
func (s *callChannels) remove(c *callChannel) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	set := s.byConn[c.connID]
	if _, ok := set[c]; !ok {
		return false
	}
	delete(set, c)
	if len(set) == 0 {
		delete(s.byConn, c.connID)
	}
	s.open.Dec()
	return true
}

// take removes and returns the channels of connection id, or of every connection when all.
func (s *callChannels) take(id uint64, all bool) []*callChannel {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*callChannel
	for cid, set := range s.byConn {
		if !all && cid != id {
			continue
		}
		for c := range set {
			out = append(out, c)
			s.open.Dec()
		}
		delete(s.byConn, cid)
	}
	if all {
		s.closed = true
	}
	return out
}

// closeConn closes connection id's channels, cancelling their calls, and waits (within the drain
// timeout) for their goroutines.
func (s *callChannels) closeConn(id uint64) {
	chans := s.take(id, false)
	for _, c := range chans {
		c.close()
	}
	wait(chans, s.d.cfg.DrainTimeout)
}

// closeAll refuses new channels, lets each open channel's call in flight finish (within ctx),
// then closes every channel and waits for their goroutines.
func (s *callChannels) closeAll(ctx context.Context) {
	chans := s.take(0, true)
	var wg sync.WaitGroup
	for _, c := range chans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case c.busy <- struct{}{}:
			case <-ctx.Done():
			case <-c.ctx.Done():
			}
			c.close()
		}()
	}
	wg.Wait()
	wait(chans, s.d.cfg.DrainTimeout)
}

func wait(chans []*callChannel, timeout time.Duration) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for _, c := range chans {
		select {
		case <-c.done:
		case <-t.C:
			return
		}
	}
}

// callJob is what the reader hands the worker: a whole request, or a refusal to answer.
type callJob struct {
	hdr  engineapi.CallHeader
	body []byte // a copy in one of the reader's two body buffers: valid until the next job is taken
	// A refusal: the status and message to answer with instead of running a call.
	code   codes.Code
	msg    string
	refuse bool
}

// callChannel is one open call channel.
type callChannel struct {
	d      *Daemon
	set    *callChannels
	conn   *net.UnixConn
	connID uint64
	ctx    context.Context // carries the connection id and peer; cancelled when the channel closes
	cancel context.CancelFunc

	jobs chan callJob
	busy chan struct{} // held by the worker while a call runs
	done chan struct{} // closed when both goroutines have returned

	closeOnce sync.Once

	// Polling for the next request (Config.CallChannelPoll): poll is the window (0: none), raw
	// the socket's descriptor access, active when a request last arrived or a reply was last
	// written, callStart when the call running began (0 when none), in callPollNow's time.
	poll      time.Duration
	raw       syscall.RawConn
	active    atomic.Int64
	callStart atomic.Int64

	// after is the hook of the call the worker runs (afterReply), in ctx.
	after *afterReplyHook

	// The worker's buffers.
	resp []byte
	out  []byte
}

// callPollWindow is the poll window a new channel uses under cfg.
func callPollWindow(cfg time.Duration) time.Duration {
	switch {
	case cfg < 0:
		return 0
	case cfg > 0:
		return cfg
	case runtime.GOMAXPROCS(0) >= callPollMinCPUs:
		return DefaultCallChannelPoll
	}
	return 0
}

// polling reports whether the reader should keep polling rather than sleep.
func (c *callChannel) polling() bool {
	if c.ctx.Err() != nil {
		return false
	}
	now, w := callPollNow(), int64(c.poll)
	if now-c.active.Load() < w {
		return true
	}
	s := c.callStart.Load()
	return s != 0 && now-s < callPollBusyFactor*w
}

// recv reads the next datagram into buf and reports whether the socket cut it short. With a
// poll window it first polls without blocking while polling says so, yielding to other
// goroutines between tries, then sleeps until the socket is readable.
func (c *callChannel) recv(buf []byte) (n int, truncated bool, err error) {
	var flags int
	if c.poll <= 0 || c.raw == nil {
		n, _, flags, _, err = c.conn.ReadMsgUnix(buf, nil)
		return n, flags&unix.MSG_TRUNC != 0, err
	}
	var rerr error
	err = c.raw.Read(func(fd uintptr) bool {
		for {
			n, _, flags, _, rerr = unix.Recvmsg(int(fd), buf, nil, unix.MSG_DONTWAIT)
			switch {
			case rerr == unix.EINTR:
				continue
			case rerr != unix.EAGAIN:
				return true
			case !c.polling():
				return false // sleep until readable, then try again
			}
			// After every empty poll: goroutines readied onto this thread's run queue (a
			// worker just handed a request, the Transfer Engine's readers during a load) run
			// at once. Yielding every 16 polls instead cut B's scheduler time but slowed
			// four engines' synchronous early loads from a peer from 0.90× to 0.78× of the
			// native get (eleven alternated rounds on an H100 host, docs/perf/cluster.md).
			runtime.Gosched()
		}
	})
	if err == nil {
		err = rerr
	}
	if err == nil && n == 0 {
		err = io.EOF // a SOCK_SEQPACKET socket reads nothing once the engine closed its end
	}
	return n, flags&unix.MSG_TRUNC != 0, err
}

func (s *service) OpenCallChannel(ctx context.Context, req *enginepb.CallChannelRequest) (*enginepb.CallChannelResponse, error) {
	// Claimed first, so that a refused call does not leave the descriptor held until it expires.
	f, err := s.d.fds.Claim(req.GetFdToken())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "open call channel: %v", err)
	}
	// net.FileConn takes its own copy of the descriptor.
	defer f.Close()
	if err = checkCallSocket(f); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "open call channel: %v", err)
	}
	nc, err := net.FileConn(f)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "open call channel: %v", err)
	}
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		_ = nc.Close()
		return nil, status.Errorf(codes.InvalidArgument, "open call channel: descriptor is a %T, not a unix socket", nc)
	}
	id := connOf(ctx)
	cctx := context.WithValue(context.Background(), connKey{}, id)
	if p, ok := peer.FromContext(ctx); ok {
		cctx = peer.NewContext(cctx, p)
	}
	after := &afterReplyHook{}
	cctx = context.WithValue(cctx, afterReplyKey{}, after)
	cctx, cancel := context.WithCancel(cctx)
	c := &callChannel{
		d: s.d, set: s.d.chans, conn: uc, connID: id, ctx: cctx, cancel: cancel, after: after,
		jobs: make(chan callJob), busy: make(chan struct{}, 1), done: make(chan struct{}),
		poll: callPollWindow(s.d.cfg.CallChannelPoll),
	}
	if c.poll > 0 {
		if raw, err := uc.SyscallConn(); err == nil {
			c.raw = raw
		}
	}
	if err := s.d.chans.add(id, c); err != nil {
		cancel()
		_ = uc.Close()
		return nil, err
	}
	// The connection may have ended while the channel was being set up, after connEnded looked
	// for its channels: then the call's own context is done too.
	if ctx.Err() != nil {
		c.close()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); c.read() }()
	go func() { defer wg.Done(); c.work() }()
	go func() { wg.Wait(); close(c.done) }()
	return &enginepb.CallChannelResponse{
		MaxFrameBytes:   engineapi.MaxCallFrameBytes,
		MaxMessageBytes: uint64(s.d.sec.limits.MaxCallRequestBytes),
	}, nil
}

// checkCallSocket refuses a descriptor that is not a connected unix SOCK_SEQPACKET socket,
// naming what it is instead.
func checkCallSocket(f *os.File) error {
	fd := int(f.Fd())
	domain, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if errors.Is(err, unix.ENOTSOCK) {
		return fmt.Errorf("descriptor is %s, not a unix SOCK_SEQPACKET socket", describeFD(fd))
	}
	if err != nil {
		return fmt.Errorf("descriptor's socket domain: %w", err)
	}
	if domain != unix.AF_UNIX {
		return fmt.Errorf("descriptor is a socket of address family %d, not a unix (AF_UNIX) SOCK_SEQPACKET socket", domain)
	}
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return fmt.Errorf("descriptor's socket type: %w", err)
	}
	if typ != unix.SOCK_SEQPACKET {
		return fmt.Errorf("descriptor is a unix %s socket, not SOCK_SEQPACKET (create it with socketpair(AF_UNIX, SOCK_SEQPACKET))", sockTypeName(typ))
	}
	if acc, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err == nil && acc != 0 {
		return errors.New("descriptor is a listening unix SOCK_SEQPACKET socket, not one end of a socket pair")
	}
	if _, err := unix.Getpeername(fd); err != nil {
		return fmt.Errorf("descriptor is a unix SOCK_SEQPACKET socket that is not connected (%w), not one end of a socket pair", err)
	}
	return nil
}

func sockTypeName(t int) string {
	switch t {
	case unix.SOCK_STREAM:
		return "SOCK_STREAM"
	case unix.SOCK_DGRAM:
		return "SOCK_DGRAM"
	case unix.SOCK_RAW:
		return "SOCK_RAW"
	}
	return fmt.Sprintf("type %d", t)
}

// describeFD names the kind of file fd is.
func describeFD(fd int) string {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "a descriptor that cannot be examined"
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFIFO:
		return "a pipe"
	case unix.S_IFREG:
		return "a regular file (or memfd)"
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	}
	return fmt.Sprintf("a file of mode %#o", st.Mode&unix.S_IFMT)
}

// close ends the channel: its call is cancelled and its socket closed. It may be called any
// number of times, from anywhere.
func (c *callChannel) close() {
	c.closeOnce.Do(func() {
		c.cancel()
		_ = c.conn.Close()
		c.set.remove(c)
	})
}

// read joins frames into messages and hands them, or the refusal of a bad one, to the worker.
func (c *callChannel) read() {
	defer c.close()
	limit := c.d.sec.limits.MaxCallRequestBytes
	asm := engineapi.NewCallAssembler(limit)
	buf := make([]byte, engineapi.MaxCallFrameBytes+1)
	var bodies [2][]byte
	next := 0
	for {
		n, truncated, err := c.recv(buf)
		if err != nil {
			return
		}
		c.active.Store(callPollNow())
		frame := buf[:n]
		reason := frameProblem(frame, truncated)
		msg, hdr, err := asm.Add(frame)
		if reason == refusedFrameTooLarge {
			err = fmt.Errorf("%w: a frame of more than %d bytes (the socket cut it short)", engineapi.ErrCallFrame, engineapi.MaxCallFrameBytes)
		}
		if err != nil {
			code := codes.InvalidArgument
			if reason == "" {
				reason = refusedInterleaved
				if tooLarge := (*engineapi.CallMessageTooLargeError)(nil); errors.As(err, &tooLarge) {
					reason, code = refusedMessageTooLong, codes.ResourceExhausted
					err = fmt.Errorf("%w (max call request bytes); send it over gRPC instead", err)
				}
			}
			c.set.refused.WithLabelValues(reason).Inc()
			// The frame errors name the call channel already ("call channel frame: ...").
			if !c.hand(callJob{hdr: hdr, refuse: true, code: code, msg: err.Error()}) {
				return
			}
			continue
		}
		if msg == nil {
			continue
		}
		// The message's body is the read buffer's or the assembler's, which the next frame
		// overwrites: the worker gets a copy in one of two buffers, used in turn. The worker
		// takes one job at a time and only after it answered the one before, so when the
		// handing of a job returns, the buffer of the job before it is free again; the reader
		// goes back to reading without waiting for the worker to decode.
		body := append(bodies[next][:0], msg.Body...)
		if cap(body) > 1<<20 {
			bodies[next] = nil // a buffer grown for one large request is not kept
		} else {
			bodies[next] = body
		}
		next ^= 1
		if !c.hand(callJob{hdr: msg.Header, body: body}) {
			return
		}
	}
}

// frameProblem is the reason a frame is refused for its own sake, "" when it is well formed.
func frameProblem(frame []byte, truncated bool) string {
	switch {
	case len(frame) < engineapi.CallFrameHeaderBytes:
		return refusedShort
	case binary.LittleEndian.Uint32(frame) != engineapi.CallFrameMagic:
		return refusedMagic
	case truncated || len(frame) > engineapi.MaxCallFrameBytes:
		return refusedFrameTooLarge
	case frame[6]&^engineapi.CallFrameMore != 0:
		return refusedFlags
	}
	return ""
}

// hand gives the worker a job; false once the channel is closed.
func (c *callChannel) hand(j callJob) bool {
	select {
	case c.jobs <- j:
		return true
	case <-c.ctx.Done():
		return false
	}
}

// work runs the calls the reader hands it, one at a time, and writes their responses.
func (c *callChannel) work() {
	defer c.close()
	for {
		var j callJob
		select {
		case j = <-c.jobs:
		case <-c.ctx.Done():
			return
		}
		select {
		case c.busy <- struct{}{}:
		case <-c.ctx.Done():
			return
		}
		c.callStart.Store(callPollNow())
		c.after.f = nil
		ok := c.serve(j)
		c.active.Store(callPollNow())
		c.callStart.Store(0)
		if f := c.after.f; f != nil && ok {
			c.after.f = nil
			f()
		}
		<-c.busy
		if !ok {
			return
		}
	}
}

// serve answers one job; false when the response could not be written.
func (c *callChannel) serve(j callJob) bool {
	if j.refuse {
		return c.reply(j.hdr, j.code, []byte(engineapi.CallErrorMessage(j.msg)))
	}
	h := callHandlers[j.hdr.Method]
	if h == nil {
		c.set.refused.WithLabelValues(refusedUnknownMethod).Inc()
		return c.reply(j.hdr, codes.Unimplemented, []byte(fmt.Sprintf("call channel: unknown method number %d", j.hdr.Method)))
	}
	name := engineapi.CallMethodName(j.hdr.Method)
	// A region per call for `go tool trace` (free when no trace runs).
	defer trace.StartRegion(c.ctx, "callchannel "+name).End()
	dec := func(v any) error {
		if err := engineapi.UnmarshalCall(j.body, v); err != nil {
			c.set.refused.WithLabelValues(refusedUndecodable).Inc()
			return status.Errorf(codes.InvalidArgument, "call channel: %s request of %d bytes does not decode: %v", name[strings.LastIndexByte(name, '/')+1:], len(j.body), err)
		}
		return nil
	}
	resp, err := h(c.d.svc, c.ctx, dec, c.d.intercept)
	if err != nil {
		st := status.Convert(err)
		return c.reply(j.hdr, st.Code(), []byte(engineapi.CallErrorMessage(st.Message())))
	}
	c.resp, err = engineapi.AppendCall(c.resp[:0], resp)
	if err == nil && len(c.resp) > engineapi.MaxMessageBytes {
		err = fmt.Errorf("a response of %d bytes, above the limit of %d", len(c.resp), engineapi.MaxMessageBytes)
	}
	if err != nil {
		return c.reply(j.hdr, codes.Internal, []byte(engineapi.CallErrorMessage("call channel: "+err.Error())))
	}
	ok := c.reply(j.hdr, codes.OK, c.resp)
	// A buffer grown for one large response is not kept for the small ones that usually follow.
	if cap(c.resp) > 1<<20 {
		c.resp = nil
	}
	return ok
}

// reply writes one response message, under the write deadline.
func (c *callChannel) reply(h engineapi.CallHeader, code codes.Code, body []byte) bool {
	h.Status = uint8(code)
	timeout := c.d.cfg.CallChannelWriteTimeout
	if timeout <= 0 {
		timeout = DefaultCallChannelWriteTimeout
	}
	_ = c.conn.SetWriteDeadline(time.Now().Add(timeout))
	var err error
	c.out, err = engineapi.AppendCallFrames(c.out[:0], h, body, func(frame []byte) error {
		_, werr := c.conn.Write(frame)
		return werr
	})
	if cap(c.out) > 2*engineapi.MaxCallFrameBytes {
		c.out = nil
	}
	if err == nil {
		return true
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		c.d.log.Warn("closed a call channel whose engine does not read its replies", "timeout", timeout, "conn", c.connID)
	}
	return false
}
