package daemon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/daemon/daemontest"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/pool/embedded"
)

// start runs a real daemon on a temporary socket with an admin listener on a free loopback port.
func start(t *testing.T, poolBytes int64) *daemontest.Running {
	t.Helper()
	popts := embedded.DefaultOptions()
	popts.Segments = []embedded.SegmentSpec{{Name: "test", Capacity: poolBytes}}
	return daemontest.Start(t, daemon.Config{Pool: popts, Defaults: connector.Options{StagingBufferBytes: 8 << 20}})
}

// prompts returns n prompts of 4-7 blocks of T tokens plus a partial tail; every third shares its
// first blocks with the one before, as turns of a conversation do.
func prompts(seed uint64, n, T int, prefix string) []enginesim.Request {
	rng := rand.New(rand.NewPCG(seed, 7))
	var out []enginesim.Request
	var prev []int64
	for i := range n {
		var toks []int64
		if i%3 == 2 && prev != nil {
			toks = append(toks, prev[:2*T]...)
		}
		for len(toks) < (4+rng.IntN(4))*T+rng.IntN(T-1)+1 {
			toks = append(toks, rng.Int64N(150000))
		}
		prev = toks
		out = append(out, enginesim.Request{ID: fmt.Sprintf("%s-%d", prefix, i), Tokens: toks})
	}
	return out
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

func getText(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestColdWarmTwoRanks runs a tensor-parallel engine of two ranks through a cold pass that
// saves every computed block and a warm pass (a new engine) that loads them, every loaded byte
// checked; then the admin API must agree with what was done.
func TestColdWarmTwoRanks(t *testing.T) {
	r := start(t, 256<<20)
	ctx := context.Background()
	const T = 16
	cfg := enginesim.Config{Socket: r.Info.Socket, ModelKey: "sim-model", World: 2, TokensPerBlock: T, Slots: 512,
		PageBytes: []int{2048, 1024}, ReplicatedBytes: []int{0, 256}, Chunk: 3*T + 5}
	reqs := prompts(1, 24, T, "cold")

	cfg.Name = "cold"
	cold, err := enginesim.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cres, err := cold.Run(ctx, reqs, 8)
	if err != nil {
		t.Fatal(err)
	}
	if err := cold.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if cres.ComputedBlocks == 0 {
		t.Fatalf("cold run computed nothing: %+v", cres)
	}

	cfg.Name = "warm"
	warm, err := enginesim.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer warm.Close(ctx)
	wres, err := warm.Run(ctx, reqs, 8)
	if err != nil {
		t.Fatal(err)
	}
	// Every full block but the one holding the last prompt token is offered and loaded.
	want := 0
	for _, q := range reqs {
		want += (len(q.Tokens) - 1) / T
	}
	if wres.LoadedBlocks != want || wres.MatchedTokens != want*T {
		t.Errorf("warm run loaded %d blocks (%d tokens), want %d blocks", wres.LoadedBlocks, wres.MatchedTokens, want)
	}
	if wres.Restarts != 0 {
		t.Errorf("warm run restarted %d requests", wres.Restarts)
	}

	base := "http://" + r.Info.AdminAddr
	var st statsapi.StatsJSON
	getJSON(t, base+"/v1/stats", &st)
	if !st.Ready || len(st.Engines) != 2 || st.Engines[0].Engine != "warm/rank0" {
		t.Errorf("stats engines: %+v", st.Engines)
	}
	// Keys per full block: rank 0 writes its shard in both groups and the replicated page of
	// group 1, rank 1 its shard in both groups.
	stored := 0
	seen := map[string]bool{}
	for _, q := range reqs {
		for b := 0; b < len(q.Tokens)/T; b++ {
			k := fmt.Sprint(q.Tokens[:(b+1)*T])
			if !seen[k] {
				seen[k] = true
				stored++
			}
		}
	}
	if st.Pool.Objects != int64(5*stored) {
		t.Errorf("pool holds %d objects, want %d (5 pages for each of %d distinct blocks)", st.Pool.Objects, 5*stored, stored)
	}
	// The warm engine's own counters: loads read the replicated page on every rank, so 3 pages
	// per block on each of the 2 ranks; its scheduler (rank 0) saw every offered block hit.
	w0, w1 := st.Engines[0], st.Engines[1]
	if w0.Loads.Pages != int64(3*want) || w1.Loads.Pages != int64(3*want) || w0.Loads.FailedPages+w1.Loads.FailedPages != 0 {
		t.Errorf("warm load stats: rank0 %+v rank1 %+v, want %d pages each", w0.Loads, w1.Loads, 3*want)
	}
	if w0.PrefixHoles.HitBlocks != int64(want) || w0.PrefixHoles.Holes != 0 {
		t.Errorf("warm prefix-hole stats: %+v, want %d hit blocks and no holes", w0.PrefixHoles, want)
	}
	// The daemon's totals also count the cold engine, which has unregistered: its few hits
	// (turns sharing a prefix with a request saved earlier in the same run) add to the warm ones.
	coldHits := cres.MatchedTokens / T
	if st.PrefixHoles.HitBlocks != int64(want+coldHits) || st.Loads.Pages != int64(6*(want+coldHits)) {
		t.Errorf("daemon totals: %+v %+v, want %d hit blocks", st.PrefixHoles, st.Loads, want+coldHits)
	}

	code, metrics := getText(t, base+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	if !strings.Contains(metrics, fmt.Sprintf("master_key_count %d\n", 5*stored)) {
		t.Errorf("/metrics does not report master_key_count %d", 5*stored)
	}
	if !strings.Contains(metrics, `kvctl_engine_calls_total{method="Lookup"}`) {
		t.Error("/metrics lacks kvctl_engine_calls_total")
	}
	if code, body := getText(t, base+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, _ := getText(t, base+"/readyz"); code != 200 {
		t.Errorf("/readyz: %d", code)
	}
	// The Mooncake master endpoints answer over the same pool.
	mc, err := mooncake.NewAdminClient(base, nil)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := mc.AllKeys(ctx)
	if err != nil || len(keys) != 5*stored {
		t.Errorf("get_all_keys: %d keys, %v", len(keys), err)
	}
}

// TestBadRequests checks that malformed calls get errors while the daemon keeps serving.
func TestBadRequests(t *testing.T) {
	r := start(t, 64<<20)
	ctx := context.Background()
	c, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	_, err = c.Lookup(ctx, &enginepb.LookupRequest{Engine: "nobody", Request: &enginepb.Request{Id: "x"}})
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "nobody") {
		t.Errorf("unknown engine: %v", err)
	}
	_, err = c.Register(ctx, &enginepb.RegisterRequest{Engine: "e", ModelKey: "m", Layout: &enginepb.Layout{TokensPerBlock: 16}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("layout without groups: %v", err)
	}
	_, err = c.Register(ctx, &enginepb.RegisterRequest{Engine: "e", Layout: &enginepb.Layout{TokensPerBlock: 16, Groups: []*enginepb.LayerGroup{{Slots: 1, Regions: []*enginepb.Region{{Size: 8, Stride: 8}}}}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "model key") {
		t.Errorf("no model key: %v", err)
	}
	_, err = c.Register(ctx, &enginepb.RegisterRequest{Engine: "e", ModelKey: "m", Layout: &enginepb.Layout{TokensPerBlock: 16, Groups: []*enginepb.LayerGroup{{Slots: 1, Regions: []*enginepb.Region{{Size: 8, Stride: 8}}}}},
		Memory: &enginepb.RegisterRequest_SharedMemory{SharedMemory: &enginepb.SharedMemory{FdToken: "0123", Size: 8}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "token") {
		t.Errorf("bogus descriptor token: %v", err)
	}

	// A registered engine with a layout that does not fit its memory is refused.
	cfg := enginesim.Config{Socket: r.Info.Socket, ModelKey: "m", Name: "ok", Slots: 8}
	e, err := enginesim.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	_, err = c.Register(ctx, &enginepb.RegisterRequest{Engine: "ok/rank0", ModelKey: "m", Layout: &enginepb.Layout{TokensPerBlock: 16, Groups: []*enginepb.LayerGroup{{Slots: 1, Regions: []*enginepb.Region{{Size: 8, Stride: 8}}}}}, Role: "capacity"})
	if status.Code(err) != codes.AlreadyExists {
		t.Errorf("duplicate engine name: %v", err)
	}
	// Another connection cannot use the engine's registration.
	_, err = c.BindMeta(ctx, &enginepb.BindMetaRequest{Engine: "ok/rank0", Metadata: &enginepb.Metadata{}})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("a call naming another connection's engine: %v", err)
	}
	// The malformed calls below go to an engine this connection registered itself.
	if _, err := c.Register(ctx, &enginepb.RegisterRequest{Engine: "mine", ModelKey: "m", Scheduler: true, Role: "capacity",
		Layout: &enginepb.Layout{TokensPerBlock: 16, Groups: []*enginepb.LayerGroup{{Slots: 8, Regions: []*enginepb.Region{{Size: 8, Stride: 8}}}}}}); err != nil {
		t.Fatal(err)
	}
	_, err = c.BindMeta(ctx, &enginepb.BindMetaRequest{Engine: "mine", Metadata: &enginepb.Metadata{Loads: []*enginepb.RequestTransfers{{RequestId: "r", Pages: []*enginepb.PageTransfer{{Hash: []byte{1, 2}}}}}}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("short page hash: %v", err)
	}
	// Metadata naming a page outside the registered layout is refused before the worker sees
	// it; the engine runs normally afterwards (checked below with a full run).
	for _, p := range []*enginepb.PageTransfer{{Hash: make([]byte, 16), Group: 0, Page: 8}, {Hash: make([]byte, 16), Group: 3}, {Hash: make([]byte, 16), Page: -1}} {
		_, err = c.BindMeta(ctx, &enginepb.BindMetaRequest{Engine: "mine", Metadata: &enginepb.Metadata{Loads: []*enginepb.RequestTransfers{{RequestId: "r", Pages: []*enginepb.PageTransfer{p}}}}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "registered") {
			t.Errorf("page %+v outside the layout: %v", p, err)
		}
	}
	if _, err := e.Run(ctx, prompts(5, 3, 16, "intact"), 1); err != nil {
		t.Errorf("the engine after refused metadata: %v", err)
	}
	_, err = c.Lookup(ctx, &enginepb.LookupRequest{Engine: "mine", Request: &enginepb.Request{Id: "r", Tokens: []int64{1, 2}, MultimodalDigests: [][]byte{{1}}}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("short multimodal digest: %v", err)
	}

	// An oversized message is refused by the transport.
	huge := make([]int64, engineapi.MaxMessageBytes/8+1024)
	for i := range huge {
		huge[i] = 1 << 60
	}
	_, err = c.Lookup(ctx, &enginepb.LookupRequest{Engine: "ok/rank0", Request: &enginepb.Request{Id: "big", Tokens: huge}})
	if code := status.Code(err); code != codes.ResourceExhausted {
		t.Errorf("oversized message: %v", err)
	}

	// Garbage on the socket and a client that hangs up mid-stream do not disturb the daemon.
	for range 3 {
		conn, err := net.Dial("unix", r.Info.Socket)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = conn.Write([]byte("GET / HTTP/1.1\r\n\r\n\x00\xff garbage \x17\x03"))
		_ = conn.Close()
	}
	conn, err := net.Dial("unix", engineapi.FDSocketPath(r.Info.Socket))
	if err == nil {
		_, _ = conn.Write([]byte("no descriptor here"))
		_ = conn.Close()
	}
	cctx, cancel := context.WithCancel(ctx)
	go func() { time.Sleep(time.Millisecond); cancel() }()
	_, _ = e.Run(cctx, prompts(9, 4, 16, "cut"), 0)

	// Still serving: a fresh engine runs to completion.
	e2, err := enginesim.Start(ctx, enginesim.Config{Socket: r.Info.Socket, ModelKey: "m", Name: "after"})
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close(ctx)
	if _, err := e2.Run(ctx, prompts(3, 6, 16, "after"), 0); err != nil {
		t.Fatal(err)
	}
}

// TestSeveralEngines runs four engines of two models at once; each model's warm run loads what
// its own cold run saved and nothing of the other model's.
func TestSeveralEngines(t *testing.T) {
	r := start(t, 256<<20)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			model := fmt.Sprintf("model-%d", i%2)
			cfg := enginesim.Config{Socket: r.Info.Socket, ModelKey: model, Name: fmt.Sprintf("e%d", i), TokensPerBlock: 16, Slots: 256}
			e, err := enginesim.Start(ctx, cfg)
			if err != nil {
				errs <- err
				return
			}
			defer e.Close(ctx)
			reqs := prompts(uint64(100+i), 12, 16, fmt.Sprintf("e%d", i))
			if _, err := e.Run(ctx, reqs, 4); err != nil {
				errs <- fmt.Errorf("engine %d cold: %w", i, err)
				return
			}
			res, err := e.Run(ctx, renamed(reqs, "again"), 4)
			if err != nil {
				errs <- fmt.Errorf("engine %d warm: %w", i, err)
				return
			}
			if res.LoadedBlocks == 0 {
				errs <- fmt.Errorf("engine %d warm run loaded nothing", i)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// warmRun runs reqs again under new ids (renamed) on e, whose pages an earlier run saved, and
// checks that the run matched and loaded part of every prompt's prefix; what names the run in
// failures.
func warmRun(ctx context.Context, t *testing.T, e *enginesim.Engine, reqs []enginesim.Request, suffix, what string) enginesim.Result {
	t.Helper()
	res, err := e.Run(ctx, renamed(reqs, suffix), 0)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if res.MatchedTokens == 0 || res.LoadedBlocks == 0 {
		t.Errorf("%s matched or loaded nothing: %+v", what, res)
	}
	return res
}

func renamed(reqs []enginesim.Request, suffix string) []enginesim.Request {
	out := make([]enginesim.Request, len(reqs))
	for i, q := range reqs {
		out[i] = enginesim.Request{ID: q.ID + "-" + suffix, Tokens: q.Tokens}
	}
	return out
}

func TestAdminRefusesRemoteAddress(t *testing.T) {
	_, err := daemon.New(daemon.Config{Socket: "/tmp/x.sock", AdminAddr: "0.0.0.0:9480", Pool: embedded.Options{Segments: []embedded.SegmentSpec{{Name: "s", Capacity: 1 << 20}}}})
	if err == nil || !strings.Contains(err.Error(), "--allow-remote-admin") {
		t.Errorf("non-loopback admin address: %v", err)
	}
}

// TestVanishedEngineIsReleased checks that an engine whose connection closes without
// Unregister — a crashed engine process — is drained and released, and its name can register
// again.
func TestVanishedEngineIsReleased(t *testing.T) {
	r := start(t, 64<<20)
	ctx := context.Background()
	cfg := enginesim.Config{Socket: r.Info.Socket, ModelKey: "m", Name: "crash", Slots: 64}
	e, err := enginesim.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Run(ctx, prompts(21, 4, 16, "before"), 0); err != nil {
		t.Fatal(err)
	}
	// Drop the connections without unregistering, as a killed process would.
	e.Abandon()

	base := "http://" + r.Info.AdminAddr
	deadline := time.Now().Add(10 * time.Second)
	for {
		var st statsapi.StatsJSON
		getJSON(t, base+"/v1/stats", &st)
		if len(st.Engines) == 0 {
			if st.Pool.Objects == 0 {
				t.Fatal("the vanished engine's saves were lost")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the vanished engine is still registered: %+v", st.Engines)
		}
		time.Sleep(10 * time.Millisecond)
	}
	again, err := enginesim.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("re-registering the name of a vanished engine: %v", err)
	}
	defer again.Close(ctx)
	res, err := again.Run(ctx, prompts(21, 4, 16, "after"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.LoadedBlocks == 0 {
		t.Errorf("the vanished engine's saved pages were not served: %+v", res)
	}
}

// TestEveryRPCImplemented calls every method of the Engine service with an engine that is not
// registered: each must answer with its own error (never codes.Unimplemented, the generated
// default), so a method added to the proto without a handler fails here.
func TestEveryRPCImplemented(t *testing.T) {
	r := start(t, 16<<20)
	c, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn, err := grpc.NewClient("passthrough:///kvctl", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", r.Info.Socket)
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, m := range enginepb.Engine_ServiceDesc.Methods {
		t.Run(m.MethodName, func(t *testing.T) {
			// An empty request of the method's own type, decoded by the server from no bytes.
			var out emptypb.Empty
			err := conn.Invoke(context.Background(), "/"+enginepb.Engine_ServiceDesc.ServiceName+"/"+m.MethodName, &emptypb.Empty{}, &out)
			if code := status.Code(err); code == codes.Unimplemented || code == codes.OK {
				t.Errorf("%s answered %v; want the method's own error for an unregistered engine", m.MethodName, err)
			}
		})
	}
}
