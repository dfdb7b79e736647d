package cluster_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
)

// These tests run the real thing: a real mooncake_master and real `kvctl serve` processes on
// loopback, each with its own engine socket, admin port, segment and transfer port, driven by
// simulated engines that check every loaded byte.

var (
	buildOnce sync.Once
	kvctlBin  string
	buildErr  error
)

// kvctl builds the kvctl binary once per test run, or returns $KVCTL_BIN when set (a host
// without Go runs a binary built elsewhere).
func kvctl(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		if bin := os.Getenv("KVCTL_BIN"); bin != "" {
			kvctlBin = bin
			return
		}
		dir, err := os.MkdirTemp("", "kvctl-cluster-bin")
		if err != nil {
			buildErr = err
			return
		}
		kvctlBin = filepath.Join(dir, "kvctl")
		out, err := exec.Command("go", "build", "-o", kvctlBin, "github.com/kvctl/kvctl/cmd/kvctl").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return kvctlBin
}

// lockedBuffer collects a process's output.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// host is one `kvctl serve` process.
type host struct {
	name   string
	socket string
	admin  string // http://127.0.0.1:PORT
	port   int    // transfer port
	cmd    *exec.Cmd
	out    *lockedBuffer
	done   chan struct{}
	exit   int
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startServe starts `kvctl serve --pool-backend mooncake` against m. It does not wait for
// readiness: the caller decides what to wait for.
func startServe(t testing.TB, m *mooncaketest.Master, name string, extra ...string) *host {
	t.Helper()
	dir, err := os.MkdirTemp("", "kvc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	h := &host{name: name, socket: filepath.Join(dir, "s.sock"), port: freePort(t)}
	return launch(t, m, h, extra...)
}

// restartServe starts a host again on the transfer port and socket of h, which must have
// exited: the same segment name comes back, as a restarted host's does. Its admin address is
// a new one.
func restartServe(t testing.TB, m *mooncaketest.Master, h *host, extra ...string) *host {
	t.Helper()
	return launch(t, m, &host{name: h.name, socket: h.socket, port: h.port}, extra...)
}

// bannerAdmin is the admin line of the banner kvctl serve prints once it listens.
var bannerAdmin = regexp.MustCompile(`(?m)^  admin    (http://127\.0\.0\.1:[0-9]+)$`)

func launch(t testing.TB, m *mooncaketest.Master, h *host, extra ...string) *host {
	t.Helper()
	h.out, h.done = &lockedBuffer{}, make(chan struct{})
	dir := filepath.Dir(h.socket)
	args := append([]string{"serve", "--pool-backend", "mooncake",
		"--master", m.RPCAddr, "--metadata", m.MetadataURL, "--master-admin", m.AdminURL,
		"--pool-size", "64MiB", "--staging-buffer-bytes", "8MiB",
		"--transfer-port", strconv.Itoa(h.port), "--socket", h.socket,
		"--admin-addr", "127.0.0.1:0", "--pool-timeout", "2s"}, extra...)
	h.cmd = exec.Command(kvctl(t), args...)
	h.cmd.Stdout, h.cmd.Stderr = h.out, h.out
	h.cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+dir, "NO_COLOR=1")
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := h.cmd.Wait()
		h.exit = 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			h.exit = ee.ExitCode()
		} else if err != nil {
			h.exit = -1
		}
		close(h.done)
	}()
	t.Cleanup(func() {
		h.kill()
		if t.Failed() {
			t.Logf("kvctl serve %s output:\n%s", h.name, h.out.String())
		}
	})
	// The admin listener takes a port of the kernel's choosing, so that no other process can
	// hold it by the time it binds (a port picked free beforehand can be taken in between); its
	// address comes from the banner, printed once the engine socket, its descriptor channel and
	// the admin listener accept.
	eventually(t, h.name+"'s banner", func() bool {
		select {
		case <-h.done:
			t.Fatalf("kvctl serve %s exited with %d:\n%s", h.name, h.exit, h.out.String())
		default:
		}
		m := bannerAdmin.FindStringSubmatch(h.out.String())
		if m == nil {
			return false
		}
		h.admin = m[1]
		return true
	})
	return h
}

func (h *host) kill() {
	select {
	case <-h.done:
	default:
		_ = h.cmd.Process.Kill()
		<-h.done
	}
}

// stop sends SIGTERM and returns the exit code.
func (h *host) stop(t testing.TB) int {
	t.Helper()
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("kvctl serve %s did not exit after SIGTERM", h.name)
	}
	return h.exit
}

func get(url string) (int, string, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func (h *host) readyz() (int, string) {
	code, body, _ := get(h.admin + "/readyz")
	return code, body
}

func (h *host) stats(t testing.TB) statsapi.StatsJSON {
	t.Helper()
	code, body, err := get(h.admin + "/v1/stats")
	if err != nil || code != 200 {
		t.Fatalf("%s /v1/stats: %d %v %s", h.name, code, err, body)
	}
	var st statsapi.StatsJSON
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// eventually polls cond until it holds; not holding within the guard fails the test.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (h *host) waitReady(t testing.TB) {
	t.Helper()
	eventually(t, h.name+" ready", func() bool {
		select {
		case <-h.done:
			t.Fatalf("kvctl serve %s exited with %d:\n%s", h.name, h.exit, h.out.String())
		default:
		}
		c, _ := h.readyz()
		return c == 200
	})
}

// Engine geometry of the simulated engines: T tokens per block, one layer group of pageBytes.
const (
	T         = 16
	pageBytes = 4096
)

func simConfig(h *host, name string) enginesim.Config {
	return enginesim.Config{Socket: h.socket, ModelKey: "cluster-model", Name: name, TokensPerBlock: T, Slots: 512, PageBytes: []int{pageBytes}, Chunk: 8 * T}
}

func startEngine(ctx context.Context, cfg enginesim.Config) (*enginesim.Engine, error) {
	return enginesim.Start(ctx, cfg)
}

func runEngine(t testing.TB, cfg enginesim.Config, reqs []enginesim.Request, running int) enginesim.Result {
	t.Helper()
	ctx := context.Background()
	e, err := enginesim.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.Run(ctx, reqs, running)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Close(ctx); err != nil {
		t.Fatal(err)
	}
	return res
}

// traceRequests reads the conversation trace slice: each 512-token block of the trace
// (hash_id) becomes T tokens derived from its hash id, so requests that share hash-id prefixes
// share token prefixes; one unique token ends each prompt, so every block is offerable.
func traceRequests(t *testing.T, n int) ([]enginesim.Request, [][]int64) {
	t.Helper()
	f, err := os.Open("testdata/conversation-60.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var reqs []enginesim.Request
	var ids [][]int64
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() && len(reqs) < n {
		var r struct {
			HashIDs []int64 `json:"hash_ids"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		toks := make([]int64, 0, len(r.HashIDs)*T+1)
		for _, h := range r.HashIDs {
			for i := range T {
				toks = append(toks, 1+h*T+int64(i))
			}
		}
		toks = append(toks, 1_000_000_000+int64(len(reqs)))
		reqs = append(reqs, enginesim.Request{ID: fmt.Sprintf("t%03d", len(reqs)), Tokens: toks})
		ids = append(ids, r.HashIDs)
	}
	return reqs, ids
}

func renamed(reqs []enginesim.Request, suffix string) []enginesim.Request {
	out := make([]enginesim.Request, len(reqs))
	for i, q := range reqs {
		out[i] = enginesim.Request{ID: q.ID + "-" + suffix, Tokens: q.Tokens}
	}
	return out
}

func distinctBlocks(ids [][]int64) int {
	seen := map[string]bool{}
	for _, r := range ids {
		for b := range r {
			seen[fmt.Sprint(r[:b+1])] = true
		}
	}
	return len(seen)
}

// TestTwoHostsShareOnePool: host A replays a slice of the conversation trace cold; host B,
// joined afterwards, replays it warm. B's hits are the ideal reuse of the slice (every block
// but none computed), every loaded byte is checked by the engine, and B's bytes came out of
// A's segment: A's transfer server served them to a peer, B's own segment holds nothing.
func TestTwoHostsShareOnePool(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	reqs, ids := traceRequests(t, 40)
	a := startServe(t, m, "A")
	a.waitReady(t)
	cold := runEngine(t, simConfig(a, "cold"), reqs, 4)
	if cold.ComputedBlocks == 0 {
		t.Fatalf("cold run computed nothing: %+v", cold)
	}
	stA := a.stats(t)
	distinct := distinctBlocks(ids)
	if stA.Backend.PoolCallFailures.DroppedSavePages != 0 {
		t.Fatalf("A dropped saves: %+v", stA.Backend.PoolCallFailures)
	}

	b := startServe(t, m, "B")
	b.waitReady(t)
	st := b.stats(t)
	if st.Backend.ClusterSegments != 2 || st.Backend.ClusterCapacityBytes != 2*64<<20 {
		t.Fatalf("B sees the cluster as %d segments, %d bytes; want 2 and %d", st.Backend.ClusterSegments, st.Backend.ClusterCapacityBytes, 2*64<<20)
	}
	warm := runEngine(t, simConfig(b, "warm"), renamed(reqs, "warm"), 4)
	ideal := 0
	for _, r := range ids {
		ideal += len(r)
	}
	if warm.LoadedBlocks != ideal || warm.MatchedTokens != ideal*T || warm.Restarts != 0 || warm.ComputedBlocks != 0 {
		t.Fatalf("warm run on B: %+v; want all %d blocks loaded, none computed", warm, ideal)
	}
	stA, stB := a.stats(t), b.stats(t)
	if stB.PrefixHoles.HitBlocks != int64(ideal) {
		t.Errorf("B's hit blocks %d, want the ideal %d", stB.PrefixHoles.HitBlocks, ideal)
	}
	servedA, servedB := stA.Backend.SegmentServed, stB.Backend.SegmentServed
	if servedA == nil || servedB == nil {
		t.Fatal("segment_served missing from /v1/stats")
	}
	if servedA.BytesRead < uint64(ideal*pageBytes) || servedB.BytesRead != 0 {
		t.Errorf("A served %d bytes to peers and B %d; want A >= %d (every loaded page), B 0", servedA.BytesRead, servedB.BytesRead, ideal*pageBytes)
	}
	// The master holds one object per distinct block of the slice: A saved each once.
	if keys, ok, err := m.Metric(context.Background(), "master_key_count"); err != nil || !ok || int(keys) != distinct {
		t.Errorf("master_key_count %v (%t, %v), want %d distinct blocks", keys, ok, err, distinct)
	}
	t.Logf("slice: %d requests, %d blocks (%d distinct); cold on A: %+v; warm on B: %+v; A served %d bytes to B",
		len(reqs), ideal, distinct, cold, warm, servedA.BytesRead)

	// Early loads (engine API 1.4) from A's segment: every page lands checked, synchronously
	// and parked, the loads started at the allocation reports.
	for _, async := range []bool{false, true} {
		name := fmt.Sprintf("early-async-%t", async)
		c := simConfig(b, name)
		c.EarlyLoads = true
		if async {
			c.AsyncLoad, c.AsyncLoadWorkers = true, 1
		}
		res := runEngine(t, c, renamed(reqs, name), 4)
		if res.LoadedBlocks != ideal || res.Restarts != 0 || res.ComputedBlocks != 0 {
			t.Fatalf("%s on B: %+v; want all %d blocks loaded, none computed", name, res, ideal)
		}
	}

	// Engines whose pages lie in four regions (K and V apart, as vLLM lays them out): B reads
	// A's values straight into their pieces, synchronously and parked; saved from pieces under
	// another model key, they read back whole on A with one region a page.
	for _, async := range []bool{false, true} {
		name := fmt.Sprintf("split-async-%t", async)
		c := simConfig(b, name)
		c.SplitRegions = 4
		if async {
			c.AsyncLoad, c.AsyncLoadWorkers = true, 1
		}
		res := runEngine(t, c, renamed(reqs, name), 4)
		if res.LoadedBlocks != ideal || res.Restarts != 0 || res.ComputedBlocks != 0 {
			t.Fatalf("%s on B: %+v; want all %d blocks loaded into pieces, none computed", name, res, ideal)
		}
	}
	split := simConfig(b, "split-cold")
	split.ModelKey, split.SplitRegions = "cluster-model-split", 4
	if res := runEngine(t, split, renamed(reqs, "split-cold"), 4); res.ComputedBlocks != cold.ComputedBlocks || res.LoadedBlocks != cold.LoadedBlocks || res.Restarts != 0 {
		t.Fatalf("split-layout cold run on B under a fresh model key: %+v; want what A's cold run did, %+v", res, cold)
	}
	whole := simConfig(a, "split-warm")
	whole.ModelKey = "cluster-model-split"
	if res := runEngine(t, whole, renamed(reqs, "split-warm"), 4); res.LoadedBlocks != ideal || res.Restarts != 0 || res.ComputedBlocks != 0 {
		t.Fatalf("A loading what B saved from pieces: %+v; want all %d blocks loaded", res, ideal)
	}

	checkStatsCLI(t, m, a, b, 2)
	// The master's read endpoints are the master's: a serve on the cluster points there.
	if code, body, _ := get(b.admin + "/get_all_keys"); code != 404 || !strings.Contains(body, "Mooncake cluster of master "+m.RPCAddr) {
		t.Errorf("/get_all_keys on B: %d %q", code, body)
	}

	if code := b.stop(t); code != 0 {
		t.Errorf("B exited %d after SIGTERM", code)
	}
	if code := a.stop(t); code != 0 {
		t.Errorf("A exited %d after SIGTERM", code)
	}
}

// checkStatsCLI runs `kvctl stats --pool MASTER --pool A --pool B -o json`: both hosts report
// the mooncake backend, their own segments and the cluster's.
func checkStatsCLI(t *testing.T, m *mooncaketest.Master, a, b *host, segments int) {
	t.Helper()
	out, err := exec.Command(kvctl(t), "stats", "--pool", m.AdminURL, "--pool", a.admin, "--pool", b.admin, "-o", "json").Output()
	if err != nil {
		t.Fatalf("kvctl stats: %v\n%s", err, out)
	}
	var res struct {
		Sources []struct {
			Source  string                      `json:"source"`
			Kind    string                      `json:"kind"`
			Backend *statsapi.BackendStatusJSON `json:"backend"`
		} `json:"sources"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Sources) != 3 {
		t.Fatalf("kvctl stats: %v\n%s", err, out)
	}
	if res.Sources[0].Kind != "mooncake-master" {
		t.Errorf("first source is %q, want the master", res.Sources[0].Kind)
	}
	for i, h := range []*host{a, b} {
		s := res.Sources[i+1]
		if s.Kind != "kvctl-serve" || s.Backend == nil || s.Backend.Kind != "mooncake" || s.Backend.Master != m.RPCAddr ||
			s.Backend.ClusterSegments != segments || s.Backend.Segment != net.JoinHostPort("127.0.0.1", strconv.Itoa(h.port)) {
			t.Errorf("kvctl stats of %s: %+v %+v", h.name, s, s.Backend)
		}
	}
}

// TestReplayLiveAcrossHosts: `kvctl replay --target SOCKET` (live mode) of the trace slice against host A, then
// against host B: B's replay hits what A's saved.
func TestReplayLiveAcrossHosts(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	a := startServe(t, m, "A")
	a.waitReady(t)
	b := startServe(t, m, "B")
	b.waitReady(t)
	replay := func(h *host) map[string]any {
		out, err := exec.Command(kvctl(t), "replay", "--target", h.socket, "--engines", "2", "--pace", "max",
			"--limit", "30", "-o", "json", "testdata/conversation-60.jsonl").Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				t.Fatalf("kvctl replay --live against %s: %v\n%s", h.name, err, ee.Stderr)
			}
			t.Fatal(err)
		}
		var v map[string]any
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("replay output: %v\n%s", err, out)
		}
		return v
	}
	replay(a)
	before := b.stats(t).PrefixHoles.HitBlocks
	replay(b)
	stB := b.stats(t)
	if stB.PrefixHoles.HitBlocks <= before || stB.Loads.Pages == 0 || stB.Loads.FailedPages != 0 {
		t.Fatalf("replay on B after A: hit blocks %d -> %d, loads %+v", before, stB.PrefixHoles.HitBlocks, stB.Loads)
	}
	if served := a.stats(t).Backend.SegmentServed; served == nil || served.PeerReads == 0 {
		t.Fatalf("A served no reads to B: %+v", served)
	}
	t.Logf("B: %d hit blocks, %d loaded pages", stB.PrefixHoles.HitBlocks, stB.Loads.Pages)
	checkStatsCLI(t, m, a, b, 2)
}

// TestFourEnginesEachHost: four engines at once on host A save their share of the trace slice,
// then four at once on host B load it, every loaded byte checked: many engines' lookups, loads
// and saves go on concurrently against the real master and a peer's segment.
func TestFourEnginesEachHost(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	reqs, ids := traceRequests(t, 48)
	a := startServe(t, m, "A")
	a.waitReady(t)
	b := startServe(t, m, "B")
	b.waitReady(t)
	const engines = 4
	share := func(e int) []enginesim.Request {
		var out []enginesim.Request
		for i := e; i < len(reqs); i += engines {
			out = append(out, reqs[i])
		}
		return out
	}
	run := func(h *host, phase string) []enginesim.Result {
		res := make([]enginesim.Result, engines)
		var wg sync.WaitGroup
		errs := make(chan error, engines)
		for e := range engines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := context.Background()
				eng, err := enginesim.Start(ctx, simConfig(h, fmt.Sprintf("%s%d", phase, e)))
				if err != nil {
					errs <- err
					return
				}
				defer eng.Close(ctx)
				r, err := eng.Run(ctx, renamed(share(e), phase), 4)
				if err != nil {
					errs <- fmt.Errorf("%s engine %d: %w", phase, e, err)
				}
				res[e] = r
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		return res
	}
	run(a, "cold")
	loaded, want := 0, 0
	for _, r := range run(b, "warm") {
		loaded += r.LoadedBlocks
		if r.Restarts != 0 {
			t.Errorf("a warm engine restarted %d requests", r.Restarts)
		}
	}
	for _, r := range ids[:len(reqs)] {
		want += len(r)
	}
	if loaded != want {
		t.Fatalf("four warm engines on B loaded %d blocks, want all %d", loaded, want)
	}
	if f := b.stats(t).Backend.PoolCallFailures; f != (statsapi.PoolFailuresJSON{}) {
		t.Fatalf("pool failures on B: %+v", f)
	}
}

// forwarder is a TCP port that refuses connections until open is called, then forwards each
// one to target: a master that one host cannot reach yet while the others can.
type forwarder struct {
	addr, target string
	ln           net.Listener
}

func newForwarder(t *testing.T, target string) *forwarder {
	t.Helper()
	return &forwarder{addr: fmt.Sprintf("127.0.0.1:%d", freePort(t)), target: target}
}

func (f *forwarder) open(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	f.ln = ln
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", f.target)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(u, c) }()
				_, _ = io.Copy(c, u)
			}()
		}
	}()
}

// TestSavesBeforeJoiningAreNotFailures is the two-host run behind "saves (failed) 220 (200)"
// under a green "pool healthy" on host B: B's engine ran before B had joined the cluster (its
// master not reachable from B yet), so its lookups missed and it saved pages that host A had
// stored already. Those saves never asked the pool; they are counted as saves before joining
// the pool, not as failed saves. Once B joins, the same requests load every block from A's
// segment and no save fails.
func TestSavesBeforeJoiningAreNotFailures(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	reqs, ids := traceRequests(t, 20)
	a := startServe(t, m, "A")
	a.waitReady(t)
	runEngine(t, simConfig(a, "cold"), reqs, 4)

	path := newForwarder(t, m.RPCAddr)
	b := startServe(t, m, "B", "--master", path.addr)
	eventually(t, "B waiting for its master", func() bool { return strings.Contains(b.out.String(), "waiting for the Mooncake master; retrying") })
	early := runEngine(t, simConfig(b, "early"), renamed(reqs, "early"), 4)
	st := b.stats(t)
	sv := st.Saves
	if early.MatchedTokens != 0 || st.Ready || sv.Saves == 0 || sv.NotJoinedSaves != sv.Saves || sv.FailedSaves != 0 || sv.NotJoinedPages == 0 || sv.FailedPages != 0 {
		t.Fatalf("B before joining: engine %+v, ready %t, saves %+v; want every save counted as before joining, none failed", early, st.Ready, sv)
	}

	path.open(t)
	b.waitReady(t)
	warm := runEngine(t, simConfig(b, "warm"), renamed(reqs, "warm"), 4)
	ideal := 0
	for _, r := range ids {
		ideal += len(r)
	}
	st = b.stats(t)
	if warm.LoadedBlocks != ideal || st.Saves.FailedSaves != 0 || st.Saves.NotJoinedSaves != sv.NotJoinedSaves {
		t.Fatalf("B once joined: engine %+v (want %d blocks loaded), saves %+v", warm, ideal, st.Saves)
	}
	code, page, err := get(b.admin + "/")
	if err != nil || code != 200 {
		t.Fatalf("status page: %d %v", code, err)
	}
	wantSaves := fmt.Sprintf(`id="saves" data-value="%d">%d (0)<`, st.Saves.Saves, st.Saves.Saves)
	wantEarly := fmt.Sprintf(`id="saves-not-joined" data-value="%d">%d (%d)<`, sv.NotJoinedSaves, sv.NotJoinedSaves, sv.NotJoinedPages)
	if !strings.Contains(page, wantSaves) || !strings.Contains(page, wantEarly) || !strings.Contains(page, "pool healthy") {
		t.Errorf("B's status page lacks %q or %q:\n%s", wantSaves, wantEarly, page)
	}
	t.Logf("B: %d saves before joining (%d pages), then %d blocks loaded from A; saves %+v", sv.NotJoinedSaves, sv.NotJoinedPages, warm.LoadedBlocks, st.Saves)
}

// TestLookupsAnswerFromKeptLists: host B's engine looks up and loads a slice that host A saved,
// then runs it again at once. The second run's lookups are answered from the replica lists the
// first run's lookups kept (/v1/stats backend.lookup_keys_from_kept counts every block of it)
// and its loads read from them too, so the master answers no BatchGetReplicaList for it; every
// block still loads from A's segment, verified.
func TestLookupsAnswerFromKeptLists(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{LeaseTTL: time.Minute})
	reqs, ids := traceRequests(t, 12)
	a := startServe(t, m, "A")
	a.waitReady(t)
	runEngine(t, simConfig(a, "cold"), reqs, 4)
	// A window of 30 s, half the master's one-minute lease: lookups answer from a kept list
	// for 15 s, ample for a run of twelve requests on a loaded host.
	b := startServe(t, m, "B", "--locate-window", "30s")
	b.waitReady(t)
	ideal := 0
	for _, r := range ids {
		ideal += len(r)
	}
	first := runEngine(t, simConfig(b, "first"), renamed(reqs, "first"), 4)
	before := b.stats(t).Backend.LookupKeysFromKept
	calls, _, err := m.Metric(context.Background(), "master_batch_get_replica_list_requests_total")
	if err != nil {
		t.Fatal(err)
	}
	second := runEngine(t, simConfig(b, "second"), renamed(reqs, "second"), 4)
	callsAfter, _, err := m.Metric(context.Background(), "master_batch_get_replica_list_requests_total")
	if err != nil {
		t.Fatal(err)
	}
	kept := b.stats(t).Backend.LookupKeysFromKept - before
	for _, r := range []enginesim.Result{first, second} {
		if r.LoadedBlocks != ideal || r.ComputedBlocks != 0 || r.Restarts != 0 {
			t.Fatalf("a run on B: %+v; want all %d blocks loaded from A, none computed", r, ideal)
		}
	}
	if kept < int64(ideal) || callsAfter != calls {
		t.Fatalf("the second run: %d keys answered from kept lists (want at least its %d blocks), the master answered %v BatchGetReplicaList calls (want none)",
			kept, ideal, callsAfter-calls)
	}
	// /metrics carries the same count.
	st := b.stats(t).Backend.LookupKeysFromKept
	code, body, err := get(b.admin + "/metrics")
	if err != nil || code != 200 {
		t.Fatalf("B's /metrics: %d %v", code, err)
	}
	if want := fmt.Sprintf("\nkvctl_pool_lookup_keys_from_kept_total %d\n", st); !strings.Contains(body, want) {
		t.Errorf("B's /metrics lacks %q", strings.TrimSpace(want))
	}
	t.Logf("%d blocks a run; the second run's lookups answered %d keys from kept lists, the first's %d", ideal, kept, before)
}
