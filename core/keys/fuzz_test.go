package keys

import (
	"encoding/binary"
	"errors"
	"testing"
)

// FuzzChain checks, for any tokens, scope, geometry, format and split points, that a chain
// extended piece by piece equals the same chain built in one call and the plain reference.
func FuzzChain(f *testing.F) {
	f.Add([]byte{}, uint8(0), uint8(4), uint8(0), "", false, int64(0), uint8(0), []byte{})
	f.Add([]byte("0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz"), uint8(0), uint8(3), uint8(2), "tenant", true, int64(-1), uint8(2), []byte{5, 1, 200})
	f.Add(make([]byte, 8*100), uint8(1), uint8(16), uint8(3), "a", false, int64(0), uint8(0), []byte{17, 40})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0, 0, 0, 0, 0x80}, uint8(2), uint8(1), uint8(0), "", false, int64(0), uint8(0), []byte{1})
	f.Add([]byte("blake3 blake3 blake3 blake3 blake3"), uint8(3), uint8(2), uint8(8), "x", true, int64(7), uint8(1), []byte{3, 9, 2})
	f.Fuzz(func(t *testing.T, data []byte, format, T, L uint8, salt string, hasLoRA bool, lora int64, items uint8, splits []byte) {
		fm := Formats()[int(format)%len(Formats())]
		cfg := ChainConfig{Format: fm, TokensPerBlock: 1 + int(T)%64, PromptLookahead: int(L) % 9}
		if !fm.hasLookahead() {
			cfg.PromptLookahead = 0
		}
		if salt != "" || hasLoRA {
			cfg.Scope.CacheSalt = &salt
		}
		if fm.hasFullScope() {
			if hasLoRA {
				cfg.Scope.LoRATaskID = &lora
			}
			for i := range int(items) % 4 {
				cfg.Scope.Multimodal = append(cfg.Scope.Multimodal, MultimodalDigest([8]int32{int32(i), int32(lora)}))
			}
		}
		// Whole 8-byte words become arbitrary int64 tokens; leftover bytes small ones.
		var tokens []int64
		for len(data) >= 8 {
			tokens = append(tokens, int64(binary.LittleEndian.Uint64(data)))
			data = data[8:]
		}
		for _, b := range data {
			tokens = append(tokens, int64(int8(b)))
		}

		one, err := NewChain(cfg)
		if err != nil {
			t.Fatalf("NewChain(%+v): %v", cfg, err)
		}
		want, err := one.Extend(tokens)
		if err != nil {
			t.Fatal(err)
		}
		if n := max(0, len(tokens)-cfg.PromptLookahead) / cfg.TokensPerBlock; len(want) != n {
			t.Fatalf("%d blocks from %d tokens, want %d", len(want), len(tokens), n)
		}
		seed, ref := referenceHashes(t, cfg, tokens)
		if one.Seed() != seed || !sameHashes(want, ref) {
			t.Fatal("one-shot chain differs from the reference")
		}

		inc, _ := NewChain(cfg)
		var got []Hash
		last := 0
		for _, s := range splits {
			cut := 0
			if len(tokens) > 0 {
				cut = int(s) % (len(tokens) + 1)
			}
			hs, err := inc.Extend(tokens[:cut])
			if cut < last {
				if !errors.Is(err, ErrTokensShrank) || hs != nil {
					t.Fatalf("%d tokens after %d: %v", cut, last, err)
				}
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, hs...)
			last = cut
		}
		hs, err := inc.Extend(tokens)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, hs...)
		if !sameHashes(got, want) || !sameHashes(inc.Hashes(), want) || inc.Len() != len(want) || inc.Tokens() != len(tokens) {
			t.Fatal("incremental chain differs from the one-shot chain")
		}
	})
}
