package adversarial

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/enginesim"
)

// soakTrace reads the conversation trace: each record's hash_ids become its prompt, a block of
// soakTokensPerHash deterministic tokens per hash id, so prompts share prefixes as in the trace.
func soakTrace(t *testing.T, path string) [][]int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Skipf("trace %s: %v (set KVCTL_SOAK_TRACE)", path, err)
	}
	defer f.Close()
	var out [][]int64
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var rec struct {
			HashIDs []int64 `json:"hash_ids"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		ids := rec.HashIDs
		if len(ids) > soakMaxHashes {
			ids = ids[:soakMaxHashes]
		}
		toks := make([]int64, 0, len(ids)*soakTokensPerHash+1)
		for _, h := range ids {
			rng := rand.New(rand.NewPCG(uint64(h), 0x5eed))
			for range soakTokensPerHash {
				toks = append(toks, rng.Int64N(150000))
			}
		}
		toks = append(toks, 1) // the token the engine generates next
		out = append(out, toks)
	}
	return out
}

const (
	soakTokensPerHash = 32 // two 16-token blocks per 512-token block of the trace
	soakMaxHashes     = 64
)

type soakSample struct {
	At     time.Duration
	RSSKiB int64
	FDs    int
}

// TestSoak runs four engines replaying the conversation trace against one kvctl serve for
// KVCTL_SOAK (e.g. 30m) while floods run from another uid (the admin port: idle connections
// and /query_key loops; the sockets: refused by their directory) and from the daemon's own uid
// (engine socket and descriptor channel). It checks: the daemon never exits, no loaded page
// holds a wrong byte, and RSS and open descriptors are flat (last quarter against the second).
// It writes its samples to KVCTL_SOAK_OUT when set.
func TestSoak(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("KVCTL_SOAK"))
	if err != nil || d <= 0 {
		t.Skip("set KVCTL_SOAK to a duration (e.g. 30m) to run the soak")
	}
	trace := os.Getenv("KVCTL_SOAK_TRACE")
	if trace == "" {
		trace = "../../../shared/traces/conversation_trace.jsonl"
	}
	prompts := soakTrace(t, trace)
	raiseOwnLimit()
	p := startServe(t, serveOpts{args: []string{"--pool-size", "1GiB", "--max-conns", "256", "--stats-interval", "60s"}})
	pid := p.cmd.Process.Pid
	ctx, cancel := context.WithTimeout(context.Background(), d+2*time.Minute)
	defer cancel()
	end := time.Now().Add(d)

	var (
		wg                        sync.WaitGroup
		requests, loaded, passes  atomic.Int64
		engineErr                 = make(chan error, 4)
		floodRounds, floodRefused atomic.Int64
	)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e, err := enginesim.Start(ctx, enginesim.Config{Socket: p.socket, ModelKey: "conversation", Name: fmt.Sprintf("soak%d", i), Slots: 8192, PageBytes: []int{2048}})
			if err != nil {
				engineErr <- fmt.Errorf("engine %d: %w", i, err)
				return
			}
			defer e.Close(context.Background())
			for pass := 0; time.Now().Before(end); pass++ {
				batch := make([]enginesim.Request, 0, 64)
				for j := i; j < len(prompts) && time.Now().Before(end); j += 4 {
					batch = append(batch, enginesim.Request{ID: fmt.Sprintf("p%d-r%d", pass, j), Tokens: prompts[j]})
					if len(batch) == cap(batch) {
						res, err := e.Run(ctx, batch, 16)
						if err != nil {
							engineErr <- fmt.Errorf("engine %d pass %d: %w", i, pass, err)
							return
						}
						requests.Add(int64(res.Requests))
						loaded.Add(int64(res.LoadedBlocks))
						batch = batch[:0]
					}
				}
				passes.Add(1)
			}
		}()
	}

	// Floods, until the end, each round bounded.
	floodCtx, stopFloods := context.WithDeadline(ctx, end)
	defer stopFloods()
	if os.Geteuid() == 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for floodCtx.Err() == nil {
				// As nobody: 500 idle admin connections for 10 s, a /query_key loop for 5 s,
				// and attempts on both sockets (refused by the 0700 directory).
				for _, c := range [][]string{
					{"flood-conns", "NETWORK=tcp", "ADDR=" + p.admin, "COUNT=500", "DURATION=10s"},
					{"query-loop", "URL=http://" + p.admin + "/query_key?key=conversation", "DURATION=5s"},
					{"flood-conns", "NETWORK=unix", "ADDR=" + p.socket, "COUNT=50", "DURATION=1s"},
					{"flood-conns", "NETWORK=unix", "ADDR=" + engineapi.FDSocketPath(p.socket), "COUNT=50", "DURATION=1s"},
				} {
					_ = runAs(floodCtx, nobodyUID, c[0], c[1:]...).Run()
				}
				floodRounds.Add(1)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for floodCtx.Err() == nil {
			// As the daemon's uid: 400 idle connections on each socket for 5 s (past the cap of
			// 256), then 40 unclaimed descriptors from another process.
			var conns []net.Conn
			for range 400 {
				for _, addr := range []string{p.socket, engineapi.FDSocketPath(p.socket)} {
					if c, err := net.DialTimeout("unix", addr, time.Second); err == nil {
						conns = append(conns, c)
					} else {
						floodRefused.Add(1)
					}
				}
			}
			select {
			case <-floodCtx.Done():
			case <-time.After(5 * time.Second):
			}
			for _, c := range conns {
				_ = c.Close()
			}
			_ = runAs(floodCtx, 0, "flood-fds", "ADDR="+engineapi.FDSocketPath(p.socket), "COUNT=40").Run()
			select {
			case <-floodCtx.Done():
			case <-time.After(10 * time.Second):
			}
		}
	}()

	var samples []soakSample
	start := time.Now()
	tick := time.NewTicker(30 * time.Second)
	defer tick.Stop()
	var runErr error
loop:
	for {
		select {
		case <-p.done:
			runErr = fmt.Errorf("kvctl serve exited during the soak: %w\n%s", p.err, tail(p.stderr.String(), 40))
			break loop
		case err := <-engineErr:
			runErr = err
			break loop
		case <-tick.C:
			rss, fds, err := procStats(pid)
			if err != nil {
				runErr = err
				break loop
			}
			samples = append(samples, soakSample{At: time.Since(start).Round(time.Second), RSSKiB: rss, FDs: fds})
			t.Logf("%v rss=%d KiB fds=%d requests=%d loaded_blocks=%d flood_rounds=%d", time.Since(start).Round(time.Second), rss, fds, requests.Load(), loaded.Load(), floodRounds.Load())
			if time.Now().After(end) {
				break loop
			}
		}
	}
	stopFloods()
	if runErr != nil {
		cancel()
		wg.Wait()
		t.Fatal(runErr)
	}
	wg.Wait()
	select {
	case err := <-engineErr:
		t.Fatal(err)
	default:
	}
	p.alive(t)
	// Idle after the floods: descriptors back to what they were before them.
	time.Sleep(15 * time.Second)
	rssEnd, fdsEnd, _ := procStats(pid)
	samples = append(samples, soakSample{At: time.Since(start).Round(time.Second), RSSKiB: rssEnd, FDs: fdsEnd})

	summary := map[string]any{
		"duration": d.String(), "requests": requests.Load(), "loaded_blocks": loaded.Load(), "trace_passes": passes.Load(),
		"flood_rounds_other_uid": floodRounds.Load(), "daemon_pid": pid, "daemon_restarts": 0, "wrong_bytes": 0,
		"samples": samples,
	}
	if out := os.Getenv("KVCTL_SOAK_OUT"); out != "" {
		b, _ := json.MarshalIndent(summary, "", "  ")
		_ = os.MkdirAll(filepath.Dir(out), 0o755)
		if err := os.WriteFile(out, b, 0o644); err != nil {
			t.Error(err)
		}
	}
	if requests.Load() == 0 || loaded.Load() == 0 {
		t.Errorf("the engines did no work: %d requests, %d loaded blocks", requests.Load(), loaded.Load())
	}
	if len(samples) >= 8 {
		q := len(samples) / 4
		mid := medianRSS(samples[q : 2*q])
		last := medianRSS(samples[3*q:])
		if last > mid+mid/5 {
			t.Errorf("RSS grew: median %d KiB in the second quarter, %d KiB in the last", mid, last)
		}
		if fdsEnd > samples[0].FDs+16 {
			t.Errorf("descriptors grew: %d at the first sample, %d idle at the end", samples[0].FDs, fdsEnd)
		}
	}
}

func medianRSS(s []soakSample) int64 {
	v := make([]int64, len(s))
	for i, x := range s {
		v[i] = x.RSSKiB
	}
	sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
	if len(v) == 0 {
		return 0
	}
	return v[len(v)/2]
}
