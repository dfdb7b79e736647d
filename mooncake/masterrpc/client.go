package masterrpc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvctl/kvctl/core/backoff"
)

// ProtocolVersion is the store protocol version kvctl speaks: what the master's ServiceReady
// returns in MooncakeRelease. Mooncake's own client refuses a master that answers anything
// else, and so does kvctl.
const ProtocolVersion = "2.0.0"

// MooncakeRelease is the Mooncake release whose master kvctl is proven against.
const MooncakeRelease = "0.3.13.post1"

var (
	// ErrProtocol reports a master whose framing or message types kvctl does not know.
	ErrProtocol = errors.New("mooncake master protocol mismatch")
	// ErrUnavailable reports a master that cannot be reached or dropped the connection.
	ErrUnavailable = errors.New("mooncake master unreachable")
	// ErrClosed reports a call on a closed Client.
	ErrClosed = errors.New("master client closed")
)

// VersionError reports a master that answered ServiceReady with another store protocol
// version.
type VersionError struct {
	Addr   string
	Master string
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("mooncake master at %s speaks store protocol %q; kvctl speaks %q (Mooncake %s)",
		e.Addr, e.Master, ProtocolVersion, MooncakeRelease)
}

// Unwrap makes a VersionError an ErrProtocol.
func (e *VersionError) Unwrap() error { return ErrProtocol }

// CodeError is an error code the master returned for a call (a Mooncake ErrorCode).
type CodeError struct {
	Method string
	Code   int32
}

func (e *CodeError) Error() string {
	return fmt.Sprintf("mooncake master %s: error code %d", e.Method, e.Code)
}

// Options configure a Client.
type Options struct {
	// Addr is the master's RPC address, host:port (mooncake_master --rpc_port).
	Addr string
	// CallTimeout bounds a call whose context has no deadline; 10 s when zero.
	CallTimeout time.Duration
	// DialTimeout bounds connecting and the ServiceReady handshake; 5 s when zero.
	DialTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait between failed connection attempts, which
	// doubles from MinBackoff (50 ms) to MaxBackoff (2 s), each wait drawn from the upper half of
	// its step (core/backoff). Calls made while waiting fail at
	// once with ErrUnavailable instead of queueing behind a dead master.
	MinBackoff time.Duration
	MaxBackoff time.Duration
	// Conns is the number of TCP connections the client keeps to the master (DefaultConns
	// when zero, at most MaxConns). The master runs the calls of one connection one after
	// another, each connection on one of its --rpc_thread_num threads, so a call queues behind
	// every call sent before it on its connection; each call goes to the connection with the
	// fewest calls in flight. The client opens them all at its first call (and again after
	// losing them all); one that breaks alone is opened again when a call finds every other
	// busy. A client that makes one call at a time (a health probe) wants 1.
	Conns int
}

// DefaultConns is the connection bound of a client whose Options name none; MaxConns the
// largest bound a client takes (a larger Conns is lowered to it).
const (
	DefaultConns = 4
	MaxConns     = 64
)

// Client is a coro_rpc client of mooncake_master over a small set of TCP connections (at most
// Options.Conns). Each call goes to the open connection with the fewest calls in flight; calls
// that share a connection are matched to their responses by sequence number, so a caller that
// gives up does not hold the others. When a connection breaks, the calls in flight on it fail
// with ErrUnavailable and a later call dials again (after a backoff while dials fail) and
// repeats the version handshake. Client is safe for concurrent use.
type Client struct {
	opts Options

	mu       sync.Mutex
	conns    []*conn // open connections, at most opts.Conns
	dialing  chan struct{}
	nextDial time.Time
	backoff  backoff.Backoff // jittered, so a fleet does not redial a restarted master in lockstep
	lastErr  error
	gen      uint64
	lost     bool   // a connection broke since the last successful dial
	losses   uint64 // connections found broken, ever
	closed   bool
}

type result struct {
	body []byte
	err  error
}

type conn struct {
	nc   net.Conn
	rd   *bufio.Reader // read only by the holder of rsem (or the handshake before sharing)
	addr string
	// inflight counts the calls using the connection; a call goes to the least busy one.
	inflight atomic.Int32
	// rsem is held by the one caller that reads responses off the connection; it hands each
	// other caller's response to that caller's channel and gives the role up once its own
	// has arrived. A lone caller so reads its own response, with no hand-off between
	// goroutines.
	rsem chan struct{}

	wmu sync.Mutex

	mu      sync.Mutex
	seq     uint32
	pending map[uint32]chan result
	err     error
}

// Dial connects to the master at opts.Addr and checks that it speaks ProtocolVersion. A
// master of another version is a *VersionError; a peer that is not a Mooncake master is an
// ErrProtocol error; an unreachable one ErrUnavailable. It opens Options.Conns connections.
func Dial(ctx context.Context, opts Options) (*Client, error) {
	c := New(opts)
	cn, err := c.get(ctx)
	if err != nil {
		return nil, err
	}
	cn.inflight.Add(-1)
	return c, nil
}

// New returns a Client that connects on its first call.
func New(opts Options) *Client {
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = 10 * time.Second
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 5 * time.Second
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 50 * time.Millisecond
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(2*time.Second, opts.MinBackoff)
	}
	if opts.Conns <= 0 {
		opts.Conns = DefaultConns
	}
	opts.Conns = min(opts.Conns, MaxConns)
	return &Client{opts: opts}
}

// Addr returns the master address the client talks to.
func (c *Client) Addr() string { return c.opts.Addr }

// Conns returns the bound on the client's connections (Options.Conns after defaults).
func (c *Client) Conns() int { return c.opts.Conns }

// OpenConns returns the number of connections open now.
func (c *Client) OpenConns() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.conns)
}

// Generation changes when the client connects after having lost a connection (so after the
// master restarted), when a segment owner must check that its segments are still mounted. The
// first connection counts as one; opening another connection beside working ones does not
// change it.
func (c *Client) Generation() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// Close closes the connections; calls in flight fail with ErrClosed, and so does every later
// call.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	conns := c.conns
	c.conns = nil
	c.mu.Unlock()
	for _, cn := range conns {
		cn.fail(ErrClosed)
	}
	return nil
}

// get returns the connection a call goes to, counted in its inflight until the caller
// subtracts it: the open connection with the fewest calls in flight. With none open, a call
// waits for the dial in progress, fails at once during the backoff, or dials Conns
// connections. When all open ones are busy and fewer than Conns are open (one broke), the
// caller dials another (one dial at a time; while another caller dials, or while a failed
// dial's backoff runs, the call shares an open connection).
func (c *Client) get(ctx context.Context) (*conn, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		var best *conn
		var load int32
		for _, cn := range c.conns {
			if l := cn.inflight.Load(); best == nil || l < load {
				best, load = cn, l
			}
		}
		if best != nil && (load == 0 || len(c.conns) >= c.opts.Conns || c.dialing != nil || time.Now().Before(c.nextDial)) {
			best.inflight.Add(1)
			c.mu.Unlock()
			return best, nil
		}
		if ch := c.dialing; ch != nil {
			c.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("%w: %s: %w", ErrUnavailable, c.opts.Addr, ctx.Err())
			}
		}
		if wait := time.Until(c.nextDial); wait > 0 {
			last := c.lastErr
			c.mu.Unlock()
			return nil, fmt.Errorf("%w: %s (next attempt in %v): %w", ErrUnavailable, c.opts.Addr, wait.Round(time.Millisecond), last)
		}
		ch := make(chan struct{})
		c.dialing = ch
		fill := 1
		if best == nil {
			fill = c.opts.Conns
		}
		c.mu.Unlock()

		cn, err := c.dial(ctx)
		// With none open, open them all back to back: the master hands its accepted
		// connections to its threads in turn, so connections opened together land on
		// different threads.
		var more []*conn
		var moreErr error
		for err == nil && len(more) < fill-1 {
			var m *conn
			if m, moreErr = c.dial(ctx); moreErr != nil {
				break
			}
			more = append(more, m)
		}

		c.mu.Lock()
		c.dialing = nil
		close(ch)
		c.backoff.Min, c.backoff.Max = c.opts.MinBackoff, c.opts.MaxBackoff
		if err != nil {
			c.lastErr = err
			c.nextDial = time.Now().Add(c.backoff.Next())
			c.mu.Unlock()
			if best != nil {
				continue // an extra connection failed: share an open one (or fail fast if it broke too)
			}
			return nil, err
		}
		if c.closed {
			c.mu.Unlock()
			cn.fail(ErrClosed)
			for _, m := range more {
				m.fail(ErrClosed)
			}
			return nil, ErrClosed
		}
		c.conns = append(c.conns, cn)
		c.conns = append(c.conns, more...)
		c.backoff.Reset()
		if moreErr != nil {
			// Connected, but not as many times as wanted: more are tried when calls need them,
			// after the backoff.
			c.lastErr = moreErr
			c.nextDial = time.Now().Add(c.backoff.Next())
		}
		if c.gen == 0 || c.lost {
			c.gen++
			c.lost = false
		}
		cn.inflight.Add(1)
		c.mu.Unlock()
		return cn, nil
	}
}

func (c *Client) dial(ctx context.Context) (*conn, error) {
	dctx, cancel := context.WithTimeout(ctx, c.opts.DialTimeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(dctx, "tcp", c.opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	cn := &conn{nc: nc, rd: bufio.NewReaderSize(nc, 64<<10), addr: c.opts.Addr, rsem: make(chan struct{}, 1), pending: map[uint32]chan result{}}
	// The handshake runs before the connection is shared: read its one response inline.
	if dl, ok := dctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	body, err := cn.roundTripSync("ServiceReady", nil)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		err = fmt.Errorf("%w: %s accepted the connection but did not answer ServiceReady within %v (is it the master's --rpc_port?): %w",
			ErrUnavailable, c.opts.Addr, c.opts.DialTimeout, err)
	}
	if err == nil {
		var version string
		var code int32
		version, code, err = decodeString(body)
		switch {
		case err != nil:
			err = fmt.Errorf("%w: mooncake master at %s answered ServiceReady with a body kvctl cannot read (%w); kvctl speaks store protocol %q (Mooncake %s)",
				ErrProtocol, c.opts.Addr, err, ProtocolVersion, MooncakeRelease)
		case code != 0:
			err = fmt.Errorf("%w: %s: master not ready: %w", ErrUnavailable, c.opts.Addr, &CodeError{Method: "ServiceReady", Code: code})
		case version != ProtocolVersion:
			err = &VersionError{Addr: c.opts.Addr, Master: version}
		}
	}
	if err != nil {
		_ = nc.Close()
		return nil, err
	}
	_ = nc.SetDeadline(time.Time{})
	return cn, nil
}

// roundTripSync sends one request and reads its response on a connection no one else uses.
func (cn *conn) roundTripSync(method string, body []byte) ([]byte, error) {
	msg := appendRequestHeader(nil, 0, functionID(method), len(body))
	if _, err := cn.nc.Write(append(msg, body...)); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrUnavailable, cn.addr, err)
	}
	cn.seq = 1
	h, resp, err := readResponse(cn.rd)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", method, cn.addr, err)
	}
	if h.Seq != 0 {
		return nil, fmt.Errorf("%w: %s: response sequence %d to request 0", ErrProtocol, cn.addr, h.Seq)
	}
	if h.ErrCode != 0 {
		return nil, rpcError(cn.addr, h.ErrCode, resp)
	}
	return resp, nil
}

func rpcError(addr string, code uint8, body []byte) error {
	msg := body
	if len(msg) > 200 {
		msg = msg[:200]
	}
	return fmt.Errorf("%w: master at %s refused the call with coro_rpc error %d: %q (kvctl speaks Mooncake %s)",
		ErrProtocol, addr, code, msg, MooncakeRelease)
}

func readResponse(r io.Reader) (respHeader, []byte, error) {
	var hb [respHeaderLen]byte
	if _, err := io.ReadFull(r, hb[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return respHeader{}, nil, fmt.Errorf("%w: connection closed", ErrUnavailable)
		}
		return respHeader{}, nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	h, err := parseRespHeader(hb[:])
	if err != nil {
		return h, nil, err
	}
	body := make([]byte, int(h.Length)+int(h.AttachLen))
	if _, err := io.ReadFull(r, body); err != nil {
		return h, nil, fmt.Errorf("%w: reading a %d-byte response: %w", ErrUnavailable, len(body), err)
	}
	return h, body[:h.Length], nil
}

// broken drops cn after a read or write error: every call waiting on it fails and later calls
// use the other connections or dial again. The idle others are checked at once (sweep): when
// one connection broke because the master went away, they are dead too, and a call sent on
// one would fail.
func (c *Client) broken(cn *conn, err error) {
	c.drop(cn, err)
	c.sweep()
}

func (c *Client) drop(cn *conn, err error) {
	cn.fail(err)
	c.mu.Lock()
	if i := slices.Index(c.conns, cn); i >= 0 {
		c.conns = slices.Delete(c.conns, i, i+1)
		c.lastErr = err
		c.lost = true
		c.losses++
	}
	c.mu.Unlock()
}

// Losses checks the idle connections for ones the master closed, without waiting on any, and
// returns how many connections the client has found broken so far. A caller that keeps what
// the master answered (a read lease) compares two readings: a change means the master may have
// gone away meanwhile, a restarted master remembering nothing of it.
func (c *Client) Losses() uint64 {
	c.sweep()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.losses
}

// sweep drops the open connections whose peer has closed them, without waiting on any: a
// connection another caller is reading is left to that caller.
func (c *Client) sweep() {
	c.mu.Lock()
	conns := slices.Clone(c.conns)
	c.mu.Unlock()
	for _, cn := range conns {
		select {
		case cn.rsem <- struct{}{}:
		default:
			continue
		}
		err := cn.peerClosed()
		<-cn.rsem
		if err != nil {
			c.drop(cn, fmt.Errorf("%w: %s: %w", ErrUnavailable, cn.addr, err))
		}
	}
}

// peerClosed reports, without blocking, an error when the peer has closed or reset the
// connection; nil when it is open (or a response waits in it). The caller holds rsem.
func (cn *conn) peerClosed() error {
	if cn.rd.Buffered() > 0 {
		return nil
	}
	sc, ok := cn.nc.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	// A deadline a reader left behind would fail the check before it looks.
	_ = cn.nc.SetReadDeadline(time.Time{})
	var n int
	var rerr error
	var b [1]byte
	if err := rc.Read(func(fd uintptr) bool {
		n, _, rerr = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true // look once, never wait
	}); err != nil {
		return err
	}
	switch {
	case errors.Is(rerr, syscall.EAGAIN) || errors.Is(rerr, syscall.EINTR):
		return nil
	case rerr != nil:
		return rerr
	case n == 0:
		return io.EOF
	}
	return nil
}

// readFor reads responses as the connection's reader until the one for ch arrives or ctx ends,
// delivering the others to their callers. It reports whether it returned ch's result.
func (c *Client) readFor(ctx context.Context, cn *conn, ch chan result) (result, bool) {
	for {
		select {
		case r := <-ch: // delivered before this caller became the reader
			return r, true
		default:
		}
		// Wait for the next response no longer than this call may: a timeout before any byte
		// of it arrived leaves the stream intact for the next reader.
		dl, _ := ctx.Deadline()
		_ = cn.nc.SetReadDeadline(dl)
		if _, err := cn.rd.Peek(1); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return result{}, false
			}
			c.broken(cn, fmt.Errorf("%w: %s: %w", ErrUnavailable, cn.addr, err))
			return <-ch, true
		}
		// A response has started: read it whole, bounded by the call timeout however the
		// caller's context ends, since a frame cut in the middle would leave the stream
		// unusable.
		_ = cn.nc.SetReadDeadline(time.Now().Add(c.opts.CallTimeout))
		h, body, err := readResponse(cn.rd)
		if err != nil {
			c.broken(cn, err)
			return <-ch, true
		}
		cn.mu.Lock()
		dst, ok := cn.pending[h.Seq]
		delete(cn.pending, h.Seq)
		cn.mu.Unlock()
		if !ok {
			continue // its caller gave up (timeout); drop the late response
		}
		r := result{body: body}
		if h.ErrCode != 0 {
			r = result{err: rpcError(cn.addr, h.ErrCode, body)}
		}
		if dst == ch {
			return r, true
		}
		dst <- r
	}
}

// fail closes the connection and fails every call waiting on it.
func (cn *conn) fail(err error) {
	cn.mu.Lock()
	if cn.err == nil {
		cn.err = err
	}
	pending := cn.pending
	cn.pending = map[uint32]chan result{}
	cn.mu.Unlock()
	_ = cn.nc.Close()
	for _, ch := range pending {
		ch <- result{err: err}
	}
}

// call sends one request and waits for its response body. It takes body over: once written,
// the buffer goes back to the encoders' pool (putBuf), so body must come from pack (or nil).
func (c *Client) call(ctx context.Context, method string, body []byte) ([]byte, error) {
	if len(body) > maxRequestBody {
		return nil, fmt.Errorf("%s: request of %d bytes, above the %d-byte bound", method, len(body), maxRequestBody)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opts.CallTimeout)
		defer cancel()
	}
	cn, err := c.get(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", method, err)
	}
	defer cn.inflight.Add(-1)
	ch := make(chan result, 1)
	cn.mu.Lock()
	if cn.err != nil {
		err := cn.err
		cn.mu.Unlock()
		return nil, fmt.Errorf("%s: %w", method, err)
	}
	seq := cn.seq
	cn.seq++
	cn.pending[seq] = ch
	cn.mu.Unlock()

	// The header and the body go out in one writev, the body not copied behind the header.
	msg := net.Buffers{appendRequestHeader(make([]byte, 0, reqHeaderLen), seq, functionID(method), len(body)), body}
	cn.wmu.Lock()
	if err := ctx.Err(); err != nil {
		cn.wmu.Unlock()
		cn.mu.Lock()
		delete(cn.pending, seq)
		cn.mu.Unlock()
		return nil, fmt.Errorf("%s: %w: %s: %w", method, ErrUnavailable, cn.addr, err)
	}
	// A write cut short would leave the stream unusable for every caller, so it is bounded
	// by the call timeout, not by this caller's deadline.
	_ = cn.nc.SetWriteDeadline(time.Now().Add(c.opts.CallTimeout))
	_, werr := msg.WriteTo(cn.nc)
	cn.wmu.Unlock()
	putBuf(body) // written (or failed): no one reads it again
	if werr != nil {
		cn.mu.Lock()
		cause := cn.err
		cn.mu.Unlock()
		if cause != nil {
			// The connection was failed (Close, or a reader that found it broken) between
			// registering the call and writing it: that failure is the call's.
			return nil, fmt.Errorf("%s: %w", method, cause)
		}
		// A partial write leaves the stream unusable for everyone.
		err := fmt.Errorf("%w: %s: %w", ErrUnavailable, cn.addr, werr)
		c.broken(cn, err)
		return nil, fmt.Errorf("%s: %w", method, err)
	}
	for {
		var r result
		var got bool
		select {
		case r = <-ch:
			got = true
		case cn.rsem <- struct{}{}:
			r, got = c.readFor(ctx, cn, ch)
			<-cn.rsem
		case <-ctx.Done():
		}
		if got {
			if r.err != nil {
				return nil, fmt.Errorf("%s: %w", method, r.err)
			}
			return r.body, nil
		}
		if ctx.Err() != nil {
			cn.mu.Lock()
			_, waiting := cn.pending[seq]
			delete(cn.pending, seq)
			cn.mu.Unlock()
			if !waiting {
				// Answered (or failed) while giving up: the result is in ch.
				if r = <-ch; r.err != nil {
					return nil, fmt.Errorf("%s: %w", method, r.err)
				}
				return r.body, nil
			}
			return nil, fmt.Errorf("%s: %w: no answer from %s: %w", method, ErrUnavailable, cn.addr, ctx.Err())
		}
	}
}
