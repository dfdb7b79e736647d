package disagg

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/kvctl/kvctl/core/config"
)

// admission bounds what clients may make the front hold at once: requests being served and
// the bytes of their bodies. Past either bound a request is answered 429 at once, before its
// body is read.
type admission struct {
	maxReqs, maxBytes int64
	reqs, bytes       atomic.Int64
}

var errOverloaded = errors.New("the front is at its in-flight bound")

// enter admits one request; leave must follow when it ends.
func (a *admission) enter() error {
	if a.reqs.Add(1) > a.maxReqs {
		a.reqs.Add(-1)
		return fmt.Errorf("%w: %d requests in flight (max_inflight_requests)", errOverloaded, a.maxReqs)
	}
	return nil
}

func (a *admission) leave() { a.reqs.Add(-1) }

// hold reserves n bytes of request bodies; release(n) returns them.
func (a *admission) hold(n int64) error {
	if a.bytes.Add(n) > a.maxBytes {
		a.bytes.Add(-n)
		return fmt.Errorf("%w: %d bytes of request bodies held (max_inflight_bytes)", errOverloaded, a.maxBytes)
	}
	return nil
}

func (a *admission) release(n int64) { a.bytes.Add(-n) }

// connLimiter is a listener that caps the connections open at once and gives each client
// address a share of them. A connection past either cap is closed as soon as it is accepted, so
// one peer that opens connections and never finishes a request cannot lock others out.
type connLimiter struct {
	net.Listener
	max, perPeer int
	refused      func(perPeer bool)

	mu    sync.Mutex
	open  int
	peers map[string]int
}

func newConnLimiter(ln net.Listener, l config.DisaggLimits, refused func(perPeer bool)) *connLimiter {
	maxConns := int(l.MaxConnections)
	// Keep room for the legs' own connections and the process's files: a cap above the
	// descriptor limit would let clients exhaust it, and then every accept fails.
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) == nil && rl.Cur > 0 && rl.Cur < 1<<31 {
		maxConns = min(maxConns, max(int(rl.Cur)/2, 8))
	}
	return &connLimiter{Listener: ln, max: maxConns, perPeer: min(int(l.MaxConnectionsPerPeer), maxConns),
		refused: refused, peers: map[string]int{}}
}

// Accept returns the next connection within the caps, closing those past them.
func (c *connLimiter) Accept() (net.Conn, error) {
	for {
		conn, err := c.Listener.Accept()
		if err != nil {
			return nil, err
		}
		peer := peerOf(conn.RemoteAddr())
		c.mu.Lock()
		over, perPeer := c.open >= c.max, c.peers[peer] >= c.perPeer
		if !over && !perPeer {
			c.open++
			c.peers[peer]++
		}
		c.mu.Unlock()
		if over || perPeer {
			_ = conn.Close()
			if c.refused != nil {
				c.refused(perPeer && !over)
			}
			continue
		}
		return &limitedConn{Conn: conn, l: c, peer: peer}, nil
	}
}

// MaxConns returns the cap in force.
func (c *connLimiter) MaxConns() int { return c.max }

func (c *connLimiter) done(peer string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.open--
	if c.peers[peer]--; c.peers[peer] <= 0 {
		delete(c.peers, peer)
	}
}

func peerOf(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

type limitedConn struct {
	net.Conn
	l    *connLimiter
	peer string
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.done(c.peer) })
	return err
}

// scanTokenIDs reads raw as a JSON array of integers without building anything for its
// elements, and returns how many it holds; it stops at limit+1, so a prompt of millions of ids
// costs no more than the bytes already read. ok is false when raw is not such an array.
func scanTokenIDs(raw []byte, limit int) (n int, ok bool) {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return 0, false
	}
	i = skipSpace(raw, i+1)
	if i < len(raw) && raw[i] == ']' {
		return 0, skipSpace(raw, i+1) == len(raw)
	}
	for {
		j := i
		if j < len(raw) && raw[j] == '-' {
			j++
		}
		start := j
		for j < len(raw) && raw[j] >= '0' && raw[j] <= '9' {
			j++
		}
		if j == start || j-start > 19 {
			return n, false
		}
		n++
		if n > limit {
			return n, true
		}
		i = skipSpace(raw, j)
		if i >= len(raw) {
			return n, false
		}
		switch raw[i] {
		case ',':
			i = skipSpace(raw, i+1)
		case ']':
			return n, skipSpace(raw, i+1) == len(raw)
		default:
			return n, false
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
