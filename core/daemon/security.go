package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/kvctl/kvctl/core/engineapi"
)

// DefaultAdminLeaseRate is how many /query_key lease grants per second the admin API allows
// when --admin-grants-leases is on; bursts of twice that pass.
const DefaultAdminLeaseRate = 200

// security holds the daemon's resolved security settings and the state that enforces them.
type security struct {
	groupID  int // -1: no engine group
	peers    *peerPolicy
	maxConns int
	leases   *tokenBucket // nil when /query_key grants no lease
	agg      *aggregator
	limits   Limits
	budget   trackedBudget

	mu        sync.Mutex
	listeners map[string]*guardedListener
}

// newSecurity resolves cfg's security settings and puts the aggregating logger in place of
// cfg.Logger.
func newSecurity(cfg *Config) (*security, error) {
	s := &security{groupID: -1, listeners: map[string]*guardedListener{}}
	if cfg.EngineGroup != "" {
		gid, err := LookupGroup(cfg.EngineGroup)
		if err != nil {
			return s, err
		}
		s.groupID = gid
	}
	s.peers = newPeerPolicy(s.groupID)
	s.maxConns = cfg.MaxConns
	if s.maxConns <= 0 {
		s.maxConns = DefaultMaxConns
	}
	if cfg.AdminGrantsLeases {
		rate := cfg.AdminLeaseRate
		if rate <= 0 {
			rate = DefaultAdminLeaseRate
		}
		s.leases = newTokenBucket(rate, 2*rate, time.Now)
	}
	s.limits = cfg.Limits.withDefaults()
	if err := s.limits.validate(); err != nil {
		return s, err
	}
	var err error
	if s.budget, err = newTrackedBudget(cfg.MaxTrackedTokens, systemAvailable); err != nil {
		return s, err
	}
	interval := cfg.FaultLogInterval
	if interval <= 0 {
		interval = DefaultFaultLogInterval
	}
	s.agg = newAggregator(cfg.Logger.Handler(), interval)
	cfg.Logger = slog.New(s.agg.handler())
	return s, nil
}

func (s *security) stop() { s.agg.stop() }

// listen opens the engine socket, the descriptor channel and the admin listener with their caps
// and peer checks, after raising the open-file limit.
func (d *Daemon) listen(ctx context.Context, socket string) (ln, fdln, adminLn net.Listener, err error) {
	limit, lerr := raiseFileLimit()
	if lerr != nil {
		d.log.Warn("open-file limit", "err", lerr)
	}
	if c := connCap(d.sec.maxConns, limit); c < d.sec.maxConns {
		d.log.Warn("connection cap lowered to fit the open-file limit", "max_conns", c, "wanted", d.sec.maxConns, "nofile", limit)
		d.sec.maxConns = c
	}
	policy := engineapi.SocketDirPolicy{GroupID: d.sec.groupID}
	raw, err := engineapi.ListenPolicy(ctx, socket, policy)
	if err != nil {
		return nil, nil, nil, err
	}
	rawFD, err := engineapi.ListenPolicy(ctx, engineapi.FDSocketPath(socket), policy)
	if err != nil {
		_ = raw.Close()
		return nil, nil, nil, err
	}
	var rawAdmin net.Listener
	if d.cfg.AdminAddr != "" {
		var lc net.ListenConfig
		rawAdmin, err = lc.Listen(ctx, "tcp", d.cfg.AdminAddr)
		if err != nil {
			_ = raw.Close()
			_ = rawFD.Close()
			return nil, nil, nil, fmt.Errorf("admin listener: %w", err)
		}
	}
	ln = d.guardListener(raw, "engine", d.sec.peers.check)
	fdln = d.guardListener(rawFD, "descriptor", d.sec.peers.check)
	if rawAdmin != nil {
		adminLn = d.guardListener(rawAdmin, "admin", nil)
	}
	return ln, fdln, adminLn, nil
}

func (d *Daemon) guardListener(l net.Listener, name string, check func(net.Conn) error) *guardedListener {
	g := newGuardedListener(l, name, d.sec.maxConns, check, d.log)
	d.sec.mu.Lock()
	d.sec.listeners[name] = g
	d.sec.mu.Unlock()
	return g
}

// adminServer is the admin HTTP server with its timeouts.
func (d *Daemon) adminServer() *http.Server {
	return &http.Server{
		Handler:           d.AdminHandler(),
		ReadHeaderTimeout: AdminReadHeaderTimeout,
		ReadTimeout:       AdminReadTimeout,
		WriteTimeout:      AdminWriteTimeout,
		IdleTimeout:       AdminIdleTimeout,
		MaxHeaderBytes:    AdminMaxHeaderBytes,
		ErrorLog:          slogErrorLog(d.log),
	}
}

// tokenBucket is the /query_key lease limiter: rate tokens a second, at most burst banked. It is
// golang.org/x/time/rate's limiter, asked with the daemon's clock.
type tokenBucket struct {
	rate float64
	lim  *rate.Limiter
	now  func() time.Time
}

func newTokenBucket(r, burst float64, now func() time.Time) *tokenBucket {
	return &tokenBucket{rate: r, lim: rate.NewLimiter(rate.Limit(r), max(1, int(burst))), now: now}
}

// allow takes a token if one is there.
func (b *tokenBucket) allow() bool { return b.lim.AllowN(b.now(), 1) }
