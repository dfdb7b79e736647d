package cluster_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/core/hostmem"
	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
)

// Load throughput from a peer's segment: four engines on host B load prompts that host A
// saved (every page lives in A's segment), against Mooncake's data path without kvctl serve in
// between: a native client in this process getting the same pages with four goroutines, in
// batches of the connector's effective get batch, in the same run against the same master and
// segment.
//
//	go test -run XXX -bench BenchmarkLoadFromPeer -benchtime 40x -v ./core/cluster/
//
// Each side runs one untimed pass or round first. It logs B's load phases and its engines' passes
// by part (admission, metadata and loads, the rest).
//
// KVCTL_BENCH_MASTER_RTT (a duration, e.g. 1ms) puts B and the native client behind a proxy
// that delays the master's round trip by that much (benchMasterAddr). KVCTL_BENCH_PROFILE takes
// CPU profiles of the timed loops (profile_bench_test.go).
const (
	benchEngines = 4
	benchReqs    = 8  // requests per engine
	benchBlocks  = 64 // blocks per request
	benchPage    = 64 << 10
	// benchBatch is one request's pages, the pool get of an asynchronous load here: the
	// engines' pages are one piece of shared memory each, so loads read them straight into
	// engine memory, a request's 64 pages in one get (a synchronous load of an engine's eight
	// requests: all 512 in one get, measured too). A staged load double-buffers its 64 slots:
	// 32 pages per get, benchStagedBatch.
	benchBatch       = 64
	benchStagedBatch = 32
	benchSegment     = "512MiB"
	benchStaging     = "16MiB"
	benchModelKey    = "cluster-model"
)

func benchPrompts(engine int) []enginesim.Request {
	var out []enginesim.Request
	for r := range benchReqs {
		toks := make([]int64, benchBlocks*T+1)
		for i := range toks {
			toks[i] = int64(engine*1_000_000 + r*10_000 + i + 1)
		}
		out = append(out, enginesim.Request{ID: fmt.Sprintf("e%d-r%d", engine, r), Tokens: toks})
	}
	return out
}

func BenchmarkLoadFromPeer(b *testing.B) {
	m := mooncaketest.StartMaster(b, mooncaketest.MasterOptions{})
	a := startServe(b, m, "A", append([]string{"--pool-size", benchSegment, "--staging-buffer-bytes", benchStaging}, profileServeArgs()...)...)
	a.waitReady(b)
	cfg := func(h *host, name string) enginesim.Config {
		return enginesim.Config{Socket: h.socket, ModelKey: benchModelKey, Name: name, TokensPerBlock: T, Slots: benchReqs * (benchBlocks + 1),
			PageBytes: []int{benchPage}, Chunk: benchBlocks*T + 1, SkipVerify: true}
	}
	for e := range benchEngines {
		runEngine(b, cfg(a, fmt.Sprint("cold", e)), benchPrompts(e), benchReqs)
	}
	masterB := benchMasterAddr(b, m)
	bh := startServe(b, m, "B", append([]string{"--pool-size", "64MiB", "--staging-buffer-bytes", benchStaging, "--master", masterB}, profileServeArgs()...)...)
	bh.waitReady(b)
	ctx := context.Background()
	admin, err := mooncake.NewAdminClient(m.AdminURL, nil)
	if err != nil {
		b.Fatal(err)
	}
	keys, err := admin.AllKeys(ctx)
	if err != nil {
		b.Fatal(err)
	}
	pages := benchEngines * benchReqs * benchBlocks
	if len(keys) != pages {
		b.Fatalf("the pool holds %d keys, want %d", len(keys), pages)
	}
	total := int64(pages) * benchPage

	// "serve": each engine admits its eight requests (lookups and allocation reports, one after
	// another), then loads them synchronously in the same pass. "serve-async": each engine
	// admits one request a pass and loads asynchronously through one load worker, so its next
	// admissions run while its earlier requests load, one 64-page get at a time as before;
	// "serve-async/admit=N" admits up to N requests a pass instead. Those engines poll while
	// they have nothing to run but parked requests (a pass every 200 µs); the ".../wait" cases
	// wait in GetFinished instead (wait_ms, enginesim.Config.FinishedWait). The "early" cases
	// register with early_loads (engine API 1.4): each hit's load starts at its allocation
	// report, so the engine's next admissions overlap it.
	const wait = 100 * time.Millisecond
	for _, v := range []struct {
		name  string
		admit int           // requests a pass admits, asynchronous loads; 0: synchronous loads, no cap
		wait  time.Duration // enginesim.Config.FinishedWait
		early bool          // enginesim.Config.EarlyLoads
	}{
		{"serve", 0, 0, false}, {"serve/early", 0, 0, true}, {"serve-async", 1, 0, false}, {"serve-async/admit=2", 2, 0, false},
		{"serve-async/admit=2/early", 2, 0, true}, {"serve-async/admit=4", 4, 0, false}, {"serve-async/admit=8", 8, 0, false},
		{"serve-async/admit=8/early", 8, 0, true}, {"serve-async/wait", 1, wait, false}, {"serve-async/admit=2/wait", 2, wait, false},
		{"serve-async/admit=2/wait/early", 2, wait, true}, {"serve-async/admit=8/wait/early", 8, wait, true},
	} {
		b.Run(fmt.Sprintf("%s/engines=%d", v.name, benchEngines), func(b *testing.B) { benchServe(ctx, b, a, bh, cfg, v.admit, v.wait, v.early, total) })
	}
	// "split=2": engines whose pages lie in two regions (K and V apart, as vLLM lays them out),
	// so each value is read from A's segment straight into its two pieces (readv).
	split := func(h *host, name string) enginesim.Config {
		c := cfg(h, name)
		c.SplitRegions = 2
		return c
	}
	b.Run(fmt.Sprintf("serve/early/split=2/engines=%d", benchEngines), func(b *testing.B) { benchServe(ctx, b, a, bh, split, 0, 0, true, total) })
	logLoads(b, bh)
	// benchReqs*benchBlocks: one get of all an engine's pages, as a synchronous load that reads
	// straight into engine memory now asks for them (one call of directBatchBytes).
	for _, batch := range []int{benchBatch, benchStagedBatch, benchReqs * benchBlocks} {
		b.Run(fmt.Sprintf("native-get/goroutines=%d/batch=%d", benchEngines, batch), func(b *testing.B) {
			benchNativeGet(b, a, masterB, m, keys, batch, total, dstBatch)
		})
	}
	// The same get into memory the size of an engine's: every page its own destination, as an
	// engine's loads land, instead of one batch of buffers written again and again (which stays
	// in the last-level cache of a large host); "-shm" into shared memory made as an engine makes
	// its own (a sealed memfd, hostmem.NewSharedMemory), the kind of memory B's loads land in.
	for _, dst := range []nativeDst{dstSpread, dstShm} {
		b.Run(fmt.Sprintf("native-get-%s/goroutines=%d/batch=%d", dst, benchEngines, benchBatch), func(b *testing.B) {
			benchNativeGet(b, a, masterB, m, keys, benchBatch, total, dst)
		})
	}
	benchExist(b, masterB, m, keys)
}

// benchMasterAddr is the master address host B and the benchmarks' native clients use: the
// master's own, or with KVCTL_BENCH_MASTER_RTT set (a duration, e.g. 1ms) a proxy that holds
// every chunk to and from the master for half that long each way, as a master across a network;
// host A and the pages between the hosts' segments are not delayed.
func benchMasterAddr(b *testing.B, m *mooncaketest.Master) string {
	v := os.Getenv("KVCTL_BENCH_MASTER_RTT")
	if v == "" {
		return m.RPCAddr
	}
	rtt, err := time.ParseDuration(v)
	if err != nil || rtt <= 0 {
		b.Fatalf("KVCTL_BENCH_MASTER_RTT=%q: want a positive duration", v)
	}
	b.Logf("B and the native client reach the master with %s added to each round trip", rtt)
	return mooncaketest.DelayProxy(b, m.RPCAddr, rtt/2)
}

// benchServe times B's four engines loading every page, each engine its own requests.
// With admitPerPass > 0 each engine loads asynchronously through one load worker and admits
// up to admitPerPass requests a pass; with early each registers with early_loads.
func benchServe(ctx context.Context, b *testing.B, a, bh *host, cfg func(*host, string) enginesim.Config, admitPerPass int, wait time.Duration, early bool, total int64) {
	engines := make([]*enginesim.Engine, benchEngines)
	for e := range engines {
		c := cfg(bh, fmt.Sprintf("warm%d-%d-%d-%d-%t", e, b.N, admitPerPass, wait.Milliseconds(), early))
		if admitPerPass > 0 {
			c.AsyncLoad, c.AsyncLoadWorkers, c.AdmitPerPass, c.FinishedWait = true, 1, admitPerPass, wait
		}
		c.EarlyLoads = early
		eng, err := enginesim.Start(ctx, c)
		if err != nil {
			b.Fatal(err)
		}
		defer eng.Close(ctx)
		engines[e] = eng
	}
	var mu sync.Mutex
	var admit, load, rest time.Duration
	var passes int
	pass := func(name string) {
		var wg sync.WaitGroup
		errs := make(chan error, benchEngines)
		for e, eng := range engines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := eng.Run(ctx, renamed(benchPrompts(e), name), benchReqs)
				if err == nil && res.LoadedBlocks != benchReqs*benchBlocks {
					err = fmt.Errorf("engine %d loaded %d blocks, want %d", e, res.LoadedBlocks, benchReqs*benchBlocks)
				}
				mu.Lock()
				admit, load, rest, passes = admit+res.Admit, load+res.Load, rest+res.Rest, passes+res.Passes
				mu.Unlock()
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	// One pass untimed: a serving engine's memory has been written before, a fresh one's
	// pages are first touched by its first load.
	pass("warm")
	before, callsBefore := bh.stats(b).Loads, callSeconds(b, bh)
	b.SetBytes(total)
	b.ResetTimer()
	admit, load, rest, passes = 0, 0, 0, 0
	profiled := startProfiles(b, false, a, bh)
	for i := range b.N {
		pass(fmt.Sprint(i))
	}
	b.StopTimer()
	profiled()
	if passes > 0 {
		per := func(d time.Duration) float64 { return 1e3 * d.Seconds() / float64(passes) }
		b.Logf("B's engine passes (%d, %.1f per engine run): admission %.1f ms, metadata and loads %.1f ms, the rest %.1f ms a pass",
			passes, float64(passes)/float64(b.N*benchEngines), per(admit), per(load), per(rest))
	}
	logLoadsSince(b, before, bh.stats(b).Loads)
	logCallsSince(b, callsBefore, callSeconds(b, bh))
}

// logCallsSince logs B's own time per engine call between two reads of its call histograms
// (from its interceptor's start to the handler's return; the transport and the engine's side
// are outside it), for the methods the engines called, with the calls per pass of every engine.
func logCallsSince(b *testing.B, before, after map[string]float64) {
	var parts []string
	for _, m := range []string{"Lookup", "UpdateStateAfterAlloc", "TakeSubmittedSaves", "BuildMeta", "BindMeta", "StartLoad",
		"TakeFailedLoads", "WaitForSave", "GetFinished", "TakeFailedAsyncLoads", "RequestFinished"} {
		k := `kvctl_engine_call_duration_seconds{method="` + m + `"}`
		n := after[k+"_count"] - before[k+"_count"]
		if n <= 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.0f us (%.1f a pass)", m, 1e6*(after[k+"_sum"]-before[k+"_sum"])/n, n/float64(b.N*benchEngines)))
	}
	b.Logf("B's side per call in the timed passes: %s", strings.Join(parts, ", "))
}

// logLoadsSince logs B's loads between two reads of its stats: per load, its wall time, the
// pool get's share of it and, for asynchronous loads, the wait for a load worker.
func logLoadsSince(b *testing.B, before, after statsapi.LoadStatsJSON) {
	loads := after.Loads - before.Loads
	if loads <= 0 {
		return
	}
	per := func(a, b float64) float64 { return 1e3 * (a - b) / float64(loads) }
	b.Logf("B's loads in the timed passes: %d (%d asynchronous), %.1f pages and %.1f store calls each; per load %.2f ms, get %.2f ms, queued for a load worker %.2f ms",
		loads, after.AsyncLoads-before.AsyncLoads, float64(after.Pages-before.Pages)/float64(loads), float64(after.StoreCalls-before.StoreCalls)/float64(loads),
		per(after.TransferSeconds, before.TransferSeconds), per(after.Phases["get"].WallSeconds, before.Phases["get"].WallSeconds),
		per(after.WaitSeconds, before.WaitSeconds))
}

// logLoads logs what B's connector reports of its loads.
func logLoads(b *testing.B, bh *host) {
	st := bh.stats(b)
	if st.Loads.TransferSeconds > 0 {
		b.Logf("B's connector loads: %d loads, %d pages, %.0f MB/s per load while loading (landed bytes / summed transfer wall time)",
			st.Loads.Loads, st.Loads.Pages, float64(st.Loads.LandedBytes)/st.Loads.TransferSeconds/1e6)
		// Where a load's wall time goes, per load (phase walls summed over loads / loads).
		phases := ""
		for _, ph := range []string{"describe", "get", "unstage", "sync"} {
			phases += fmt.Sprintf(" %s %.1f ms (cpu %.1f ms)", ph, 1e3*st.Loads.Phases[ph].WallSeconds/float64(st.Loads.Loads),
				1e3*st.Loads.Phases[ph].CPUSeconds/float64(st.Loads.Loads))
		}
		b.Logf("B's load phases per load (%.1f ms each, %d store calls):%s", 1e3*st.Loads.TransferSeconds/float64(st.Loads.Loads), st.Loads.StoreCalls, phases)
	}
}

// benchExist times what one engine lookup costs underneath: one existence probe of a
// request's keys, as BatchIsExist (BatchExistKey) and as the lookup's BatchLocate
// (BatchGetReplicaList, keeping the lists for the load).
func benchExist(b *testing.B, master string, m *mooncaketest.Master, keys []string) {
	ctx := context.Background()
	n, err := mooncake.NewNative(ctx, mooncake.NativeOptions{MasterAddr: master, MetadataURL: m.MetadataURL})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	ks := keys[:benchBlocks]
	for _, p := range []struct {
		name  string
		probe func(context.Context, []string) []int
	}{{"native-exist", n.BatchIsExist}, {"native-locate", n.BatchLocate}} {
		b.Run(fmt.Sprintf("%s/keys=%d", p.name, benchBlocks), func(b *testing.B) {
			for range b.N {
				for _, v := range p.probe(ctx, ks) {
					if v != 1 {
						b.Fatalf("%s: %d", p.name, v)
					}
				}
			}
		})
	}
}

// procCPU is the CPU time (user and system) process pid has used, from /proc.
func procCPU(b *testing.B, pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command name (which ends at the last ')'): utime and stime are
	// the 12th and 13th, in clock ticks (100 a second on Linux).
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: %v %v", pid, err1, err2)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// selfCPU is the CPU time (user and system) this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// callSeconds reads the _sum and _count series of the engine call and lookup duration
// histograms from h's /metrics, by their name and labels (histogram_sum{labels}).
func callSeconds(b *testing.B, h *host) map[string]float64 {
	code, body, err := get(h.admin + "/metrics")
	if err != nil || code != 200 {
		b.Fatalf("%s /metrics: %d %v", h.name, code, err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		name, val, ok := strings.Cut(line, " ")
		if !ok || !strings.HasPrefix(name, "kvctl_engine_call_duration_seconds_") && !strings.HasPrefix(name, "kvctl_lookup_duration_seconds_") {
			continue
		}
		base, labels, _ := strings.Cut(name, "{")
		if labels != "" {
			labels = "{" + labels
		}
		for _, suf := range []string{"_sum", "_count"} {
			if trimmed, ok := strings.CutSuffix(base, suf); ok {
				v, err := strconv.ParseFloat(val, 64)
				if err != nil {
					b.Fatal(err)
				}
				out[trimmed+labels+suf] = v
			}
		}
	}
	return out
}

// nativeDst is where benchNativeGet's pages land.
type nativeDst string

const (
	dstBatch  nativeDst = ""       // one batch of buffers a goroutine, reused
	dstSpread nativeDst = "spread" // a page of Go heap memory for every page
	dstShm    nativeDst = "shm"    // a page of memfd shared memory for every page, as an engine's
)

// benchNativeGet gets every key with a native client (no segment) in this process, four
// goroutines in batches of batch pages, each goroutine one engine's share of the pages, into dst.
func benchNativeGet(b *testing.B, a *host, master string, m *mooncaketest.Master, keys []string, batch int, total int64, dst nativeDst) {
	ctx := context.Background()
	n, err := mooncake.NewNative(ctx, mooncake.NativeOptions{MasterAddr: master, MetadataURL: m.MetadataURL})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	// The same split as the engines: each goroutine gets one engine's pages, dealt round-robin.
	perEngine := make([][]string, benchEngines)
	for i, k := range keys {
		perEngine[i%benchEngines] = append(perEngine[i%benchEngines], k)
	}
	spread := dst != dstBatch
	bufs := make([][][]byte, benchEngines)
	for g := range bufs {
		n := batch
		if spread {
			n = len(perEngine[g])
		}
		var mem []byte
		if dst == dstShm {
			shm, err := hostmem.NewSharedMemory(int64(n * benchPage))
			if err != nil {
				b.Fatal(err)
			}
			defer shm.Close()
			mem = shm.Data
		} else {
			mem = make([]byte, n*benchPage)
		}
		bufs[g] = make([][]byte, n)
		for j := range bufs[g] {
			bufs[g][j] = mem[j*benchPage : (j+1)*benchPage : (j+1)*benchPage]
		}
	}
	round := func() {
		var wg sync.WaitGroup
		var failed sync.Map
		for g := range benchEngines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ks := perEngine[g]
				for s := 0; s < len(ks); s += batch {
					some := ks[s:min(s+batch, len(ks))]
					dst := bufs[g][:len(some)]
					if spread {
						dst = bufs[g][s : s+len(some)]
					}
					for j, got := range n.BatchGet(ctx, some, dst) {
						if got != benchPage {
							failed.Store(some[j], got)
						}
					}
				}
			}()
		}
		wg.Wait()
		failed.Range(func(k, v any) bool {
			b.Fatalf("get %s: %v", k, v)
			return false
		})
	}
	round() // untimed, as the engines' first pass
	b.SetBytes(total)
	b.ResetTimer()
	profiled := startProfiles(b, true, a)
	for range b.N {
		round()
	}
	b.StopTimer()
	profiled()
}

// Where one request's admission through kvctl serve goes, on an otherwise idle daemon: host A
// saves one engine's eight 64-block prompts, then one engine on host B admits them again and
// again (Lookup, then UpdateStateAfterAlloc honouring the whole match, as BenchmarkLoadFromPeer's
// engines do) without loading them; each admitted request is finished after its admission,
// outside the admission's clock. Against it, in the same run: the native client's existence
// probe of the same 64 keys (the master round trip a lookup makes underneath) and an empty
// engine call (TakeFailedLoads, nothing failed) over the same engine connection.
//
//	go test -run XXX -bench BenchmarkAdmission -benchtime 2000x -v ./core/cluster/
//
// serve-admit reports admission-us (per request), lookup-us and alloc-us (its two calls).
// KVCTL_BENCH_MASTER_RTT applies as in BenchmarkLoadFromPeer (benchMasterAddr), and
// KVCTL_BENCH_PROFILE profiles host B and this process (the engine's side) over serve-admit's
// timed loop (profile_bench_test.go).
func BenchmarkAdmission(b *testing.B) {
	m := mooncaketest.StartMaster(b, mooncaketest.MasterOptions{})
	a := startServe(b, m, "A", "--pool-size", "128MiB", "--staging-buffer-bytes", benchStaging)
	a.waitReady(b)
	cfg := func(h *host, name string) enginesim.Config {
		return enginesim.Config{Socket: h.socket, ModelKey: benchModelKey, Name: name, TokensPerBlock: T, Slots: benchReqs * (benchBlocks + 1),
			PageBytes: []int{benchPage}, Chunk: benchBlocks*T + 1, SkipVerify: true}
	}
	prompts := benchPrompts(0)
	runEngine(b, cfg(a, "cold"), prompts, benchReqs)
	masterB := benchMasterAddr(b, m)
	bh := startServe(b, m, "B", append([]string{"--pool-size", "64MiB", "--staging-buffer-bytes", benchStaging, "--master", masterB}, profileServeArgs()...)...)
	bh.waitReady(b)
	ctx := context.Background()
	eng, err := enginesim.Start(ctx, cfg(bh, "admit"))
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close(ctx)
	rank := eng.Remote(0)
	pages := make([]int, benchBlocks+1)
	for i := range pages {
		pages[i] = i
	}
	byGroup := [][]int{pages}
	// Keys of the saved pages, for the native probe: any 64 of them cost one round trip alike.
	admin, err := mooncake.NewAdminClient(m.AdminURL, nil)
	if err != nil {
		b.Fatal(err)
	}
	keys, err := admin.AllKeys(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if len(keys) != benchReqs*benchBlocks {
		b.Fatalf("the pool holds %d keys, want %d", len(keys), benchReqs*benchBlocks)
	}

	b.Run(fmt.Sprintf("serve-admit/blocks=%d", benchBlocks), func(b *testing.B) {
		admitOne := func(name string, i int) (time.Duration, time.Duration) {
			p := prompts[i%len(prompts)]
			req := connector.Request{ID: fmt.Sprintf("%s-%s%d", p.ID, name, i), Tokens: p.Tokens}
			t0 := time.Now()
			got, async, err := rank.Lookup(ctx, req, 0)
			t1 := time.Now()
			if err != nil || async || got != benchBlocks*T {
				b.Fatalf("lookup %s: %d tokens, async %t, %v", req.ID, got, async, err)
			}
			if err := rank.UpdateStateAfterAlloc(ctx, req.ID, byGroup, got); err != nil {
				b.Fatal(err)
			}
			t2 := time.Now()
			if _, err := rank.RequestFinished(ctx, req.ID); err != nil {
				b.Fatal(err)
			}
			return t1.Sub(t0), t2.Sub(t1)
		}
		for i := range len(prompts) {
			admitOne("warm", i) // untimed: the rank's prompt arena and call channel are set up
		}
		var lookup, alloc time.Duration
		before := callSeconds(b, bh)
		cpuB, cpuSelf := procCPU(b, bh.cmd.Process.Pid), selfCPU()
		b.ResetTimer()
		profiled := startProfiles(b, true, bh)
		for i := range b.N {
			l, a := admitOne("", i)
			lookup += l
			alloc += a
		}
		b.StopTimer()
		profiled()
		cpuB, cpuSelf = procCPU(b, bh.cmd.Process.Pid)-cpuB, selfCPU()-cpuSelf
		us := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(b.N) }
		// CPU per admitted request (and its finish, outside the admission's clock): of host B's
		// daemon and of this process, the engine's side.
		b.ReportMetric(us(cpuB), "daemon-cpu-us")
		b.ReportMetric(us(cpuSelf), "engine-cpu-us")
		b.ReportMetric(us(lookup+alloc), "admission-us")
		b.ReportMetric(us(lookup), "lookup-us")
		b.ReportMetric(us(alloc), "alloc-us")
		// The daemon's side of the same calls: from its interceptor's start to the handler's
		// return (the engine_call histogram), and the prefix lookup within it.
		after := callSeconds(b, bh)
		perCall := func(k string) float64 {
			return 1e6 * (after[k+"_sum"] - before[k+"_sum"]) / (after[k+"_count"] - before[k+"_count"])
		}
		b.Logf("B's side per call: Lookup %.0f us (prefix lookup %.0f us), UpdateStateAfterAlloc %.0f us, RequestFinished %.0f us",
			perCall(`kvctl_engine_call_duration_seconds{method="Lookup"}`), perCall("kvctl_lookup_duration_seconds"),
			perCall(`kvctl_engine_call_duration_seconds{method="UpdateStateAfterAlloc"}`), perCall(`kvctl_engine_call_duration_seconds{method="RequestFinished"}`))
	})
	b.Run("engine-call/TakeFailedLoads", func(b *testing.B) {
		for range b.N {
			ids, err := rank.TakeFailedLoadRequests(ctx)
			if err != nil || len(ids) != 0 {
				b.Fatalf("take failed loads: %v %v", ids, err)
			}
		}
	})
	b.Run(fmt.Sprintf("native-exist/keys=%d", benchBlocks), func(b *testing.B) {
		n, err := mooncake.NewNative(ctx, mooncake.NativeOptions{MasterAddr: masterB, MetadataURL: m.MetadataURL})
		if err != nil {
			b.Fatal(err)
		}
		defer n.Close()
		ks := keys[:benchBlocks]
		b.ResetTimer()
		for range b.N {
			for _, v := range n.BatchIsExist(ctx, ks) {
				if v != 1 {
					b.Fatalf("exist: %d", v)
				}
			}
		}
	})
}
