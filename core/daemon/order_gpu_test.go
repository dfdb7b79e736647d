package daemon_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// orderCase is one run of a case in test_events_gpu.py's summary.
type orderCase struct {
	// Expected counts the pages holding the right bytes (loaded, or saved final KV), Other those
	// holding only the racing work's bytes (the kernel's fill, or the stale KV), Mixed the rest.
	Expected int  `json:"expected"`
	Other    int  `json:"other"`
	Mixed    int  `json:"mixed"`
	Saved    bool `json:"saved"`
	// Whether the engine's kernel was still running when the call returned.
	RunningAfterSave bool    `json:"kernel_running_when_wait_for_save_returned"`
	RunningAfterLoad bool    `json:"kernel_running_when_start_load_returned"`
	StartLoadSeconds float64 `json:"start_load_seconds"`
	WaitSaveSeconds  float64 `json:"wait_for_save_seconds"`
}

type orderSummary struct {
	GPU              string                 `json:"gpu"`
	SleepMS          float64                `json:"sleep_ms"`
	Blocks           int                    `json:"blocks"`
	DaemonEvent      int                    `json:"daemon_event_bytes"`
	UnorderedEvent   int                    `json:"unordered_daemon_event_bytes"`
	EngineEventBytes int                    `json:"event_handle_bytes"`
	Cases            map[string][]orderCase `json:"cases"`
}

// TestGPUStreamOrdering runs clients/python/tests/test_events_gpu.py against a daemon on the
// GPU: an engine that never synchronises its device around StartLoad and WaitForSave, with its
// CUDA interprocess event registered (ordered) and without (unordered, the negative control).
// Ordered, a load never lands in pages that queued work still uses and a save never reads KV
// before the kernel writing it ends, while WaitForSave returns with that kernel still running;
// unordered, the race shows. GPU, PyTorch and grpcio only: KVCTL_GPU_E2E=1.
//
//	KVCTL_EVENTS_ENGINE=path   the script (default ../../clients/python/tests/test_events_gpu.py)
//	KVCTL_TORCH_PYTHON=python3 the interpreter
//	KVCTL_EVENTS_ARGS=         more arguments for the script (e.g. "--repeats 5 --sleep-ms 200")
func TestGPUStreamOrdering(t *testing.T) {
	if os.Getenv("KVCTL_GPU_E2E") != "1" {
		t.Skip("set KVCTL_GPU_E2E=1 to run the stream-ordering checks on a GPU (needs PyTorch and grpcio)")
	}
	script := envOr("KVCTL_EVENTS_ENGINE", "../../clients/python/tests/test_events_gpu.py")
	python := envOr("KVCTL_TORCH_PYTHON", "python3")
	r := startOnGPU(t, 1<<30)
	args := []string{script, "--socket", r.Info.Socket, "--descriptor", "testdata/engine.pb"}
	args = append(args, strings.Fields(os.Getenv("KVCTL_EVENTS_ARGS"))...)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), "PYTHONUNBUFFERED=1")
	runErr := cmd.Run()
	if s := strings.TrimSpace(stderr.String()); s != "" {
		t.Logf("engine stderr:\n%s", s)
	}
	var sum *orderSummary
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), "SUMMARY "); ok {
			t.Logf("summary: %s", line)
			sum = new(orderSummary)
			if err := json.Unmarshal([]byte(line), sum); err != nil {
				t.Fatalf("summary: %v", err)
			}
		}
	}
	if sum == nil || runErr != nil {
		t.Fatalf("engine failed (%v):\n%s", runErr, stdout.String())
	}
	if sum.EngineEventBytes != 64 || sum.DaemonEvent != 64 || sum.UnorderedEvent != 0 {
		t.Errorf("event handles: engine %d bytes, daemon %d (unordered engine %d), want 64, 64, 0", sum.EngineEventBytes, sum.DaemonEvent, sum.UnorderedEvent)
	}
	for _, name := range []string{"load/ordered", "save/ordered", "load/unordered", "save/unordered"} {
		if len(sum.Cases[name]) == 0 {
			t.Fatalf("no %s runs", name)
		}
	}
	for i, c := range sum.Cases["load/ordered"] {
		if c.Expected != sum.Blocks {
			t.Errorf("ordered load %d: %d of %d pages hold the loaded bytes (%d the kernel's, %d mixed)", i, c.Expected, sum.Blocks, c.Other, c.Mixed)
		}
	}
	for i, c := range sum.Cases["save/ordered"] {
		if c.Expected != sum.Blocks || !c.Saved {
			t.Errorf("ordered save %d: the pool holds %d of %d pages as the kernel wrote them (%d stale, %d mixed; saved %t)", i, c.Expected, sum.Blocks, c.Other, c.Mixed, c.Saved)
		}
		if !c.RunningAfterSave {
			t.Errorf("ordered save %d: the kernel had ended when WaitForSave returned, so the run shows no ordering (raise --sleep-ms)", i)
		}
	}
	// The negative controls: without the event the copies race the kernel. Each case counts
	// the runs where the race showed; at least one must, or the ordered checks prove nothing.
	for _, name := range []string{"load/unordered", "save/unordered"} {
		raced := 0
		for _, c := range sum.Cases[name] {
			if c.Expected != sum.Blocks {
				raced++
			}
		}
		t.Logf("%s: the race showed in %d of %d runs", name, raced, len(sum.Cases[name]))
		if raced == 0 {
			t.Errorf("%s: no run showed the race, so the ordered runs prove nothing", name)
		}
	}
}
