package adversarial

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/enginesim"
)

// TestFaultLogsAggregated: saves into a pool too small for them fail page after page (correctly:
// no wrong byte is ever served), and the daemon logs one line per kind of failure per interval
// with a count, not one line per failed save.
func TestFaultLogsAggregated(t *testing.T) {
	p := startServe(t, serveOpts{args: []string{"--pool-size", "16MiB", "--log-level", "info"}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := enginesim.Start(ctx, enginesim.Config{Socket: p.socket, ModelKey: "m", Name: "big", Slots: 2048, PageBytes: []int{256 << 10}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	rng := rand.New(rand.NewPCG(5, 5))
	var reqs []enginesim.Request
	for i := range 120 {
		toks := make([]int64, 16*16)
		for j := range toks {
			toks[j] = rng.Int64N(150000)
		}
		reqs = append(reqs, enginesim.Request{ID: "r" + string(rune('a'+i%26)) + strings.Repeat("x", i/26), Tokens: toks})
	}
	start := time.Now()
	res, err := e.Run(ctx, reqs, 64)
	windows := int(time.Since(start)/(10*time.Second)) + 2 // the daemon's 10 s folding windows the run touched
	if err != nil {
		t.Fatalf("run against a full pool: %v", err)
	}
	p.alive(t)
	// Stop the daemon: the last window's counts are written on the way out.
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		t.Fatal("no exit after SIGTERM")
	}
	log := p.stderr.String()
	var first, repeated int
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, "failed to save") {
			continue
		}
		if !strings.Contains(line, "(repeated)") {
			first++
			continue
		}
		if i := strings.Index(line, "repeated="); i >= 0 {
			n, _ := strconv.Atoi(strings.Fields(line[i+len("repeated="):])[0])
			repeated += n
		}
	}
	t.Logf("%d blocks computed; %d 'failed to save' lines, %d more folded into counts", res.ComputedBlocks, first, repeated)
	if first == 0 {
		t.Fatalf("no save failed: the pool was not full, the test did not test anything:\n%s", tail(log, 20))
	}
	if repeated == 0 {
		t.Errorf("no count of folded failures was logged:\n%s", tail(log, 20))
	}
	if first > windows {
		t.Errorf("%d 'failed to save' lines for one engine in a run over %d windows; want at most one per window:\n%s", first, windows, tail(log, 20))
	}
}
