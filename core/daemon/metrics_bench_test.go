package daemon_test

import (
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/daemon/daemontest"
	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/pool/embedded"
)

// BenchmarkScrape times one /metrics scrape of a daemon serving four engine ranks (two models,
// two ranks each), in each format a scraper may ask for.
func BenchmarkScrape(b *testing.B) {
	popts := embedded.DefaultOptions()
	popts.Segments = []embedded.SegmentSpec{{Name: "bench", Capacity: 128 << 20}}
	r := daemontest.Start(b, daemon.Config{Pool: popts, Defaults: connector.Options{StagingBufferBytes: 8 << 20}})
	ctx := context.Background()
	const T = 16
	for _, model := range []string{"model-a", "model-b"} {
		e, err := enginesim.Start(ctx, enginesim.Config{Socket: r.Info.Socket, ModelKey: model, Name: model, World: 2, TokensPerBlock: T, Slots: 256, PageBytes: []int{1024}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = e.Close(ctx) })
		if _, err := e.Run(ctx, prompts(9, 6, T, model), 2); err != nil {
			b.Fatal(err)
		}
	}
	url := "http://" + r.Info.AdminAddr + "/metrics"
	for _, f := range []struct{ name, accept, encoding string }{
		{"text", "", "identity"},
		{"text-gzip", "", "gzip"},
		{"openmetrics", "application/openmetrics-text;version=1.0.0", "identity"},
		{"protobuf", "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited", "identity"},
	} {
		b.Run(f.name, func(b *testing.B) {
			var n int64
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				if f.accept != "" {
					req.Header.Set("Accept", f.accept)
				}
				req.Header.Set("Accept-Encoding", f.encoding)
				resp, err := http.DefaultTransport.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				var body io.Reader = resp.Body
				if f.encoding == "gzip" {
					zr, err := gzip.NewReader(resp.Body)
					if err != nil {
						b.Fatal(err)
					}
					body = zr
				}
				m, _ := io.Copy(io.Discard, body)
				resp.Body.Close()
				n = m
			}
			b.ReportMetric(float64(n), "bytes/scrape")
		})
	}
}

// BenchmarkPerCallMetrics is what the metrics add to every engine call, from all cores at once:
// the call counter alone (what was there before) against the counter plus the latency
// histogram with native buckets.
func BenchmarkPerCallMetrics(b *testing.B) {
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c"}, []string{"method"})
	hist := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "h",
		Buckets:                     []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		NativeHistogramBucketFactor: 1.1, NativeHistogramMaxBucketNumber: 160, NativeHistogramMinResetDuration: time.Hour,
	}, []string{"method"})
	b.Run("counter", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				calls.WithLabelValues("Lookup").Inc()
			}
		})
	})
	b.Run("counter+histogram", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				began := time.Now()
				calls.WithLabelValues("Lookup").Inc()
				hist.WithLabelValues("Lookup").Observe(time.Since(began).Seconds())
			}
		})
	})
}
