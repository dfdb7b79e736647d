package transfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvctl/kvctl/core/backoff"
)

// Defaults applied by NewServer to zero ServerOptions fields.
const (
	DefaultMaxConns       = 256
	DefaultIdleTimeout    = 2 * time.Minute
	DefaultIOTimeout      = 30 * time.Second
	DefaultMaxRequestSize = 256 << 20
	DefaultStagingBytes   = 512 << 20
	// DefaultMinRate is the slowest a request's payload may move on average: a request of
	// size bytes must finish within ReadTimeout (WriteTimeout for a READ) plus size /
	// DefaultMinRate seconds, however it trickles.
	DefaultMinRate = 16 << 20
)

// ioChunk is how many bytes move between deadline refreshes: a peer must make this much
// progress every ReadTimeout / WriteTimeout.
const ioChunk = 1 << 20

// refusalDrainBytes and refusalDrainTime (or ReadTimeout when shorter) bound what the server
// reads and discards after
// refusing a request, so that the initiator (still sending a WRITE body) receives the status
// frame and a clean close instead of a reset that can destroy the frame in flight.
const (
	refusalDrainBytes = 4 << 20
	refusalDrainTime  = 2 * time.Second
)

// ErrRegion reports a Register or Unregister call that does not fit the registered regions.
var ErrRegion = errors.New("invalid transfer region")

// ServerOptions configures a Server. Zero fields take the Default… values.
type ServerOptions struct {
	// Addr is the TCP address to listen on, "127.0.0.1:0" when empty.
	Addr string
	// MaxConns caps the connections served at once; further connections are closed on
	// accept.
	MaxConns int
	// IdleTimeout closes a connection that sends no header for this long between requests.
	IdleTimeout time.Duration
	// ReadTimeout closes a connection whose request (header rest or WRITE body) makes no
	// progress (1 MiB) for this long.
	ReadTimeout time.Duration
	// WriteTimeout closes a connection whose reply (status frame or READ payload) the peer
	// does not take (1 MiB) for this long.
	WriteTimeout time.Duration
	// MaxRequestSize refuses requests larger than this many bytes.
	MaxRequestSize uint64
	// StagingBytes bounds the memory all in-flight requests stage at once (see the package
	// documentation). It is raised to MaxRequestSize when smaller.
	StagingBytes int64
	// PeerStagingBytes bounds the staging the requests of one peer (a remote IP address) hold
	// at once, so that peers stalling their transfers cannot take the staging other peers'
	// transfers need. Default: half of StagingBytes; raised to MaxRequestSize when smaller.
	PeerStagingBytes int64
	// MinRate is the slowest average rate, in bytes a second, at which a request's payload
	// must move: past ReadTimeout (WriteTimeout for a READ) plus size/MinRate the request is
	// cut off, so a peer that drips its payload cannot hold staging for long. Default
	// DefaultMinRate.
	MinRate int64
	// Logger receives a line per refused request, at most one a second (each says how many
	// refusals went unlogged before it); nil discards them.
	Logger *slog.Logger
}

// ServerStats counts what a Server has done since it started.
type ServerStats struct {
	// Conns is the number of connections open now.
	Conns int64 `json:"conns"`
	// ConnsRejected counts connections closed on accept because MaxConns were open.
	ConnsRejected uint64 `json:"conns_rejected"`
	// Reads and Writes count requests served in full.
	Reads  uint64 `json:"reads"`
	Writes uint64 `json:"writes"`
	// BytesRead and BytesWritten count payload bytes of those requests, seen from the
	// initiator: bytes it read from and wrote to this server's memory.
	BytesRead    uint64 `json:"bytes_read"`
	BytesWritten uint64 `json:"bytes_written"`
	// Refused counts requests answered with a refusal (or, under v1, a close).
	Refused uint64 `json:"refused"`
	// Aborted counts requests cut off by a deadline or the peer before they completed.
	Aborted uint64 `json:"aborted"`
	// V1Requests counts the requests among Reads and Writes that used v1 framing.
	V1Requests uint64 `json:"v1_requests"`
}

// Server serves registered memory to Transfer Engine initiators over TCP.
type Server struct {
	opts ServerOptions
	ln   net.Listener
	log  *slog.Logger

	mu      sync.RWMutex
	regions []*region // sorted by base, non-overlapping

	staging *weighted
	peers   peerShares
	bufs    bufferPool
	// ctx ends at Close, so requests waiting for staging room give up at once.
	ctx    context.Context
	cancel context.CancelFunc

	connMu sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup

	lastRefusalLog   atomic.Int64 // unix nanoseconds of the last refusal logged
	unloggedRefusals atomic.Uint64

	stats struct {
		conns                        atomic.Int64
		connsRejected, reads, writes atomic.Uint64
		bytesRead, bytesWritten      atomic.Uint64
		refused, aborted, v1         atomic.Uint64
	}
}

type region struct {
	base uint64
	mem  []byte
	mu   sync.RWMutex
	gone bool // set under mu once Unregister has taken the region away
}

func (r *region) end() uint64 { return r.base + uint64(len(r.mem)) }

// NewServer listens on opts.Addr. Call Serve to accept connections and Close to stop.
func NewServer(opts ServerOptions) (*Server, error) {
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = DefaultMaxConns
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	if opts.ReadTimeout <= 0 {
		opts.ReadTimeout = DefaultIOTimeout
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = DefaultIOTimeout
	}
	if opts.MaxRequestSize == 0 {
		opts.MaxRequestSize = DefaultMaxRequestSize
	}
	if opts.StagingBytes <= 0 {
		opts.StagingBytes = DefaultStagingBytes
	}
	if uint64(opts.StagingBytes) < opts.MaxRequestSize {
		opts.StagingBytes = int64(opts.MaxRequestSize)
	}
	if opts.PeerStagingBytes <= 0 {
		opts.PeerStagingBytes = opts.StagingBytes / 2
	}
	if uint64(opts.PeerStagingBytes) < opts.MaxRequestSize {
		opts.PeerStagingBytes = int64(opts.MaxRequestSize)
	}
	opts.PeerStagingBytes = min(opts.PeerStagingBytes, opts.StagingBytes)
	if opts.MinRate <= 0 {
		opts.MinRate = DefaultMinRate
	}
	lc := net.ListenConfig{KeepAlive: 15 * time.Second}
	ln, err := lc.Listen(context.Background(), "tcp", opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("transfer server: listen on %s: %w", opts.Addr, err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{
		ctx:     ctx,
		cancel:  cancel,
		opts:    opts,
		ln:      ln,
		log:     log,
		staging: newWeighted(opts.StagingBytes),
		peers:   peerShares{size: opts.PeerStagingBytes, m: map[string]*peerShare{}},
		conns:   make(map[net.Conn]struct{}),
	}, nil
}

// Addr returns the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Port returns the TCP port the server listens on (the descriptor's tcp_data_port).
func (s *Server) Port() int {
	if a, ok := s.ln.Addr().(*net.TCPAddr); ok {
		return a.Port
	}
	return 0
}

// Register serves mem at the absolute addresses [base, base+len(mem)). The server reads and
// writes mem until Unregister(base) returns. Regions may not overlap, be empty, start at 0 or
// wrap past 2^64.
func (s *Server) Register(base uint64, mem []byte) error {
	if len(mem) == 0 {
		return fmt.Errorf("%w: empty region at %#x", ErrRegion, base)
	}
	if base == 0 {
		return fmt.Errorf("%w: region of %d bytes at address 0 (Mooncake treats 0 as no buffer)", ErrRegion, len(mem))
	}
	end := base + uint64(len(mem))
	if end < base {
		return fmt.Errorf("%w: region [%#x, +%d) wraps past 2^64", ErrRegion, base, len(mem))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	i := sort.Search(len(s.regions), func(i int) bool { return s.regions[i].base >= base })
	if i > 0 && s.regions[i-1].end() > base {
		p := s.regions[i-1]
		return fmt.Errorf("%w: [%#x, %#x) overlaps registered [%#x, %#x)", ErrRegion, base, end, p.base, p.end())
	}
	if i < len(s.regions) && s.regions[i].base < end {
		n := s.regions[i]
		return fmt.Errorf("%w: [%#x, %#x) overlaps registered [%#x, %#x)", ErrRegion, base, end, n.base, n.end())
	}
	s.regions = append(s.regions, nil)
	copy(s.regions[i+1:], s.regions[i:])
	s.regions[i] = &region{base: base, mem: mem}
	return nil
}

// Unregister stops serving the region registered at base. It waits for requests copying to
// or from the region; once it returns the server never touches that memory again. Unknown
// bases are ignored.
func (s *Server) Unregister(base uint64) {
	s.mu.Lock()
	var r *region
	for i, x := range s.regions {
		if x.base == base {
			r = x
			s.regions = append(s.regions[:i], s.regions[i+1:]...)
			break
		}
	}
	s.mu.Unlock()
	if r == nil {
		return
	}
	r.mu.Lock()
	r.gone = true
	r.mem = nil
	r.mu.Unlock()
}

// lookup returns the region holding [addr, addr+size) whole, or nil.
func (s *Server) lookup(addr, size uint64) *region {
	end := addr + size
	if size == 0 || end < addr {
		return nil
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	i := sort.Search(len(s.regions), func(i int) bool { return s.regions[i].base > addr })
	if i == 0 {
		return nil
	}
	r := s.regions[i-1]
	if end > r.end() {
		return nil
	}
	return r
}

// ReadAt copies [addr, addr+len(dst)) of registered memory into dst under the region's read
// lock, so it never observes a remote WRITE half applied.
func (s *Server) ReadAt(addr uint64, dst []byte) error {
	return s.access(addr, dst, false)
}

// WriteAt copies src into registered memory at addr under the region's write lock.
func (s *Server) WriteAt(addr uint64, src []byte) error {
	return s.access(addr, src, true)
}

func (s *Server) access(addr uint64, b []byte, write bool) error {
	if len(b) == 0 {
		return nil
	}
	r := s.lookup(addr, uint64(len(b)))
	if r == nil {
		return fmt.Errorf("%w: [%#x, +%d) is not inside one registered region", ErrRegion, addr, len(b))
	}
	if !r.copy(addr, b, write) {
		return fmt.Errorf("%w: region at %#x was unregistered", ErrRegion, r.base)
	}
	return nil
}

// copy moves bytes between b and the region under its lock; false when the region is gone.
func (r *region) copy(addr uint64, b []byte, write bool) bool {
	if write {
		r.mu.Lock()
		defer r.mu.Unlock()
	} else {
		r.mu.RLock()
		defer r.mu.RUnlock()
	}
	if r.gone {
		return false
	}
	off := addr - r.base
	if write {
		copy(r.mem[off:], b)
	} else {
		copy(b, r.mem[off:off+uint64(len(b))])
	}
	return true
}

// writeChunks copies consecutive chunks into the region at addr under its write lock, so a
// READ sees the range before or after the whole WRITE; false when the region is gone.
func (r *region) writeChunks(addr uint64, chunks [][]byte) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gone {
		return false
	}
	off := addr - r.base
	for _, b := range chunks {
		off += uint64(copy(r.mem[off:], b))
	}
	return true
}

// peerShares holds one staging semaphore per peer address with connections open.
type peerShares struct {
	size int64
	mu   sync.Mutex
	m    map[string]*peerShare
}

type peerShare struct {
	key  string
	w    *weighted
	refs int
}

func (p *peerShares) get(key string) *peerShare {
	p.mu.Lock()
	defer p.mu.Unlock()
	ps, ok := p.m[key]
	if !ok {
		ps = &peerShare{key: key, w: newWeighted(p.size)}
		p.m[key] = ps
	}
	ps.refs++
	return ps
}

func (p *peerShares) put(ps *peerShare) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ps.refs--; ps.refs == 0 {
		delete(p.m, ps.key)
	}
}

// peerOf is the peer a connection's staging is counted against: its remote IP address.
func peerOf(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return c.RemoteAddr().String()
}

// Stats returns the server's counters.
func (s *Server) Stats() ServerStats {
	return ServerStats{
		Conns:         s.stats.conns.Load(),
		ConnsRejected: s.stats.connsRejected.Load(),
		Reads:         s.stats.reads.Load(),
		Writes:        s.stats.writes.Load(),
		BytesRead:     s.stats.bytesRead.Load(),
		BytesWritten:  s.stats.bytesWritten.Load(),
		Refused:       s.stats.refused.Load(),
		Aborted:       s.stats.aborted.Load(),
		V1Requests:    s.stats.v1.Load(),
	}
}

// Serve accepts connections until Close. It returns nil after Close and the accept error
// otherwise.
func (s *Server) Serve() error {
	retry := backoff.Backoff{Min: 5 * time.Millisecond, Max: time.Second}
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if s.isClosed() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporaryAccept(err) {
				time.Sleep(retry.Next())
				continue
			}
			return fmt.Errorf("transfer server: accept: %w", err)
		}
		retry.Reset()
		if !s.track(c) {
			_ = c.Close()
			continue
		}
		go s.serveConn(c)
	}
}

// track admits c under the connection cap; false when it must be closed.
func (s *Server) track(c net.Conn) bool {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if s.closed {
		return false
	}
	if len(s.conns) >= s.opts.MaxConns {
		s.stats.connsRejected.Add(1)
		return false
	}
	s.conns[c] = struct{}{}
	s.stats.conns.Add(1)
	s.wg.Add(1)
	return true
}

func (s *Server) untrack(c net.Conn) {
	s.connMu.Lock()
	delete(s.conns, c)
	s.connMu.Unlock()
	s.stats.conns.Add(-1)
	s.wg.Done()
}

func (s *Server) isClosed() bool {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	return s.closed
}

// Close stops accepting, closes every connection and waits for their handlers. Registered
// regions are no longer touched once it returns.
func (s *Server) Close() error {
	s.connMu.Lock()
	if s.closed {
		s.connMu.Unlock()
		return nil
	}
	s.closed = true
	s.cancel()
	err := s.ln.Close()
	for c := range s.conns {
		_ = c.Close()
	}
	s.connMu.Unlock()
	s.wg.Wait()
	return err
}

// serveConn runs requests on c one after another until the peer closes, a deadline passes or
// a request is refused.
func (s *Server) serveConn(c net.Conn) {
	defer s.untrack(c)
	defer c.Close()
	peer := s.peers.get(peerOf(c))
	defer s.peers.put(peer)
	var hdr [HeaderSize]byte
	for {
		// The first byte may take IdleTimeout; the rest of the header is a request in flight.
		// Usually the whole header comes in the first read.
		if err := c.SetReadDeadline(time.Now().Add(s.opts.IdleTimeout)); err != nil {
			return
		}
		n, err := io.ReadAtLeast(c, hdr[:], 1)
		if err != nil {
			return
		}
		if n < HeaderSize {
			if err := c.SetReadDeadline(time.Now().Add(s.opts.ReadTimeout)); err != nil {
				return
			}
			if _, err := io.ReadFull(c, hdr[n:]); err != nil {
				s.stats.aborted.Add(1)
				return
			}
		}
		h, _ := DecodeHeader(hdr[:])
		if !s.serveRequest(c, h, peer) {
			return
		}
	}
}

// serveRequest answers one request; false when the connection must close.
func (s *Server) serveRequest(c net.Conn, h Header, peer *peerShare) bool {
	reason := ""
	var r *region
	switch {
	case !h.Valid():
		reason = "unknown opcode"
	case h.Size == 0:
		reason = "size 0"
	case h.Size > s.opts.MaxRequestSize:
		reason = fmt.Sprintf("size above the %d-byte request limit", s.opts.MaxRequestSize)
	default:
		if _, ok := h.End(); !ok {
			reason = "addr+size overflows 64 bits"
		} else if r = s.lookup(h.Addr, h.Size); r == nil {
			reason = "range not inside one registered region"
		}
	}
	if reason != "" {
		s.refuse(c, h, reason)
		return false
	}

	if h.Op() == OpWrite {
		return s.serveWrite(c, h, r, peer)
	}
	// A READ stages its whole range at once: it is copied out under the region's lock, so it
	// never mixes two WRITEs.
	if err := s.acquire(peer, int64(h.Size), time.Now().Add(s.opts.ReadTimeout)); err != nil {
		s.refuse(c, h, "no staging memory within the read timeout")
		return false
	}
	defer s.release(peer, int64(h.Size))
	buf := s.bufs.get(int(h.Size))
	defer s.bufs.put(buf)
	return s.serveRead(c, h, r, buf)
}

// deadline is when a request of size bytes started now must be done: the I/O timeout plus
// the time its payload takes at MinRate.
func (s *Server) deadline(size uint64, timeout time.Duration) time.Time {
	return time.Now().Add(timeout + time.Duration(float64(size)/float64(s.opts.MinRate)*float64(time.Second)))
}

// acquire takes n bytes of staging from the peer's share and the server's, waiting until
// by at the latest.
func (s *Server) acquire(peer *peerShare, n int64, by time.Time) error {
	ctx, cancel := context.WithDeadline(s.ctx, by)
	defer cancel()
	if err := peer.w.acquire(ctx, n); err != nil {
		return err
	}
	if err := s.staging.acquire(ctx, n); err != nil {
		peer.w.release(n)
		return err
	}
	return nil
}

func (s *Server) release(peer *peerShare, n int64) {
	s.staging.release(n)
	peer.w.release(n)
}

// serveWrite takes a WRITE's payload as it arrives: staging is taken one chunk at a time, so a
// peer that announces a large WRITE and sends slowly holds only what it sent, within its
// peer's share, and never longer than the request's deadline. The payload reaches registered
// memory only once it is complete.
func (s *Server) serveWrite(c net.Conn, h Header, r *region, peer *peerShare) bool {
	end := s.deadline(h.Size, s.opts.ReadTimeout)
	chunks := make([][]byte, 0, (h.Size+ioChunk-1)/ioChunk)
	var held int64
	defer func() {
		for _, b := range chunks {
			s.bufs.put(b)
		}
		s.release(peer, held)
	}()
	for off := uint64(0); off < h.Size; {
		n := min(h.Size-off, ioChunk)
		step := time.Now().Add(s.opts.ReadTimeout)
		if step.After(end) {
			step = end
		}
		if err := s.acquire(peer, int64(n), step); err != nil {
			s.refuse(c, h, "no staging memory within the read timeout")
			return false
		}
		held += int64(n)
		buf := s.bufs.get(int(n))
		chunks = append(chunks, buf)
		if err := c.SetReadDeadline(step); err != nil {
			return false
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			// Nothing reached registered memory: a cut-off WRITE changes nothing.
			s.stats.aborted.Add(1)
			return false
		}
		off += n
	}
	if !r.writeChunks(h.Addr, chunks) {
		s.refuse(c, h, "region unregistered while the payload arrived")
		return false
	}
	s.stats.writes.Add(1)
	s.stats.bytesWritten.Add(h.Size)
	if !h.V2 {
		s.stats.v1.Add(1)
	}
	if h.V2 {
		return s.sendStatus(c, StatusOK)
	}
	return true
}

func (s *Server) serveRead(c net.Conn, h Header, r *region, buf []byte) bool {
	if !r.copy(h.Addr, buf, false) {
		s.refuse(c, h, "region unregistered")
		return false
	}
	end := s.deadline(h.Size, s.opts.WriteTimeout)
	var status [StatusFrameSize]byte
	for off := 0; off < len(buf); {
		n := min(len(buf)-off, ioChunk)
		step := time.Now().Add(s.opts.WriteTimeout)
		if step.After(end) {
			step = end
		}
		if err := c.SetWriteDeadline(step); err != nil {
			return false
		}
		// The v2 status frame goes out with the first chunk in one writev.
		out := net.Buffers{buf[off : off+n]}
		if off == 0 && h.V2 {
			out = net.Buffers{AppendStatus(status[:0], StatusOK), buf[:n]}
		}
		if _, err := out.WriteTo(c); err != nil {
			s.stats.aborted.Add(1)
			return false
		}
		off += n
	}
	s.stats.reads.Add(1)
	s.stats.bytesRead.Add(h.Size)
	if !h.V2 {
		s.stats.v1.Add(1)
	}
	return true
}

func (s *Server) sendStatus(c net.Conn, code uint32) bool {
	var b [StatusFrameSize]byte
	if err := c.SetWriteDeadline(time.Now().Add(s.opts.WriteTimeout)); err != nil {
		return false
	}
	_, err := c.Write(AppendStatus(b[:0], code))
	return err == nil
}

// refuse answers a request the server will not serve: a v2 status frame (a v1 initiator only
// sees the close), then a bounded drain so the frame is not lost to a reset.
func (s *Server) refuse(c net.Conn, h Header, reason string) {
	s.stats.refused.Add(1)
	// A hostile peer can send refusals as fast as it connects: log at most one a second and
	// say how many went unlogged since.
	now := time.Now().UnixNano()
	if last := s.lastRefusalLog.Load(); now-last >= int64(time.Second) && s.lastRefusalLog.CompareAndSwap(last, now) {
		s.log.Warn("transfer request refused", "peer", c.RemoteAddr().String(), "op", h.Op().String(),
			"addr", fmt.Sprintf("%#x", h.Addr), "size", h.Size, "v2", h.V2, "reason", reason,
			"unlogged_refusals", s.unloggedRefusals.Swap(0))
	} else {
		s.unloggedRefusals.Add(1)
	}
	if h.V2 {
		s.sendStatus(c, StatusAddrRejected)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(min(refusalDrainTime, s.opts.ReadTimeout)))
	_, _ = io.CopyN(io.Discard, c, refusalDrainBytes)
}
