package daemon

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/pool"
)

// Metric names of the peer segment health state (mooncake.SegmentHealthStats). They are a
// contract, pinned by TestMetricContract's golden lists.
const (
	metricUnhealthySegments       = "kvctl_pool_unhealthy_segments"
	metricSegmentHealthTransition = "kvctl_pool_segment_health_transitions_total"
)

// segmentHealther is a pool that keeps a health state per peer segment (a Mooncake cluster).
type segmentHealther interface {
	SegmentHealth() mooncake.SegmentHealthStats
}

// healthCollector exports the pool's segment health; a pool without one exports zeros, so
// every series exists from the start whatever the backend.
type healthCollector struct {
	pool        pool.Pool
	unhealthy   *prometheus.Desc
	transitions *prometheus.Desc
}

func newHealthCollector(pl pool.Pool) *healthCollector {
	return &healthCollector{pool: pl,
		unhealthy: prometheus.NewDesc(metricUnhealthySegments,
			"Peer segments marked unhealthy now: a transfer with them failed and no probe has answered since; their pages are answered as misses.", nil, nil),
		transitions: prometheus.NewDesc(metricSegmentHealthTransition,
			"Changes of a peer segment's health state, by new state: unhealthy (a transfer failed), healthy (a probe or transfer answered), forgotten (the master no longer lists it).", []string{"to"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *healthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.unhealthy
	ch <- c.transitions
}

// Collect implements prometheus.Collector.
func (c *healthCollector) Collect(ch chan<- prometheus.Metric) {
	var st mooncake.SegmentHealthStats
	if h, ok := c.pool.(segmentHealther); ok {
		st = h.SegmentHealth()
	}
	ch <- prometheus.MustNewConstMetric(c.unhealthy, prometheus.GaugeValue, float64(st.Unhealthy))
	ch <- prometheus.MustNewConstMetric(c.transitions, prometheus.CounterValue, float64(st.ToUnhealthy), "unhealthy")
	ch <- prometheus.MustNewConstMetric(c.transitions, prometheus.CounterValue, float64(st.ToHealthy), "healthy")
	ch <- prometheus.MustNewConstMetric(c.transitions, prometheus.CounterValue, float64(st.Forgotten), "forgotten")
}
