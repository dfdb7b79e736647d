package mooncake

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// MasterCollectorTimeout bounds how long one scrape waits for the inspector's metrics.
const MasterCollectorTimeout = 5 * time.Second

// NewMasterCollector returns a Prometheus collector that exports insp's metrics under the
// master's family names, types and help texts (every family RenderMasterMetrics prints), so a
// dashboard built for a Mooncake master reads a kvctl daemon unchanged. Per-segment gauges
// appear once a segment is mounted and master_value_size_bytes once a value was stored, as on
// the master. A scrape whose inspector fails exports an invalid metric carrying the error, so
// the registry reports it instead of serving stale figures.
func NewMasterCollector(insp Inspector) prometheus.Collector {
	return newMasterCollector(insp.Metrics)
}

func newMasterCollector(metrics func(context.Context) (MetricsSnapshot, error)) *masterCollector {
	c := &masterCollector{metrics: metrics, descs: map[string]*prometheus.Desc{}}
	for _, f := range masterMetricFamilies {
		var labels []string
		if f.name == "segment_allocated_bytes" || f.name == "segment_total_capacity_bytes" {
			labels = []string{"segment"}
		}
		c.descs[f.name] = prometheus.NewDesc(f.name, f.help, labels, nil)
	}
	return c
}

type masterCollector struct {
	metrics func(context.Context) (MetricsSnapshot, error)
	descs   map[string]*prometheus.Desc
}

// Describe implements prometheus.Collector.
func (c *masterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, f := range masterMetricFamilies {
		ch <- c.descs[f.name]
	}
}

// Collect implements prometheus.Collector.
func (c *masterCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), MasterCollectorTimeout)
	defer cancel()
	m, err := c.metrics(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.descs["master_allocated_bytes"], err)
		return
	}
	vals := masterMetricValues(m)
	for _, f := range masterMetricFamilies {
		desc := c.descs[f.name]
		switch f.name {
		case "segment_allocated_bytes", "segment_total_capacity_bytes":
			for _, s := range m.Segments {
				v := s.Used
				if f.name == "segment_total_capacity_bytes" {
					v = s.Capacity
				}
				ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, float64(v), s.Name)
			}
		case "master_value_size_bytes":
			h := m.ValueSizes
			if h.Count == 0 {
				continue
			}
			buckets := make(map[float64]uint64, len(h.Bounds))
			for i, b := range h.Bounds {
				buckets[b] = h.Counts[i]
			}
			ch <- prometheus.MustNewConstHistogram(desc, h.Count, h.Sum, buckets)
		default:
			t := prometheus.GaugeValue
			if f.kind == "counter" {
				t = prometheus.CounterValue
			}
			ch <- prometheus.MustNewConstMetric(desc, t, vals[f.name])
		}
	}
}
