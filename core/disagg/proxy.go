package disagg

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvctl/kvctl/core/config"
)

// Endpoints the proxy serves (the endpoint label of its metrics).
const (
	EndpointCompletions = "/v1/completions"
	EndpointChat        = "/v1/chat/completions"
	EndpointMessages    = "/v1/messages"
	EndpointModels      = "/v1/models"
	EndpointResponses   = "/v1/responses"
	EndpointHealth      = "/health"
	EndpointReadyz      = "/readyz"
	EndpointMetrics     = "/metrics"
)

// Roles of an upstream server.
const (
	RoleContext    = "context"
	RoleGeneration = "generation"
)

// Bounds on what an upstream server may send.
const (
	maxContextResponse = 16 << 20 // a context leg's JSON answer
	maxGenResponse     = 64 << 20 // a non-streamed generation answer
	maxErrorBody       = 64 << 10 // an error answer
	maxModelsResponse  = 1 << 20
)

// Options configures a Proxy.
type Options struct {
	// Config is the loaded disagg_config.yaml.
	Config *config.DisaggConfig
	// Logger receives one line per failed request; nil discards.
	Logger *slog.Logger
	// PoolLookup replaces the pool_aware lookup the config describes (tests).
	PoolLookup PoolLookup
	// RetryBackoff is the pause before a context leg is re-sent; 0 means 100ms.
	RetryBackoff time.Duration
	// Transport carries the legs; nil builds one.
	Transport http.RoundTripper
}

// Proxy is the disaggregated front. Build it with New; serve Handler.
type Proxy struct {
	cfg        *config.DisaggConfig
	log        *slog.Logger
	hc         *http.Client
	ctxUps     []*upstream
	genUps     []*upstream
	ctxPick    picker
	genPick    picker
	ids        *idGen
	m          *metrics
	kvTimeout  time.Duration
	reqTimeout time.Duration
	maxBody    int64
	maxRetries int
	backoff    time.Duration

	adm         *admission
	limits      config.DisaggLimits
	bodyTimeout time.Duration
	maxTokens   int
	health      *healthProbe
	draining    atomic.Bool
	active      atomic.Int64 // client requests being served
}

// New builds a proxy for opts.Config. It dials nothing.
func New(opts Options) (*Proxy, error) {
	c := opts.Config
	if c == nil {
		return nil, errors.New("disagg: no config")
	}
	if len(c.Context.URLs) == 0 || len(c.Generation.URLs) == 0 {
		return nil, errors.New("disagg: the config needs at least one context and one generation server")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tr := opts.Transport
	if tr == nil {
		tr = &http.Transport{
			DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:          1024,
			MaxIdleConnsPerHost:   256,
			IdleConnTimeout:       30 * time.Second,
			DisableCompression:    true,
			ExpectContinueTimeout: 0,
		}
	}
	p := &Proxy{
		cfg: c, log: log, hc: &http.Client{Transport: tr},
		m:          newMetrics(),
		kvTimeout:  time.Duration(c.KVTransferTimeoutMs) * time.Millisecond,
		reqTimeout: time.Duration(c.RequestTimeoutS) * time.Second,
		maxBody:    c.MaxRequestBytes,
		maxRetries: int(c.MaxRetries),
		backoff:    opts.RetryBackoff,
	}
	if p.kvTimeout <= 0 {
		p.kvTimeout = config.DefaultKVTransferTimeoutMs * time.Millisecond
	}
	if p.reqTimeout <= 0 {
		p.reqTimeout = config.DefaultDisaggRequestTimeoutS * time.Second
	}
	if p.maxBody <= 0 {
		p.maxBody = 32 << 20
	}
	if p.backoff <= 0 {
		p.backoff = 100 * time.Millisecond
	}
	p.limits = c.Limits
	def := config.DefaultDisaggLimits()
	for _, l := range []struct{ v, d *int64 }{
		{&p.limits.MaxPromptTokens, &def.MaxPromptTokens}, {&p.limits.MaxInflightRequests, &def.MaxInflightRequests},
		{&p.limits.MaxInflightBytes, &def.MaxInflightBytes}, {&p.limits.BodyReadTimeoutS, &def.BodyReadTimeoutS},
		{&p.limits.MaxConnections, &def.MaxConnections}, {&p.limits.MaxConnectionsPerPeer, &def.MaxConnectionsPerPeer},
	} {
		if *l.v <= 0 {
			*l.v = *l.d
		}
	}
	p.adm = &admission{maxReqs: p.limits.MaxInflightRequests, maxBytes: p.limits.MaxInflightBytes}
	p.bodyTimeout = time.Duration(p.limits.BodyReadTimeoutS) * time.Second
	p.maxTokens = int(p.limits.MaxPromptTokens)
	node := int64(0)
	if c.NodeID != nil {
		node = *c.NodeID
	} else if h, err := os.Hostname(); err == nil {
		f := fnv.New32a()
		_, _ = f.Write([]byte(h))
		node = int64(f.Sum32() % 256)
	}
	p.ids = newIDGen(node, time.Now())
	for _, u := range c.Context.URLs {
		p.ctxUps = append(p.ctxUps, &upstream{addr: u, role: RoleContext})
	}
	for _, u := range c.Generation.URLs {
		p.genUps = append(p.genUps, &upstream{addr: u, role: RoleGeneration})
	}
	var err error
	if p.ctxPick, err = newPicker(c.Context.Router, p.ctxUps, p.m, opts.PoolLookup); err != nil {
		return nil, fmt.Errorf("context_servers.router: %w", err)
	}
	if p.genPick, err = newPicker(c.Generation.Router, p.genUps, p.m, nil); err != nil {
		return nil, fmt.Errorf("generation_servers.router: %w", err)
	}
	for _, up := range append(append([]*upstream{}, p.ctxUps...), p.genUps...) {
		p.m.inFlight.WithLabelValues(up.role, up.addr).Set(0)
	}
	p.health = newHealthProbe(p)
	return p, nil
}

// Handler serves the OpenAI-compatible endpoints, /health and /metrics.
func (p *Proxy) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+EndpointCompletions, func(w http.ResponseWriter, r *http.Request) { p.serveDisagg(w, r, EndpointCompletions) })
	mux.HandleFunc("POST "+EndpointChat, func(w http.ResponseWriter, r *http.Request) { p.serveDisagg(w, r, EndpointChat) })
	mux.HandleFunc("POST "+EndpointMessages, p.serveMessages)
	mux.HandleFunc("POST "+EndpointResponses, p.serveResponses)
	mux.HandleFunc("GET "+EndpointModels, p.serveModels)
	mux.HandleFunc("GET "+EndpointHealth, p.serveHealth)
	mux.HandleFunc("GET "+EndpointReadyz, p.serveReadyz)
	mux.Handle("GET "+EndpointMetrics, promhttp.HandlerFor(p.m.reg, promhttp.HandlerOpts{}))
	return mux
}

// admit counts a client request in for its whole life and refuses it with 429 past
// max_inflight_requests, or 503 while the front drains. It returns false when the request
// was answered.
func (p *Proxy) admit(w http.ResponseWriter, r *http.Request, ep string, anthropic bool) (leave func(), ok bool) {
	if p.draining.Load() {
		p.m.overloaded.WithLabelValues(RefusedDraining).Inc()
		w.Header().Set("Connection", "close")
		p.fail(w, r, ep, anthropic, &LegError{Status: http.StatusServiceUnavailable, Message: "the front is shutting down", Err: ErrBadRequest})
		return nil, false
	}
	if err := p.adm.enter(); err != nil {
		p.m.overloaded.WithLabelValues(RefusedRequests).Inc()
		w.Header().Set("Retry-After", "1")
		p.fail(w, r, ep, anthropic, &LegError{Status: http.StatusTooManyRequests, Message: err.Error(), Err: ErrBadRequest})
		return nil, false
	}
	p.active.Add(1)
	return func() { p.active.Add(-1); p.adm.leave() }, true
}

// RunOptions are the inputs of Run besides the proxy's.
type RunOptions struct {
	Options
	// Addr overrides the config's hostname:port (tests pass 127.0.0.1:0).
	Addr string
	// Ready is called with the address the proxy listens on.
	Ready func(addr string)
	// DrainTimeout bounds the shutdown's wait for requests in flight; 0 means 30s.
	DrainTimeout time.Duration
}

// Run serves the proxy until ctx is cancelled, then stops taking requests and waits for those
// in flight up to the drain timeout.
func Run(ctx context.Context, opts RunOptions) error {
	p, err := New(opts.Options)
	if err != nil {
		return err
	}
	addr := opts.Addr
	if addr == "" {
		addr = opts.Config.ListenAddr()
	}
	var lc net.ListenConfig
	raw, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("disagg: listen on %s: %w", addr, err)
	}
	ln := newConnLimiter(raw, p.limits, func(perPeer bool) {
		if perPeer {
			p.m.overloaded.WithLabelValues(RefusedPeerShare).Inc()
		} else {
			p.m.overloaded.WithLabelValues(RefusedConnections).Inc()
		}
	})
	// Idle keep-alive connections count against the caps, so they are closed sooner than the
	// default; headers must arrive within 10s and a body within body_read_timeout_s.
	srv := &http.Server{Handler: p.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 30 * time.Second,
		MaxHeaderBytes: 1 << 20, ErrorLog: slog.NewLogLogger(p.log.Handler(), slog.LevelDebug)}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	if opts.Ready != nil {
		opts.Ready(ln.Addr().String())
	}
	select {
	case err := <-errc:
		return fmt.Errorf("disagg: serve: %w", err)
	case <-ctx.Done():
	}
	drain := opts.DrainTimeout
	if drain <= 0 {
		drain = 30 * time.Second
	}
	// Draining: /readyz turns 503 so a balancer stops sending, new requests on open connections
	// get 503, and requests in flight run to their end within the drain timeout.
	p.draining.Store(true)
	inFlight := p.active.Load()
	p.log.Info("draining the disaggregated front", "requests_in_flight", inFlight, "drain_timeout", drain)
	start := time.Now()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drain)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		left := p.active.Load()
		_ = srv.Close()
		p.log.Warn("drain timed out; closed the remaining connections", "requests_in_flight", inFlight,
			"requests_cut", left, "waited", time.Since(start).Round(time.Millisecond))
		return fmt.Errorf("disagg: shutdown: %d of %d requests still in flight after %s: %w", left, inFlight, drain, err)
	}
	p.log.Info("drained the disaggregated front", "requests_finished", inFlight, "waited", time.Since(start).Round(time.Millisecond))
	return nil
}

// serveModels relays the first generation (then context) server that lists its models.
func (p *Proxy) serveModels(w http.ResponseWriter, r *http.Request) {
	var last error
	for _, up := range append(append([]*upstream{}, p.genUps...), p.ctxUps...) {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+up.addr+EndpointModels, nil)
		resp, err := p.hc.Do(req)
		if err != nil {
			cancel()
			last = fmt.Errorf("%s: %w", up.addr, err)
			continue
		}
		body, err := readBounded(resp.Body, maxModelsResponse)
		resp.Body.Close()
		cancel()
		if err != nil {
			last = fmt.Errorf("%s: %w", up.addr, err)
			continue
		}
		if resp.StatusCode != http.StatusOK {
			last = fmt.Errorf("%s: status %d", up.addr, resp.StatusCode)
			continue
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
		return
	}
	writeError(w, false, http.StatusBadGateway, fmt.Sprintf("no server listed its models: %v", last))
}

// idGen mints disagg_request_ids: the node id in the top byte below the sign bit, then a
// counter that starts from the clock so that a restarted proxy does not reuse ids.
type idGen struct {
	prefix uint64
	n      atomic.Uint64
}

const idBits = 55

func newIDGen(node int64, now time.Time) *idGen {
	g := &idGen{prefix: uint64(node&0xff) << idBits}
	g.n.Store((uint64(now.UnixMilli()) << 12) & (1<<idBits - 1))
	return g
}

func (g *idGen) next() int64 {
	v := g.n.Add(1) & (1<<idBits - 1)
	if v == 0 {
		v = g.n.Add(1) & (1<<idBits - 1)
	}
	return int64(g.prefix | v)
}

var errTooLarge = errors.New("the body is too large")

func readBounded(r io.Reader, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%w: more than %d bytes", errTooLarge, limit)
	}
	return b, nil
}

// writeError sends an HTTP error in the OpenAI envelope, or Anthropic's when anthropic is set.
func writeError(w http.ResponseWriter, anthropic bool, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Del("Content-Length")
	w.WriteHeader(status)
	if anthropic {
		_, _ = w.Write(anthropicErrorBody(status, msg))
		return
	}
	_, _ = w.Write(openAIErrorBody(status, msg))
}
