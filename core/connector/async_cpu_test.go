package connector

import (
	"context"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/stats"
)

// An asynchronous load counts the thread CPU of its phases only while the stats line that
// reports it is on (StatsInterval), as a synchronous load does: the load goroutine is pinned
// to its thread only then. Its phases' wall times are counted either way. The pool's gets burn
// CPU on the calling thread, so that a counted load's CPU is well above the clock's tick.
func TestAsyncLoadThreadCPUOnlyWithStatsLine(t *testing.T) {
	poolKinds(t, testAsyncLoadThreadCPUOnlyWithStatsLine)
}

func testAsyncLoadThreadCPUOnlyWithStatsLine(t *testing.T, newPool func() testPool) {
	pool := newPool()
	opts := baseOptions()
	tokens := prompt(71, 0, 41)
	cold := newEngine(t, pool, opts, 1, 64)
	cold.add("r", tokens)
	cold.mustRun()
	for _, interval := range []time.Duration{0, time.Hour} {
		rep, err := stats.NewReporter(stats.ReporterOptions{Interval: interval, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		ao := opts
		ao.AsyncLoad, ao.AsyncLoadWorkers = true, 1
		ao.Stats, ao.StatsInterval = rep, interval
		warm := newEngine(t, busyGets{pool}, ao, 1, 64)
		warm.add("r", tokens)
		warm.mustRun()
		if got, want := warm.byID["r"].loaded, (len(tokens)-1)/testT; got != want {
			t.Fatalf("stats interval %v: loaded %d blocks, want %d", interval, got, want)
		}
		tot := rep.LoadTotals()
		if tot.AsyncLoads != 1 || tot.Loads != 1 {
			t.Fatalf("stats interval %v: %d loads, %d asynchronous, want one asynchronous load", interval, tot.Loads, tot.AsyncLoads)
		}
		var cpu time.Duration
		for _, ph := range tot.Phases {
			cpu += ph.CPU
		}
		if tot.Phases[stats.PhaseGet].Wall <= 0 || tot.Phases[stats.PhaseResolve].Wall <= 0 {
			t.Fatalf("stats interval %v: phases not timed: %+v", interval, tot.Phases)
		}
		switch {
		case interval == 0 && cpu != 0:
			t.Fatalf("no stats line, yet the asynchronous load counted %v of thread CPU: %+v", cpu, tot.Phases)
		case interval > 0 && cpu <= 0 && stats.ThreadCPUSupported:
			t.Fatalf("stats line on, yet the asynchronous load counted no thread CPU: %+v", tot.Phases)
		}
	}
}

// busyGets is a pool whose gets first keep the calling thread busy for busyGetFor; the get
// itself is the pool's.
type busyGets struct{ testPool }

const busyGetFor = 40 * time.Millisecond

func (b busyGets) BatchGet(ctx context.Context, keys []string, bufs [][]byte) []int64 {
	x := 1
	for start := time.Now(); time.Since(start) < busyGetFor; {
		for range 1000 {
			x = x*31 + 7
		}
	}
	if x == 0 {
		keys = nil
	}
	return b.testPool.BatchGet(ctx, keys, bufs)
}
