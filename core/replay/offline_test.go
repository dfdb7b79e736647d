package replay

import (
	"context"
	"os"
	"reflect"
	"testing"
	"time"
)

// conversationTrace returns the path of the whole Mooncake conversation trace: the shared copy
// when this checkout sits next to it, else the copy core/radix keeps.
func conversationTrace(t testing.TB) string {
	for _, p := range []string{"../../../shared/traces/conversation_trace.jsonl", "../radix/testdata/conversation_trace.jsonl"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Skip("conversation trace not found")
	return ""
}

func readTrace(t testing.TB, path string) *Trace {
	t.Helper()
	tr, err := ReadTraceFile(path, ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// idealHits computes, from hash_ids alone, each request's ideal prefix reuse in blocks: the
// leading blocks whose whole block-prefix chain was a full block of an earlier request (a
// partial last block is never stored), capped at all blocks but the last, since the last
// prompt token is always computed and with it the block that holds it.
func idealHits(tr *Trace) []int {
	type node struct {
		parent int
		id     int64
	}
	seen := map[node]int{}
	out := make([]int, len(tr.Requests))
	for i, r := range tr.Requests {
		parent, hit, chained := 0, 0, true
		full := len(r.HashIDs) - 1
		if r.InputLength%TraceBlockTokens == 0 {
			full = len(r.HashIDs)
		}
		for b, h := range r.HashIDs[:full] {
			k := node{parent, h}
			id, ok := seen[k]
			if !ok {
				id = len(seen) + 1
				seen[k] = id
			} else if chained && b < len(r.HashIDs)-1 {
				hit++
			}
			chained = chained && ok
			parent = id
		}
		out[i] = hit
	}
	return out
}

func TestUnlimitedPoolReproducesIdealReuse(t *testing.T) {
	tr := readTrace(t, conversationTrace(t))
	ideal := idealHits(tr)
	got := make([]int, len(tr.Requests))
	p := DefaultParams()
	p.observe = func(i, hit int) { got[i] = hit }
	rep, err := Offline(context.Background(), tr, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	var want int64
	for i := range ideal {
		want += int64(ideal[i])
		if got[i] != ideal[i] {
			t.Errorf("request %d (line %d): %d hit blocks, ideal %d", i, tr.Requests[i].Line, got[i], ideal[i])
		}
	}
	run := rep.Runs[0]
	if hit := run.Blocks.LocalHit + run.Blocks.PoolHit; hit != want {
		t.Fatalf("hit blocks %d (local %d + pool %d), ideal %d", hit, run.Blocks.LocalHit, run.Blocks.PoolHit, want)
	}
	if run.Pool.Evicted != 0 || run.Holes.Holes != 0 || run.FailedRequests != 0 {
		t.Fatalf("unlimited pool: evicted %d, holes %d, failed %d", run.Pool.Evicted, run.Holes.Holes, run.FailedRequests)
	}
	t.Logf("ideal %d blocks; local %d pool %d; hit rate %.4f (local %.4f pool %.4f)", want, run.Blocks.LocalHit, run.Blocks.PoolHit, run.HitRate.Total, run.HitRate.Local, run.HitRate.Pool)
}

func TestSameSeedSameReport(t *testing.T) {
	tr := readTrace(t, "testdata/conversation_head500.jsonl")
	cfg := DefaultConfig()
	cfg.PoolBytes = 600 << 20 * 64 // 600 pages of 64 MiB
	cfg.Ranks = 2
	run := func() *Report {
		rep, err := Offline(context.Background(), tr, DefaultParams(), []Config{cfg})
		if err != nil {
			t.Fatal(err)
		}
		for i := range rep.Runs {
			rep.Runs[i].Wall = WallTimes{}
		}
		return rep
	}
	a, b := run(), run()
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("two runs with the same seed differ:\n%+v\n%+v", a.Runs[0], b.Runs[0])
	}
}

func BenchmarkReplayConversationTrace(b *testing.B) {
	tr := readTrace(b, conversationTrace(b))
	b.ResetTimer()
	for b.Loop() {
		if _, err := Offline(context.Background(), tr, DefaultParams(), nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(tr.Requests)), "requests/op")
}

func TestBoundedPoolShowsEvictionsAndHoles(t *testing.T) {
	if testing.Short() {
		t.Skip("replays the whole conversation trace")
	}
	tr := readTrace(t, conversationTrace(t))
	cfg := DefaultConfig()
	cfg.GPUBlocks = 2048
	cfg.PoolBytes = 1 << 40 // 16384 pages of 64 MiB
	cfg.SoftPinTTL = 10 * time.Minute
	rep, err := Offline(context.Background(), tr, DefaultParams(), []Config{cfg})
	if err != nil {
		t.Fatal(err)
	}
	run := rep.Runs[0]
	ideal := int64(0)
	for _, h := range idealHits(tr) {
		ideal += int64(h)
	}
	if run.Pool.Evicted == 0 || run.Pool.EvictionRounds == 0 {
		t.Fatalf("no eviction in a bounded pool: %+v", run.Pool)
	}
	if run.Holes.Holes == 0 || run.Holes.HoleBlocks < run.Holes.Holes {
		t.Fatalf("no prefix holes: %+v", run.Holes)
	}
	if hit := run.Blocks.LocalHit + run.Blocks.PoolHit; hit >= ideal {
		t.Fatalf("a bounded pool hit %d blocks, the ideal is %d", hit, ideal)
	}
	if run.Pool.PeakUsedBytes > run.Pool.CapacityBytes {
		t.Fatalf("peak %d above capacity %d", run.Pool.PeakUsedBytes, run.Pool.CapacityBytes)
	}
	t.Logf("evicted %d in %d rounds; %d holes of %d blocks; hit rate %.4f", run.Pool.Evicted, run.Pool.EvictionRounds, run.Holes.Holes, run.Holes.HoleBlocks, run.HitRate.Total)
}
