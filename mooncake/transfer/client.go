package transfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// Client defaults applied by NewClient to zero ClientOptions fields.
const (
	DefaultClientTimeout  = 30 * time.Second
	DefaultDialTimeout    = 5 * time.Second
	DefaultMaxIdlePerPeer = 8
)

// ErrRefused reports a request the target refused with a status frame.
var ErrRefused = errors.New("transfer refused by target")

// RefusedError is the target's refusal of one request; it wraps ErrRefused.
type RefusedError struct {
	Peer   string
	Op     Op
	Addr   uint64
	Size   uint64
	Status uint32
}

// Error names the peer, the operation, the address range and the status.
func (e *RefusedError) Error() string {
	why := "unknown status"
	if e.Status == StatusAddrRejected {
		why = "address rejected"
	}
	return fmt.Sprintf("transfer %s of %d bytes at %#x: %s refused it (status %d: %s)",
		e.Op, e.Size, e.Addr, e.Peer, e.Status, why)
}

// Unwrap returns ErrRefused.
func (e *RefusedError) Unwrap() error { return ErrRefused }

// ClientOptions configures a Client. Zero fields take the Default… values.
type ClientOptions struct {
	// Timeout bounds one Read or Write when its ctx has no deadline.
	Timeout time.Duration
	// DialTimeout bounds connecting to a peer.
	DialTimeout time.Duration
	// MaxIdlePerPeer is how many idle connections to keep per peer for reuse.
	MaxIdlePerPeer int
	// Legacy speaks v1 framing (no status frames), for targets whose descriptor has no
	// tcp_proto_version ≥ 2. A v1 WRITE completes when its bytes are sent, not when applied.
	Legacy bool
}

// Client reads and writes peers' registered memory. It keeps a few idle connections per peer.
type Client struct {
	opts   ClientOptions
	dialer net.Dialer

	mu     sync.Mutex
	idle   map[string][]net.Conn
	closed bool
}

// NewClient returns a Client. Close releases its idle connections.
func NewClient(opts ClientOptions) *Client {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultClientTimeout
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = DefaultDialTimeout
	}
	if opts.MaxIdlePerPeer <= 0 {
		opts.MaxIdlePerPeer = DefaultMaxIdlePerPeer
	}
	return &Client{
		opts:   opts,
		dialer: net.Dialer{Timeout: opts.DialTimeout, KeepAlive: 15 * time.Second},
		idle:   make(map[string][]net.Conn),
	}
}

// Read fills dst from the peer's memory at [addr, addr+len(dst)). peer is the target's TCP
// data address, host:port. An empty dst is a no-op that does not contact the peer.
func (c *Client) Read(ctx context.Context, peer string, addr uint64, dst []byte) error {
	return c.do(ctx, peer, OpRead, addr, [][]byte{dst})
}

// ReadPieces is Read into several buffers filled in order, as one request for the sum of their
// lengths: the payload is read straight into them (readv on a TCP connection), so bytes bound
// for memory that lies apart are not gathered into one buffer first. Empty pieces are skipped;
// if every piece is empty the peer is not contacted.
func (c *Client) ReadPieces(ctx context.Context, peer string, addr uint64, dsts [][]byte) error {
	return c.do(ctx, peer, OpRead, addr, dsts)
}

// Write copies src to the peer's memory at [addr, addr+len(src)). Under v2 framing it returns
// nil only once the target acknowledged that the bytes are applied. An empty src is a no-op.
func (c *Client) Write(ctx context.Context, peer string, addr uint64, src []byte) error {
	return c.do(ctx, peer, OpWrite, addr, [][]byte{src})
}

// WritePieces is Write of several buffers, in order, as one request for the sum of their
// lengths, sent from where they lie (writev). Empty pieces are skipped; if every piece is
// empty the peer is not contacted.
func (c *Client) WritePieces(ctx context.Context, peer string, addr uint64, srcs [][]byte) error {
	return c.do(ctx, peer, OpWrite, addr, srcs)
}

// Close closes the idle connections; Reads and Writes in flight finish on their own.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for _, conns := range c.idle {
		for _, conn := range conns {
			_ = conn.Close()
		}
	}
	c.idle = make(map[string][]net.Conn)
	return nil
}

func (c *Client) do(ctx context.Context, peer string, op Op, addr uint64, b [][]byte) error {
	var size uint64
	for _, p := range b {
		size += uint64(len(p))
	}
	if size == 0 {
		return nil
	}
	if addr+size < addr {
		return fmt.Errorf("transfer %s of %d bytes at %#x on %s: range overflows 64 bits", op, size, addr, peer)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opts.Timeout)
		defer cancel()
	}
	// A pooled connection the target closed while idle fails before any reply byte; such a
	// request is repeated once on a fresh connection (READ and WRITE of the same bytes are
	// idempotent).
	for attempt := 0; ; attempt++ {
		conn, reused, err := c.conn(ctx, peer)
		if err != nil {
			return fmt.Errorf("transfer %s of %d bytes at %#x: dial %s: %w", op, size, addr, peer, err)
		}
		replied, err := c.roundTrip(ctx, conn, peer, op, addr, size, b)
		if err == nil {
			c.release(peer, conn)
			return nil
		}
		_ = conn.Close()
		var refused *RefusedError
		if errors.As(err, &refused) {
			return err
		}
		if cerr := ctx.Err(); cerr != nil || errors.Is(err, os.ErrDeadlineExceeded) {
			// The socket deadline is the ctx deadline; its timer may fire before ctx's own.
			if cerr == nil {
				cerr = context.DeadlineExceeded
			}
			return fmt.Errorf("transfer %s of %d bytes at %#x on %s: %w (%w)", op, size, addr, peer, cerr, err)
		}
		if !replied && reused && attempt == 0 {
			continue
		}
		return fmt.Errorf("transfer %s of %d bytes at %#x on %s: %w", op, size, addr, peer, err)
	}
}

// conn returns an idle connection to peer or dials one; reused tells which.
func (c *Client) conn(ctx context.Context, peer string) (net.Conn, bool, error) {
	c.mu.Lock()
	if l := c.idle[peer]; len(l) > 0 {
		conn := l[len(l)-1]
		c.idle[peer] = l[:len(l)-1]
		c.mu.Unlock()
		return conn, true, nil
	}
	c.mu.Unlock()
	conn, err := c.dialer.DialContext(ctx, "tcp", peer)
	return conn, false, err
}

func (c *Client) release(peer string, conn net.Conn) {
	_ = conn.SetDeadline(time.Time{})
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || len(c.idle[peer]) >= c.opts.MaxIdlePerPeer {
		_ = conn.Close()
		return
	}
	c.idle[peer] = append(c.idle[peer], conn)
}

// roundTrip runs one request for size bytes, those of the pieces b, on conn. replied reports
// whether any reply byte arrived (after which the request is never repeated).
func (c *Client) roundTrip(ctx context.Context, conn net.Conn, peer string, op Op, addr, size uint64, b [][]byte) (replied bool, err error) {
	deadline, _ := ctx.Deadline()
	if err := conn.SetDeadline(deadline); err != nil {
		return false, err
	}
	// Cancellation unblocks the socket by moving its deadline into the past.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	v2 := !c.opts.Legacy
	var hdr [HeaderSize]byte
	AppendHeader(hdr[:0], Header{Size: size, Addr: addr, Opcode: uint8(op), V2: v2})
	refusal := func(code uint32) error {
		return &RefusedError{Peer: peer, Op: op, Addr: addr, Size: size, Status: code}
	}

	if op == OpRead {
		if _, err := conn.Write(hdr[:]); err != nil {
			return false, err
		}
		if v2 {
			var st [StatusFrameSize]byte
			if _, err := io.ReadFull(conn, st[:]); err != nil {
				return false, fmt.Errorf("reading status frame: %w", err)
			}
			code, err := DecodeStatus(st[:])
			if err != nil {
				return true, err
			}
			if code != StatusOK {
				return true, refusal(code)
			}
		}
		n, err := readPieces(conn, b)
		if err != nil {
			if !v2 && n == 0 && errors.Is(err, io.EOF) {
				// A v1 target refuses by closing: nothing tells it from a dropped connection.
				return false, fmt.Errorf("target closed the connection without data (v1 framing: refused or gone): %w", err)
			}
			return v2 || n > 0, fmt.Errorf("reading payload after %d of %d bytes: %w", n, size, err)
		}
		return true, nil
	}

	// The header and the pieces in one writev (net.Buffers); the list is the call's own, as
	// WriteTo consumes it.
	bufs := make(net.Buffers, 0, 1+len(b))
	bufs = append(append(bufs, hdr[:]), b...)
	if !v2 {
		_, err := bufs.WriteTo(conn)
		return false, err
	}
	// v2 WRITE: the status frame is read while the body is still being sent, so a refusal
	// that arrives early ends the transfer instead of deadlocking on full socket buffers.
	type result struct {
		code uint32
		err  error
	}
	ack := make(chan result, 1)
	go func() {
		var st [StatusFrameSize]byte
		if _, err := io.ReadFull(conn, st[:]); err != nil {
			ack <- result{err: fmt.Errorf("reading status frame: %w", err)}
			return
		}
		code, err := DecodeStatus(st[:])
		ack <- result{code: code, err: err}
	}()
	_, werr := bufs.WriteTo(conn)
	if werr != nil {
		// The body could not be sent; a refusal may already be on its way. Wait for the
		// reader, which ends at the latest at the deadline or when the peer closes.
		_ = conn.SetReadDeadline(time.Now().Add(time.Second))
	}
	r := <-ack
	switch {
	case r.err == nil && r.code != StatusOK:
		return true, refusal(r.code)
	case r.err != nil && werr != nil:
		return false, fmt.Errorf("sending payload: %w", werr)
	case r.err != nil:
		var malformed bool
		if errors.Is(r.err, ErrMalformed) {
			malformed = true
		}
		return malformed, r.err
	case werr != nil:
		return true, fmt.Errorf("sending payload: %w", werr)
	}
	return true, nil
}
