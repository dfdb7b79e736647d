package daemon_test

// Benchmarks of `kvctl serve` over its real engine socket: lookup round trips, sustained
// load and save throughput of four concurrent engines, and the daemon's memory at rest and
// under load (in-process, and of a built binary when KVCTL_BENCH_PROCESS=1).
//
//	go test -run '^$' -bench 'ServeLookup' -benchtime 2000x ./core/daemon/
//	go test -run '^$' -bench 'ServeThroughput' -benchtime 3x ./core/daemon/
//	go test -run '^$' -bench 'ServeMemory$' -benchtime 1x ./core/daemon/
//	go build -o /tmp/kvctl ./cmd/kvctl && KVCTL_BENCH_PROCESS=1 \
//	    go test -run '^$' -bench 'ServeProcessMemory' -benchtime 1x ./core/daemon/
//
// Figures and what limits them: docs/perf/serve.md.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/daemon/daemontest"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/pool/embedded"
)

// benchT is the block size the benchmarks use: TensorRT-LLM's default tokens_per_block.
const benchT = 32

// serveStaging is `kvctl serve`'s default staging budget per direction (1 GiB), which with the
// default transfer batch of 64 pages gives every rank 64 page slots per direction.
const serveStaging = connector.DefaultStagingBufferBytes

// benchStart runs a real daemon on a temporary socket, as `kvctl serve` would with
// --pool-size poolBytes and the default staging budget.
func benchStart(tb testing.TB, poolBytes int64) *daemontest.Running {
	tb.Helper()
	popts := embedded.DefaultOptions()
	popts.Segments = []embedded.SegmentSpec{{Name: "bench", Capacity: poolBytes}}
	return daemontest.Start(tb, daemon.Config{Pool: popts, Defaults: connector.Options{StagingBufferBytes: serveStaging}, Version: "bench"})
}

// benchPrompt is a prompt of blocks full blocks and one more token, so that a cold run saves
// exactly blocks blocks and a warm run is offered and loads exactly as many.
func benchPrompt(seed uint64, blocks int) []int64 {
	return randTokens(seed, blocks*benchT+1)
}

func randTokens(seed uint64, n int) []int64 {
	rng := rand.New(rand.NewPCG(seed, 11))
	toks := make([]int64, n)
	for i := range toks {
		toks[i] = rng.Int64N(150000)
	}
	return toks
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p * float64(len(sorted)-1))
	return sorted[i]
}

// BenchmarkServeLookup measures one Lookup RPC over the engine socket for a 4k- and a 32k-token
// prompt: warm (every offerable block of the prompt is in the pool) and cold (none is). Each
// lookup is a new request, as an engine's are; the RequestReset that forgets it is outside the
// timed part. ns/op is the mean; p50-ns and p99-ns are of the individually timed calls.
func BenchmarkServeLookup(b *testing.B) {
	for _, tokens := range []int{4 << 10, 32 << 10} {
		for _, warm := range []bool{true, false} {
			name := fmt.Sprintf("tokens=%dk/cold", tokens>>10)
			if warm {
				name = fmt.Sprintf("tokens=%dk/warm", tokens>>10)
			}
			b.Run(name, func(b *testing.B) { benchLookup(b, tokens, warm) })
		}
	}
}

func benchLookup(b *testing.B, tokens int, warm bool) {
	r := benchStart(b, 256<<20)
	ctx := context.Background()
	blocks := tokens / benchT
	// 16 KiB pages: the page size does not enter a lookup, which only asks whether keys exist.
	cfg := enginesim.Config{Socket: r.Info.Socket, ModelKey: "bench-model", Name: "lk", TokensPerBlock: benchT,
		Slots: blocks + 1, PageBytes: []int{16 << 10}, Chunk: 8 << 10}
	e, err := enginesim.Start(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close(ctx)
	// A prompt of exactly tokens tokens: its last block holds the last token, so (tokens-T)
	// tokens are offerable.
	prompt := randTokens(uint64(tokens), tokens)
	want := 0
	if warm {
		if _, err := e.Run(ctx, []enginesim.Request{{ID: "fill", Tokens: prompt}}, 0); err != nil {
			b.Fatal(err)
		}
		want = (tokens - 1) / benchT * benchT
	}
	// The engine's own connection: only the connection that registered an engine may call it.
	c := e.Client(0)

	lat := make([]time.Duration, 0, 4096)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("q%d", i)
		t0 := time.Now()
		resp, err := c.Lookup(ctx, &enginepb.LookupRequest{Engine: "lk/rank0", Request: &enginepb.Request{Id: id, Tokens: prompt, ContextOnly: true}})
		lat = append(lat, time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
		if int(resp.GetMatchedTokens()) != want {
			b.Fatalf("lookup matched %d tokens, want %d", resp.GetMatchedTokens(), want)
		}
		b.StopTimer()
		if _, err := c.RequestReset(ctx, &enginepb.RequestRef{Engine: "lk/rank0", RequestId: id}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	slices.Sort(lat)
	b.ReportMetric(float64(percentile(lat, 0.50).Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(percentile(lat, 0.99).Nanoseconds()), "p99-ns")
}

// A throughput pass moves throughputBytes of page data per engine: throughputRequests requests
// of throughputBytes/throughputRequests/page blocks each, all running at once.
const (
	throughputEngines  = 4
	throughputRequests = 4
	throughputBytes    = 64 << 20
)

type benchEngines struct {
	engines []*enginesim.Engine
	bytes   int // per engine and round
	blocks  int // per request
	page    int
}

func startEngines(b *testing.B, socket string, page, perEngine int, name string) *benchEngines {
	ctx := context.Background()
	be := &benchEngines{page: page, bytes: perEngine, blocks: perEngine / throughputRequests / page}
	for i := range throughputEngines {
		cfg := enginesim.Config{Socket: socket, ModelKey: fmt.Sprintf("model-%d", i), Name: fmt.Sprintf("%s%d", name, i),
			TokensPerBlock: benchT, Slots: throughputRequests * (be.blocks + 1), PageBytes: []int{page}, Chunk: 4096}
		e, err := enginesim.Start(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		be.engines = append(be.engines, e)
	}
	b.Cleanup(func() {
		for _, e := range be.engines {
			_ = e.Close(context.Background())
		}
	})
	return be
}

// requests is engine i's set of prompts for round seed; tag names them.
func (be *benchEngines) requests(i int, seed uint64, tag string) []enginesim.Request {
	out := make([]enginesim.Request, throughputRequests)
	for q := range out {
		out[q] = enginesim.Request{ID: fmt.Sprintf("e%d-%s-%d", i, tag, q), Tokens: benchPrompt(seed<<16|uint64(i)<<8|uint64(q), be.blocks)}
	}
	return out
}

// round is every engine's set of prompts for round seed.
func (be *benchEngines) round(seed uint64, tag string) [][]enginesim.Request {
	out := make([][]enginesim.Request, len(be.engines))
	for i := range out {
		out[i] = be.requests(i, seed, tag)
	}
	return out
}

// run runs every engine's requests at once and returns each engine's result.
func (be *benchEngines) run(reqs [][]enginesim.Request) ([]enginesim.Result, error) {
	ctx := context.Background()
	res := make([]enginesim.Result, len(be.engines))
	errs := make([]error, len(be.engines))
	var wg sync.WaitGroup
	for i, e := range be.engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = e.Run(ctx, reqs[i], 0)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return res, fmt.Errorf("engine %d: %w", i, err)
		}
	}
	return res, nil
}

var benchPages = []int{64 << 10, 256 << 10, 1 << 20}

func pageName(p int) string {
	if p >= 1<<20 {
		return fmt.Sprintf("page=%dMiB", p>>20)
	}
	return fmt.Sprintf("page=%dKiB", p>>10)
}

// BenchmarkServeThroughput4Engines measures sustained page movement with four engines (four
// models) running at once against one daemon. save: each iteration every engine runs four new
// prompts cold, and the daemon saves every block; load: every engine runs prompts whose blocks
// are all in the pool, and the daemon loads every block. MB/s is page data moved per second
// of wall time, over all four engines; it includes the simulated engines' own work (writing
// the KV of computed blocks, checking every loaded byte), which runs on the same cores.
func BenchmarkServeThroughput4Engines(b *testing.B) {
	for _, dir := range []string{"save", "load"} {
		for _, page := range benchPages {
			b.Run(dir+"/"+pageName(page), func(b *testing.B) { benchThroughput(b, dir, page) })
		}
	}
}

func benchThroughput(b *testing.B, dir string, page int) {
	// Room for 8 save rounds of 4 x 64 MiB before the pool's high watermark.
	r := benchStart(b, 3<<30)
	be := startEngines(b, r.Info.Socket, page, throughputBytes, "tp")
	perIter := int64(throughputEngines * throughputRequests * be.blocks * page)
	b.SetBytes(perIter)
	var warmSet [][]enginesim.Request
	if dir == "load" {
		warmSet = be.round(1, "fill")
		if _, err := be.run(warmSet); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; b.Loop(); i++ {
		var reqs [][]enginesim.Request
		if dir == "save" {
			b.StopTimer()
			reqs = be.round(uint64(100+i), fmt.Sprintf("s%d", i))
			b.StartTimer()
		} else {
			reqs = make([][]enginesim.Request, len(warmSet))
			for e := range warmSet {
				reqs[e] = renamed(warmSet[e], fmt.Sprint(i))
			}
		}
		res, err := be.run(reqs)
		if err != nil {
			b.Fatal(err)
		}
		for e, rs := range res {
			want := throughputRequests * be.blocks
			if dir == "save" && (rs.ComputedBlocks != want || rs.LoadedBlocks != 0) {
				b.Fatalf("engine %d: cold round computed %d blocks and loaded %d, want %d computed", e, rs.ComputedBlocks, rs.LoadedBlocks, want)
			}
			if dir == "load" && rs.LoadedBlocks != want {
				b.Fatalf("engine %d: warm round loaded %d blocks, want %d", e, rs.LoadedBlocks, want)
			}
		}
	}
	st, err := r.Daemon.Pool().Stats(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	if st.Detail[embedded.DetailFailedEvictions]+st.Detail[embedded.DetailEvictedPass1]+st.Detail[embedded.DetailEvictedPass2] > 0 || st.PutFailures > 0 {
		b.Logf("pool evicted or refused during the run: %+v", st)
	}
}
