package probe

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvctl/kvctl/core/keys"
)

func TestParsePoolKey(t *testing.T) {
	const h = "2cbd989e68a1d62fe8bebc04262e3dd9"
	good := map[string]PoolKey{
		"trtllm/m/w2r1/lg0/t32b65536/" + h:            {Namespace: "trtllm", Model: "m", World: 2, Rank: 1, Group: 0, TokensPerBlock: 32, BytesPerPage: 65536, Hash: h},
		"ns/org/model-7b/replicated/lg3/t16b512/" + h: {Namespace: "ns", Model: "org/model-7b", Replicated: true, Group: 3, TokensPerBlock: 16, BytesPerPage: 512, Hash: h},
		"trtllm/a/b/c/w1r0/lg12/t4b1/" + h:            {Namespace: "trtllm", Model: "a/b/c", World: 1, Rank: 0, Group: 12, TokensPerBlock: 4, BytesPerPage: 1, Hash: h},
	}
	for s, want := range good {
		got, ok := ParsePoolKey(s)
		if !ok || got != want {
			t.Errorf("ParsePoolKey(%q) = %+v %v, want %+v", s, got, ok, want)
		}
	}
	for _, s := range []string{
		"", "a/b/c", "trtllm//w1r0/lg0/t4b1/" + h, "trtllm/m/w1r1/lg0/t4b1/" + h, "trtllm/m/w0r0/lg0/t4b1/" + h,
		"trtllm/m/w1r0/lg0/t4b0/" + h, "trtllm/m/w1r0/g0/t4b1/" + h, "trtllm/m/w1r0/lg0/t4/" + h,
		"trtllm/m/w1r0/lg0/t4b1/" + strings.ToUpper(h), "trtllm/m/w1r0/lg0/t4b1/xyz", "trtllm/m/x1r0/lg-1/t4b1/" + h,
	} {
		if k, ok := ParsePoolKey(s); ok {
			t.Errorf("ParsePoolKey(%q) accepted: %+v", s, k)
		}
	}
	// Round trip with the key writer.
	ns := keys.Namespace{Namespace: "trtllm", ModelKey: "llama/3", WorldSize: 4, Rank: 2}
	var hh keys.Hash
	hh[0] = 0xab
	for _, s := range ns.BlockKeys(32, []keys.LayerGroupPages{{Group: 1, BytesPerPage: 4096, ReplicatedBytesPerPage: 64}}, hh) {
		k, ok := ParsePoolKey(s)
		if !ok || k.Model != "llama/3" || k.Group != 1 || k.TokensPerBlock != 32 {
			t.Errorf("%s: %+v %v", s, k, ok)
		}
	}
}

func FuzzParsePoolKey(f *testing.F) {
	f.Add("trtllm/m/w2r1/lg0/t32b65536/2cbd989e68a1d62fe8bebc04262e3dd9")
	f.Add("ns/a/b/replicated/lg3/t16b512/2cbd989e68a1d62fe8bebc04262e3dd9")
	f.Fuzz(func(t *testing.T, s string) {
		k, ok := ParsePoolKey(s)
		if !ok {
			return
		}
		if k.TokensPerBlock <= 0 || k.BytesPerPage == 0 || len(k.Hash) != 32 || (!k.Replicated && (k.World <= 0 || k.Rank >= k.World)) {
			t.Errorf("accepted an impossible key %q: %+v", s, k)
		}
	})
}

// TestDiagnoseListing covers what only the listing can tell: a failed listing, and a scan
// bounded below the listing's length.
func TestDiagnoseListing(t *testing.T) {
	ns := keys.Namespace{Namespace: "trtllm", ModelKey: "m", WorldSize: 1}
	groups := []keys.LayerGroupPages{{Group: 0, BytesPerPage: 64}}
	var ours, theirs []string
	for i := range 4 {
		var h keys.Hash
		h[0] = byte(i)
		ours = append(ours, ns.BlockKeys(16, groups, h)...)
		h[1] = 1
		theirs = append(theirs, keys.Namespace{Namespace: "trtllm", ModelKey: "m", WorldSize: 1}.BlockKeys(8, groups, h)...)
	}
	in := MissInput{Tokens: 64, TokensPerBlock: 16, Blocks: 4, MissingBlocks: 4, Keys: ours}

	d := DiagnoseMiss(context.Background(), in, func(context.Context) ([]string, error) { return nil, errors.New("HTTP 500") }, 0)
	if d.Code != DiagListingUnavailable || !strings.Contains(d.Text, "HTTP 500") {
		t.Errorf("failed listing: %+v", d)
	}
	list := func(context.Context) ([]string, error) {
		return append(append([]string{"not-a-page-key"}, theirs...), ours[:0]...), nil
	}
	d = DiagnoseMiss(context.Background(), in, list, 0)
	if d.Code != DiagOtherTokensPerBlock || d.Flag != "--tokens-per-block 8" || d.ScannedKeys != 5 || d.Truncated {
		t.Errorf("other T: %+v", d)
	}
	d = DiagnoseMiss(context.Background(), in, list, 1)
	if d.Code != DiagPoolEmpty || !d.Truncated || !strings.Contains(d.Text, "first 1 keys") {
		t.Errorf("a scan of 1 key (not a page key): %+v", d)
	}
}
