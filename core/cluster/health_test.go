package cluster_test

import (
	"bufio"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
)

// healthMetrics reads the segment health series from a host's /metrics: the unhealthy gauge
// and the transitions counter by its "to" label.
func healthMetrics(t testing.TB, h *host) (unhealthy float64, to map[string]float64) {
	t.Helper()
	code, body, err := get(h.admin + "/metrics")
	if err != nil || code != 200 {
		t.Fatalf("%s /metrics: %d %v", h.name, code, err)
	}
	to = map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, val, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		switch {
		case name == "kvctl_pool_unhealthy_segments":
			unhealthy = v
		case strings.HasPrefix(name, `kvctl_pool_segment_health_transitions_total{to="`):
			to[strings.TrimSuffix(strings.TrimPrefix(name, `kvctl_pool_segment_health_transitions_total{to="`), `"}`)] = v
		}
	}
	return unhealthy, to
}

// shifted returns reqs with every token moved by off, so their pages are new keys.
func shifted(reqs []enginesim.Request, suffix string, off int64) []enginesim.Request {
	out := make([]enginesim.Request, len(reqs))
	for i, q := range reqs {
		toks := make([]int64, len(q.Tokens))
		for j, v := range q.Tokens {
			toks[j] = v + off
		}
		out[i] = enginesim.Request{ID: q.ID + "-" + suffix, Tokens: toks}
	}
	return out
}

// blocksOf is the number of blocks an engine can load for reqs: every full block but the one
// holding the last token.
func blocksOf(reqs []enginesim.Request) int {
	n := 0
	for _, q := range reqs {
		n += (len(q.Tokens) - 1) / T
	}
	return n
}

// TestRealPeerHostKilledNoRestartStorm: host A, which holds every page, is killed while the
// master still lists its segment. Host B's first load from A fails and marks A's segment
// unhealthy: from then on B answers A's pages as misses, so a request restarts at most once
// for the lost host, and a second run while the master still lists A restarts nothing. No
// wrong byte is accepted (the engine checks every loaded page). When the master drops A's
// segment B forgets its state; A comes back on the same ports, and B's hit rate on pages saved
// after its return is whole again, read in part out of A's new segment.
func TestRealPeerHostKilledNoRestartStorm(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{ClientTTL: 5 * time.Second})
	reqs, _ := traceRequests(t, 12)
	a := startServe(t, m, "A")
	a.waitReady(t)
	runEngine(t, simConfig(a, "cold"), reqs, 4)
	b := startServe(t, m, "B")
	b.waitReady(t)
	segA := a.stats(t).Backend.Segment
	a.kill()
	killed := time.Now()

	res := runEngine(t, simConfig(b, "warm"), renamed(reqs, "warm"), 4)
	// The bound: one lost host, so at most one restart per request. Before the health state
	// every lookup in the window offered A's pages again (hundreds of restarts per run).
	if res.Requests != len(reqs) || res.Restarts == 0 || res.Restarts > len(reqs) {
		t.Fatalf("warm run on B after A died: %+v; want every request finished and 1..%d restarts", res, len(reqs))
	}
	again := runEngine(t, simConfig(b, "again"), renamed(reqs, "again"), 4)
	listed := segmentListed(t, m, segA)
	t.Logf("after A died (%s ago, still listed by the master: %t): first run %+v, second run %+v",
		time.Since(killed).Round(time.Millisecond), listed, res, again)
	if again.Restarts != 0 || again.Requests != len(reqs) {
		t.Fatalf("second run on B with A dead: %+v; want no restart (A's pages are not offered)", again)
	}
	st := b.stats(t)
	if st.Backend.PoolCallFailures.LoadPages == 0 || st.Loads.FailedPages == 0 {
		t.Fatalf("failed loads not counted on B: %+v %+v", st.Backend.PoolCallFailures, st.Loads)
	}
	gauge, to := healthMetrics(t, b)
	// However many transfers were in flight when A died, A turned unhealthy once.
	if to["unhealthy"] != 1 || to["healthy"] != 0 {
		t.Fatalf("B's transitions after A died: %v; want exactly one to unhealthy, none to healthy", to)
	}
	if listed && gauge != 1 {
		t.Fatalf("B's unhealthy segments while the master lists A: %v, want 1", gauge)
	}

	// The master drops A's segment after its client TTL; B's prober forgets the state.
	eventually(t, "the master dropping A's segment", func() bool { return !segmentListed(t, m, segA) })
	eventually(t, "B forgetting A's state", func() bool { g, to := healthMetrics(t, b); return g == 0 && to["forgotten"] == 1 })

	a = restartServe(t, m, a)
	a.waitReady(t)
	if seg := a.stats(t).Backend.Segment; seg != segA {
		t.Fatalf("A came back as segment %q, want %q", seg, segA)
	}
	back := shifted(reqs, "back", 1_000_000_000)
	runEngine(t, simConfig(a, "back-cold"), back, 4)
	readsBefore := a.stats(t).Backend.SegmentServed.PeerReads
	warm := runEngine(t, simConfig(b, "back-warm"), renamed(back, "warm"), 4)
	if want := blocksOf(back); warm.LoadedBlocks != want || warm.Restarts != 0 {
		t.Fatalf("B after A came back: %+v; want %d loaded blocks (every block) and no restart", warm, want)
	}
	if reads := a.stats(t).Backend.SegmentServed.PeerReads; reads <= readsBefore {
		t.Fatalf("B read nothing out of A's new segment (%d reads before, %d after)", readsBefore, reads)
	}
	for _, h := range []*host{a, b} {
		if code := h.stop(t); code != 0 {
			t.Fatalf("%s exit %d", h.name, code)
		}
	}
}

// TestRealPeerHostStopsAndAnswersAgain: host A is stopped (SIGSTOP: its process holds its
// pages but answers nothing) while the master keeps its segment. B's loads from A run out of
// time, A turns unhealthy, and B stops offering its pages. After SIGCONT a probe finds A
// answering, A turns healthy again and B loads every block from A's segment, the same bytes.
func TestRealPeerHostStopsAndAnswersAgain(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{ClientTTL: 120 * time.Second})
	reqs, _ := traceRequests(t, 8)
	a := startServe(t, m, "A")
	a.waitReady(t)
	runEngine(t, simConfig(a, "cold"), reqs, 4)
	b := startServe(t, m, "B")
	b.waitReady(t)
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	t.Cleanup(func() {
		if stopped {
			_ = a.cmd.Process.Signal(syscall.SIGCONT)
		}
	})

	res := runEngine(t, simConfig(b, "stopped"), renamed(reqs, "stopped"), 4)
	if res.Requests != len(reqs) || res.Restarts == 0 || res.Restarts > len(reqs) {
		t.Fatalf("run on B with A stopped: %+v; want every request finished and 1..%d restarts", res, len(reqs))
	}
	if g, to := healthMetrics(t, b); g != 1 || to["unhealthy"] != 1 {
		t.Fatalf("B with A stopped: unhealthy %v, transitions %v; want 1 and one to unhealthy", g, to)
	}

	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	eventually(t, "B finding A healthy again", func() bool { g, to := healthMetrics(t, b); return g == 0 && to["healthy"] == 1 })
	warm := runEngine(t, simConfig(b, "back"), renamed(reqs, "back"), 4)
	// B computed and saved nothing of its own while A held the keys (a put of an existing key
	// is skipped), so every block it loads now comes out of A's segment.
	if want := blocksOf(reqs); warm.LoadedBlocks != want || warm.Restarts != 0 {
		t.Fatalf("B after A answered again: %+v; want %d loaded blocks and no restart", warm, want)
	}
	for _, h := range []*host{a, b} {
		if code := h.stop(t); code != 0 {
			t.Fatalf("%s exit %d", h.name, code)
		}
	}
}

// segmentListed reports whether the master's admin API lists seg.
func segmentListed(t testing.TB, m *mooncaketest.Master, seg string) bool {
	t.Helper()
	code, body, err := get(m.AdminURL + "/get_all_segments")
	if err != nil || code != 200 {
		t.Fatalf("get_all_segments: %d %v", code, err)
	}
	return strings.Contains(body, seg)
}
