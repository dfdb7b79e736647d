package mooncake_test

import (
	"os"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/pool"
)

func FuzzParsePromText(f *testing.F) {
	for _, p := range []string{"testdata/http/populated/metrics.txt", "testdata/http/empty/metrics.txt"} {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte("a{b=\"c\\\"d\",e=\"\"} 1 123\n# TYPE a counter\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := mooncake.ParsePromText(b)
		if err != nil {
			return
		}
		for _, s := range m.Samples {
			if s.Name == "" {
				t.Fatalf("sample with no name from %q", b)
			}
		}
	})
}

func FuzzParseSummary(f *testing.F) {
	for _, p := range []string{"testdata/http/populated/metrics_summary.txt"} {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(string(b))
		}
	}
	f.Add("role=leader, state=serving, service_ready=true, master={Keys: 1 (soft-pinned: 0) | Eviction: Success/Attempts=1/2, AllocFail=0, keys=3, size=0 B}")
	f.Fuzz(func(t *testing.T, s string) {
		sum, err := mooncake.ParseSummary(s)
		if err == nil && (sum.Keys < 0 || sum.EvictionAttempts < 0) {
			t.Fatalf("negative counts from %q", s)
		}
	})
}

// TestRenderedMetricsParse checks that what the handler prints parses back to the snapshot's
// values, labels included.
func TestRenderedMetricsParse(t *testing.T) {
	snap := mooncake.MetricsSnapshot{
		Stats:               pool.Stats{CapacityBytes: 1 << 30, UsedBytes: 12345, Objects: 7, Hits: 5, BytesOut: 999},
		SoftPinned:          2,
		Segments:            []pool.Segment{{Name: `we"ird\seg`, Capacity: 1 << 30, Used: 12345}},
		Uptime:              10 * time.Second,
		ActiveClients:       1,
		ValueSizes:          mooncake.Histogram{Bounds: []float64{4096, 65536}, Counts: []uint64{1, 3}, Count: 4, Sum: 70000},
		SuccessfulEvictions: 3, AttemptedEvictions: 4, EvictedKeys: 11, EvictedBytes: 1 << 20,
	}
	body, err := mooncake.RenderMasterMetrics(snap)
	if err != nil {
		t.Fatal(err)
	}
	m, err := mooncake.ParsePromText(body)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		"master_key_count": 7, "master_soft_pin_key_count": 2, "master_allocated_bytes": 12345,
		"mem_cache_hit_nums_": 5, "mem_cache_hit_bytes_total": 999, "master_evicted_key_count": 11,
		"master_successful_evictions_total": 3, "master_attempted_evictions_total": 4,
		"master_value_size_bytes_count": 4, "segment_allocated_bytes": 12345,
	}
	for name, v := range want {
		if got, ok := m.Value(name); !ok || got != v {
			t.Errorf("%s = %v (%v), want %v", name, got, ok, v)
		}
	}
	for _, s := range m.Samples {
		if s.Name == "segment_allocated_bytes" && s.Labels["segment"] != `we"ird\seg` {
			t.Errorf("segment label %q", s.Labels["segment"])
		}
	}
	sum, err := mooncake.ParseSummary(mooncake.RenderMasterSummary(snap, "leader", "serving"))
	if err != nil || sum.Keys != 7 || sum.SoftPinnedKeys != 2 || sum.EvictionSuccess != 3 || sum.EvictionAttempts != 4 || sum.EvictedKeys != 11 {
		t.Fatalf("summary %+v %v", sum, err)
	}
}

// TestParsePromTextHistogram pins the flattening of a histogram through expfmt: one sample per
// bucket (the +Inf bucket once), then _sum and _count, and the family's type.
func TestParsePromTextHistogram(t *testing.T) {
	m, err := mooncake.ParsePromText([]byte("# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 3\nh_sum 4.5\nh_count 3\n# TYPE c counter\nc{x=\"a\\\"b\"} 7\n"))
	if err != nil {
		t.Fatal(err)
	}
	var inf int
	for _, s := range m.Samples {
		if s.Name == "h_bucket" && s.Labels["le"] == "+Inf" {
			inf++
		}
	}
	if v, _ := m.Value("h_count"); v != 3 || inf != 1 || m.Types["h"] != "histogram" || m.Types["c"] != "counter" {
		t.Errorf("h_count %v, +Inf buckets %d, types %v", v, inf, m.Types)
	}
	if m.Samples[len(m.Samples)-1].Name != "h_count" || m.Samples[0].Labels["x"] != `a"b` {
		t.Errorf("samples %+v", m.Samples)
	}
	if _, err := mooncake.ParsePromText([]byte("a 1\n# TYPE a counter\n")); err == nil {
		t.Error("a TYPE line after the family's samples was accepted")
	}
}
