package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvctl/kvctl/core/backoff"
)

// DefaultMaxConns is the cap on concurrent connections of each listener (engine socket,
// descriptor channel, admin HTTP) when Config.MaxConns is zero.
const DefaultMaxConns = 1024

// Admin HTTP timeouts: a client that opens a connection and sends nothing, trickles a request or
// never reads its answer is cut off instead of holding a descriptor for ever.
const (
	AdminReadHeaderTimeout = 5 * time.Second
	AdminReadTimeout       = 10 * time.Second
	AdminWriteTimeout      = 30 * time.Second
	AdminIdleTimeout       = 60 * time.Second
	// AdminMaxHeaderBytes bounds a request's header block.
	AdminMaxHeaderBytes = 64 << 10
)

// EngineHandshakeTimeout bounds how long a new engine-socket connection may take to start
// talking gRPC; a connection that sends nothing is closed after it.
const EngineHandshakeTimeout = 10 * time.Second

// Accept backoff: a failing accept (EMFILE, ENFILE, ENOBUFS...) waits and retries, doubling the
// wait from acceptBackoffInitial up to acceptBackoffCap, rather than stopping the listener.
const (
	acceptBackoffInitial = 5 * time.Millisecond
	acceptBackoffCap     = time.Second
)

// guardedListener wraps a listener with a connection cap, an optional peer check and an accept
// loop that survives resource exhaustion. A connection over the cap or from a refused peer is
// accepted and closed at once, so the kernel's backlog never fills with connections nobody will
// serve and the connections already open keep working.
//
// golang.org/x/net/netutil.LimitListener is not enough here: at its cap it stops calling Accept,
// so new connections wait unanswered in the kernel's backlog (a client sees a hang, not a
// refusal) and a probe that connects and sends nothing holds its slot. This listener answers
// every connection at once, refuses the ones over the cap or from a refused peer and counts
// them, and keeps accepting through EMFILE with a backoff; the servers' handshake and idle
// timeouts close silent connections and so free their slots.
type guardedListener struct {
	net.Listener
	name   string
	max    int64
	open   atomic.Int64
	check  func(net.Conn) error // nil accepts every peer
	log    *slog.Logger
	counts *listenerCounts

	closeOnce sync.Once
	closed    chan struct{}

	// evict is set on HTTP listeners (see evictIdleHTTP): at the cap, the connection idle the
	// longest is closed to admit the new one, so idle keep-alive connections cannot lock out
	// health probes.
	evict bool
	mu    sync.Mutex
	conns map[*guardedConn]struct{}
}

// listenerCounts are what a listener refused, for the logs and the tests.
type listenerCounts struct {
	overCap     atomic.Int64
	refusedPeer atomic.Int64
	acceptErrs  atomic.Int64
	evictedIdle atomic.Int64
}

func newGuardedListener(l net.Listener, name string, maxConns int, check func(net.Conn) error, log *slog.Logger) *guardedListener {
	return &guardedListener{Listener: l, name: name, max: int64(maxConns), check: check, log: log, counts: &listenerCounts{}, closed: make(chan struct{})}
}

// Accept returns the next connection within the cap from an accepted peer. It returns an error
// only once the listener is closed (or on an error that retrying cannot fix).
func (g *guardedListener) Accept() (net.Conn, error) {
	retry := backoff.Backoff{Min: acceptBackoffInitial, Max: acceptBackoffCap}
	for {
		c, err := g.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || !retryableAccept(err) {
				return nil, err
			}
			g.counts.acceptErrs.Add(1)
			wait := retry.Next()
			g.log.Warn("accept failed; retrying", "listener", g.name, "err", err, "backoff", wait)
			select {
			case <-time.After(wait):
			case <-g.closed:
				return nil, net.ErrClosed
			}
			continue
		}
		retry.Reset()
		// Closing an evicted connection gives its slot back (Accept is never run concurrently).
		if g.open.Add(1) > g.max && g.evictIdle() {
			g.counts.evictedIdle.Add(1)
		}
		if g.open.Load() > g.max {
			g.open.Add(-1)
			g.counts.overCap.Add(1)
			g.log.Warn("connection refused: listener at its cap", "listener", g.name, "max_conns", g.max)
			_ = c.Close()
			continue
		}
		if g.check != nil {
			if err := g.check(c); err != nil {
				g.open.Add(-1)
				g.counts.refusedPeer.Add(1)
				g.log.Warn("connection refused", "listener", g.name, "err", err)
				_ = c.Close()
				continue
			}
		}
		gc := &guardedConn{Conn: c}
		gc.idleSince.Store(time.Now().UnixNano())
		if !g.evict {
			gc.release = func() { g.open.Add(-1) }
			return gc, nil
		}
		gc.release = func() {
			g.mu.Lock()
			delete(g.conns, gc)
			g.mu.Unlock()
			g.open.Add(-1)
		}
		g.mu.Lock()
		g.conns[gc] = struct{}{}
		g.mu.Unlock()
		return gc, nil
	}
}

// evictIdleHTTP makes g an HTTP listener whose idle connections give way to new ones at the cap:
// hs reports each connection's state to it. Call it before hs serves g.
func (g *guardedListener) evictIdleHTTP(hs *http.Server) {
	g.mu.Lock()
	g.evict, g.conns = true, map[*guardedConn]struct{}{}
	g.mu.Unlock()
	hs.ConnState = func(c net.Conn, st http.ConnState) {
		gc, ok := c.(*guardedConn)
		if !ok {
			return
		}
		switch st {
		case http.StateNew, http.StateIdle:
			gc.idleSince.Store(time.Now().UnixNano())
		case http.StateActive:
			gc.idleSince.Store(0)
		}
	}
}

// evictIdle closes the connection of g idle the longest (a keep-alive connection between
// requests, or one that has sent nothing yet); false when none is idle.
func (g *guardedListener) evictIdle() bool {
	if !g.evict {
		return false
	}
	var oldest *guardedConn
	var at int64
	g.mu.Lock()
	for c := range g.conns {
		if t := c.idleSince.Load(); t != 0 && (oldest == nil || t < at) {
			oldest, at = c, t
		}
	}
	g.mu.Unlock()
	if oldest == nil {
		return false
	}
	_ = oldest.Close()
	return true
}

// Close closes the listener and ends any backoff in progress.
func (g *guardedListener) Close() error {
	g.closeOnce.Do(func() { close(g.closed) })
	return g.Listener.Close()
}

// retryableAccept reports whether an accept error is a passing shortage (descriptors, buffers,
// memory) or a connection that died in the backlog, which retrying after a pause survives.
func retryableAccept(err error) bool {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case unix.EMFILE, unix.ENFILE, unix.ENOBUFS, unix.ENOMEM, unix.ECONNABORTED, unix.EINTR, unix.EAGAIN, unix.EPROTO, unix.EPERM:
			return true
		}
		return false
	}
	var ne interface{ Timeout() bool }
	return errors.As(err, &ne) && ne.Timeout()
}

// guardedConn gives its slot back to the listener's cap once, when closed.
type guardedConn struct {
	net.Conn
	once    sync.Once
	release func()
	// idleSince is when an HTTP connection became idle (unix nanoseconds), 0 while it serves a
	// request.
	idleSince atomic.Int64
}

func (c *guardedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

// unixConn returns the unix connection under c (through guardedConn), or nil.
func unixConn(c net.Conn) *net.UnixConn {
	if g, ok := c.(*guardedConn); ok {
		c = g.Conn
	}
	uc, _ := c.(*net.UnixConn)
	return uc
}

// raiseFileLimit raises the soft open-file limit to the hard limit, so that a connection flood
// meets the listeners' caps long before the process runs out of descriptors. It returns the
// soft limit in force afterwards.
func raiseFileLimit() (uint64, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0, fmt.Errorf("open-file limit: %w", err)
	}
	if rl.Cur < rl.Max {
		want := rl
		want.Cur = rl.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &want); err != nil {
			return rl.Cur, fmt.Errorf("raise open-file limit from %d to %d: %w", rl.Cur, rl.Max, err)
		}
		rl = want
	}
	return rl.Cur, nil
}

// connCap fits the per-listener cap under the open-file limit: three listeners at their caps
// must leave room for the pool, engine memory descriptors and logs.
func connCap(want int, fileLimit uint64) int {
	const reserve = 256
	if fileLimit == 0 || fileLimit > 1<<30 {
		return want
	}
	room := (int64(fileLimit) - reserve) / 4
	if room < 16 {
		room = 16
	}
	return int(min(int64(want), room))
}

// Unwrap returns the connection under the cap's bookkeeping.
func (c *guardedConn) Unwrap() net.Conn { return c.Conn }
