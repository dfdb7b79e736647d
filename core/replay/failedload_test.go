package replay

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"
)

// failedLoadTrace, for one rank with a local cache of 40 blocks and a pool of 80 pages: at 0 s
// four prompts of 8 blocks and a token (a0-a3) are computed and saved; at 0.5 s four fresh
// ones (x0-x3) push them out of the local cache; at 1 s three fresh prompts of 4 blocks
// (f0-f2) arrive with a0-a3's prompts again (b0-b3). The f requests are admitted and computed
// in the first pass; b0 and b1, pool hits of 8 blocks, park, b1's transfer queued behind b0's
// on the rank's load worker, and the local cache has no room for b2 and b3 yet. Every request
// decodes 2 tokens.
func failedLoadTrace() *Trace {
	tr := &Trace{Name: "hand-made", Format: FormatTokens}
	add := func(id string, at time.Duration, seed, blocks int) {
		toks := make([]int64, blocks*16+1)
		for i := range toks {
			toks[i] = int64(100000*seed + i)
		}
		tr.Requests = append(tr.Requests, Request{Line: len(tr.Requests) + 1, ID: id, Arrival: at,
			InputLength: len(toks), OutputLength: 2, Tokens: toks})
	}
	for k := range 4 {
		add(fmt.Sprintf("a%d", k), 0, k+1, 8)
	}
	for k := range 4 {
		add(fmt.Sprintf("x%d", k), time.Second/2, 20+k, 8)
	}
	for k := range 3 {
		add(fmt.Sprintf("f%d", k), time.Second, 10+k, 4)
	}
	for k := range 4 {
		add(fmt.Sprintf("b%d", k), time.Second, k+1, 8)
	}
	return tr
}

// Seed commit 4 in the replay's model: a page the lookup found can be gone by the time its
// load reads it. With asynchronous loads each transfer reads the pool when the rank's load
// worker starts it; while b1-b3 wait behind b0's transfer, the fresh prompts' saves push the
// pool (48 pages) past its watermark and an eviction tick takes the oldest pages, which are
// theirs: the existence probe of their lookup granted no lease (exist_key_grant_lease=false,
// Mooncake's flag), and b0's transfer leased only its own. Their loads fail, each such request
// restarts without the offer, is looked up again and completes, and the token accounting holds.
// With the lookup's lease (the master's default) the same trace loses no load.
func TestAsyncLoadsFailWhenThePoolEvictsWhileTheyWait(t *testing.T) {
	tr := failedLoadTrace()
	var in, blocks int64
	for _, q := range tr.Requests {
		in += int64(q.InputLength)
		blocks += int64(blocksOf(tr.Format, q, 16))
	}
	run := func(lease bool, tick time.Duration) (RunReport, []int) {
		t.Helper()
		c := schedConfig(t, "async_load=true", "pool_size=5GiB", "gpu_blocks=40", "eviction_ratio=0.5",
			fmt.Sprintf("exist_key_grant_lease=%t", lease))
		p := DefaultParams()
		p.TickInterval = tick
		hits := make([]int, len(tr.Requests))
		p.observe = func(i, hit int) { hits[i] = hit }
		rep, err := Offline(context.Background(), tr, p, []Config{c})
		if err != nil {
			t.Fatal(err)
		}
		return rep.Runs[0], hits
	}
	rep, hits := run(false, DefaultParams().TickInterval)
	s := rep.Scheduler
	t.Logf("no lease: failed loads %d, tokens %+v, scheduler %+v, pool %+v, hits %v", rep.FailedLoads, rep.Tokens, *s, rep.Pool, hits)
	// b1's transfer was queued behind b0's when the tick took its pages. b2 and b3 were not
	// admitted yet: their lookups come after the tick and miss, which is no failed load.
	if rep.FailedLoads != 1 || rep.Pool.EvictionRounds == 0 {
		t.Fatalf("%d failed loads after %d eviction rounds, want b1's", rep.FailedLoads, rep.Pool.EvictionRounds)
	}
	// Every request completed its prompt once: each is accounted once on its rank, the
	// restarted one after its second admission.
	if rep.Requests != len(tr.Requests) || rep.FailedRequests != 0 || rep.RankLoad[0].Requests != len(tr.Requests) {
		t.Fatalf("%d requests, %d failed, %d accounted on the rank; want all %d completed once",
			rep.Requests, rep.FailedRequests, rep.RankLoad[0].Requests, len(tr.Requests))
	}
	// The failed load is one more admission of its request: admitted, then again after its
	// restart (nothing was preempted or deferred).
	if s.Preemptions != 0 || s.Deferrals != 0 || s.Admissions != int64(len(tr.Requests)+rep.FailedLoads) {
		t.Fatalf("%d admissions, %d preemptions, %d deferrals for %d requests and %d failed loads", s.Admissions, s.Preemptions, s.Deferrals, len(tr.Requests), rep.FailedLoads)
	}
	// Token accounting: only b0's landed transfer is a pool hit (8 blocks of 16 tokens, 8
	// pages moved, its modelled load time); b1's failed transfer counts neither as a hit nor as
	// bytes moved, and its prompt is recomputed whole.
	tk := rep.Tokens
	pageSec := float64(DefaultParams().PageBytes) / DefaultParams().LoadBandwidth
	if tk.Input != in || tk.LocalHit != 0 || tk.PoolHit != 8*16 || tk.Recomputed != in-8*16 || rep.RankLoad[0].RecomputedTokens != tk.Recomputed {
		t.Fatalf("tokens %+v (rank recomputed %d), want input %d, 128 from the pool and the rest recomputed", tk, rep.RankLoad[0].RecomputedTokens, in)
	}
	if rep.Moved.LoadedPages != 8 || math.Abs(rep.Time.LoadSec-8*pageSec) > 1e-12 {
		t.Fatalf("moved %d pages in %v s, want b0's 8 in %v s", rep.Moved.LoadedPages, rep.Time.LoadSec, 8*pageSec)
	}
	if rep.Blocks.Input != blocks || rep.Blocks.PoolHit != int64(hits[11]+hits[12]) {
		t.Fatalf("blocks %+v, want %d input blocks and b0's and b1's pool hits %v", rep.Blocks, blocks, hits[11:13])
	}
	// b0's transfer started at once and restored its 8 blocks; b1, looked up again after its
	// restart, found none of its pages.
	if hits[11] != 8 || hits[12] != 0 {
		t.Fatalf("b0 and b1 restored %v blocks, want 8 and 0", hits[11:13])
	}

	leased, lhits := run(true, DefaultParams().TickInterval)
	if leased.FailedLoads != 0 || leased.Requests != len(tr.Requests) || leased.FailedRequests != 0 {
		t.Fatalf("with the lookup's lease: %d failed loads, %d requests, %d failed; want none failed", leased.FailedLoads, leased.Requests, leased.FailedRequests)
	}
	if lhits[11] != 8 || lhits[12] != 8 {
		t.Fatalf("with the lookup's lease b0 and b1 restored %v blocks, want 8 each", lhits[11:13])
	}

	// Events keep their virtual-time order: with ticks every 341 ms, the first tick after the
	// fresh saves is at 1.023 s, after b1's transfer started (1.020 s), and one pass of the rank
	// (1.0039 s to 1.0239 s) spans both. The transfer reads first and leases its pages, so the
	// tick takes other pages and no load fails.
	late, thits := run(false, 341*time.Millisecond)
	if late.FailedLoads != 0 || late.Pool.EvictionRounds == 0 || thits[11] != 8 || thits[12] != 8 {
		t.Fatalf("ticks every 341 ms: %d failed loads, %d eviction rounds, b0 and b1 restored %v blocks; want none failed after a round, 8 each",
			late.FailedLoads, late.Pool.EvictionRounds, thits[11:13])
	}
}
