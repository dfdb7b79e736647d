package disagg

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metric names, a contract pinned by tests.
const (
	MetricRequests           = "kvctl_disagg_requests_total"
	MetricResponses          = "kvctl_disagg_responses_total"
	MetricErrors             = "kvctl_disagg_errors_total"
	MetricRetries            = "kvctl_disagg_retries_total"
	MetricFirstChunkFailures = "kvctl_disagg_first_chunk_failures_total"
	MetricTimeouts           = "kvctl_disagg_timeouts_total"
	MetricClientDisconnects  = "kvctl_disagg_client_disconnects_total"
	MetricLegsInFlight       = "kvctl_disagg_legs_in_flight"
	MetricPoolLookups        = "kvctl_disagg_pool_lookups_total"
	MetricLegSeconds         = "kvctl_disagg_leg_duration_seconds"
	MetricRefused            = "kvctl_disagg_refused_total"
	MetricBackendsUp         = "kvctl_disagg_backends_up"
)

// Refusal reasons (the reason label of MetricRefused).
const (
	RefusedRequests    = "requests"     // past max_inflight_requests (429)
	RefusedBytes       = "bytes"        // past max_inflight_bytes (429)
	RefusedBodyTimeout = "body_timeout" // body not read within body_read_timeout_s (408)
	RefusedConnections = "connections"  // a connection past max_connections, closed
	RefusedPeerShare   = "peer_share"   // a connection past max_connections_per_peer, closed
	RefusedDraining    = "draining"     // a request that arrived while draining (503)
)

// Retry causes (the cause label of MetricRetries).
const (
	CauseConnect           = "connect"             // the connection could not be opened (refused)
	CauseResetWhileWriting = "reset_while_writing" // reset before the request was fully written
	CauseContextTransport  = "context_transport"   // a context leg's transport error
	CauseContextStatus     = "context_status_5xx"  // a context leg answered 5xx
)

// Timeout kinds (the kind label of MetricTimeouts).
const (
	TimeoutKVTransfer = "kv_transfer" // no first chunk within kv_transfer_timeout_ms
	TimeoutRequest    = "request"     // a leg ran past request_timeout_s
)

// Pool lookup results (the result label of MetricPoolLookups).
const (
	LookupHit           = "answered"
	LookupTimeout       = "fallback_timeout"
	LookupError         = "fallback_error"
	LookupNoTokenIDs    = "fallback_text_prompt"
	LookupOverTokenCaps = "fallback_too_long"
)

type metrics struct {
	reg         *prometheus.Registry
	requests    *prometheus.CounterVec
	responses   *prometheus.CounterVec
	errors      *prometheus.CounterVec
	retries     *prometheus.CounterVec
	firstChunk  *prometheus.CounterVec
	timeouts    *prometheus.CounterVec
	disconnects *prometheus.CounterVec
	inFlight    *prometheus.GaugeVec
	lookups     *prometheus.CounterVec
	legSeconds  *prometheus.HistogramVec
	overloaded  *prometheus.CounterVec
	backendsUp  *prometheus.GaugeVec
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricRequests,
			Help: "Client requests received, by endpoint and whether they asked for a stream."}, []string{"endpoint", "stream"}),
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricResponses,
			Help: "Responses that went out with status 200; a stream counts once its first chunk arrived."}, []string{"endpoint"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricErrors,
			Help: "Requests failed to the client, by the HTTP status they got (in_stream after the first chunk)."}, []string{"endpoint", "status"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricRetries,
			Help: "Legs re-sent, by leg and cause."}, []string{"leg", "cause"}),
		firstChunk: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricFirstChunkFailures,
			Help: "Streams that failed before their first chunk and became an HTTP error."}, []string{"endpoint"}),
		timeouts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricTimeouts,
			Help: "Legs cancelled for time, by kind (kv_transfer: no first chunk in kv_transfer_timeout_ms)."}, []string{"leg", "kind"}),
		disconnects: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricClientDisconnects,
			Help: "Requests whose client went away before the response ended; the upstream leg was cancelled."}, []string{"endpoint"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricLegsInFlight,
			Help: "Legs in flight per upstream server."}, []string{"role", "server"}),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricPoolLookups,
			Help: "pool_aware lookups, by result (answered, or the reason for the work-aware fallback)."}, []string{"result"}),
		legSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: MetricLegSeconds,
			Help:    "Time from sending a leg to its response headers (context) or first chunk (generation).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18)}, []string{"role"}),
		overloaded: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricRefused,
			Help: "Requests and connections refused to bound what clients make the front hold, by reason."}, []string{"reason"}),
		backendsUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricBackendsUp,
			Help: "Upstream servers of each role whose /health answered 200 at the last probe."}, []string{"role"}),
	}
	for _, r := range []string{RefusedRequests, RefusedBytes, RefusedBodyTimeout, RefusedConnections, RefusedPeerShare, RefusedDraining} {
		m.overloaded.WithLabelValues(r)
	}
	m.reg.MustRegister(m.requests, m.responses, m.errors, m.retries, m.firstChunk, m.timeouts, m.disconnects,
		m.inFlight, m.lookups, m.legSeconds, m.overloaded, m.backendsUp)
	return m
}

// Registry is the proxy's metrics registry, served on /metrics.
func (p *Proxy) Registry() *prometheus.Registry { return p.m.reg }
