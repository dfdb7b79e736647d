package daemon_test

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/daemon/daemontest"
	"github.com/kvctl/kvctl/core/enginesim"
	corestats "github.com/kvctl/kvctl/core/stats"
	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/gpu"
	"github.com/kvctl/kvctl/pool/embedded"
)

// torchPass is one pass's counts in torch_engine.py's summary.
type torchPass struct {
	Requests         int     `json:"requests"`
	Passes           int     `json:"passes"`
	MatchedTokens    int     `json:"matched_tokens"`
	LoadedBlocks     int     `json:"loaded_blocks"`
	ComputedBlocks   int     `json:"computed_blocks"`
	Restarts         int     `json:"restarts"`
	MismatchedBlocks int     `json:"mismatched_blocks"`
	MismatchedBytes  int     `json:"mismatched_bytes"`
	StartLoadSeconds float64 `json:"start_load_seconds"`
	StartLoads       int     `json:"start_loads"`
	// RPCSeconds is the time of the TakeFailedLoads calls made right after each StartLoad,
	// which do next to nothing in the daemon: an engine RPC's own cost.
	RPCSeconds  float64 `json:"rpc_seconds"`
	LoadedBytes int64   `json:"loaded_bytes"`
	WallSeconds float64 `json:"wall_seconds"`
	// StartLoadEach is each StartLoad's seconds and the pages it restored, in order.
	StartLoadEach [][2]float64 `json:"start_load_each"`
}

type torchSummary struct {
	Memory         string                  `json:"memory"`
	PageBytes      int                     `json:"page_bytes"`
	Layers         int                     `json:"layers"`
	SpinUS         float64                 `json:"spin_us"`
	GPU            string                  `json:"gpu"`
	Torch          string                  `json:"torch"`
	Registration   map[string]any          `json:"registration"`
	Cold           torchPass               `json:"cold"`
	Warm           torchPass               `json:"warm"`
	ExpectedLoaded int                     `json:"expected_warm_loaded_blocks"`
	DaemonLoads    *statsapi.LoadStatsJSON `json:"daemon_loads"`
	// IdleRPCSeconds is the mean time of a call that does next to nothing, made 200 times on
	// the idle daemon before the warm pass.
	IdleRPCSeconds float64 `json:"idle_rpc_seconds"`
	// Anchor and AnchorAfter are the pinned 64 MiB copies (h2d_64mib_gbs, d2h_64mib_gbs)
	// measured by the engine before the cold pass and after the warm pass.
	Anchor      map[string]float64 `json:"anchor"`
	AnchorAfter map[string]float64 `json:"anchor_after"`
	OK          bool               `json:"ok"`
	Problems    []string           `json:"problems"`
}

// TestGPUTorchEngine is the end-to-end run with a PyTorch process as the engine: it registers a
// CUDA tensor through a CUDA IPC handle, runs a cold pass that saves every computed block and a
// warm pass (a new engine over a fresh tensor) that loads them, every loaded page checked on the
// GPU. It needs a GPU, PyTorch and grpcio, so it runs only with KVCTL_GPU_E2E=1.
//
//	KVCTL_GPU_E2E=1             run it
//	KVCTL_TORCH_ENGINE=path     the script (default testdata/torch_engine.py)
//	KVCTL_TORCH_PYTHON=python3  the interpreter
//	KVCTL_TORCH_MEMORY=cuda     cuda, or shm to check the script on a machine without a GPU
//	KVCTL_TORCH_REQUESTS=64     requests per pass
//	KVCTL_TORCH_SCATTER=auto    how the daemon copies pages in: auto, kernel or engines
//	                            (gpu.CUDAMoverOptions.Scatter), to compare the two
//	KVCTL_TORCH_CALLS=channel   the engine calls' transport (--calls): channel, a call channel
//	                            (OpenCallChannel), or grpc, plain gRPC calls
//	KVCTL_TORCH_BUSY_MS=0       milliseconds the engine keeps the GPU computing before each
//	                            StartLoad (--busy-ms), as a forward pass does; 0 leaves it idle
//	KVCTL_TORCH_SPIN_US=10000   microseconds a call over the channel polls for its response
//	                            before the engine sleeps in recv (--spin-us), as an engine
//	                            waiting on its load does (README, "Call channels"); 0 sleeps
//	KVCTL_TORCH_CALL_POLL=      the daemon's call channel poll window (Config.CallChannelPoll,
//	                            a Go duration; -1ns turns polling off); unset, the default
func TestGPUTorchEngine(t *testing.T) {
	if os.Getenv("KVCTL_GPU_E2E") != "1" {
		t.Skip("set KVCTL_GPU_E2E=1 to run the PyTorch engine over CUDA IPC (needs a GPU, PyTorch and grpcio)")
	}
	script := envOr("KVCTL_TORCH_ENGINE", "testdata/torch_engine.py")
	python := envOr("KVCTL_TORCH_PYTHON", "python3")
	memory := envOr("KVCTL_TORCH_MEMORY", "cuda")
	requests := envOr("KVCTL_TORCH_REQUESTS", "64")
	calls := envOr("KVCTL_TORCH_CALLS", "channel")
	busy := envOr("KVCTL_TORCH_BUSY_MS", "0")
	spin := envOr("KVCTL_TORCH_SPIN_US", "10000")

	cases := []struct {
		name      string
		pageBytes int
		layers    int
		batch     int // transfer_batch_size, 0 = the default (64)
	}{
		{"page=1MiB/layers=2", 1 << 20, 2, 0},
		{"page=256KiB/layers=8", 256 << 10, 8, 0},
		{"page=64KiB/layers=2/batch=256", 64 << 10, 2, 256},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := startOnGPU(t, 4<<30)
			args := []string{script, "--socket", r.Info.Socket, "--memory", memory,
				"--stats-url", "http://" + r.Info.AdminAddr + "/v1/stats",
				"--requests", requests, "--page-bytes", strconv.Itoa(c.pageBytes), "--layers", strconv.Itoa(c.layers),
				"--transfer-batch", strconv.Itoa(c.batch), "--calls", calls, "--busy-ms", busy, "--spin-us", spin}
			sum := &runPythonEngine(t, python, args).torchSummary
			checkTorchSummary(t, sum)

			w := sum.Warm
			line := fmt.Sprintf("warm pass: %d pages (%d bytes each) loaded in %.3fs of StartLoad: %.0f pages/s, %.2f GB/s",
				w.LoadedBlocks, sum.PageBytes, w.StartLoadSeconds,
				float64(w.LoadedBlocks)/w.StartLoadSeconds, float64(w.LoadedBytes)/w.StartLoadSeconds/1e9)
			line += fmt.Sprintf("; whole pass %.3fs", w.WallSeconds)
			if w.StartLoads > 0 {
				line += fmt.Sprintf("; %d StartLoads, a plain RPC %.0f µs after one (idle %.0f µs)", w.StartLoads, w.RPCSeconds/float64(w.StartLoads)*1e6, sum.IdleRPCSeconds*1e6)
			}
			if each := startLoadSpread(w.StartLoadEach); each != "" {
				line += "; " + each
			}
			if d := sum.DaemonLoads; d != nil && d.TransferSeconds > 0 {
				line += fmt.Sprintf("; daemon: %d pages, %d bytes landed in %.3fs of transfers: %.0f pages/s, %.2f GB/s",
					d.Pages, d.LandedBytes, d.TransferSeconds, float64(d.Pages)/d.TransferSeconds, float64(d.LandedBytes)/d.TransferSeconds/1e9)
				if d.Loads > 0 {
					line += fmt.Sprintf(" (per load: %.3f ms of transfer, of which the GPU copied %.3f ms and checked %.3f ms after the copies)",
						d.TransferSeconds/float64(d.Loads)*1e3, d.GPUCopySeconds/float64(d.Loads)*1e3, d.GPUCheckSeconds/float64(d.Loads)*1e3)
					for p := corestats.Phase(0); p < corestats.NumPhases; p++ {
						line += fmt.Sprintf(", %s %.3f", p, d.Phases[p.String()].WallSeconds/float64(d.Loads)*1e3)
					}
				}
			}
			if h2d := (sum.Anchor["h2d_64mib_gbs"] + sum.AnchorAfter["h2d_64mib_gbs"]) / 2; h2d > 0 && w.StartLoadSeconds > 0 {
				line += fmt.Sprintf("; pinned H2D 64 MiB %.2f / %.2f GB/s (before / after): StartLoad at %.1f %% of their mean",
					sum.Anchor["h2d_64mib_gbs"], sum.AnchorAfter["h2d_64mib_gbs"], 100*float64(w.LoadedBytes)/w.StartLoadSeconds/1e9/h2d)
			}
			t.Log(line)
		})
	}
}

// startLoadSpread describes how the StartLoads that restored pages were spread: the first one's
// time, the median and the slowest, in ms, with the pages each restored.
func startLoadSpread(each [][2]float64) string {
	var ls [][2]float64
	for _, e := range each {
		if e[1] > 0 {
			ls = append(ls, e)
		}
	}
	if len(ls) == 0 {
		return ""
	}
	first := ls[0]
	slices.SortFunc(ls, func(a, b [2]float64) int { return cmp.Compare(a[0], b[0]) })
	med, most := ls[len(ls)/2], ls[len(ls)-1]
	return fmt.Sprintf("loading StartLoads: first %.3f ms (%.0f pages), median %.3f ms (%.0f pages), slowest %.3f ms (%.0f pages)",
		first[0]*1e3, first[1], med[0]*1e3, med[1], most[0]*1e3, most[1])
}

func checkTorchSummary(t *testing.T, s *torchSummary) {
	t.Helper()
	if !s.OK {
		t.Errorf("engine reports problems: %v", s.Problems)
	}
	for _, p := range []struct {
		name string
		p    torchPass
	}{{"cold", s.Cold}, {"warm", s.Warm}} {
		if p.p.MismatchedBlocks != 0 {
			t.Errorf("%s pass: %d loaded pages held wrong bytes (%d bytes)", p.name, p.p.MismatchedBlocks, p.p.MismatchedBytes)
		}
		if p.p.Restarts != 0 {
			t.Errorf("%s pass: %d requests restarted after failed loads", p.name, p.p.Restarts)
		}
	}
	if s.Cold.ComputedBlocks == 0 {
		t.Errorf("cold pass computed nothing: %+v", s.Cold)
	}
	if s.Warm.LoadedBlocks == 0 || s.Warm.LoadedBlocks != s.ExpectedLoaded {
		t.Errorf("warm pass loaded %d blocks, want %d", s.Warm.LoadedBlocks, s.ExpectedLoaded)
	}
	// The warm pass computes only the block holding each prompt's last token.
	if s.Warm.ComputedBlocks > s.Warm.Requests {
		t.Errorf("warm pass computed %d blocks for %d requests", s.Warm.ComputedBlocks, s.Warm.Requests)
	}
	// The daemon's totals count both engines, the cold one included after it unregistered (its
	// few loads are turns sharing a prefix with a request saved earlier in the same pass).
	if d := s.DaemonLoads; d != nil {
		if want := int64(s.Cold.LoadedBlocks + s.Warm.LoadedBlocks); d.Pages != want || d.FailedPages != 0 {
			t.Errorf("daemon load stats: %d pages (%d failed), engines loaded %d", d.Pages, d.FailedPages, want)
		}
		if want := s.Cold.LoadedBytes + s.Warm.LoadedBytes; d.LandedBytes != want {
			t.Errorf("daemon landed %d bytes, engines checked %d", d.LandedBytes, want)
		}
	}
	if s.Memory == "cuda" {
		if n, _ := s.Registration["handle_bytes"].(float64); n != 66 && n != 64 {
			t.Errorf("registration: %v", s.Registration)
		}
	}
}

// startOnGPU is start with the daemon's device backend set to the gpu package's, as
// `kvctl serve` sets it, so that engines can register CUDA memory.
func startOnGPU(t *testing.T, poolBytes int64) *daemontest.Running {
	t.Helper()
	popts := embedded.DefaultOptions()
	popts.Segments = []embedded.SegmentSpec{{Name: "test", Capacity: poolBytes}}
	var dev gpu.CUDA
	switch os.Getenv("KVCTL_TORCH_SCATTER") {
	case "kernel":
		dev.Options.Scatter = gpu.ScatterKernel
	case "engines":
		dev.Options.Scatter = gpu.ScatterCopyEngines
	}
	cfg := daemon.Config{Pool: popts, Defaults: connector.Options{StagingBufferBytes: 8 << 20}, Device: dev}
	if v := os.Getenv("KVCTL_TORCH_CALL_POLL"); v != "" {
		poll, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("KVCTL_TORCH_CALL_POLL=%q: %v", v, err)
		}
		cfg.CallChannelPoll = poll
	}
	return daemontest.Start(t, cfg)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// TestGPUEngineCUDAFD runs a two-rank tensor-parallel engine whose KV memory is CUDA device
// memory made with cuMemCreate and handed to the daemon as an exported file descriptor (the
// virtual-memory pools engines allocate), with two layer groups and a replicated region: a cold
// engine saves, a warm engine loads, every page read back from the GPU and compared. GPU only
// (KVCTL_GPU_E2E=1); with KVCTL_GPU_E2E_MEMORY=shm it runs the same over shared memory.
func TestGPUEngineCUDAFD(t *testing.T) {
	if os.Getenv("KVCTL_GPU_E2E") != "1" {
		t.Skip("set KVCTL_GPU_E2E=1 to run on a GPU host")
	}
	memory := envOr("KVCTL_GPU_E2E_MEMORY", enginesim.MemoryCUDAFD)
	r := startOnGPU(t, 2<<30)
	ctx := context.Background()
	const T = 32
	cfg := enginesim.Config{Socket: r.Info.Socket, ModelKey: "fd-model", World: 2, TokensPerBlock: T, Slots: 1024,
		PageBytes: []int{256 << 10, 64 << 10}, ReplicatedBytes: []int{0, 16 << 10}, Chunk: 4 * T, Memory: memory,
		Device: gpu.CUDA{}}
	reqs := prompts(41, 48, T, "fd")
	var results [2]enginesim.Result
	for i, name := range []string{"cold", "warm"} {
		cfg.Name = name
		e, err := enginesim.Start(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		res, err := e.Run(ctx, reqs, 16)
		if err != nil {
			t.Fatalf("%s pass: %v", name, err)
		}
		if err := e.Close(ctx); err != nil {
			t.Fatal(err)
		}
		results[i] = res
		t.Logf("%s pass over %s memory: %+v in %v", name, memory, res, time.Since(began))
	}
	want := 0
	for _, q := range reqs {
		want += (len(q.Tokens) - 1) / T
	}
	if w := results[1]; w.LoadedBlocks != want || w.Restarts != 0 {
		t.Errorf("warm pass loaded %d blocks (restarts %d), want %d", w.LoadedBlocks, w.Restarts, want)
	}
}
