package disagg_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/config"
	"github.com/kvctl/kvctl/core/disagg"
	"github.com/kvctl/kvctl/core/disagg/disaggtest"
	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/embedded"
)

const (
	poolT     = 32
	poolModel = "llama"
	poolPage  = 4096
)

// poolWith starts an embedded pool behind the Mooncake admin HTTP API (what probe-pool asks)
// holding the first `cached` blocks of tokens, under the layout of routerYAML.
func poolWith(t *testing.T, tokens []int64, cached int) string {
	t.Helper()
	o := embedded.DefaultOptions()
	o.Segments = []embedded.SegmentSpec{{Name: "test", Capacity: 64 << 20}}
	emb, err := embedded.NewEmbedded(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emb.Close() })
	chain, err := keys.NewChain(keys.ChainConfig{Format: keys.FormatTRTLLM, TokensPerBlock: poolT})
	if err != nil {
		t.Fatal(err)
	}
	hashes, err := chain.Extend(tokens)
	if err != nil {
		t.Fatal(err)
	}
	ns := keys.Namespace{ModelKey: poolModel, WorldSize: 1}
	groups := []keys.LayerGroupPages{{Group: 0, BytesPerPage: poolPage}}
	var ks []string
	var bufs [][]byte
	for _, h := range hashes[:cached] {
		for _, k := range ns.BlockKeys(poolT, groups, h) {
			ks = append(ks, k)
			bufs = append(bufs, make([]byte, 64))
		}
	}
	for i, c := range emb.BatchPut(context.Background(), ks, bufs, pool.ReplicateConfig{}) {
		if c != pool.OK {
			t.Fatalf("put %s: %v", ks[i], c)
		}
	}
	srv := httptest.NewServer(mooncake.NewAdminHandler(emb, mooncake.AdminHandlerOptions{}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

func routerYAML(pool string, timeoutMs int) string {
	return "  router:\n    type: pool_aware\n    pool: " + pool + "\n    model_key: " + poolModel +
		"\n    tokens_per_block: 32\n    layer_groups: [\"0:4096\"]\n    lookup_timeout_ms: " + strconv.Itoa(timeoutMs) + "\n"
}

func promptTokens(n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(1000 + i)
	}
	return out
}

// The pool_aware lookup derives the block keys as kvctl hash does and counts the leading blocks
// the pool holds, through the admin API probe-pool uses.
func TestPoolLookupCountsLeadingHeldBlocks(t *testing.T) {
	tokens := promptTokens(10*poolT + 5)
	addr := poolWith(t, tokens, 6)
	l, err := disagg.NewPoolLookup(config.DisaggRouter{Type: config.RouterPoolAware, Pool: addr, ModelKey: poolModel,
		TokensPerBlock: poolT, LayerGroups: []string{"0:4096"}, LookupTimeoutMs: 2000})
	if err != nil {
		t.Fatal(err)
	}
	held, err := l.CachedTokens(context.Background(), tokens)
	if err != nil || held != 6*poolT {
		t.Fatalf("held %d (%v), want %d", held, err, 6*poolT)
	}
	held, err = l.CachedTokens(context.Background(), promptTokens(3)) // less than a block
	if err != nil || held != 0 {
		t.Fatalf("short prompt: held %d (%v)", held, err)
	}
}

// Through the proxy: a token-id prompt is looked up in the pool; a lookup that fails or passes
// its deadline falls back to the work-aware estimate, and the request still runs.
func TestPoolAwareRoutingAndFallback(t *testing.T) {
	tokens := promptTokens(8 * poolT)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(2 * time.Second):
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(slow.Close)
	for _, tc := range []struct {
		name, pool string
		result     string
	}{
		{"answered", poolWith(t, tokens, 4), disagg.LookupHit},
		{"refused", disaggtest.DeadAddr(t), disagg.LookupError},
		{"deadline", slow.Listener.Addr().String(), disagg.LookupTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c0, c1, g := disaggtest.StartContext(t), disaggtest.StartContext(t), disaggtest.StartGeneration(t)
			text := yamlFor([]string{c0.Addr, c1.Addr}, []string{g.Addr}, "")
			text = text[:len(text)-len("generation_servers:\n  num_instances: 1\n  urls:\n    - \""+g.Addr+"\"\n")] +
				routerYAML(tc.pool, 50) + "generation_servers:\n  urls: [\"" + g.Addr + "\"]\n"
			url := startProxy(t, loadConfig(t, text), disagg.Options{})
			start := time.Now()
			r := post(t, url+disagg.EndpointCompletions, map[string]any{"prompt": tokens, "max_tokens": 2})
			if r.Status != http.StatusOK {
				t.Fatalf("status %d: %s", r.Status, r.Body)
			}
			if d := time.Since(start); d > time.Second {
				t.Fatalf("the lookup held the request %s, past its 50ms deadline", d)
			}
			if n := metric(t, url, `kvctl_disagg_pool_lookups_total{result="`+tc.result+`"}`); n != 1 {
				t.Fatalf("lookups %s = %v", tc.result, n)
			}
			post(t, url+disagg.EndpointCompletions, map[string]any{"prompt": "text prompt", "max_tokens": 2})
			if n := metric(t, url, `kvctl_disagg_pool_lookups_total{result="`+disagg.LookupNoTokenIDs+`"}`); n != 1 {
				t.Fatalf("text prompt lookups = %v", n)
			}
		})
	}
}

// pool_aware places by what the pool lacks: with a long uncached prefill running on the first
// context server, a fully cached prompt and then another uncached one both go to the second
// server, where work_aware (whole prompts, no conversation) sends the third to the first.
func TestPoolAwarePlacesByUncachedPrefill(t *testing.T) {
	cached := promptTokens(8 * poolT)
	fresh := func(seed int) []int64 {
		out := promptTokens(8 * poolT)
		for i := range out {
			out[i] += int64(seed * 100000)
		}
		return out
	}
	pool := poolWith(t, cached, 8)
	for _, tc := range []struct {
		router    string
		wantThird int // the context server the third request reaches
	}{
		{routerYAML(pool, 2000), 1},
		{"  router:\n    type: work_aware\n", 0},
	} {
		c0, c1, g := disaggtest.StartContext(t), disaggtest.StartContext(t), disaggtest.StartGeneration(t)
		text := "context_servers:\n  urls: [\"" + c0.Addr + "\", \"" + c1.Addr + "\"]\n" + tc.router +
			"generation_servers:\n  urls: [\"" + g.Addr + "\"]\n"
		url := startProxy(t, loadConfig(t, text), disagg.Options{})
		done := make(chan result, 3)
		send := func(p []int64) {
			go func() {
				done <- post(t, url+disagg.EndpointCompletions, map[string]any{"prompt": p, "max_tokens": 1, "user": "fault:ctx_slow"})
			}()
		}
		seen := func(n int) func() bool {
			return func() bool { return c0.Stats().Requests+c1.Stats().Requests == n }
		}
		// All three are placed while the earlier ones still hold their servers (500ms each).
		send(fresh(1))
		eventually(t, "the first prefill to start", seen(1))
		send(cached)
		eventually(t, "the second prefill to start", seen(2))
		send(fresh(2))
		eventually(t, "the third prefill to start", seen(3))
		for range 3 {
			if r := <-done; r.Status != http.StatusOK {
				t.Fatalf("status %d: %s", r.Status, r.Body)
			}
		}
		got := []int{c0.Stats().Requests, c1.Stats().Requests}
		want := []int{1, 2}
		if tc.wantThird == 0 {
			want = []int{2, 1}
		}
		if got[0] != want[0] || got[1] != want[1] {
			t.Errorf("%s: context servers got %v requests, want %v", tc.router, got, want)
		}
	}
}
