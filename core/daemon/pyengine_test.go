package daemon_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/daemon/daemontest"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/pool/embedded"
)

// pyEngineSummary is torch_engine.py's summary with what it records about the transports.
type pyEngineSummary struct {
	torchSummary
	// Calls is the transport the passes' engine calls went over: "channel" or "grpc".
	Calls string `json:"calls"`
	// CallChannel is what OpenCallChannel answered.
	CallChannel struct {
		MaxFrameBytes   int   `json:"max_frame_bytes"`
		MaxMessageBytes int64 `json:"max_message_bytes"`
	} `json:"call_channel"`
	// IdleRPCSecondsGRPC and IdleRPCSecondsChannel time the idle plain call over each
	// transport; IdleRPCSeconds is the one of Calls.
	IdleRPCSecondsGRPC    float64 `json:"idle_rpc_seconds_grpc"`
	IdleRPCSecondsChannel float64 `json:"idle_rpc_seconds_channel"`
	// UnregisteredCallErrors is the error of a call for an engine never registered, made over
	// each transport.
	UnregisteredCallErrors map[string]*callError `json:"unregistered_call_errors"`
	// LargeCalls are the calls of requests larger than a frame and larger than the channel
	// takes (large_calls in the script).
	LargeCalls struct {
		Lookup32kGRPC     *int       `json:"lookup_32k_grpc"`
		Lookup32kChannel  *int       `json:"lookup_32k_channel"`
		OverChannelError  *callError `json:"over_channel_error"`
		OverBytes         int        `json:"over_bytes"`
		OverRoutedMatched *int       `json:"over_routed_matched"`
		ChannelAfterOver  string     `json:"channel_after_over"`
	} `json:"large_calls"`
	// ChannelAfterConnectionEnd is the error of a call over the channel once the gRPC
	// connection that opened it has ended.
	ChannelAfterConnectionEnd struct {
		callError
		Seconds float64 `json:"seconds"`
	} `json:"channel_after_connection_end"`
	// CallChannelStats counts what went over the call channel.
	CallChannelStats struct {
		Calls                int `json:"calls"`
		FramesSent           int `json:"frames_sent"`
		FramesReceived       int `json:"frames_received"`
		MultiFrameRequests   int `json:"multi_frame_requests"`
		MultiFrameResponses  int `json:"multi_frame_responses"`
		LargestRequestBytes  int `json:"largest_request_bytes"`
		LargestResponseBytes int `json:"largest_response_bytes"`
	} `json:"call_channel_stats"`
}

// callError is a failed call's status code name and message in the script's summary.
type callError struct {
	Code    string `json:"code"`
	Details string `json:"details"`
}

// pythonEngine returns the interpreter of `make pyenv`'s environment (KVCTL_PYENV) once it
// imports grpc and protobuf. The test is skipped when it does not, or fails when CI=true.
func pythonEngine(tb testing.TB) string {
	tb.Helper()
	unavailable := func(why string) {
		tb.Helper()
		msg := "the Python engine cannot run (" + why + "): run `make pyenv`, or `make test`, which builds it"
		if os.Getenv("CI") == "true" {
			tb.Fatal(msg)
		}
		tb.Skip(msg)
	}
	dir := os.Getenv("KVCTL_PYENV")
	if dir == "" {
		unavailable("KVCTL_PYENV is not set")
		return ""
	}
	python := filepath.Join(dir, "bin", "python3")
	if out, err := exec.Command(python, "-c", "import grpc, google.protobuf").CombinedOutput(); err != nil {
		unavailable(fmt.Sprintf("%s does not import grpc and protobuf: %v: %s", python, err, bytes.TrimSpace(out)))
		return ""
	}
	return python
}

// TestPythonEngineSharedMemory runs torch_engine.py with its KV pool in shared memory (no GPU)
// against a real daemon, with its engine calls over a call channel and over plain gRPC: a cold
// pass saves every computed block and a warm pass loads them, each loaded page checked byte for
// byte. It also checks that a failing call reads the same over both transports, and logs the
// calls' timings.
func TestPythonEngineSharedMemory(t *testing.T) {
	python := pythonEngine(t)
	for _, calls := range []string{"channel", "grpc"} {
		for _, c := range []struct {
			name string
			args []string
			// long: prompts of 128-160 blocks, 24 running, so that the warm pass's BuildMeta
			// answer and BindMeta request (~3,500 pages) take more than one frame.
			long bool
		}{
			{"page=64KiB/layers=2", []string{"--page-bytes", "65536", "--layers", "2", "--requests", "12",
				"--min-blocks", "4", "--max-blocks", "8", "--max-running", "6"}, false},
			// Every call polls for its response for up to 2 ms before it sleeps in recv.
			{"page=64KiB/layers=2/spin", []string{"--page-bytes", "65536", "--layers", "2", "--requests", "12",
				"--min-blocks", "4", "--max-blocks", "8", "--max-running", "6", "--spin-us", "2000"}, false},
			{"page=4KiB/layers=2/long", []string{"--page-bytes", "4096", "--layers", "2", "--requests", "24",
				"--min-blocks", "128", "--max-blocks", "160", "--max-running", "24", "--chunk-blocks", "160"}, true},
		} {
			if calls == "grpc" && strings.HasSuffix(c.name, "/spin") {
				continue // only calls over the channel poll
			}
			t.Run("calls="+calls+"/"+c.name, func(t *testing.T) {
				r := start(t, 512<<20)
				args := append([]string{"testdata/torch_engine.py", "--socket", r.Info.Socket, "--memory", "shm",
					"--stats-url", "http://" + r.Info.AdminAddr + "/v1/stats", "--calls", calls, "--pass-timeout", "60"}, c.args...)
				sum := runPythonEngine(t, python, args)
				checkTorchSummary(t, &sum.torchSummary)
				if sum.Calls != calls {
					t.Errorf("summary: calls %q, want %q", sum.Calls, calls)
				}
				if spin := strings.HasSuffix(c.name, "/spin"); spin != (sum.SpinUS == 2000) {
					t.Errorf("summary: spin_us %v for case %s", sum.SpinUS, c.name)
				}
				if sum.CallChannel.MaxFrameBytes != engineapi.MaxCallFrameBytes || sum.CallChannel.MaxMessageBytes <= 0 {
					t.Errorf("OpenCallChannel answered %+v, want max_frame_bytes %d and a message bound", sum.CallChannel, engineapi.MaxCallFrameBytes)
				}
				if sum.IdleRPCSecondsGRPC <= 0 || sum.IdleRPCSecondsChannel <= 0 {
					t.Errorf("idle call timings missing: grpc %v, channel %v", sum.IdleRPCSecondsGRPC, sum.IdleRPCSecondsChannel)
				}
				want := map[string]float64{"grpc": sum.IdleRPCSecondsGRPC, "channel": sum.IdleRPCSecondsChannel}[calls]
				if sum.IdleRPCSeconds != want {
					t.Errorf("idle_rpc_seconds %v is not the %s transport's %v", sum.IdleRPCSeconds, calls, want)
				}
				g, ch := sum.UnregisteredCallErrors["grpc"], sum.UnregisteredCallErrors["channel"]
				switch {
				case g == nil || ch == nil:
					t.Errorf("a call for an engine never registered succeeded: %+v", sum.UnregisteredCallErrors)
				case *g != *ch:
					t.Errorf("the same failing call reads differently: grpc %+v, channel %+v", *g, *ch)
				case g.Code != "NOT_FOUND" && g.Code != "FAILED_PRECONDITION":
					t.Errorf("a call for an engine never registered: %+v", *g)
				}
				checkLargeCalls(t, sum, calls == "channel" && c.long)
				// Over the channel whatever the transport: the failing call, 200 idle calls and
				// three of large_calls' (the 32k-token lookup, the refused oversized one, the call
				// after it; the oversized one that call() routes goes over gRPC). The passes'
				// calls (at least a StartLoad and a TakeFailedLoads a pass) go over the chosen
				// transport.
				const fixed = 1 + 200 + 3
				passCalls := 2 * (sum.Cold.StartLoads + sum.Warm.StartLoads)
				if n := sum.CallChannelStats.Calls; (calls == "grpc" && n != fixed) || (calls == "channel" && n < fixed+passCalls) {
					t.Errorf("%d calls went over the channel with --calls %s (%d a pass's calls at least)", n, calls, passCalls)
				}
				// The daemon closes a connection's channels when the connection ends.
				if e := sum.ChannelAfterConnectionEnd; e.Code != "UNAVAILABLE" {
					t.Errorf("a call over the channel after its connection ended: %+v, want UNAVAILABLE", e)
				}
				w := sum.Warm
				t.Logf("calls over %s: %d pages of %d bytes loaded in %.3fs of StartLoad (%d StartLoads, %.0f µs each); a plain call %.0f µs after one; idle: grpc %.0f µs, channel %.0f µs",
					calls, w.LoadedBlocks, sum.PageBytes, w.StartLoadSeconds, w.StartLoads, w.StartLoadSeconds/float64(max(w.StartLoads, 1))*1e6,
					w.RPCSeconds/float64(max(w.StartLoads, 1))*1e6, sum.IdleRPCSecondsGRPC*1e6, sum.IdleRPCSecondsChannel*1e6)
			})
		}
	}
}

// checkLargeCalls checks the calls of requests larger than a frame: the 32k-token Lookup agrees
// over both transports and matches the saved prompt it starts with; the request over the
// channel's bound is refused over the channel with RESOURCE_EXHAUSTED naming the bound, goes
// through over gRPC, and the channel works after it. With multiFrame the passes' own calls
// must have sent and received messages of more than one frame.
func checkLargeCalls(t *testing.T, sum *pyEngineSummary, multiFrame bool) {
	t.Helper()
	lc := sum.LargeCalls
	switch {
	case lc.Lookup32kGRPC == nil || lc.Lookup32kChannel == nil:
		t.Errorf("32k-token lookups missing: %+v", lc)
	case *lc.Lookup32kGRPC != *lc.Lookup32kChannel || *lc.Lookup32kGRPC <= 0:
		t.Errorf("32k-token lookup matched %d tokens over gRPC, %d over the channel; want the same, above 0", *lc.Lookup32kGRPC, *lc.Lookup32kChannel)
	}
	bound := strconv.FormatInt(sum.CallChannel.MaxMessageBytes, 10)
	if e := lc.OverChannelError; e == nil || e.Code != "RESOURCE_EXHAUSTED" || !strings.Contains(e.Details, bound) {
		t.Errorf("a %d-byte request over the channel (bound %s): %+v, want RESOURCE_EXHAUSTED naming the bound", lc.OverBytes, bound, e)
	}
	if int64(lc.OverBytes) <= sum.CallChannel.MaxMessageBytes {
		t.Errorf("the oversized request was %d bytes, not over the bound %s", lc.OverBytes, bound)
	}
	if lc.OverRoutedMatched == nil || lc.ChannelAfterOver != "ok" {
		t.Errorf("after the oversized request: routed over gRPC %v, channel %q", lc.OverRoutedMatched, lc.ChannelAfterOver)
	}
	st := sum.CallChannelStats
	// large_calls sends two requests of more than one frame (the 32k-token prompt and the
	// oversized one).
	if st.MultiFrameRequests < 2 || st.LargestRequestBytes != lc.OverBytes || st.FramesReceived < st.Calls {
		t.Errorf("call channel stats %+v", st)
	}
	if multiFrame && (st.MultiFrameResponses == 0 || st.MultiFrameRequests < 3 || st.LargestResponseBytes <= engineapi.MaxCallFragmentBytes) {
		t.Errorf("no messages of several frames in the passes: %+v", st)
	}
}

// runPythonEngine runs torch_engine.py with args and returns its summary; the test fails when
// it prints none or exits non-zero.
func runPythonEngine(t *testing.T, python string, args []string) *pyEngineSummary {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), "PYTHONUNBUFFERED=1")
	runErr := cmd.Run()
	if s := strings.TrimSpace(stderr.String()); s != "" {
		t.Logf("engine stderr:\n%s", s)
	}
	var sum *pyEngineSummary
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), "SUMMARY "); ok {
			t.Logf("summary: %s", line)
			sum = new(pyEngineSummary)
			if err := json.Unmarshal([]byte(line), sum); err != nil {
				t.Fatalf("summary: %v", err)
			}
		}
	}
	if sum == nil {
		t.Fatalf("engine printed no summary (%v):\n%s", runErr, stdout.String())
	}
	if runErr != nil {
		t.Errorf("engine: %v", runErr)
	}
	return sum
}

// BenchmarkPythonEngineCall times a plain engine call (TakeFailedLoads, which does next to
// nothing in the daemon) made from the Python engine over plain gRPC and over a call channel:
// one daemon and one torch_engine.py --bench-calls process for the whole benchmark, each
// iteration one call over each transport, interleaved in chunks of 100. It reports the
// script's mean per call of each (grpc-µs/call, channel-µs/call) and their ratio
// (grpc/channel); ns/op is the wall time of the pair as the benchmark sees it.
func BenchmarkPythonEngineCall(b *testing.B) {
	python := pythonEngine(b)
	r := daemonForBench(b)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, python, "testdata/torch_engine.py", "--socket", r, "--memory", "shm",
		"--page-bytes", strconv.Itoa(64<<10), "--bench-calls", "500")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		in.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cancel()
			<-done
		}
		cancel()
		if s := strings.TrimSpace(stderr.String()); s != "" {
			b.Logf("engine stderr:\n%s", s)
		}
	})
	out := bufio.NewReader(outPipe)
	b.Run("calls", func(b *testing.B) {
		b.ResetTimer()
		if _, err := fmt.Fprintf(in, "%d\n", b.N); err != nil {
			b.Fatal(err)
		}
		var res struct {
			Calls          int     `json:"calls"`
			GRPCSeconds    float64 `json:"grpc_seconds"`
			ChannelSeconds float64 `json:"channel_seconds"`
		}
		for {
			line, err := out.ReadString('\n')
			if err != nil {
				b.Fatalf("engine: %v (stderr: %s)", err, bytes.TrimSpace(stderr.Bytes()))
			}
			if rest, ok := strings.CutPrefix(line, "BENCH "); ok {
				if err := json.Unmarshal([]byte(rest), &res); err != nil {
					b.Fatalf("engine: %q: %v", line, err)
				}
				break
			}
		}
		b.StopTimer()
		if res.Calls != b.N || res.GRPCSeconds <= 0 || res.ChannelSeconds <= 0 {
			b.Fatalf("engine answered %+v for %d calls", res, b.N)
		}
		b.ReportMetric(res.GRPCSeconds*1e6, "grpc-µs/call")
		b.ReportMetric(res.ChannelSeconds*1e6, "channel-µs/call")
		b.ReportMetric(res.GRPCSeconds/res.ChannelSeconds, "grpc/channel")
	})
}

// daemonForBench starts a daemon for a benchmark, as start does for a test, and returns its
// engine socket.
func daemonForBench(b *testing.B) string {
	b.Helper()
	popts := embedded.DefaultOptions()
	popts.Segments = []embedded.SegmentSpec{{Name: "test", Capacity: 256 << 20}}
	r := daemontest.Start(b, daemon.Config{Pool: popts, Defaults: connector.Options{StagingBufferBytes: 8 << 20}})
	return r.Info.Socket
}

// BenchmarkSDKAgainstGoClient compares the Python engine SDK with the Go client on one daemon,
// in one run, making the same calls: a plain call (TakeFailedLoads, next to nothing in the
// daemon) over a call channel and over gRPC, and a lookup of a 32k-token prompt whose blocks
// the pool holds (written into the rank's prompt arena, the call over its call channel). The
// Go side is the engine API client an engine links (engineapi.Client and RemoteRank, through
// enginesim); the Python side is torch_engine.py --bench-calls on kvctl_engine's Client and
// Rank. Each sub-benchmark reports µs per call; compare the go/ and python/ rows of one run.
//
//	go test -run '^$' -bench SDKAgainstGoClient -benchtime 2000x ./core/daemon/
func BenchmarkSDKAgainstGoClient(b *testing.B) {
	const tokens = 32 << 10
	python := pythonEngine(b)
	r := benchStart(b, 256<<20)
	ctx := context.Background()
	// The Go engines: one with call channels (the default), one over gRPC only.
	cfg := enginesim.Config{Socket: r.Info.Socket, ModelKey: "sdk-bench", Name: "go-chan", TokensPerBlock: benchT,
		Slots: tokens/benchT + 1, PageBytes: []int{64 << 10}, Chunk: 8 << 10}
	goChan, err := enginesim.Start(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer goChan.Close(ctx)
	cfg.Name, cfg.NoCallChannels, cfg.Slots = "go-grpc", true, 4
	goGRPC, err := enginesim.Start(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer goGRPC.Close(ctx)
	// The prompt both sides look up, saved once so that every lookup matches all its full blocks.
	prompt := randTokens(7, tokens)
	if _, err := goChan.Run(ctx, []enginesim.Request{{ID: "fill", Tokens: prompt}}, 0); err != nil {
		b.Fatal(err)
	}
	want := (tokens - 1) / benchT * benchT

	py := startBenchEngine(b, python, r.Info.Socket, "--model-key", "sdk-bench", "--tokens-per-block", strconv.Itoa(benchT),
		"--page-bytes", strconv.Itoa(64<<10), "--layers", "2", "--slots", strconv.Itoa(tokens/benchT+1))
	promptFile := filepath.Join(b.TempDir(), "prompt.json")
	if data, err := json.Marshal(prompt); err != nil {
		b.Fatal(err)
	} else if err := os.WriteFile(promptFile, data, 0o600); err != nil {
		b.Fatal(err)
	}

	goCall := func(e *enginesim.Engine, name string) func(b *testing.B) {
		return func(b *testing.B) {
			c, ref := e.Client(0), &enginepb.EngineRef{Engine: name + "/rank0"}
			for b.Loop() {
				if _, err := c.TakeFailedLoads(ctx, ref); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/call")
		}
	}
	b.Run("go/call-channel", goCall(goChan, "go-chan"))
	b.Run("go/call-grpc", goCall(goGRPC, "go-grpc"))
	b.Run("go/lookup32k-channel", func(b *testing.B) {
		rk, c := goChan.Remote(0), goChan.Client(0)
		var took time.Duration
		for i := 0; b.Loop(); i++ {
			id := fmt.Sprintf("go-lk-%d", i)
			t0 := time.Now()
			n, _, err := rk.Lookup(ctx, connector.Request{ID: id, Tokens: prompt, ContextOnly: true}, 0)
			took += time.Since(t0)
			if err != nil || n != want {
				b.Fatalf("lookup: %d tokens, %v; want %d", n, err, want)
			}
			if _, err := c.RequestReset(ctx, &enginepb.RequestRef{Engine: "go-chan/rank0", RequestId: id}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(took.Microseconds())/float64(b.N), "µs/call")
	})
	b.Run("python/calls", func(b *testing.B) {
		var res struct {
			Calls          int     `json:"calls"`
			GRPCSeconds    float64 `json:"grpc_seconds"`
			ChannelSeconds float64 `json:"channel_seconds"`
		}
		py.ask(b, fmt.Sprintf("%d", b.N), &res)
		if res.Calls != b.N || res.GRPCSeconds <= 0 || res.ChannelSeconds <= 0 {
			b.Fatalf("engine answered %+v for %d calls", res, b.N)
		}
		b.ReportMetric(res.ChannelSeconds*1e6, "channel-µs/call")
		b.ReportMetric(res.GRPCSeconds*1e6, "grpc-µs/call")
	})
	b.Run("python/lookup32k-channel", func(b *testing.B) {
		var res struct {
			Lookups       int     `json:"lookups"`
			LookupSeconds float64 `json:"lookup_seconds"`
			Matched       int     `json:"matched_tokens"`
		}
		py.ask(b, fmt.Sprintf("lookup %d %s", b.N, promptFile), &res)
		if res.Lookups != b.N || res.Matched != want {
			b.Fatalf("engine answered %+v for %d lookups, want %d tokens matched", res, b.N, want)
		}
		b.ReportMetric(res.LookupSeconds*1e6, "µs/call")
	})
}

// benchEngine is a torch_engine.py --bench-calls process: lines written to its stdin, one
// `BENCH {json}` line read back per request.
type benchEngine struct {
	in     io.WriteCloser
	out    *bufio.Reader
	stderr *bytes.Buffer
}

func startBenchEngine(b *testing.B, python, socket string, args ...string) *benchEngine {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	all := append([]string{"testdata/torch_engine.py", "--socket", socket, "--memory", "shm", "--bench-calls", "500"}, args...)
	cmd := exec.CommandContext(ctx, python, all...)
	stderr := new(bytes.Buffer)
	cmd.Stderr = stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		in.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cancel()
			<-done
		}
		cancel()
		if s := strings.TrimSpace(stderr.String()); s != "" {
			b.Logf("engine stderr:\n%s", s)
		}
	})
	return &benchEngine{in: in, out: bufio.NewReader(out), stderr: stderr}
}

// ask sends line and decodes the engine's next BENCH answer into v; the wall time between is
// the sub-benchmark's.
func (e *benchEngine) ask(b *testing.B, line string, v any) {
	b.Helper()
	if _, err := fmt.Fprintln(e.in, line); err != nil {
		b.Fatal(err)
	}
	for {
		got, err := e.out.ReadString('\n')
		if err != nil {
			b.Fatalf("engine: %v (stderr: %s)", err, bytes.TrimSpace(e.stderr.Bytes()))
		}
		if rest, ok := strings.CutPrefix(got, "BENCH "); ok {
			if err := json.Unmarshal([]byte(rest), v); err != nil {
				b.Fatalf("engine: %q: %v", got, err)
			}
			return
		}
	}
}
