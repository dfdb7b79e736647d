package hash

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/commands/cmdutil"
)

// The vectors of vLLM's and SGLang's key derivation (../shared/testdata/engine-keys.json),
// checked byte for byte through the command line: every input is given as a flag.

type engineVectors struct {
	VLLM struct {
		Cases []struct {
			Name           string            `json:"name"`
			HashFn         string            `json:"hash_fn"`
			Seed           *string           `json:"PYTHONHASHSEED"`
			HashBlockSize  int               `json:"hash_block_size"`
			BlockSize      int               `json:"block_size"`
			Tokens         []json.Number     `json:"tokens"`
			LoRAName       *string           `json:"lora_name"`
			CacheSalt      *string           `json:"cache_salt"`
			MMFeatures     []json.RawMessage `json:"mm_features"`
			PromptEmbeds   []json.RawMessage `json:"prompt_embeds_block_digests"`
			NoneHashHex    string            `json:"none_hash_hex"`
			ObjectIdentity string            `json:"object_identity"`
			BlockHashes    []struct {
				TokenSpan [2]int `json:"token_span"`
				HashHex   string `json:"hash_hex"`
			} `json:"block_hashes"`
			Keys []struct {
				Config map[string]any `json:"config"`
				Chunks []struct {
					TokenSpan [2]int `json:"token_span"`
					HashHex   string `json:"hash_hex"`
					Key       string `json:"key"`
				} `json:"chunks"`
			} `json:"keys"`
		} `json:"cases"`
		V0 []struct {
			Name      string        `json:"name"`
			Tokens    []json.Number `json:"tokens"`
			TPRank    int           `json:"local_tp_rank"`
			KVKey     string        `json:"kv_key"`
			HiddenKey string        `json:"hidden_key"`
		} `json:"v0_legacy_mooncake_store_connector"`
	} `json:"vllm"`
	SGLang struct {
		Cases []struct {
			Name             string        `json:"name"`
			PageSize         int           `json:"page_size"`
			Tokens           []json.Number `json:"tokens"`
			ExtraKey         *string       `json:"extra_key"`
			CacheSalt        *string       `json:"cache_salt"`
			Bigram           bool          `json:"is_bigram"`
			Continuation     *string       `json:"continuation_prior_hash"`
			NamespaceLineage string        `json:"namespace_lineage"`
			NamespaceSeed    *string       `json:"namespace_seed_hex"`
			Error            string        `json:"error"`
			PageHashes       []struct {
				TokenSpan [2]int `json:"token_span"`
				HashHex   string `json:"hash_hex"`
			} `json:"page_hashes"`
			Keys []struct {
				Config     map[string]any `json:"config"`
				ObjectKeys []string       `json:"object_keys"`
			} `json:"keys"`
		} `json:"cases"`
	} `json:"sglang"`
}

func loadEngineVectors(t *testing.T) *engineVectors {
	t.Helper()
	data, err := os.ReadFile("../../testdata/engine-keys.json")
	if err != nil {
		t.Fatal(err)
	}
	var v engineVectors
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	return &v
}

// runCLI runs `kvctl hash ARGS… -o json` and returns the result and the exit code.
func runCLI(t *testing.T, args []string) (*Result, int, string) {
	t.Helper()
	ios, _, out, errOut := cmdutil.Test()
	f := &cmdutil.Factory{IOStreams: ios, Seams: cmdutil.Seams{Now: func() time.Time { return time.Unix(0, 0).UTC() }}, Getenv: func(string) string { return "" }}
	cmd := NewCmdHash(f, func(o *Options) error {
		o.OutputFormat = cmdutil.FormatJSON // -o belongs to the root command
		return runHash(context.Background(), o)
	})
	cmd.SetArgs(args)
	cmd.SetOut(errOut)
	cmd.SetErr(errOut)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	if err := cmd.Execute(); err != nil {
		return nil, cmdutil.ExitCode(err), err.Error()
	}
	var r Result
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	return &r, 0, ""
}

func tokenArgs(nums []json.Number) []string {
	if len(nums) == 0 {
		return []string{"--tokens-file", os.DevNull}
	}
	out := make([]string, 0, len(nums)+1)
	out = append(out, "--")
	for _, n := range nums {
		out = append(out, n.String())
	}
	return out
}

// configArgs turns a vector's key configuration into flags.
func configArgs(t *testing.T, cfg map[string]any) (lineage string, args []string) {
	t.Helper()
	flags := map[string]string{"model": "--model", "served_model_name": "--model", "tp_rank": "--rank", "tp_size": "--world-size",
		"num_kv_heads": "--num-kv-heads", "pp_rank": "--pp-rank", "pp_size": "--pp-size", "pcp_rank": "--pcp-rank",
		"pcp_size": "--pcp-size", "dcp_rank": "--dcp-rank", "dcp_size": "--dcp-size", "group_id": "--kv-group",
		"cache_prefix": "--cache-prefix", "store_namespace": "--store-namespace", "extra_backend_tag": "--backend-tag",
		"tp_lcm_size": "--tp-lcm-size"}
	tpSize, ppSize := false, false
	var tpRank, ppRank float64
	for k, v := range cfg {
		switch k {
		case "lineage":
			lineage = v.(string)
		case "is_mla":
			if v.(bool) {
				args = append(args, "--mla")
			}
		case "derived_model_name", "derived_key_tp_rank", "derived_config_prefix":
		default:
			flag, ok := flags[k]
			if !ok {
				t.Errorf("config field %q: no flag known for it", k)
				continue
			}
			args = append(args, flag, fmt.Sprint(v))
			switch k {
			case "tp_size":
				tpSize = true
			case "pp_size":
				ppSize = true
			case "tp_rank":
				tpRank = v.(float64)
			case "pp_rank":
				ppRank = v.(float64)
			}
		}
	}
	// A rank given without its size: the smallest size that holds it (the size is not in the key).
	if !tpSize {
		args = append(args, "--world-size", fmt.Sprint(tpRank+1))
	}
	if !ppSize && ppRank > 0 {
		args = append(args, "--pp-size", fmt.Sprint(ppRank+1))
	}
	return lineage, args
}

var vllmFormatSuffix = map[string]string{"sha256": "", "sha256_cbor": "-sha256-cbor", "xxhash": "-xxhash",
	"xxhash_cbor": "-xxhash-cbor", "sha256_msgpack": "-sha256-msgpack", "xxhash_msgpack": "-xxhash-msgpack"}

func TestEngineVectorsVLLMThroughCLI(t *testing.T) {
	v := loadEngineVectors(t)
	for _, c := range v.VLLM.Cases {
		t.Run(c.Name, func(t *testing.T) {
			suffix, ok := vllmFormatSuffix[c.HashFn]
			if !ok {
				t.Fatalf("hash function %q", c.HashFn)
			}
			base := []string{"--tokens-per-block", fmt.Sprint(c.BlockSize), "--hash-block-size", fmt.Sprint(c.HashBlockSize)}
			if c.Seed != nil {
				base = append(base, "--python-hash-seed", *c.Seed)
			}
			if c.LoRAName != nil {
				base = append(base, "--lora-name", *c.LoRAName)
			}
			if c.CacheSalt != nil {
				base = append(base, "--cache-salt", *c.CacheSalt)
			}
			for _, raw := range c.MMFeatures {
				var m struct {
					Identifier     string
					Offset, Length int
				}
				if err := json.Unmarshal(raw, &m); err != nil {
					t.Fatal(err)
				}
				base = append(base, "--mm-feature", fmt.Sprintf("%s:%d:%d", m.Identifier, m.Offset, m.Length))
			}
			for _, raw := range c.PromptEmbeds {
				var s string
				if json.Unmarshal(raw, &s) != nil {
					var o struct {
						Hex string `json:"bytes_hex"`
					}
					_ = json.Unmarshal(raw, &o)
					s = o.Hex
				}
				base = append(base, "--prompt-embeds-digest", s)
			}
			toks := tokenArgs(c.Tokens)
			r, code, msg := runCLI(t, append(append([]string{"--format", "vllm" + suffix}, base...), toks...))
			if code != 0 {
				t.Fatalf("exit %d: %s", code, msg)
			}
			if r.Seed != c.NoneHashHex || len(r.Blocks) != len(c.BlockHashes) {
				t.Fatalf("seed %s, %d blocks; want %s, %d", r.Seed, len(r.Blocks), c.NoneHashHex, len(c.BlockHashes))
			}
			if c.ObjectIdentity != "" && !strings.Contains(c.HashFn, "_") {
				// Pickle memoizes by identity, and the command line cannot say that two strings are one Python object; it hashes
				// them as distinct objects, as an engine's request fields are.
				if r.Blocks[0].Hash == c.BlockHashes[0].HashHex {
					t.Error("the shared-object vector hashed as if by identity")
				}
				return
			}
			for i, b := range c.BlockHashes {
				if r.Blocks[i].Hash != b.HashHex || [2]int{r.Blocks[i].Start, r.Blocks[i].End} != b.TokenSpan {
					t.Errorf("block %d: %s %d-%d, want %s %v", i, r.Blocks[i].Hash, r.Blocks[i].Start, r.Blocks[i].End, b.HashHex, b.TokenSpan)
				}
			}
			for _, k := range c.Keys {
				lineage, cfg := configArgs(t, k.Config)
				format := "vllm" + suffix
				if lineage == "A" {
					format = "vllm-lineage-a" + suffix
				}
				r, code, msg := runCLI(t, append(append(append([]string{"--format", format}, base...), cfg...), toks...))
				if code != 0 {
					t.Fatalf("%s %v: exit %d: %s", format, cfg, code, msg)
				}
				var chunks []Block
				for _, b := range r.Blocks {
					if len(b.Keys) > 0 {
						chunks = append(chunks, b)
					}
				}
				if len(chunks) != len(k.Chunks) {
					t.Fatalf("%s %v: %d chunks, want %d", format, cfg, len(chunks), len(k.Chunks))
				}
				for i, want := range k.Chunks {
					got := chunks[i]
					span := [2]int{got.Start, got.End}
					if got.ChunkStart != nil {
						span = [2]int{*got.ChunkStart, *got.ChunkEnd}
					}
					if span != want.TokenSpan || got.Hash != want.HashHex || strings.Join(got.Keys, " ") != want.Key {
						t.Errorf("%s %v chunk %d: %v %s %v\nwant %v %s %s", format, cfg, i, span, got.Hash, got.Keys, want.TokenSpan, want.HashHex, want.Key)
					}
				}
			}
		})
	}
	for _, c := range v.VLLM.V0 {
		r, code, msg := runCLI(t, append([]string{"--format", "vllm-v0", "--world-size", fmt.Sprint(c.TPRank + 1), "--rank", fmt.Sprint(c.TPRank)}, tokenArgs(c.Tokens)...))
		if code != 0 || len(r.Blocks) != 1 || strings.Join(r.Blocks[0].Keys, " ") != c.KVKey+" "+c.HiddenKey {
			t.Errorf("%s: exit %d %s %+v", c.Name, code, msg, r)
		}
	}
}

func TestEngineVectorsSGLangThroughCLI(t *testing.T) {
	v := loadEngineVectors(t)
	for _, c := range v.SGLang.Cases {
		t.Run(c.Name, func(t *testing.T) {
			format := "sglang"
			base := []string{"--tokens-per-block", fmt.Sprint(c.PageSize)}
			if c.NamespaceLineage == "pre-38577" {
				format = "sglang-pre-38577"
			} else {
				if c.ExtraKey != nil {
					base = append(base, "--extra-key", *c.ExtraKey)
				}
				if c.CacheSalt != nil {
					base = append(base, "--cache-salt", *c.CacheSalt)
				}
			}
			if c.Bigram {
				base = append(base, "--bigram")
			}
			if c.Continuation != nil {
				base = append(base, "--prior-hash", *c.Continuation)
			}
			toks := tokenArgs(c.Tokens)
			r, code, msg := runCLI(t, append(append([]string{"--format", format}, base...), toks...))
			if c.Error != "" {
				if code != 3 || !strings.Contains(msg, "unsigned 32-bit") {
					t.Errorf("exit %d %q, want 3 for %s", code, msg, c.Error)
				}
				return
			}
			if code != 0 {
				t.Fatalf("exit %d: %s", code, msg)
			}
			wantSeed := ""
			if c.NamespaceSeed != nil {
				wantSeed = *c.NamespaceSeed
			}
			if r.Seed != wantSeed || len(r.Blocks) != len(c.PageHashes) {
				t.Fatalf("seed %q, %d pages; want %q, %d", r.Seed, len(r.Blocks), wantSeed, len(c.PageHashes))
			}
			for i, p := range c.PageHashes {
				if r.Blocks[i].Hash != p.HashHex || [2]int{r.Blocks[i].Start, r.Blocks[i].End} != p.TokenSpan {
					t.Errorf("page %d: %s, want %s", i, r.Blocks[i].Hash, p.HashHex)
				}
			}
			for _, k := range c.Keys {
				lineage, cfg := configArgs(t, k.Config)
				f := format
				if lineage == "older" {
					f = "sglang-legacy"
				}
				args := append([]string{"--format", f, "--tokens-per-block", fmt.Sprint(c.PageSize)}, cfg...)
				if f != "sglang-legacy" {
					args = append(args, base[2:]...)
				} else if c.Bigram || c.Continuation != nil {
					args = append(args, base[2:]...)
				}
				r, code, msg := runCLI(t, append(args, toks...))
				if code != 0 {
					t.Fatalf("%v: exit %d: %s", args, code, msg)
				}
				var got []string
				for _, b := range r.Blocks {
					got = append(got, b.Keys...)
				}
				if strings.Join(got, "\n") != strings.Join(k.ObjectKeys, "\n") {
					t.Errorf("%v keys\n got %q\nwant %q", cfg, got, k.ObjectKeys)
				}
			}
		})
	}
}

// TestVLLMWithoutSeedIsUsageError checks that a vLLM format without --python-hash-seed exits 2
// and says why the keys cannot be derived.
func TestVLLMWithoutSeedIsUsageError(t *testing.T) {
	_, code, msg := runCLI(t, []string{"--format", "vllm", "--model", "m", "1", "2", "3"})
	if code != 2 || !strings.Contains(msg, "random per process when PYTHONHASHSEED is unset") || !strings.Contains(msg, "cannot be derived") {
		t.Errorf("exit %d: %s", code, msg)
	}
	_, code, msg = runCLI(t, []string{"--format", "trtllm", "--python-hash-seed", "0", "1"})
	if code != 2 || !strings.Contains(msg, "does not take --python-hash-seed") {
		t.Errorf("trtllm with a PYTHONHASHSEED: exit %d: %s", code, msg)
	}
}
