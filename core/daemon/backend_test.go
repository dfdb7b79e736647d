package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/daemon/daemontest"
	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/embedded"
)

// These tests drive the daemon's supervision of a remote backend (mount, readiness, outages,
// timeouts, unmount on shutdown) with outagePool: the embedded pool behind a switch that makes
// it answer as a Mooncake client does while its master is down. The same behaviour against the
// real mooncake_master is covered by the cluster end-to-end tests.

var errMasterDown = errors.New("dial tcp 127.0.0.1:50051: connect: connection refused")

// outagePool is a Mounter and Pinger over the embedded pool. While down, every call fails the
// way a client with an unreachable master fails; while hang is set, existence probes never
// return (until the test ends), ignoring their context.
type outagePool struct {
	*embedded.Embedded
	down     atomic.Bool
	hang     atomic.Bool
	release  chan struct{}
	mounts   atomic.Int64
	unmounts atomic.Int64
	// objectsAtUnmount is how many objects the pool held when the segment was unmounted.
	objectsAtUnmount atomic.Int64
}

func newOutagePool(t *testing.T, capacity int64) *outagePool {
	t.Helper()
	o := embedded.DefaultOptions()
	o.Segments = []embedded.SegmentSpec{{Name: "host-a", Capacity: capacity}}
	e, err := embedded.NewEmbedded(o)
	if err != nil {
		t.Fatal(err)
	}
	p := &outagePool{Embedded: e, release: make(chan struct{})}
	t.Cleanup(func() { close(p.release) })
	return p
}

func (p *outagePool) Ping(context.Context) error {
	if p.down.Load() {
		return errMasterDown
	}
	return nil
}

func (p *outagePool) Mount(context.Context) error {
	if p.down.Load() {
		return errMasterDown
	}
	p.mounts.Add(1)
	return nil
}

func (p *outagePool) Unmount(ctx context.Context) error {
	st, err := p.Embedded.Stats(ctx)
	if err != nil {
		return err
	}
	p.objectsAtUnmount.Store(st.Objects)
	p.unmounts.Add(1)
	return nil
}

func (p *outagePool) BatchIsExist(ctx context.Context, keys []string) []int {
	if p.hang.Load() {
		<-p.release
	}
	if p.down.Load() {
		return fill(len(keys), int(pool.ErrRPCFail))
	}
	return p.Embedded.BatchIsExist(ctx, keys)
}

func (p *outagePool) BatchPut(ctx context.Context, keys []string, bufs [][]byte, cfg pool.ReplicateConfig) []pool.Code {
	if p.down.Load() {
		return fill(len(keys), pool.ErrRPCFail)
	}
	return p.Embedded.BatchPut(ctx, keys, bufs, cfg)
}

func (p *outagePool) BatchGet(ctx context.Context, keys []string, bufs [][]byte) []int64 {
	if p.down.Load() {
		return fill(len(keys), int64(pool.ErrRPCFail))
	}
	return p.Embedded.BatchGet(ctx, keys, bufs)
}

func (p *outagePool) Segments(ctx context.Context) ([]pool.Segment, error) {
	if p.down.Load() {
		return nil, errMasterDown
	}
	return p.Embedded.Segments(ctx)
}

func (p *outagePool) Stats(ctx context.Context) (pool.Stats, error) {
	if p.down.Load() {
		return pool.Stats{}, errMasterDown
	}
	return p.Embedded.Stats(ctx)
}

func fill[T any](n int, v T) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// remoteInfo is what serve reports for a Mooncake backend.
var remoteInfo = statsapi.BackendInfo{Kind: statsapi.BackendMooncake, Master: "127.0.0.1:50051", Metadata: "http://127.0.0.1:8080/metadata",
	HostAddress: "127.0.0.1", Protocol: "tcp", Segment: "127.0.0.1:15000", SegmentBytes: 64 << 20, LocalBufferBytes: 16 << 20}

func startRemote(t *testing.T, p *outagePool, timeout time.Duration) *daemontest.Running {
	t.Helper()
	return daemontest.Start(t, daemon.Config{
		Backend:  &daemon.Backend{Pool: p, Info: remoteInfo},
		Defaults: connector.Options{StagingBufferBytes: 8 << 20},
		// Short periods keep the test quick; what is checked never depends on them.
		PoolTimeout: timeout, HealthInterval: 20 * time.Millisecond, MountRetry: 10 * time.Millisecond,
	})
}

// eventually polls cond until it holds, failing the test when it has not within the guard.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func stats(t *testing.T, r *daemontest.Running) statsapi.StatsJSON {
	t.Helper()
	var st statsapi.StatsJSON
	getJSON(t, "http://"+r.Info.AdminAddr+"/v1/stats", &st)
	return st
}

func readyz(t *testing.T, r *daemontest.Running) (int, string) {
	t.Helper()
	return getText(t, "http://"+r.Info.AdminAddr+"/readyz")
}

func simConfig(r *daemontest.Running, name string) enginesim.Config {
	return enginesim.Config{Socket: r.Info.Socket, ModelKey: "sim-model", Name: name, TokensPerBlock: 16, Slots: 256, PageBytes: []int{2048}}
}

func runEngine(t *testing.T, cfg enginesim.Config, reqs []enginesim.Request) enginesim.Result {
	t.Helper()
	ctx := context.Background()
	e, err := enginesim.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.Run(ctx, reqs, 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Close(ctx); err != nil {
		t.Fatal(err)
	}
	return res
}

func fullBlocks(reqs []enginesim.Request, T int) int {
	n := 0
	for _, q := range reqs {
		n += (len(q.Tokens) - 1) / T
	}
	return n
}

// TestMasterDownAtStart: the daemon listens, says it is waiting, is not ready and says why;
// when the master appears it mounts the segment and becomes ready.
func TestMasterDownAtStart(t *testing.T) {
	p := newOutagePool(t, 64<<20)
	p.down.Store(true)
	r := startRemote(t, p, time.Second)

	// Until the first mount attempt has failed the daemon is unready without a reason yet; it is
	// never ready while the master is down, and once it has tried it says why.
	eventually(t, "/readyz to name the master it waits for", func() bool {
		code, body := readyz(t, r)
		if code != 503 {
			t.Fatalf("/readyz with the master down: %d %q", code, body)
		}
		return strings.Contains(body, "waiting for the Mooncake master 127.0.0.1:50051")
	})
	var st statsapi.StatsJSON
	eventually(t, "/v1/stats to give the reason", func() bool {
		st = stats(t, r)
		if st.Ready || st.Backend.SegmentMounted || st.Backend.MasterReachable {
			t.Fatalf("stats with the master down: ready %t backend %+v", st.Ready, st.Backend)
		}
		return strings.Contains(st.Backend.UnreadyReason, "connection refused")
	})

	p.down.Store(false)
	eventually(t, "ready after the master appeared", func() bool { c, _ := readyz(t, r); return c == 200 })
	st = stats(t, r)
	b := st.Backend
	if !st.Ready || !b.SegmentMounted || !b.MasterReachable || b.UnreadyReason != "" || b.Mounts != 1 {
		t.Fatalf("stats once mounted: ready %t backend %+v", st.Ready, b)
	}
	if b.Kind != "mooncake" || b.Master != remoteInfo.Master || b.Segment != remoteInfo.Segment || b.SegmentBytes != 64<<20 ||
		b.ClusterSegments != 1 || b.ClusterCapacityBytes != 64<<20 {
		t.Fatalf("backend description: %+v", b)
	}
}

// TestMasterOutageWhileEnginesRun: while the master is away lookups answer miss, saves are
// dropped and counted, the engine finishes its requests, and the daemon is unready with the
// reason; when the master is back the segment is remounted and the pool serves hits again.
func TestMasterOutageWhileEnginesRun(t *testing.T) {
	p := newOutagePool(t, 64<<20)
	r := startRemote(t, p, time.Second)
	eventually(t, "ready", func() bool { c, _ := readyz(t, r); return c == 200 })
	const T = 16
	first := prompts(1, 8, T, "a")
	runEngine(t, simConfig(r, "cold"), first)

	p.down.Store(true)
	eventually(t, "unready while the master is down", func() bool { c, _ := readyz(t, r); return c == 503 })
	if st := stats(t, r); !strings.Contains(st.Backend.UnreadyReason, "unreachable") && !strings.Contains(st.Backend.UnreadyReason, "waiting") {
		t.Fatalf("unready reason %q", st.Backend.UnreadyReason)
	}
	during := runEngine(t, simConfig(r, "during"), renamed(first, "during"))
	if during.MatchedTokens != 0 || during.LoadedBlocks != 0 {
		t.Fatalf("engine during the outage was offered %d tokens; lookups must answer miss", during.MatchedTokens)
	}
	st := stats(t, r)
	f := st.Backend.PoolCallFailures
	if f.LookupKeys == 0 || f.DroppedSavePages == 0 {
		t.Fatalf("outage not counted: %+v", f)
	}
	// The same counts under the pinned metric names.
	_, metrics := getText(t, "http://"+r.Info.AdminAddr+"/metrics")
	for _, series := range []string{
		fmt.Sprintf("kvctl_pool_failed_keys_total{op=\"exist\"} %d\n", f.LookupKeys),
		fmt.Sprintf("kvctl_pool_failed_keys_total{op=\"put\"} %d\n", f.DroppedSavePages),
	} {
		if !strings.Contains(metrics, series) {
			t.Errorf("/metrics lacks %q", series)
		}
	}

	p.down.Store(false)
	eventually(t, "ready again", func() bool { c, _ := readyz(t, r); return c == 200 })
	if n := p.mounts.Load(); n != 2 {
		t.Fatalf("segment mounted %d times, want 2 (once at start, once after the outage)", n)
	}
	if st := stats(t, r); st.Backend.Mounts != 2 || !st.Backend.SegmentMounted {
		t.Fatalf("backend after the outage: %+v", st.Backend)
	}
	after := runEngine(t, simConfig(r, "after"), renamed(first, "after"))
	if want := fullBlocks(first, T); after.LoadedBlocks != want {
		t.Fatalf("after the outage the engine loaded %d blocks, want %d", after.LoadedBlocks, want)
	}
}

// TestPoolTimeoutBoundsLookup: a pool whose existence probe never returns holds no engine past
// the pool timeout; the lookup answers miss and the timeout is counted.
func TestPoolTimeoutBoundsLookup(t *testing.T) {
	p := newOutagePool(t, 64<<20)
	r := startRemote(t, p, 100*time.Millisecond)
	eventually(t, "ready", func() bool { c, _ := readyz(t, r); return c == 200 })
	p.hang.Store(true)
	reqs := prompts(2, 3, 16, "h")
	done := make(chan enginesim.Result, 1)
	go func() { done <- runEngine(t, simConfig(r, "hung"), reqs) }()
	select {
	case res := <-done:
		if res.MatchedTokens != 0 {
			t.Fatalf("matched %d tokens from a pool that never answered", res.MatchedTokens)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the engine is still blocked in a lookup the pool never answers")
	}
	if st := stats(t, r); st.Backend.PoolCallFailures.Timeouts == 0 {
		t.Fatalf("timeouts not counted: %+v", st.Backend.PoolCallFailures)
	}
	if _, metrics := getText(t, "http://"+r.Info.AdminAddr+"/metrics"); !strings.Contains(metrics, `kvctl_pool_call_timeouts_total{op="exist"}`) {
		t.Error("/metrics lacks kvctl_pool_call_timeouts_total{op=\"exist\"}")
	}
}

// TestShutdownFlushesAndUnmounts: on stop, the queued saves of a registered engine reach the
// pool before the segment is unmounted, and Run returns nil.
func TestShutdownFlushesAndUnmounts(t *testing.T) {
	p := newOutagePool(t, 64<<20)
	r := startRemote(t, p, time.Second)
	eventually(t, "ready", func() bool { c, _ := readyz(t, r); return c == 200 })
	ctx := context.Background()
	e, err := enginesim.Start(ctx, simConfig(r, "live"))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Abandon()
	reqs := prompts(3, 6, 16, "s")
	if _, err := e.Run(ctx, reqs, 4); err != nil {
		t.Fatal(err)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if p.unmounts.Load() != 1 {
		t.Fatalf("segment unmounted %d times, want 1", p.unmounts.Load())
	}
	seen := map[string]bool{}
	for _, q := range reqs {
		for b := 0; b < len(q.Tokens)/16; b++ {
			seen[fmt.Sprint(q.Tokens[:(b+1)*16])] = true
		}
	}
	if got := p.objectsAtUnmount.Load(); got != int64(len(seen)) {
		t.Fatalf("pool held %d objects at unmount, want every saved block (%d)", got, len(seen))
	}
}

// TestBackendJSONContract pins the field names of /v1/stats "backend".
func TestBackendJSONContract(t *testing.T) {
	b, err := json.Marshal(statsapi.BackendStatusJSON{BackendInfo: remoteInfo})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var got []string
	for k := range m {
		got = append(got, k)
	}
	slices.Sort(got)
	want := []string{"cluster_capacity_bytes", "cluster_segments", "cluster_used_bytes", "host_address", "kind", "local_buffer_bytes",
		"lookup_keys_from_kept", "master", "master_reachable", "metadata", "mounts", "pool_call_failures", "protocol", "segment", "segment_bytes",
		"segment_mounted", "segment_remounts"}
	if !slices.Equal(got, want) {
		t.Fatalf("backend fields\n got %v\nwant %v", got, want)
	}
	if sv, _ := json.Marshal(statsapi.SegmentServedJSON{}); string(sv) != `{"peer_reads":0,"peer_writes":0,"bytes_read_by_peers":0,"bytes_written_by_peers":0}` {
		t.Fatalf("segment_served: %s", sv)
	}
	f, _ := json.Marshal(statsapi.PoolFailuresJSON{})
	if string(f) != `{"timeouts":0,"lookup_keys":0,"dropped_save_pages":0,"load_pages":0}` {
		t.Fatalf("pool_call_failures: %s", f)
	}
	// The embedded default names its kind and segment too.
	r := start(t, 32<<20)
	st := stats(t, r)
	if st.Backend.Kind != "embedded" || st.Backend.Segment != "test" || st.Backend.SegmentBytes != 32<<20 ||
		st.Backend.ClusterCapacityBytes != 32<<20 || !st.Backend.SegmentMounted || st.Backend.UnreadyReason != "" {
		t.Fatalf("embedded backend: %+v", st.Backend)
	}
}

// TestStatusPageWhilePoolUnreachable: with the master down the status page still shows the
// daemon's own counters (the lookups and saves /v1/stats counts) and marks the pool's figures
// unknown instead of 0.
func TestStatusPageWhilePoolUnreachable(t *testing.T) {
	p := newOutagePool(t, 64<<20)
	r := startRemote(t, p, time.Second)
	eventually(t, "ready", func() bool { c, _ := readyz(t, r); return c == 200 })
	p.down.Store(true)
	eventually(t, "unready while the master is down", func() bool { c, _ := readyz(t, r); return c == 503 })
	runEngine(t, simConfig(r, "during"), prompts(3, 4, 16, "d"))
	st := stats(t, r)
	if st.HitRates.Lookups == 0 || st.Saves.Saves == 0 {
		t.Fatalf("/v1/stats counted no lookups or saves during the outage: %+v %+v", st.HitRates, st.Saves)
	}
	code, page := getText(t, "http://"+r.Info.AdminAddr+"/")
	if code != 200 {
		t.Fatalf("status page: %d", code)
	}
	for _, want := range []string{
		fmt.Sprintf(`id="prompt-tokens" data-value="%d"`, st.HitRates.PromptTokens),
		fmt.Sprintf(`id="saves" data-value="%d"`, st.Saves.Saves),
		`id="pool-used" data-value="">unknown`,
		`id="pool-objects" data-value="">unknown`,
		"pool unreachable",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("status page lacks %q", want)
		}
	}
}
