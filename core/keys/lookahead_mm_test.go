package keys

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os"
	"testing"

	"golang.org/x/crypto/blake2b"
)

// lookaheadMMPath holds prompt-lookahead vectors with multimodal scopes (seed commit 14: "key
// bytes built by hand from the framed scope and the lookahead digest for lookahead 0, 1 and 3
// with salt and multimodal scopes"). The shared golden file's seed_format cases cover salt and
// LoRA scopes only. These were derived from the rules with Python's hashlib, independently of
// this package, and every preimage is in the file (its meta says how).
const lookaheadMMPath = "testdata/lookahead-multimodal.json"

type lookaheadMMCase struct {
	seedFormatCase
	DigestsHex         []string `json:"multimodal_digests_hex"`
	SeedPreimageHex    string   `json:"seed_preimage_hex"`
	LookaheadPreimage  string   `json:"lookahead_preimage_hex"`
	FirstBlockPreimage string   `json:"first_block_preimage_hex"`
}

// TestGoldenLookaheadMultimodal pins kvctl's default format under a prompt lookahead with
// multimodal scopes: the preimages are rebuilt here from the rules (framed scope, then the
// lookahead re-digest, then T+L tokens per block), and the chain's seed, block hashes, page
// keys and group keys must equal the vectors, built in one go and token by token.
func TestGoldenLookaheadMultimodal(t *testing.T) {
	raw, err := os.ReadFile(lookaheadMMPath)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var f struct {
		Cases []lookaheadMMCase `json:"cases"`
	}
	if err := dec.Decode(&f); err != nil {
		t.Fatal(err)
	}
	seen := map[int]int{}
	ns := Namespace{ModelKey: "llama-3-8b", WorldSize: 4, Rank: 2}
	for _, tc := range f.Cases {
		t.Run(tc.Name, func(t *testing.T) {
			if len(tc.Multimodal) == 0 {
				t.Fatal("a case without multimodal items")
			}
			seen[tc.PromptLookahead]++
			scope := goldenScope(t, tc.CacheSalt, tc.LoRATaskID, tc.Multimodal)
			for i, d := range scope.Multimodal {
				if got := hex.EncodeToString(d[:]); got != tc.DigestsHex[i] {
					t.Errorf("multimodal digest %d: %s, want %s", i, got, tc.DigestsHex[i])
				}
			}
			// The framed scope: u32le length + bytes, for salt, LoRA, then each item.
			var pre []byte
			part := func(b []byte) {
				pre = binary.LittleEndian.AppendUint32(pre, uint32(len(b)))
				pre = append(pre, b...)
			}
			var salt, lora []byte
			if scope.CacheSalt != nil {
				salt = []byte(*scope.CacheSalt)
			}
			if scope.LoRATaskID != nil {
				lora = binary.LittleEndian.AppendUint64(nil, uint64(*scope.LoRATaskID))
			}
			part(salt)
			part(lora)
			for _, d := range scope.Multimodal {
				part(d[:])
			}
			if got := hex.EncodeToString(pre); got != tc.SeedPreimageHex {
				t.Fatalf("framed scope %s, want %s", got, tc.SeedPreimageHex)
			}
			seed := digest16(pre)
			if L := tc.PromptLookahead; L > 0 {
				la := append(append(append([]byte(nil), seed[:]...), "prompt-lookahead"...), binary.LittleEndian.AppendUint64(nil, uint64(L))...)
				if got := hex.EncodeToString(la); got != tc.LookaheadPreimage {
					t.Fatalf("lookahead preimage %s, want %s", got, tc.LookaheadPreimage)
				}
				seed = digest16(la)
			} else if tc.LookaheadPreimage != "" {
				t.Fatal("a lookahead preimage for L = 0")
			}
			if got := hex.EncodeToString(seed[:]); got != tc.SeedHex {
				t.Fatalf("seed from the rules %s, want %s", got, tc.SeedHex)
			}
			tokens := int64s(t, tc.Tokens)
			if len(tc.BlockHashesHex) > 0 {
				first := append([]byte(nil), seed[:]...)
				for _, tok := range tokens[:tc.TokensPerBlock+tc.PromptLookahead] {
					first = binary.LittleEndian.AppendUint64(first, uint64(tok))
				}
				if got := hex.EncodeToString(first); got != tc.FirstBlockPreimage {
					t.Fatalf("first block preimage %s, want %s", got, tc.FirstBlockPreimage)
				}
				if h := digest16(first); hex.EncodeToString(h[:]) != tc.BlockHashesHex[0] {
					t.Fatalf("first block from the rules %x, want %s", h, tc.BlockHashesHex[0])
				}
			}

			cfg := ChainConfig{TokensPerBlock: tc.TokensPerBlock, PromptLookahead: tc.PromptLookahead, Scope: scope}
			hs := checkChain(t, cfg, tokens, tc.SeedHex, tc.BlockHashesHex)
			if want := max(0, len(tokens)-tc.PromptLookahead) / tc.TokensPerBlock; len(hs) != want {
				t.Errorf("blocks: got %d, want max(0,len-L)/T = %d", len(hs), want)
			}
			var pages, groups []string
			for _, h := range hs {
				pages = append(pages, ns.PageKey(1, tc.TokensPerBlock, 65536, h))
				groups = append(groups, ns.GroupKey(h))
			}
			equalStrings(t, "page keys", pages, tc.PageKeys)
			equalStrings(t, "group keys", groups, tc.GroupKeys)
		})
	}
	if seen[0] == 0 || seen[1] == 0 || seen[3] == 0 {
		t.Fatalf("lookaheads covered %v, want 0, 1 and 3", seen)
	}
}

// digest16 is unkeyed BLAKE2b with a 16-byte digest, straight from x/crypto.
func digest16(b []byte) [16]byte {
	h, err := blake2b.New(16, nil)
	if err != nil {
		panic(err)
	}
	h.Write(b)
	var out [16]byte
	copy(out[:], h.Sum(nil))
	return out
}
