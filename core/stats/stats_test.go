package stats

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// pattern turns "##.#" into a completeness slice: '#' complete, '.' missing.
func pattern(s string) []bool {
	out := make([]bool, len(s))
	for i, c := range s {
		out[i] = c == '#'
	}
	return out
}

func TestFoldLookup(t *testing.T) {
	const T = 16
	tests := []struct {
		name string
		in   string
		hit  int
		want HoleStats
	}{
		{"empty", "", 0, HoleStats{}},
		{"all hit", "####", 4, HoleStats{Lookups: 1, LookedUpBlocks: 4, HitBlocks: 4}},
		{"all miss", "....", 0, HoleStats{Lookups: 1, LookedUpBlocks: 4}},
		{"prefix then tail miss", "##..", 2, HoleStats{Lookups: 1, LookedUpBlocks: 4, HitBlocks: 2}},
		{"one hole", "##.##", 2, HoleStats{Lookups: 1, LookedUpBlocks: 5, HitBlocks: 2, Holes: 1, HoleBlocks: 1, RecomputedStoredTokens: 2 * T}},
		{"hole at head", "..###", 0, HoleStats{Lookups: 1, LookedUpBlocks: 5, Holes: 1, HoleBlocks: 2, RecomputedStoredTokens: 3 * T}},
		{"two holes and a tail", "#.##...#..", 1, HoleStats{Lookups: 1, LookedUpBlocks: 10, HitBlocks: 1, Holes: 2, HoleBlocks: 4, RecomputedStoredTokens: 3 * T}},
		{"alternating", ".#.#.#", 0, HoleStats{Lookups: 1, LookedUpBlocks: 6, Holes: 3, HoleBlocks: 3, RecomputedStoredTokens: 3 * T}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hit, got := FoldLookup(pattern(tt.in), T)
			if hit != tt.hit || got != tt.want {
				t.Fatalf("FoldLookup(%q) = %d, %+v; want %d, %+v", tt.in, hit, got, tt.hit, tt.want)
			}
		})
	}
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestReporterIntervalAndFlush(t *testing.T) {
	var buf bytes.Buffer
	clk := &fakeClock{t: time.Unix(1000, 0)}
	reg := prometheus.NewRegistry()
	r, err := NewReporter(ReporterOptions{
		Interval:    10 * time.Second,
		Logger:      slog.New(slog.NewTextHandler(&buf, nil)),
		Now:         clk.Now,
		Registerer:  reg,
		ConstLabels: prometheus.Labels{"rank": "0"},
	})
	if err != nil {
		t.Fatal(err)
	}
	_, h := FoldLookup(pattern("##.#"), 4)
	r.RecordLookup(h)
	r.TickHoles()
	if buf.Len() != 0 {
		t.Fatalf("logged before the interval: %s", buf.String())
	}
	clk.Advance(10 * time.Second)
	r.RecordLookup(h)
	r.TickHoles()
	r.TickHoles() // a second tick in the same interval logs nothing
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], `msg="prefix-hole stats"`) ||
		!strings.Contains(lines[0], "lookups=2") || !strings.Contains(lines[0], "holes=2") ||
		!strings.Contains(lines[0], "hole_blocks=2") || !strings.Contains(lines[0], "recomputed_stored_tokens=8") {
		t.Fatalf("lines = %q", lines)
	}

	s := &LoadSample{Pages: 10, StoreCalls: 2, LandedBytes: 4096, FailedPages: 1, Transfer: 3 * time.Millisecond}
	m := s.Start()
	s.End(PhaseGet, m)
	r.RecordLoad(s)
	r.RecordLoad(&LoadSample{Pages: 2, StoreCalls: 1, LandedBytes: 100, Async: true, Wait: time.Millisecond})
	r.TickLoads() // same interval as construction + 10s? lastLoadLine is construction time: due now
	r.Flush()
	out := buf.String()
	if got := strings.Count(out, `msg="load stats"`); got != 1 {
		t.Fatalf("load stats lines = %d in %s", got, out)
	}
	if !strings.Contains(out, "pages=12") || !strings.Contains(out, "failed_pages=1") || !strings.Contains(out, "async_loads=1") {
		t.Fatalf("load line missing counters: %s", out)
	}
	// Flush with nothing pending logs nothing more.
	before := buf.Len()
	r.Flush()
	if buf.Len() != before {
		t.Fatalf("empty flush logged: %s", buf.String()[before:])
	}

	if got := testutil.ToFloat64(r.m.lookups); got != 2 {
		t.Errorf("lookups metric = %v", got)
	}
	if got := testutil.ToFloat64(r.m.pages); got != 12 {
		t.Errorf("pages metric = %v", got)
	}
	if got := testutil.ToFloat64(r.m.bytes); got != 4196 {
		t.Errorf("bytes metric = %v", got)
	}
	n, err := testutil.GatherAndCount(reg, "kvctl_load_phase_seconds_total")
	if err != nil || n != int(NumPhases) {
		t.Errorf("phase series = %d, %v", n, err)
	}
	// A second reporter with the same labels cannot register; with other labels it can.
	if _, err := NewReporter(ReporterOptions{Registerer: reg, ConstLabels: prometheus.Labels{"rank": "0"}}); err == nil {
		t.Error("duplicate registration succeeded")
	}
	r2, err := NewReporter(ReporterOptions{Registerer: reg, ConstLabels: prometheus.Labels{"rank": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	r2.Unregister()
	r.Unregister()
}

func TestNilReporterAndSample(t *testing.T) {
	var r *Reporter
	r.RecordLookup(HoleStats{Lookups: 1})
	r.RecordLoad(&LoadSample{})
	r.TickHoles()
	r.TickLoads()
	r.Flush()
	var s *LoadSample
	s.End(PhaseGet, s.Start())
	if r.Enabled() || r.HoleTotals() != (HoleStats{}) {
		t.Fatal("nil reporter reported something")
	}
}

func TestLoadStatsConcurrent(t *testing.T) {
	var l LoadStats
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 100; j++ {
				l.Record(&LoadSample{Pages: 1, LandedBytes: 10})
			}
		}()
	}
	wg.Wait()
	tot, _, _ := l.Drain()
	if tot.Pages != 800 || tot.LandedBytes != 8000 || tot.Loads != 800 {
		t.Fatalf("totals %+v", tot)
	}
	if again, _, _ := l.Drain(); again.Loads != 0 {
		t.Fatal("drain did not reset")
	}
	if l.Totals().Pages != 800 {
		t.Fatal("totals lost")
	}
}
