package keys

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/zeebo/blake3"
	"golang.org/x/crypto/blake2b"
	"pgregory.net/rapid"
)

// fataler is the part of testing.TB that rapid.T also has.
type fataler interface {
	Helper()
	Fatal(args ...any)
}

// referenceHashes is a deliberately plain restatement of the derivation in the package
// documentation: one fresh digest per block, preimages built token by token.
func referenceHashes(t fataler, cfg ChainConfig, tokens []int64) (Hash, []Hash) {
	t.Helper()
	f := cfg.format()
	digest := func(parts ...[]byte) Hash {
		var pre []byte
		for _, p := range parts {
			pre = append(pre, p...)
		}
		var h Hash
		if f == FormatBLAKE3 {
			d := blake3.NewDeriveKey(blake3Context)
			d.Write(pre)
			d.Digest().Read(h[:])
			return h
		}
		b, err := blake2b.New(16, nil)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(pre)
		copy(h[:], b.Sum(nil))
		return h
	}
	salt := ""
	if cfg.Scope.CacheSalt != nil {
		salt = *cfg.Scope.CacheSalt
	}
	var seed Hash
	switch f {
	case FormatTRTLLMV1:
		seed = digest([]byte("salt"), []byte(salt))
	case FormatTRTLLMLookaheadV2:
		seed = digest([]byte("mooncake-kv-v2"), []byte("salt"), []byte(salt))
	default:
		frame := func(p []byte) []byte { return append(binary.LittleEndian.AppendUint32(nil, uint32(len(p))), p...) }
		var lora []byte
		if cfg.Scope.LoRATaskID != nil {
			lora = binary.LittleEndian.AppendUint64(nil, uint64(*cfg.Scope.LoRATaskID))
		}
		parts := [][]byte{frame([]byte(salt)), frame(lora)}
		for _, m := range cfg.Scope.Multimodal {
			parts = append(parts, frame(m[:]))
		}
		seed = digest(parts...)
	}
	L, T := cfg.PromptLookahead, cfg.TokensPerBlock
	if L > 0 {
		seed = digest(seed[:], []byte("prompt-lookahead"), binary.LittleEndian.AppendUint64(nil, uint64(L)))
	}
	var out []Hash
	parent := seed
	for b := 0; (b+1)*T+L <= len(tokens); b++ {
		var enc []byte
		for _, tok := range tokens[b*T : (b+1)*T+L] {
			enc = binary.LittleEndian.AppendUint64(enc, uint64(tok))
		}
		parent = digest(parent[:], enc)
		out = append(out, parent)
	}
	return seed, out
}

func sameHashes(a, b []Hash) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func mustChain(t testing.TB, cfg ChainConfig) *Chain {
	t.Helper()
	c, err := NewChain(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func ptr[T any](v T) *T { return &v }

func seqTokens(n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(i*7919) - 1000
	}
	return out
}

func TestChainConfigErrors(t *testing.T) {
	mm := [][32]byte{{1}}
	tests := []struct {
		name string
		cfg  ChainConfig
		want []string
	}{
		{"zero tokens per block", ChainConfig{TokensPerBlock: 0}, []string{"tokens per block 0: must be at least 1"}},
		{"negative tokens per block", ChainConfig{TokensPerBlock: -4}, []string{"tokens per block -4"}},
		{"huge tokens per block", ChainConfig{TokensPerBlock: MaxTokensPerBlock + 1}, []string{"must be at most"}},
		{"negative lookahead", ChainConfig{TokensPerBlock: 4, PromptLookahead: -1}, []string{"prompt lookahead -1: must be at least 0"}},
		{"unknown format", ChainConfig{Format: "sha256", TokensPerBlock: 4}, []string{`unknown format "sha256"`, "trtllm-lookahead-v2"}},
		{"v1 lookahead", ChainConfig{Format: FormatTRTLLMV1, TokensPerBlock: 4, PromptLookahead: 1}, []string{"format trtllm-v1 has no prompt lookahead"}},
		{"v1 lora", ChainConfig{Format: FormatTRTLLMV1, TokensPerBlock: 4, Scope: Scope{LoRATaskID: ptr[int64](0)}}, []string{"trtllm-v1 cannot express a LoRA"}},
		{"v2 lora", ChainConfig{Format: FormatTRTLLMLookaheadV2, TokensPerBlock: 4, Scope: Scope{LoRATaskID: ptr[int64](3)}}, []string{"trtllm-lookahead-v2 cannot express a LoRA"}},
		{"v2 multimodal", ChainConfig{Format: FormatTRTLLMLookaheadV2, TokensPerBlock: 4, Scope: Scope{Multimodal: mm}}, []string{"cannot express multimodal"}},
		{"every problem at once", ChainConfig{Format: FormatTRTLLMV1, TokensPerBlock: 0, PromptLookahead: 2, Scope: Scope{Multimodal: mm}},
			[]string{"tokens per block 0", "has no prompt lookahead", "cannot express multimodal"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if err == nil {
				t.Fatal("Validate accepted the config")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if c, err2 := NewChain(tc.cfg); c != nil || err2 == nil {
				t.Error("NewChain accepted the config")
			}
		})
	}
	if err := (ChainConfig{Format: "x", TokensPerBlock: 1}).Validate(); !errors.Is(err, ErrUnknownFormat) {
		t.Errorf("unknown format error %v does not wrap ErrUnknownFormat", err)
	}
	for _, ok := range []ChainConfig{
		{TokensPerBlock: 1},
		{Format: FormatTRTLLM, TokensPerBlock: 32, PromptLookahead: 3, Scope: Scope{LoRATaskID: ptr[int64](1), Multimodal: mm}},
		{Format: FormatBLAKE3, TokensPerBlock: 32, PromptLookahead: 3, Scope: Scope{LoRATaskID: ptr[int64](1), Multimodal: mm}},
		{Format: FormatTRTLLMLookaheadV2, TokensPerBlock: 16, PromptLookahead: 1, Scope: Scope{CacheSalt: ptr("a")}},
		{Format: FormatTRTLLMV1, TokensPerBlock: 16, Scope: Scope{CacheSalt: ptr("a")}},
	} {
		if err := ok.Validate(); err != nil {
			t.Errorf("Validate(%+v): %v", ok, err)
		}
	}
}

func TestParseFormat(t *testing.T) {
	for _, f := range Formats() {
		got, err := ParseFormat(string(f))
		if err != nil || got != f {
			t.Errorf("ParseFormat(%q) = %q, %v", f, got, err)
		}
	}
	for _, bad := range []string{"", "TRTLLM", "trtllm-v2", " trtllm"} {
		if _, err := ParseFormat(bad); !errors.Is(err, ErrUnknownFormat) || !strings.Contains(err.Error(), "want one of trtllm,") {
			t.Errorf("ParseFormat(%q): %v", bad, err)
		}
	}
	if Formats()[0] != FormatTRTLLM {
		t.Error("the default format is not listed first")
	}
}

// allConfigs returns a spread of valid configs over every format.
func allConfigs() []ChainConfig {
	var out []ChainConfig
	for _, f := range Formats() {
		for _, T := range []int{1, 3, 4} {
			for _, L := range []int{0, 1, 3} {
				if L > 0 && !f.hasLookahead() {
					continue
				}
				s := Scope{CacheSalt: ptr("tenant")}
				if f.hasFullScope() {
					s.LoRATaskID = ptr[int64](-1)
					s.Multimodal = [][32]byte{MultimodalDigest([8]int32{1, -2, 3, 4, 5, 6, 7, 8})}
				}
				out = append(out, ChainConfig{Format: f, TokensPerBlock: T, PromptLookahead: L, Scope: s})
			}
		}
	}
	return out
}

func TestExtendEverySplitMatchesOneShot(t *testing.T) {
	tokens := seqTokens(41)
	for _, cfg := range allConfigs() {
		t.Run(fmt.Sprintf("%s/T=%d/L=%d", cfg.Format, cfg.TokensPerBlock, cfg.PromptLookahead), func(t *testing.T) {
			seed, want := referenceHashes(t, cfg, tokens)
			one := mustChain(t, cfg)
			if one.Seed() != seed {
				t.Fatalf("seed %s, reference %s", one.Seed(), seed)
			}
			got, err := one.Extend(tokens)
			if err != nil || !sameHashes(got, want) {
				t.Fatalf("one-shot differs from the reference (%v)", err)
			}
			for split := 0; split <= len(tokens); split++ {
				c := mustChain(t, cfg)
				first, err := c.Extend(tokens[:split])
				if err != nil {
					t.Fatal(err)
				}
				second, err := c.Extend(tokens)
				if err != nil {
					t.Fatal(err)
				}
				all := append(append([]Hash(nil), first...), second...)
				if !sameHashes(all, want) || !sameHashes(c.Hashes(), want) {
					t.Fatalf("split at %d: incremental differs from one-shot", split)
				}
			}
		})
	}
}

func TestExtendNoNewBlock(t *testing.T) {
	c := mustChain(t, ChainConfig{TokensPerBlock: 4, PromptLookahead: 3})
	for n := 0; n <= 6; n++ {
		if got, err := c.Extend(seqTokens(n)); err != nil || got != nil {
			t.Fatalf("%d tokens with T=4 L=3: got %v, %v; want no block", n, got, err)
		}
	}
	if got, _ := c.Extend(seqTokens(7)); len(got) != 1 {
		t.Fatalf("7 tokens with T=4 L=3: got %d blocks, want 1", len(got))
	}
	for _, n := range []int{7, 8, 9, 10} {
		if got, err := c.Extend(seqTokens(n)); err != nil || got != nil {
			t.Fatalf("%d tokens: got %v, %v; want nothing new", n, got, err)
		}
	}
	if c.Tokens() != 10 || c.Len() != 1 {
		t.Errorf("Tokens %d Len %d, want 10 1", c.Tokens(), c.Len())
	}
}

func TestExtendShrinkRejected(t *testing.T) {
	c := mustChain(t, ChainConfig{TokensPerBlock: 4})
	if _, err := c.Extend(seqTokens(10)); err != nil {
		t.Fatal(err)
	}
	before := append([]Hash(nil), c.Hashes()...)
	for _, n := range []int{9, 8, 0} {
		_, err := c.Extend(seqTokens(n))
		if !errors.Is(err, ErrTokensShrank) || !strings.Contains(err.Error(), fmt.Sprintf("%d tokens after 10", n)) {
			t.Errorf("%d tokens after 10: %v", n, err)
		}
	}
	if c.Tokens() != 10 || !sameHashes(c.Hashes(), before) {
		t.Error("a rejected Extend changed the chain")
	}
	got, err := c.Extend(seqTokens(12))
	if err != nil || len(got) != 1 {
		t.Fatalf("extending after a rejection: %v, %v", got, err)
	}
}

func TestHashesAliasing(t *testing.T) {
	c := mustChain(t, ChainConfig{TokensPerBlock: 2})
	c.Extend(seqTokens(4))
	hs := c.Hashes()
	_ = append(hs, Hash{0xff})
	c.Extend(seqTokens(6))
	_, want := referenceHashes(t, ChainConfig{TokensPerBlock: 2}, seqTokens(6))
	if !sameHashes(c.Hashes(), want) {
		t.Error("appending to Hashes() reached the chain")
	}
	if !sameHashes(hs, want[:2]) {
		t.Error("a later Extend changed hashes already returned")
	}
}

func TestBlockSpan(t *testing.T) {
	c := mustChain(t, ChainConfig{Format: FormatTRTLLMLookaheadV2, TokensPerBlock: 16, PromptLookahead: 3})
	for i, want := range [][2]int{{0, 19}, {16, 35}, {32, 51}} {
		if s, e := c.BlockSpan(i); s != want[0] || e != want[1] {
			t.Errorf("BlockSpan(%d) = %d, %d; want %v", i, s, e, want)
		}
	}
	if s, e := c.BlockSpan(-1); s != 0 || e != 0 {
		t.Errorf("BlockSpan(-1) = %d, %d", s, e)
	}
}

// TestEncodeBatches runs chains whose blocks cross the encoding batches at every offset.
func TestEncodeBatches(t *testing.T) {
	saved := encodeBatchBytes
	defer func() { encodeBatchBytes = saved }()
	tokens := seqTokens(300)
	for _, batch := range []int{1, 8, 40, 100, 1000} {
		encodeBatchBytes = batch
		for _, cfg := range allConfigs() {
			_, want := referenceHashes(t, cfg, tokens)
			c := mustChain(t, cfg)
			got, err := c.Extend(tokens)
			if err != nil || !sameHashes(got, want) {
				t.Fatalf("batch %d bytes, %+v: differs from the reference", batch, cfg)
			}
		}
	}
}

func TestExtendAllocationsDoNotGrowWithBlocks(t *testing.T) {
	allocs := func(n int) float64 {
		tokens := seqTokens(n)
		return testing.AllocsPerRun(5, func() {
			c, _ := NewChain(ChainConfig{TokensPerBlock: 4, PromptLookahead: 1})
			c.Extend(tokens)
		})
	}
	small, large := allocs(4*8), allocs(4*8192)
	if large > small+1 || large > 16 {
		t.Errorf("allocations per chain: %v for 8 blocks, %v for 8192 blocks", small, large)
	}
	c := mustChain(t, ChainConfig{TokensPerBlock: 4})
	tokens := seqTokens(4 * 4096)
	c.Extend(tokens[:4*2048])
	step := 4 * 2048
	perCall := testing.AllocsPerRun(100, func() {
		step += 4
		c.Extend(tokens[:step])
	})
	if perCall > 0.1 {
		t.Errorf("steady-state Extend allocates %v times per call", perCall)
	}
}

func TestSeedsSeparateScopes(t *testing.T) {
	seed := func(f Format, s Scope, L int) Hash {
		return mustChain(t, ChainConfig{Format: f, TokensPerBlock: 4, PromptLookahead: L, Scope: s}).Seed()
	}
	a := MultimodalDigest([8]int32{1})
	b := MultimodalDigest([8]int32{2})
	for _, f := range Formats() {
		if seed(f, Scope{}, 0) != seed(f, Scope{CacheSalt: ptr("")}, 0) {
			t.Errorf("%s: nil and empty salt differ", f)
		}
		if seed(f, Scope{}, 0) == seed(f, Scope{CacheSalt: ptr("x")}, 0) {
			t.Errorf("%s: salt ignored", f)
		}
		if f.hasLookahead() && seed(f, Scope{}, 0) == seed(f, Scope{}, 1) {
			t.Errorf("%s: lookahead ignored", f)
		}
	}
	for _, f := range []Format{FormatTRTLLM, FormatBLAKE3} {
		if seed(f, Scope{}, 0) == seed(f, Scope{LoRATaskID: ptr[int64](0)}, 0) {
			t.Errorf("%s: LoRA 0 equals no LoRA", f)
		}
		if seed(f, Scope{Multimodal: [][32]byte{a, b}}, 0) == seed(f, Scope{Multimodal: [][32]byte{b, a}}, 0) {
			t.Errorf("%s: multimodal order ignored", f)
		}
		// Framing keeps a salt from posing as a LoRA id.
		if seed(f, Scope{CacheSalt: ptr("\x08\x00\x00\x00\x00\x00\x00\x00")}, 0) == seed(f, Scope{LoRATaskID: ptr[int64](0)}, 0) {
			t.Errorf("%s: salt bytes collide with a LoRA id", f)
		}
	}
	seen := map[Hash]Format{}
	for _, f := range Formats() {
		s := seed(f, Scope{}, 0)
		if g, dup := seen[s]; dup {
			t.Errorf("formats %s and %s share a seed", f, g)
		}
		seen[s] = f
	}
}

func TestBypassed(t *testing.T) {
	mm := [][32]byte{{}}
	for _, tc := range []struct {
		positions bool
		s         Scope
		want      bool
	}{{false, Scope{}, false}, {true, Scope{}, true}, {true, Scope{Multimodal: mm}, false}, {false, Scope{Multimodal: mm}, false}} {
		if got := Bypassed(tc.positions, tc.s); got != tc.want {
			t.Errorf("Bypassed(%v, %d digests) = %v", tc.positions, len(tc.s.Multimodal), got)
		}
	}
}

func TestMultimodal(t *testing.T) {
	want := "ffffffff000000007fffffff8000000000000005000000060000000700000008"
	d := MultimodalDigest([8]int32{-1, 0, 2147483647, -2147483648, 5, 6, 7, 8})
	if got := fmt.Sprintf("%x", d); got != want {
		t.Fatalf("MultimodalDigest: %s, want %s", got, want)
	}
	for _, in := range []string{"-1,0,2147483647,-2147483648,5,6,7,8", " -1, 0 ,2147483647, -2147483648,5,6,7,8 ", want, strings.ToUpper(want)} {
		got, err := ParseMultimodal(in)
		if err != nil || got != d {
			t.Errorf("ParseMultimodal(%q) = %x, %v", in, got, err)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"1,2,3,4,5,6,7", "want 8 comma-separated int32 chunks, got 7"},
		{"1,2,3,4,5,6,7,8,9", "got 9"},
		{"1,2,3,4,5,6,7,", `chunk 7: "" is not an integer`},
		{"1,2,3,4,5,6,7,2147483648", "chunk 7: 2147483648 is outside int32"},
		{"1,2,3,-2147483649,5,6,7,8", "chunk 3: -2147483649 is outside int32"},
		{"1,2,x,4,5,6,7,8", `chunk 2: "x" is not an integer`},
		{"42", "got 1 chunk"},
		{"abcd", "got 4 characters"},
		{"", "got 0 characters"},
		{strings.Repeat("g", 64), "bad hex"},
		{strings.Repeat("a", 63), "got 63 characters"},
	} {
		_, err := ParseMultimodal(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "multimodal digest ") {
			t.Errorf("ParseMultimodal(%q): %v; want an error with %q", tc.in, err, tc.want)
		}
	}
}

func TestChainProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		f := rapid.SampledFrom(Formats()).Draw(rt, "format")
		cfg := ChainConfig{Format: f, TokensPerBlock: rapid.IntRange(1, 64).Draw(rt, "T")}
		if f.hasLookahead() {
			cfg.PromptLookahead = rapid.IntRange(0, 8).Draw(rt, "L")
		}
		if rapid.Bool().Draw(rt, "salted") {
			cfg.Scope.CacheSalt = ptr(rapid.String().Draw(rt, "salt"))
		}
		if f.hasFullScope() {
			if rapid.Bool().Draw(rt, "lora") {
				cfg.Scope.LoRATaskID = ptr(rapid.Int64().Draw(rt, "loraID"))
			}
			for i := range rapid.IntRange(0, 3).Draw(rt, "items") {
				var chunks [8]int32
				chunks[0] = rapid.Int32().Draw(rt, fmt.Sprintf("mm%d", i))
				cfg.Scope.Multimodal = append(cfg.Scope.Multimodal, MultimodalDigest(chunks))
			}
		}
		tokens := rapid.SliceOfN(rapid.Int64(), 0, 400).Draw(rt, "tokens")
		cuts := rapid.SliceOfN(rapid.IntRange(0, len(tokens)), 0, 8).Draw(rt, "cuts")

		seed, want := referenceHashes(rt, cfg, tokens)
		c, err := NewChain(cfg)
		if err != nil {
			rt.Fatal(err)
		}
		if c.Seed() != seed {
			rt.Fatalf("seed differs from the reference")
		}
		var got []Hash
		last := 0
		for _, cut := range append(cuts, len(tokens)) {
			hs, err := c.Extend(tokens[:cut])
			if cut < last {
				if !errors.Is(err, ErrTokensShrank) {
					rt.Fatalf("%d tokens after %d: %v", cut, last, err)
				}
				continue
			}
			if err != nil {
				rt.Fatal(err)
			}
			last = cut
			got = append(got, hs...)
		}
		if !sameHashes(got, want) || !sameHashes(c.Hashes(), want) {
			rt.Fatalf("incremental hashes differ from the reference")
		}
	})
}
