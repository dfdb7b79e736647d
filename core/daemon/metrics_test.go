package daemon_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/daemon/daemontest"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/pool/embedded"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// scrape fetches /metrics as Prometheus text and parses it.
func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := getText(t, base+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// value returns the value of the sample of family name whose labels include want, and
// whether there is one.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		case m.Untyped != nil:
			return m.GetUntyped().GetValue(), true
		}
	}
	return 0, false
}

// contractNames lists the families a scrape exports, with their type, leaving out the Go
// runtime's and the process's (their set follows the Go version, not kvctl).
func contractNames(fams map[string]*dto.MetricFamily) string {
	var out []string
	for name, f := range fams {
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			continue
		}
		var labels []string
		seen := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if !seen[l.GetName()] {
					seen[l.GetName()] = true
					labels = append(labels, l.GetName())
				}
			}
		}
		sort.Strings(labels)
		line := name + " " + strings.ToLower(f.GetType().String())
		if len(labels) > 0 {
			line += " " + strings.Join(labels, ",")
		}
		out = append(out, line)
	}
	sort.Strings(out)
	return strings.Join(out, "\n") + "\n"
}

func checkGolden(t *testing.T, file, got string) {
	t.Helper()
	path := filepath.Join("testdata", file)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to write it)", err)
	}
	if string(want) != got {
		t.Errorf("metric families differ from %s (the names are a contract: add, never rename):\n%s", path, lineDiff(string(want), got))
	}
}

func lineDiff(want, got string) string {
	w, g := map[string]bool{}, map[string]bool{}
	for _, l := range strings.Split(want, "\n") {
		w[l] = true
	}
	for _, l := range strings.Split(got, "\n") {
		g[l] = true
	}
	var b strings.Builder
	for _, l := range strings.Split(want, "\n") {
		if !g[l] {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range strings.Split(got, "\n") {
		if !w[l] {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}

// replayColdWarm runs a cold engine that saves and a warm engine that loads the same prompts
// against r, unregistering the cold one, and leaves the warm one registered until the test ends.
func replayColdWarm(t *testing.T, r *daemontest.Running) {
	t.Helper()
	ctx := context.Background()
	const T = 16
	cfg := enginesim.Config{Socket: r.Info.Socket, ModelKey: "sim-model", World: 2, TokensPerBlock: T, Slots: 512,
		PageBytes: []int{2048, 1024}, ReplicatedBytes: []int{0, 256}, Chunk: 3*T + 5}
	reqs := prompts(3, 12, T, "m")
	cfg.Name = "cold"
	cold, err := enginesim.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cold.Run(ctx, reqs, 4); err != nil {
		t.Fatal(err)
	}
	if err := cold.Close(ctx); err != nil {
		t.Fatal(err)
	}
	cfg.Name = "warm"
	warm, err := enginesim.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = warm.Close(ctx) })
	if _, err := warm.Run(ctx, reqs, 4); err != nil {
		t.Fatal(err)
	}
}

// TestMetricContract diffs the metric families of a fresh daemon and of one after a replay
// against the committed lists, and checks that every daemon-level series exists at 0 from the
// start.
func TestMetricContract(t *testing.T) {
	r := start(t, 128<<20)
	base := "http://" + r.Info.AdminAddr
	fresh := scrape(t, base)
	checkGolden(t, "metrics-fresh.txt", contractNames(fresh))

	for name, f := range fresh {
		if !strings.HasPrefix(name, "kvctl_") || strings.HasPrefix(name, "kvctl_rank_") {
			continue
		}
		for _, m := range f.GetMetric() {
			v, _ := value(map[string]*dto.MetricFamily{name: {Type: f.Type, Metric: []*dto.Metric{m}}}, name, nil)
			switch name {
			case "kvctl_build_info", "kvctl_ready", "kvctl_pool_capacity_bytes", "kvctl_pool_up":
				if v != 1 && name != "kvctl_pool_capacity_bytes" {
					t.Errorf("fresh %s = %v, want 1", name, v)
				}
			default:
				if v != 0 {
					t.Errorf("fresh %s = %v, want 0", name, v)
				}
			}
		}
	}
	if v, ok := value(fresh, "kvctl_pool_capacity_bytes", nil); !ok || v != 128<<20 {
		t.Errorf("kvctl_pool_capacity_bytes = %v (%v), want %d", v, ok, 128<<20)
	}
	if _, ok := value(fresh, "kvctl_build_info", map[string]string{"version": "test"}); !ok {
		t.Error("kvctl_build_info lacks version=\"test\"")
	}
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total", "process_resident_memory_bytes", "master_key_count", "master_allocated_bytes"} {
		if fresh[name] == nil {
			t.Errorf("fresh /metrics lacks %s", name)
		}
	}

	replayColdWarm(t, r)
	// One call that fails, as an engine that lost its registration makes, so that the error
	// family is part of the contract too.
	c, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Lookup(context.Background(), &enginepb.LookupRequest{Engine: "nobody", Request: &enginepb.Request{Id: "x"}}); err == nil {
		t.Fatal("a lookup by an unregistered engine succeeded")
	}
	after := scrape(t, base)
	checkGolden(t, "metrics-after-replay.txt", contractNames(after))
	if n, _ := value(after, "kvctl_engine_call_errors_total", map[string]string{"method": "Lookup", "code": "NotFound"}); n != 1 {
		t.Errorf("kvctl_engine_call_errors_total{Lookup,NotFound} = %v, want 1", n)
	}
	for _, f := range after {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "engine" || l.GetName() == "pid" {
					t.Errorf("%s has label %s=%q: engine labels must not carry process ids", f.GetName(), l.GetName(), l.GetValue())
				}
			}
		}
	}
	for _, name := range []string{"kvctl_lookup_duration_seconds", "kvctl_load_duration_seconds", "kvctl_save_duration_seconds"} {
		if n, _ := value(after, name, nil); n == 0 {
			t.Errorf("%s observed nothing after a replay", name)
		}
	}
	if n, _ := value(after, "kvctl_engine_call_duration_seconds", map[string]string{"method": "Lookup"}); n == 0 {
		t.Error("kvctl_engine_call_duration_seconds{method=Lookup} observed nothing")
	}
	// Thread CPU per load phase is read only while the stats line is on (loads are then pinned
	// to their thread); this daemon has none, so after its loads the family holds zeros, and
	// its help says when it counts.
	if f := after["kvctl_load_phase_cpu_seconds_total"]; f == nil || !strings.Contains(f.GetHelp(), "only while --stats-interval is set") {
		t.Errorf("kvctl_load_phase_cpu_seconds_total help %q does not say it counts only while --stats-interval is set", f.GetHelp())
	}
	for _, phase := range []string{"resolve", "fence", "describe", "get", "unstage", "sync"} {
		if v, ok := value(after, "kvctl_load_phase_cpu_seconds_total", map[string]string{"phase": phase}); !ok || v != 0 {
			t.Errorf("kvctl_load_phase_cpu_seconds_total{phase=%q} = %v (present %v) without --stats-interval, want 0", phase, v, ok)
		}
	}
	if n, _ := value(after, "kvctl_load_phase_seconds_total", map[string]string{"phase": "get"}); n == 0 {
		t.Error("kvctl_load_phase_seconds_total{phase=get} is 0 after a replay: wall time per phase is always recorded")
	}
	var st statsapi.StatsJSON
	getJSON(t, base+"/v1/stats", &st)
	// A page another save stored between the existence check and the put is accepted without
	// a write, so the pool's stores plus its skipped puts are what saves handed it.
	if put, _ := value(after, "kvctl_save_put_pages_total", nil); put == 0 || put != float64(st.Pool.Puts+st.Pool.SkippedExisting) {
		t.Errorf("kvctl_save_put_pages_total = %v, the pool stored %d and skipped %d", put, st.Pool.Puts, st.Pool.SkippedExisting)
	}
	if hits, _ := value(after, "kvctl_prefix_hit_blocks_total", nil); hits != float64(st.PrefixHoles.HitBlocks) || hits == 0 {
		t.Errorf("kvctl_prefix_hit_blocks_total = %v, /v1/stats says %d", hits, st.PrefixHoles.HitBlocks)
	}
	if pt, _ := value(after, "kvctl_lookup_pool_tokens_total", nil); pt == 0 || pt != float64(st.HitRates.PoolTokens) {
		t.Errorf("kvctl_lookup_pool_tokens_total = %v, /v1/stats hit_rates.pool_tokens = %d", pt, st.HitRates.PoolTokens)
	}
	if st.HitRates.PromptTokens == 0 || st.HitRates.Total < st.HitRates.Pool || st.HitRates.Total > 1 {
		t.Errorf("hit rates %+v", st.HitRates)
	}
	if st.Saves.PutPages == 0 || len(st.Engines) != 2 || st.Engines[1].Rank != 1 {
		t.Errorf("/v1/stats saves %+v, engines %+v", st.Saves, st.Engines)
	}
	if pages, _ := value(after, "kvctl_load_pages_total", nil); pages != float64(st.Loads.Pages) {
		t.Errorf("kvctl_load_pages_total = %v, /v1/stats says %d", pages, st.Loads.Pages)
	}
	var sum float64
	for _, rank := range []string{"0", "1"} {
		v, ok := value(after, "kvctl_rank_load_pages_total", map[string]string{"model_key": "sim-model", "rank": rank})
		if !ok {
			t.Errorf("no kvctl_rank_load_pages_total for sim-model rank %s", rank)
		}
		sum += v
	}
	if total, _ := value(after, "kvctl_load_pages_total", nil); sum != total {
		t.Errorf("per-rank load pages add up to %v, daemon total %v", sum, total)
	}
}

// TestEngineSeriesOutliveEngine checks that an engine's series keep their values after it
// leaves (no counter reset for Prometheus), count on when a new engine takes the same model
// and rank, and expire once the retention has passed with no engine holding them.
func TestEngineSeriesOutliveEngine(t *testing.T) {
	popts := embedded.DefaultOptions()
	popts.Segments = []embedded.SegmentSpec{{Name: "test", Capacity: 128 << 20}}
	const retention = 2 * time.Second
	r := daemontest.Start(t, daemon.Config{Pool: popts, Defaults: connector.Options{StagingBufferBytes: 8 << 20}, EngineSeriesRetention: retention})
	base := "http://" + r.Info.AdminAddr
	ctx := context.Background()
	const T = 16
	cfg := enginesim.Config{Socket: r.Info.Socket, ModelKey: "m1", World: 1, TokensPerBlock: T, Slots: 256, PageBytes: []int{1024}, Chunk: 2 * T}
	reqs := prompts(5, 6, T, "a")
	rank0 := map[string]string{"model_key": "m1", "rank": "0"}

	cfg.Name = "first"
	e, err := enginesim.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Run(ctx, reqs, 2); err != nil {
		t.Fatal(err)
	}
	live := scrape(t, base)
	before, ok := value(live, "kvctl_rank_save_put_pages_total", rank0)
	if !ok || before == 0 {
		t.Fatalf("kvctl_rank_save_put_pages_total{m1,0} = %v (%v) while the engine runs", before, ok)
	}
	if reg, _ := value(live, "kvctl_rank_registered", rank0); reg != 1 {
		t.Errorf("kvctl_rank_registered = %v, want 1", reg)
	}
	if err := e.Close(ctx); err != nil {
		t.Fatal(err)
	}
	gone := scrape(t, base)
	if v, ok := value(gone, "kvctl_rank_save_put_pages_total", rank0); !ok || v != before {
		t.Errorf("after the engine left: kvctl_rank_save_put_pages_total = %v (%v), want %v kept", v, ok, before)
	}
	if reg, _ := value(gone, "kvctl_rank_registered", rank0); reg != 0 {
		t.Errorf("kvctl_rank_registered = %v after the engine left, want 0", reg)
	}
	if v, _ := value(gone, "kvctl_save_put_pages_total", nil); v != before {
		t.Errorf("daemon total kvctl_save_put_pages_total = %v after the engine left, want %v", v, before)
	}

	// A restarted engine with the same model and rank counts on from where the first stopped.
	cfg.Name = "second"
	e2, err := enginesim.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e2.Run(ctx, prompts(6, 4, T, "b"), 2); err != nil {
		t.Fatal(err)
	}
	if err := e2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	again := scrape(t, base)
	if v, _ := value(again, "kvctl_rank_save_put_pages_total", rank0); v <= before {
		t.Errorf("after a second engine on m1/0: kvctl_rank_save_put_pages_total = %v, want above %v", v, before)
	}
	total, _ := value(again, "kvctl_save_put_pages_total", nil)

	deadline := time.Now().Add(30 * time.Second)
	for {
		fams := scrape(t, base)
		if _, ok := value(fams, "kvctl_rank_save_put_pages_total", rank0); !ok {
			if v, _ := value(fams, "kvctl_save_put_pages_total", nil); v != total {
				t.Errorf("daemon total changed from %v to %v when the engine series expired", total, v)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the series of m1/0 is still exported long after its %v retention", retention)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestMetricsNegotiation checks the formats /metrics offers: Prometheus text by default,
// OpenMetrics when asked, gzip when accepted, and protobuf with native histograms.
func TestMetricsNegotiation(t *testing.T) {
	r := start(t, 64<<20)
	base := "http://" + r.Info.AdminAddr
	replayColdWarm(t, r)

	get := func(accept, encoding string) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, base+"/metrics", nil)
		if err != nil {
			t.Fatal(err)
		}
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		// Setting Accept-Encoding by hand keeps the transport from decompressing on its own.
		req.Header.Set("Accept-Encoding", encoding)
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, b
	}

	resp, body := get("", "identity")
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("default Content-Type %q", ct)
	}
	if !bytes.Contains(body, []byte("# TYPE kvctl_lookup_duration_seconds histogram")) {
		t.Error("text output lacks the lookup histogram")
	}

	resp, body = get("application/openmetrics-text;version=1.0.0", "identity")
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/openmetrics-text") {
		t.Errorf("OpenMetrics Content-Type %q", ct)
	}
	if !bytes.HasSuffix(body, []byte("# EOF\n")) {
		t.Error("OpenMetrics output does not end in # EOF")
	}

	resp, body = get("", "gzip")
	if resp.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("Content-Encoding %q with gzip accepted", resp.Header.Get("Content-Encoding"))
	}
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := io.ReadAll(zr)
	if err != nil || !bytes.Contains(plain, []byte("kvctl_build_info{")) {
		t.Errorf("gzipped body does not decode to the metrics: %v", err)
	}

	resp, body = get("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited", "identity")
	if ct := resp.Header.Get("Content-Type"); !strings.Contains(ct, "application/vnd.google.protobuf") {
		t.Fatalf("protobuf Content-Type %q", ct)
	}
	dec := expfmt.NewDecoder(bytes.NewReader(body), expfmt.NewFormat(expfmt.TypeProtoDelim))
	native := false
	for {
		var f dto.MetricFamily
		if err := dec.Decode(&f); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatal(err)
		}
		if f.GetName() == "kvctl_lookup_duration_seconds" {
			h := f.GetMetric()[0].GetHistogram()
			native = h.Schema != nil && h.GetSampleCount() > 0 && (len(h.GetPositiveSpan()) > 0 || h.GetZeroCount() > 0)
			if len(h.GetBucket()) == 0 {
				t.Error("protobuf lookup histogram lost its classic buckets")
			}
		}
	}
	if !native {
		t.Error("kvctl_lookup_duration_seconds is not a native histogram in protobuf")
	}
}

// TestBuildInfoAndErrorSeries pins two promises of /metrics: kvctl_build_info's revision is the
// commit kvctl version prints (daemon.Config.Commit), and kvctl_engine_call_errors_total exists
// at 0 before the first error, as every family does.
func TestBuildInfoAndErrorSeries(t *testing.T) {
	popts := embedded.DefaultOptions()
	popts.Segments = []embedded.SegmentSpec{{Name: "test", Capacity: 32 << 20}}
	r := daemontest.Start(t, daemon.Config{Pool: popts, Defaults: connector.Options{StagingBufferBytes: 8 << 20}, Version: "v9.9.9", Commit: "0123abcd"})
	fresh := scrape(t, "http://"+r.Info.AdminAddr)
	if _, ok := value(fresh, "kvctl_build_info", map[string]string{"version": "v9.9.9", "revision": "0123abcd"}); !ok {
		t.Errorf("kvctl_build_info lacks revision=\"0123abcd\": %v", fresh["kvctl_build_info"])
	}
	for _, code := range []string{"Internal", "Unavailable"} {
		if v, ok := value(fresh, "kvctl_engine_call_errors_total", map[string]string{"method": "Lookup", "code": code}); !ok || v != 0 {
			t.Errorf("kvctl_engine_call_errors_total{method=\"Lookup\",code=%q} = %v (present %v), want 0", code, v, ok)
		}
	}
}
