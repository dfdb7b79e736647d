package disagg_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/kvctl/kvctl/core/config"
	"github.com/kvctl/kvctl/core/disagg"
	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
)

// The pool_aware lookup against a real mooncake_master: Mooncake's own Python client stores the
// first blocks of a prompt under the keys TensorRT-LLM's connector writes, and the lookup, asking
// the master's admin API, counts exactly those blocks as cached; a prompt the pool never saw
// counts none.
func TestPoolLookupOnRealMaster(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	c := mooncaketest.StartClient(t, m, mooncaketest.ClientOptions{SegmentSize: 64 << 20})
	tokens := promptTokens(10*poolT + 5)
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
	const cached = 6
	for _, h := range hashes[:cached] {
		for _, k := range ns.BlockKeys(poolT, groups, h) {
			if rc := c.Put(k, bytes.Repeat([]byte{9}, poolPage), mooncaketest.PutOptions{}); rc != 0 {
				t.Fatalf("python put %s: rc %d", k, rc)
			}
		}
	}
	l, err := disagg.NewPoolLookup(config.DisaggRouter{Type: config.RouterPoolAware, Pool: m.AdminURL, ModelKey: poolModel,
		TokensPerBlock: poolT, LayerGroups: []string{"0:4096"}, LookupTimeoutMs: 5000})
	if err != nil {
		t.Fatal(err)
	}
	held, err := l.CachedTokens(context.Background(), tokens)
	if err != nil || held != cached*poolT {
		t.Fatalf("held %d tokens (%v), want %d", held, err, cached*poolT)
	}
	other := promptTokens(4 * poolT)
	for i := range other {
		other[i] += 7_000_000
	}
	if held, err := l.CachedTokens(context.Background(), other); err != nil || held != 0 {
		t.Fatalf("a prompt the pool never saw: held %d (%v), want 0", held, err)
	}
}
