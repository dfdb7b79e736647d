package probe

import (
	"bytes"
	"log/slog"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/stats"
)

func blocks(s string) []bool {
	out := make([]bool, len(s))
	for i, c := range s {
		out[i] = c == '#'
	}
	return out
}

func TestAnalyze(t *testing.T) {
	tests := []struct {
		in    string // '#' complete, '.' incomplete
		hit   int
		holes []Hole
		tail  int
	}{
		{in: "", hit: 0},
		{in: "####", hit: 4},
		{in: "....", hit: 0, tail: 4},
		{in: "##..", hit: 2, tail: 2},
		{in: "##.#", hit: 2, holes: []Hole{{Start: 2, Blocks: 1, StoredBlocks: 1, RecomputedStoredTokens: 4}}},
		{in: "#..##.#..", hit: 1, holes: []Hole{
			{Start: 1, Blocks: 2, StoredBlocks: 2, RecomputedStoredTokens: 8},
			{Start: 5, Blocks: 1, StoredBlocks: 1, RecomputedStoredTokens: 4},
		}, tail: 2},
		{in: ".#", hit: 0, holes: []Hole{{Start: 0, Blocks: 1, StoredBlocks: 1, RecomputedStoredTokens: 4}}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			a := Analyze(blocks(tt.in), 4)
			if a.Hit != tt.hit || a.MissingTail != tt.tail || !reflect.DeepEqual(a.Holes, tt.holes) || a.Blocks != len(tt.in) {
				t.Errorf("got hit %d tail %d holes %+v, want %d %d %+v", a.Hit, a.MissingTail, a.Holes, tt.hit, tt.tail, tt.holes)
			}
		})
	}
}

// TestAnalyzeAgreesWithFoldLookup checks that the holes a probe reports add up to the counts the
// connector's stats fold from the same answer.
func TestAnalyzeAgreesWithFoldLookup(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 0; n < 2000; n++ {
		c := make([]bool, rng.IntN(20))
		for i := range c {
			c[i] = rng.IntN(3) > 0
		}
		a := Analyze(c, 16)
		hit, s := stats.FoldLookup(c, 16)
		var holeBlocks, stored int64
		for _, h := range a.Holes {
			holeBlocks += int64(h.Blocks)
			stored += h.RecomputedStoredTokens
		}
		if a.Hit != hit || a.Stats != s || int64(len(a.Holes)) != s.Holes || holeBlocks != s.HoleBlocks || stored != s.RecomputedStoredTokens {
			t.Fatalf("%v: analysis %+v disagrees with FoldLookup %d %+v", c, a, hit, s)
		}
		if a.Hit+int(holeBlocks)+int(stored/16)+a.MissingTail != len(c) {
			t.Fatalf("%v: blocks do not add up: %+v", c, a)
		}
	}
}

// reporterLines writes stats lines with core/stats' real reporter in the given slog handler.
func reporterLines(t *testing.T, json bool) string {
	t.Helper()
	var buf bytes.Buffer
	var h slog.Handler = slog.NewTextHandler(&buf, nil)
	if json {
		h = slog.NewJSONHandler(&buf, nil)
	}
	r, err := stats.NewReporter(stats.ReporterOptions{Interval: time.Second, Logger: slog.New(h).With("engine", "e0")})
	if err != nil {
		t.Fatal(err)
	}
	r.RecordLookup(stats.HoleStats{Lookups: 2, LookedUpBlocks: 10, HitBlocks: 4, Holes: 1, HoleBlocks: 2, RecomputedStoredTokens: 64})
	s := &stats.LoadSample{Pages: 8, StoreCalls: 2, LandedBytes: 4096, Transfer: 3 * time.Millisecond}
	s.Phases[stats.PhaseGet] = stats.PhaseTime{Wall: 2 * time.Millisecond, CPU: time.Millisecond}
	r.RecordLoad(s)
	r.RecordLoad(&stats.LoadSample{Pages: 2, StoreCalls: 1, LandedBytes: 1024, Transfer: 5 * time.Millisecond, Async: true, Wait: 4 * time.Millisecond, FailedPages: 1})
	r.Flush()
	r.RecordLookup(stats.HoleStats{Lookups: 1, LookedUpBlocks: 3, HitBlocks: 3})
	r.Flush()
	return buf.String()
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestParseLogKvctlFormats(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			log := "starting\n" + reporterLines(t, format == "json") + "level=INFO msg=\"something else\" a=1\n"
			ls, err := ParseLog(strings.NewReader(log))
			if err != nil {
				t.Fatal(err)
			}
			want := stats.HoleStats{Lookups: 3, LookedUpBlocks: 13, HitBlocks: 7, Holes: 1, HoleBlocks: 2, RecomputedStoredTokens: 64}
			if ls.Holes != want || ls.HoleLines != 2 || ls.LoadLines != 1 || ls.Skipped != 2 || ls.Malformed != 0 || ls.Lines != 5 {
				t.Fatalf("%+v\n%s", ls, log)
			}
			l := ls.Loads
			if l.Loads != 2 || l.AsyncLoads != 1 || l.Pages != 10 || l.StoreCalls != 3 || l.LandedBytes != 5120 || l.FailedPages != 1 {
				t.Errorf("loads %+v", l)
			}
			if !near(l.TransferSeconds, 0.008) || !near(l.TransferMaxSecs, 0.005) || !near(l.WaitSeconds, 0.004) || !near(l.WaitMaxSeconds, 0.004) {
				t.Errorf("times %+v", l)
			}
			if g := l.Phases["get"]; !near(g.WallSeconds, 0.002) || !near(g.CPUSeconds, 0.001) {
				t.Errorf("get phase %+v", g)
			}
		})
	}
}

func TestParseLogSeedFormats(t *testing.T) {
	log := strings.Join([]string{
		"[11/30/2026-06:28:06] [TRT-LLM] [I] mooncake-store prefix-hole stats: lookups=4 looked_up_blocks=20, hit_blocks=12, holes=2, hole_blocks=3, recomputed_stored_tokens=128",
		"[11/30/2026-06:28:07] [TRT-LLM] [I] mooncake-store rank 0 load stats: loads=3 pages=24 store_calls=3 landed_bytes=98304 transfer_ms mean=2.0 max=4.0 resolve_wall_ms=0.5 resolve_cpu_ms=0.25 get_wall_ms=3.0 get_cpu_ms=1.0",
		"[TensorRT-LLM][INFO] mooncake-store async-load stats: rank 1 workers 2 completed=2 wait_ms mean=1.5 max=2.0 transfer_ms mean=10.0 max=12.0 queue=0 active=1 failed_pages=1 loaded_gib=0.50",
		"[TensorRT-LLM][INFO] mooncake-store matched 4 blocks (128 tokens) for request 7",
		"mooncake-store prefix-hole stats: lookups=x",
	}, "\n")
	ls, err := ParseLog(strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	if ls.Holes != (stats.HoleStats{Lookups: 4, LookedUpBlocks: 20, HitBlocks: 12, Holes: 2, HoleBlocks: 3, RecomputedStoredTokens: 128}) {
		t.Errorf("holes %+v", ls.Holes)
	}
	if ls.HoleLines != 1 || ls.LoadLines != 2 || ls.Skipped != 2 || ls.Malformed != 1 || ls.FirstMalformed != 5 {
		t.Errorf("counts %+v", ls)
	}
	l := ls.Loads
	if l.Loads != 5 || l.AsyncLoads != 2 || l.Pages != 24 || l.LandedBytes != 98304+(1<<29) || l.FailedPages != 1 {
		t.Errorf("loads %+v", l)
	}
	if !near(l.TransferSeconds, 0.006+0.020) || !near(l.TransferMaxSecs, 0.012) || !near(l.WaitSeconds, 0.003) || !near(l.WaitMaxSeconds, 0.002) {
		t.Errorf("times %+v", l)
	}
	if r := l.Phases["resolve"]; !near(r.WallSeconds, 0.0005) || !near(r.CPUSeconds, 0.00025) {
		t.Errorf("resolve %+v", r)
	}
}

func FuzzParseLog(f *testing.F) {
	f.Add("level=INFO msg=\"prefix-hole stats\" lookups=1 holes=2\n")
	f.Add(`{"msg":"load stats","loads":1,"pages":"x"}`)
	f.Add("x load stats: wait_ms mean= max=\"")
	f.Fuzz(func(t *testing.T, s string) {
		ls, err := ParseLog(strings.NewReader(s))
		if err != nil {
			return
		}
		if ls.HoleLines+ls.LoadLines+ls.Skipped != ls.Lines {
			t.Fatalf("lines do not add up: %+v", ls)
		}
	})
}
