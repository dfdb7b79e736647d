package replay

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// tokenTrace builds a token trace: request k has its own prompt of prompt tokens (the first
// shared tokens common to all), output tokens, and arrives at arrivals[k].
func tokenTrace(n, prompt, shared, output int, arrival func(k int) time.Duration) *Trace {
	tr := &Trace{Name: "hand-made", Format: FormatTokens}
	for k := range n {
		toks := make([]int64, prompt)
		for i := range toks {
			if i < shared {
				toks[i] = int64(1000 + i)
			} else {
				toks[i] = int64(100000*(k+1) + i)
			}
		}
		tr.Requests = append(tr.Requests, Request{Line: k + 1, ID: fmt.Sprintf("r%d", k), Arrival: arrival(k),
			InputLength: prompt, OutputLength: output, Tokens: toks})
	}
	return tr
}

func schedConfig(t *testing.T, sets ...string) Config {
	t.Helper()
	c := DefaultConfig()
	for _, s := range append([]string{"scheduler=true"}, sets...) {
		k, v, _ := cut(s)
		if err := c.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	c.Name = fmt.Sprint(sets)
	return c
}

func cut(s string) (string, string, bool) {
	for i := range s {
		if s[i] == '=' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

func runOne(t *testing.T, tr *Trace, c Config) RunReport {
	t.Helper()
	rep, err := Offline(context.Background(), tr, DefaultParams(), []Config{c})
	if err != nil {
		t.Fatal(err)
	}
	run := rep.Runs[0]
	if run.Scheduler == nil {
		t.Fatal("the scheduler model reported nothing")
	}
	if run.Requests != len(tr.Requests) || run.FailedRequests != 0 || run.Tokens.Input != int64(len(tr.Requests)*tr.Requests[0].InputLength) {
		t.Fatalf("requests %d, failed %d, input %d", run.Requests, run.FailedRequests, run.Tokens.Input)
	}
	if len(run.RankLoad) != 1 || run.RankLoad[0].Requests != len(tr.Requests) {
		t.Fatalf("rank load %+v", run.RankLoad)
	}
	return run
}

// Seed commit 6 on a hand-made trace: three requests of 3 prompt blocks that each grow by 3
// output blocks arrive together at a disaggregated generation server with 10 blocks. Without
// completion reservations all three are admitted against their prompts and decoding runs out of
// pages, so an admitted request is preempted; with them a request is admitted only while its
// whole bound fits, the others wait (their cache freed, not suspended), and no admitted request
// is ever preempted. An aggregated server never reserves, whatever the connector declares, and
// preempts as TensorRT-LLM does.
func TestCompletionReservationsPreventPreemption(t *testing.T) {
	tr := tokenTrace(3, 40, 0, 48, func(int) time.Duration { return 0 })

	agg := runOne(t, tr, schedConfig(t, "gpu_blocks=10", "completion_reservation=true", "server=aggregated")).Scheduler
	if agg.Preemptions == 0 || agg.ReservationsRefused != 0 || agg.PeakReservationsHeld != 0 {
		t.Fatalf("an aggregated server reserved completion headroom: %+v; want preemptions and no bound", *agg)
	}

	without := runOne(t, tr, schedConfig(t, "gpu_blocks=10", "completion_reservation=false", "server=generation"))
	ws := without.Scheduler
	if ws.Preemptions == 0 || ws.PreemptedRequests == 0 {
		t.Fatalf("without reservations nothing was preempted: %+v", *ws)
	}
	if ws.ReservationsRefused != 0 || ws.PeakReservationsHeld != 0 {
		t.Fatalf("without reservations a bound was held or refused: %+v", *ws)
	}

	t.Logf("without: %+v ttft p50 %.3f p99 %.3f", *ws, without.Latency.P50TTFTSec, without.Latency.P99TTFTSec)
	with := runOne(t, tr, schedConfig(t, "gpu_blocks=10", "server=generation"))
	s := with.Scheduler
	t.Logf("with: %+v ttft p50 %.3f p99 %.3f", *s, with.Latency.P50TTFTSec, with.Latency.P99TTFTSec)
	if s.Preemptions != 0 {
		t.Fatalf("with reservations %d admitted requests were preempted for lack of pages: %+v", s.Preemptions, *s)
	}
	if s.Admissions != 3 || s.ReservationsRefused == 0 || s.RefusedFreed != s.ReservationsRefused {
		t.Fatalf("admissions %d, refused %d, freed %d; want 3 admissions and every refusal freed", s.Admissions, s.ReservationsRefused, s.RefusedFreed)
	}
	if s.RequestsWaited != 2 || s.WaitPasses < 2 || s.PeakReservationsHeld != 1 || s.PeakReservedBlocks != 3 {
		t.Fatalf("waited %d (%d passes), peak held %d bounds of %d blocks; want 2 waiters and one 6-block bound holding 3 blocks back", s.RequestsWaited, s.WaitPasses, s.PeakReservationsHeld, s.PeakReservedBlocks)
	}
	// Waiting costs time to first token; preemption costs recomputation.
	if with.Latency.P99TTFTSec <= without.Latency.P50TTFTSec {
		t.Fatalf("p99 TTFT %.3fs with reservations, p50 %.3fs without: the waiters did not wait", with.Latency.P99TTFTSec, without.Latency.P50TTFTSec)
	}
}

// offerTrace: a cold request saves a 10-block prompt to the pool; two fillers push it out of
// the rank's local cache; a long generation then holds most of the rank's pages; a request with
// the cold prompt arrives and is offered 9 blocks from the pool while its first chunk (32-token
// budget) needs 2.
func offerTrace() *Trace {
	tr := tokenTrace(4, 160, 0, 0, func(k int) time.Duration { return time.Duration(k) * 100 * time.Millisecond })
	hold := tokenTrace(5, 112, 0, 120, func(int) time.Duration { return 0 })
	h := hold.Requests[4]
	h.ID, h.Line, h.Arrival = "hold", 4, 500*time.Millisecond
	b := tr.Requests[0]
	b.ID, b.Line, b.Arrival, b.OutputLength = "again", 5, 2600*time.Millisecond, 16
	tr.Requests = append(tr.Requests[:3], h, b)
	return tr
}

func runOffer(t *testing.T, sets ...string) *SchedulerCounts {
	t.Helper()
	tr := offerTrace()
	c := schedConfig(t, append([]string{"gpu_blocks=16", "max_num_tokens=32", "completion_reservation=false"}, sets...)...)
	rep, err := Offline(context.Background(), tr, DefaultParams(), []Config{c})
	if err != nil {
		t.Fatal(err)
	}
	run := rep.Runs[0]
	if run.FailedRequests != 0 || run.Requests != 5 {
		t.Fatalf("%d requests, %d failed", run.Requests, run.FailedRequests)
	}
	t.Logf("%v: %+v pool hit %d", sets, *run.Scheduler, run.Tokens.PoolHit)
	return run.Scheduler
}

// Seed commit 7: an offer the pool cannot cover at admission defers the first chunk up to
// max_offer_deferrals passes, then is shrunk; without admission queries the connector is asked
// only once the batch is final and an offer that cannot grow is shrunk at once.
func TestAdmissionQueryDefersThenShrinks(t *testing.T) {
	for _, n := range []int{0, 3} {
		s := runOffer(t, fmt.Sprintf("max_offer_deferrals=%d", n))
		if s.AdmissionQueries == 0 || (n == 0) != (s.Deferrals == 0) || s.Deferrals < int64(n) || s.OffersShrunk == 0 {
			t.Fatalf("max_offer_deferrals=%d: %d queries, %d deferrals, %d shrunk; want queries, at least %d deferrals (none for 0) and a shrink", n, s.AdmissionQueries, s.Deferrals, s.OffersShrunk, n)
		}
	}
	s := runOffer(t, "admission_query=false")
	if s.AdmissionQueries != 0 || s.Deferrals != 0 || s.OffersShrunk == 0 {
		t.Fatalf("without admission queries: %d queries, %d deferrals, %d shrunk; want 0, 0 and a shrink", s.AdmissionQueries, s.Deferrals, s.OffersShrunk)
	}
}

// Seed commits 7 and 17: with asynchronous loads the offered chunk parks, and up to
// max_uncharged_parks such chunks per pass are admitted without a token charge.
func TestUnchargedParks(t *testing.T) {
	for _, n := range []int{0, 1} {
		s := runOffer(t, "async_load=true", fmt.Sprintf("max_uncharged_parks=%d", n), "gpu_blocks=26")
		if s.Parked == 0 {
			t.Fatalf("max_uncharged_parks=%d: nothing parked: %+v", n, *s)
		}
		if (n == 0) != (s.UnchargedParks == 0) {
			t.Fatalf("max_uncharged_parks=%d: %d uncharged parks", n, s.UnchargedParks)
		}
	}
}

// BenchmarkSchedulerModel replays the whole conversation trace with each request served at once
// (the baseline) and with the scheduler model, in the same run.
func BenchmarkSchedulerModel(b *testing.B) {
	tr := readTrace(b, conversationTrace(b))
	for _, sched := range []bool{false, true} {
		b.Run(fmt.Sprintf("scheduler=%t", sched), func(b *testing.B) {
			c := DefaultConfig()
			c.Scheduler = sched
			for b.Loop() {
				rep, err := Offline(context.Background(), tr, DefaultParams(), []Config{c})
				if err != nil {
					b.Fatal(err)
				}
				if s := rep.Runs[0].Scheduler; s != nil {
					b.ReportMetric(float64(s.Passes), "passes/op")
				}
			}
			b.ReportMetric(float64(len(tr.Requests)), "requests/op")
		})
	}
}

// The scheduler model over the whole conversation trace: every request admitted, nothing
// failed, nothing preempted with completion reservations, and the hits close to serving each
// request at once (admission order changes which blocks are local when a request waits).
func TestSchedulerModelConversationTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("replays the whole conversation trace")
	}
	tr := readTrace(t, conversationTrace(t))
	c := DefaultConfig()
	c.Scheduler = true
	rep, err := Offline(context.Background(), tr, DefaultParams(), []Config{DefaultConfig(), c})
	if err != nil {
		t.Fatal(err)
	}
	base, run := rep.Runs[0], rep.Runs[1]
	s := run.Scheduler
	if run.Requests != len(tr.Requests) || run.FailedRequests != 0 || s.Admissions < int64(len(tr.Requests)) || s.Preemptions != 0 {
		t.Fatalf("requests %d, failed %d, scheduler %+v", run.Requests, run.FailedRequests, *s)
	}
	if d := run.HitRate.Total - base.HitRate.Total; d < -0.01 || d > 0.01 {
		t.Fatalf("total hit rate %.4f with the scheduler model, %.4f without", run.HitRate.Total, base.HitRate.Total)
	}
}

// Seed commit 6 on a disaggregated context server: a connector first chunk is bound through the
// end of its prompt only, so requests a generation server refuses as whole requests (prompt +
// output) are admitted there without a refusal, and nothing is decoded.
func TestContextServerReservesThroughThePrompt(t *testing.T) {
	tr := tokenTrace(3, 40, 0, 48, func(int) time.Duration { return 0 })
	agg := runOne(t, tr, schedConfig(t, "gpu_blocks=10", "max_num_tokens=48", "server=generation"))
	ctx := runOne(t, tr, schedConfig(t, "gpu_blocks=10", "max_num_tokens=48", "server=context"))
	a, c := agg.Scheduler, ctx.Scheduler
	if a.ReservationsRefused == 0 {
		t.Fatalf("whole requests were never refused: %+v", *a)
	}
	if c.ReservationsRefused != 0 || c.Preemptions != 0 || c.Admissions != 3 || c.PeakReservationsHeld == 0 {
		t.Fatalf("context server: %+v; want no refusal, no preemption, 3 admissions and a bound held across a pass", *c)
	}
	if c.Passes >= a.Passes {
		t.Fatalf("a context server ran %d passes, the generation one %d: it decoded", c.Passes, a.Passes)
	}
}

// Seed commit 6: a refused request's cache is freed instead of suspending it; the switch keeps
// it instead. Either way no admitted request is preempted: an unreserved allocation never takes
// pages an admitted bound counts on (kvcache's headroom rule), so a suspended request only holds
// pages the others' bounds left over.
func TestRefusedRequestCacheIsFreed(t *testing.T) {
	tr := tokenTrace(3, 40, 0, 48, func(int) time.Duration { return 0 })
	kept := runOne(t, tr, schedConfig(t, "gpu_blocks=10", "free_refused_generation=false", "server=generation")).Scheduler
	if kept.ReservationsRefused == 0 || kept.RefusedFreed != 0 || kept.Preemptions != 0 {
		t.Fatalf("kept suspended: %+v; want refusals, none freed, no preemption", *kept)
	}
	freed := runOne(t, tr, schedConfig(t, "gpu_blocks=10", "server=generation")).Scheduler
	if freed.ReservationsRefused == 0 || freed.RefusedFreed != freed.ReservationsRefused || freed.Preemptions != 0 {
		t.Fatalf("freed: %+v; want every refusal freed and no preemption", *freed)
	}
}

// With several ranks and a router capped at two active requests per rank, a request the router
// cannot place waits for the scheduler model's passes to finish one (runUntilEvent); every
// request is served on some rank and admission queries are off under attention DP.
func TestSchedulerModelWithCappedRouter(t *testing.T) {
	tr := tokenTrace(8, 40, 16, 32, func(int) time.Duration { return 0 })
	c := schedConfig(t, "ranks=2")
	p := DefaultParams()
	p.MaxActiveRequests = 2
	rep, err := Offline(context.Background(), tr, p, []Config{c})
	if err != nil {
		t.Fatal(err)
	}
	run := rep.Runs[0]
	s := run.Scheduler
	if run.Requests != 8 || run.FailedRequests != 0 || s.Admissions != 8 || s.AdmissionQueries != 0 {
		t.Fatalf("requests %d, failed %d, scheduler %+v; want 8 served and no admission query under attention DP", run.Requests, run.FailedRequests, *s)
	}
	for _, rl := range run.RankLoad {
		if rl.Requests != 4 {
			t.Fatalf("rank loads %+v, want 4 requests each under a cap of 2", run.RankLoad)
		}
	}
	// Requests placed after a slot freed started later: the last TTFT is past the first decode.
	if run.Latency.P99TTFTSec <= run.Latency.P50TTFTSec {
		t.Fatalf("TTFT p50 %.3fs, p99 %.3fs: nobody waited for a router slot", run.Latency.P50TTFTSec, run.Latency.P99TTFTSec)
	}
}

// Seed commit 20: the router's estimate is published as each request's uncached-prefill count,
// and the V2 scheduler's long-prefill demotion reads it. On one rank admitting one request per
// pass, a conversation's first turn runs, then a fresh 96-token prompt and the conversation's
// second turn (160 tokens, 32 of them new) wait together, the fresh one first in line. With
// long_prefill_tokens=64 the fresh prompt is long by the router's estimate and goes behind the
// second turn, which is long by its prompt length but not by its estimate. With the demotion
// off, or a prompt-length router whose estimate is the whole prompt (both long), nothing moves.
func TestLongPrefillDemotionReadsTheRoutersEstimate(t *testing.T) {
	turn := func(id, conv string, n int, at time.Duration, base int64) Request {
		toks := make([]int64, n)
		for i := range toks {
			toks[i] = base + int64(i)
		}
		return Request{ID: id, ConversationID: conv, Arrival: at, InputLength: n, OutputLength: 1, Tokens: toks}
	}
	tr := &Trace{Name: "hand-made", Format: FormatTokens, Requests: []Request{
		turn("c1", "conv", 128, 0, 1000),
		turn("fresh", "", 96, time.Second, 500000),
		turn("c2", "conv", 160, time.Second, 1000),
	}}
	for i := range tr.Requests {
		tr.Requests[i].Line = i + 1
	}
	run := func(sets ...string) *SchedulerCounts {
		t.Helper()
		rep, err := Offline(context.Background(), tr, DefaultParams(), []Config{schedConfig(t, append([]string{"max_batch_size=1"}, sets...)...)})
		if err != nil {
			t.Fatal(err)
		}
		r := rep.Runs[0]
		if r.Requests != 3 || r.FailedRequests != 0 {
			t.Fatalf("%v: %d requests, %d failed", sets, r.Requests, r.FailedRequests)
		}
		return r.Scheduler
	}
	if s := run("long_prefill_tokens=64"); s.LongPrefillsDemoted != 1 {
		t.Fatalf("demoted %d requests, want the fresh prompt only: %+v", s.LongPrefillsDemoted, *s)
	}
	if s := run("long_prefill_tokens=0"); s.LongPrefillsDemoted != 0 {
		t.Fatalf("the demotion off demoted %d requests", s.LongPrefillsDemoted)
	}
	if s := run("long_prefill_tokens=64", "router=prompt-length"); s.LongPrefillsDemoted != 0 {
		t.Fatalf("with whole prompts as the estimate (both long) %d requests were demoted", s.LongPrefillsDemoted)
	}
	if s := run("long_prefill_tokens=100"); s.LongPrefillsDemoted != 0 {
		t.Fatalf("with both estimates under the limit %d requests were demoted", s.LongPrefillsDemoted)
	}
}
