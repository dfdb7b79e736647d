package hash

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/commands/cmdutil/cmdtest"
)

// TestFlags checks flag parsing alone: runF stands in for the work.
func TestFlags(t *testing.T) {
	tests := []struct {
		args    string
		check   func(t *testing.T, o *Options)
		wantErr string
	}{
		{args: "1 2 3", check: func(t *testing.T, o *Options) {
			if strings.Join(o.Args, ",") != "1,2,3" || o.TokensPerBlock != 32 || o.Format != "trtllm" || o.KeySet != KeySetSave {
				t.Errorf("defaults: %+v", o)
			}
			if o.HasCacheSalt || o.HasLoRAID {
				t.Error("salt and LoRA must be absent unless given")
			}
		}},
		{args: "--tokens-file - --cache-salt '' --lora-id 0", check: func(t *testing.T, o *Options) {
			if !o.HasCacheSalt || o.CacheSalt != "" || !o.HasLoRAID || o.LoRAID != 0 {
				t.Errorf("an empty salt and LoRA 0 are present values: %+v", o)
			}
		}},
		{args: "--mm-hash 1,2,3,4,5,6,7,8 --mm-hash " + strings.Repeat("ab", 32) + " 1", check: func(t *testing.T, o *Options) {
			if len(o.MMHashes) != 2 {
				t.Errorf("mm hashes: %v", o.MMHashes)
			}
		}},
		{args: "--layer-group 0:4 --layer-group 1:8 --replicated 1:2 --key-set lookup 1", check: func(t *testing.T, o *Options) {
			if len(o.LayerGroups) != 2 || len(o.Replicated) != 1 || o.KeySet != KeySetLookup {
				t.Errorf("groups: %+v", o)
			}
		}},
		{args: "", wantErr: "no tokens"},
		{args: "--tokens-file x 1", wantErr: "not both"},
		{args: "--key-set all 1", wantErr: "invalid --key-set"},
		{args: "--tokens-per-block x 1", wantErr: "invalid argument"},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			f := cmdtest.Factory()
			var got *Options
			cmd := NewCmdHash(f, func(o *Options) error { got = o; return nil })
			err := cmdtest.Execute(t, cmd, tt.args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, got)
		})
	}
}

func baseOptions(ios *cmdutil.IOStreams) *Options {
	return &Options{IO: ios, KeyFlags: cmdutil.KeyFlags{Format: "trtllm", TokensPerBlock: 4, Namespace: "trtllm", WorldSize: 1, KeySet: KeySetSave}, OutputFormat: cmdutil.FormatJSON}
}

func runJSON(t *testing.T, o *Options) Result {
	t.Helper()
	out := o.IO.Out.(interface{ String() string })
	if err := runHash(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	var r Result
	if err := json.Unmarshal([]byte(out.String()), &r); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	return r
}

// TestRunGolden checks the command against anchor values of TensorRT-LLM's key derivation (the
// full vector set is checked in core/keys).
func TestRunGolden(t *testing.T) {
	ios, _, _, _ := cmdutil.Test()
	o := baseOptions(ios)
	o.Args = []string{"0", "1", "2", "3", "4", "5", "6", "7", "8"}
	o.ModelKey = "minimax-m3-fp4"
	o.LayerGroups = []string{"1:2359296"}
	o.Replicated = []string{"1:16384"}
	r := runJSON(t, o)
	if r.Seed != "c804ce198ec337e3dc762bdd1a09aece" {
		t.Errorf("seed %s", r.Seed)
	}
	if len(r.Blocks) != 2 || r.UncoveredTokens != 1 {
		t.Fatalf("blocks %d uncovered %d, want 2 and 1", len(r.Blocks), r.UncoveredTokens)
	}
	want := []string{
		"trtllm/minimax-m3-fp4/w1r0/lg1/t4b2359296/2cbd989e68a1d62fe8bebc04262e3dd9",
		"trtllm/minimax-m3-fp4/replicated/lg1/t4b16384/2cbd989e68a1d62fe8bebc04262e3dd9",
	}
	if strings.Join(r.Blocks[0].Keys, " ") != strings.Join(want, " ") {
		t.Errorf("keys %v, want %v", r.Blocks[0].Keys, want)
	}
	if r.Blocks[1].Hash != "2a4fd6d9610279f6733a044d56664a9d" || r.Blocks[1].Start != 4 || r.Blocks[1].End != 8 {
		t.Errorf("block 1: %+v", r.Blocks[1])
	}
}

func TestRunLookupKeysAndLookahead(t *testing.T) {
	ios, _, _, _ := cmdutil.Test()
	o := baseOptions(ios)
	o.Args = []string{"0 1 2 3 4 5 6 7"}
	o.ModelKey, o.WorldSize, o.Rank = "llama-3-8b", 4, 2
	o.LayerGroups = []string{"1:65536"}
	o.PromptLookahead = 1
	o.KeySet = KeySetLookup
	r := runJSON(t, o)
	// seed_format case t4_short8_plain_L1: one block over tokens [0,5).
	if len(r.Blocks) != 1 || r.Blocks[0].Hash != "cc9889c0ebadd9c7711553b72d3dfcc0" || r.Blocks[0].End != 5 {
		t.Fatalf("blocks %+v", r.Blocks)
	}
	if len(r.Blocks[0].Keys) != 4 || r.Blocks[0].Keys[2] != "trtllm/llama-3-8b/w4r2/lg1/t4b65536/cc9889c0ebadd9c7711553b72d3dfcc0" {
		t.Errorf("lookup keys %v", r.Blocks[0].Keys)
	}
	if r.Blocks[0].GroupKey != "trtllm/llama-3-8b/w4/cc9889c0ebadd9c7711553b72d3dfcc0" {
		t.Errorf("group key %s", r.Blocks[0].GroupKey)
	}
}

func TestRunAttentionDPSharesKeys(t *testing.T) {
	var got []string
	for _, rank := range []int{0, 3} {
		ios, _, _, _ := cmdutil.Test()
		o := baseOptions(ios)
		o.Args = []string{"1 2 3 4"}
		o.ModelKey, o.WorldSize, o.Rank, o.AttentionDP = "m", 4, rank, true
		o.LayerGroups = []string{"0:8"}
		r := runJSON(t, o)
		got = append(got, r.Blocks[0].Keys[0])
	}
	if got[0] != got[1] || !strings.Contains(got[0], "/w1r0/") {
		t.Errorf("attention-DP owners must share w1r0 keys: %v", got)
	}
}

func TestRunMultimodalBypass(t *testing.T) {
	ios, _, _, _ := cmdutil.Test()
	o := baseOptions(ios)
	o.Args = []string{"1 2 3 4 5 6 7 8"}
	o.HasMultimodal = true
	r := runJSON(t, o)
	if !r.Bypassed || len(r.Blocks) != 0 || r.UncoveredTokens != 8 {
		t.Errorf("an unhashed multimodal prompt gets no keys: %+v", r)
	}
	ios, _, _, _ = cmdutil.Test()
	o = baseOptions(ios)
	o.Args = []string{"1 2 3 4 5 6 7 8"}
	o.HasMultimodal = true
	o.MMHashes = []string{"1,2,3,4,5,6,7,8"}
	r = runJSON(t, o)
	if r.Bypassed || len(r.Blocks) != 2 {
		t.Errorf("a hashed multimodal prompt is keyed: %+v", r)
	}
}

func TestBinaryPageSizes(t *testing.T) {
	ios, _, out, _ := cmdutil.Test()
	o := baseOptions(ios)
	o.Args = []string{"0 1 2 3"}
	o.ModelKey, o.LayerGroups, o.Replicated, o.KeysOnly = "test-model", []string{"0:128KiB"}, []string{"0:16KiB"}, true
	if err := runHash(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	want := "trtllm/test-model/w1r0/lg0/t4b131072/2cbd989e68a1d62fe8bebc04262e3dd9\ntrtllm/test-model/replicated/lg0/t4b16384/2cbd989e68a1d62fe8bebc04262e3dd9\n"
	if out.String() != want {
		t.Errorf("binary sizes must become decimal byte counts in keys:\n%s", out.String())
	}
}

func TestKeysOnlyAndTable(t *testing.T) {
	ios, _, out, _ := cmdutil.Test()
	o := baseOptions(ios)
	o.Args = []string{"0 1 2 3 4 5 6 7"}
	o.ModelKey = "test-model"
	o.LayerGroups = []string{"0:131072"}
	o.KeysOnly = true
	if err := runHash(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	want := "trtllm/test-model/w1r0/lg0/t4b131072/2cbd989e68a1d62fe8bebc04262e3dd9\ntrtllm/test-model/w1r0/lg0/t4b131072/2a4fd6d9610279f6733a044d56664a9d\n"
	if out.String() != want {
		t.Errorf("keys-only:\n%s", out.String())
	}

	ios, _, out, _ = cmdutil.Test()
	o = baseOptions(ios)
	o.Args = []string{"0 1 2 3 4 5 6 7"}
	o.OutputFormat = cmdutil.FormatTable
	if err := runHash(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	wantTable := "BLOCK\tTOKENS\tHASH\n0\t0-4\t2cbd989e68a1d62fe8bebc04262e3dd9\n1\t4-8\t2a4fd6d9610279f6733a044d56664a9d\n"
	if out.String() != wantTable {
		t.Errorf("table:\n%s", out.String())
	}
}

func TestRunErrors(t *testing.T) {
	tests := []struct {
		name     string
		mod      func(o *Options)
		wantCode int
		wantErr  string
	}{
		{"T=0", func(o *Options) { o.TokensPerBlock = 0 }, cmdutil.ExitUsage, "tokens-per-block 0"},
		{"negative lookahead", func(o *Options) { o.PromptLookahead = -1 }, cmdutil.ExitUsage, "lookahead"},
		{"unknown format", func(o *Options) { o.Format = "sha1" }, cmdutil.ExitUsage, "sha1"},
		{"bad mm hash", func(o *Options) { o.MMHashes = []string{"1,2,3"} }, cmdutil.ExitUsage, "--mm-hash #1"},
		{"bad token", func(o *Options) { o.Args = []string{"1", "two"} }, cmdutil.ExitUsage, `"two"`},
		{"token outside int64", func(o *Options) { o.Args = []string{"9223372036854775808"} }, cmdutil.ExitUsage, "outside int64"},
		{"keys without groups", func(o *Options) { o.ModelKey = "m" }, cmdutil.ExitUsage, "--layer-group"},
		{"groups without model key", func(o *Options) { o.LayerGroups = []string{"0:4"} }, cmdutil.ExitUsage, "model key"},
		{"rank outside world", func(o *Options) { o.ModelKey, o.LayerGroups, o.Rank = "m", []string{"0:4"}, 1 }, cmdutil.ExitUsage, "rank 1"},
		{"bad group", func(o *Options) { o.ModelKey, o.LayerGroups = "m", []string{"0=4"} }, cmdutil.ExitUsage, "g:bytes_per_page"},
		{"zero page", func(o *Options) { o.ModelKey, o.LayerGroups = "m", []string{"0:0"} }, cmdutil.ExitUsage, "positive"},
		{"decimal page unit", func(o *Options) { o.ModelKey, o.LayerGroups = "m", []string{"0:128KB"} }, cmdutil.ExitUsage, "128KiB"},
		{"replicated without group", func(o *Options) { o.ModelKey, o.LayerGroups, o.Replicated = "m", []string{"0:4"}, []string{"1:4"} }, cmdutil.ExitUsage, "layer group 1"},
		{"duplicate group", func(o *Options) { o.ModelKey, o.LayerGroups = "m", []string{"0:4", "0:8"} }, cmdutil.ExitUsage, "twice"},
		{"missing file", func(o *Options) { o.Args, o.TokensFile = nil, "/nonexistent/tokens.json" }, cmdutil.ExitFailure, "/nonexistent/tokens.json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ios, _, out, _ := cmdutil.Test()
			o := baseOptions(ios)
			o.Args = []string{"1", "2", "3", "4"}
			tt.mod(o)
			err := runHash(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
			}
			if code := cmdutil.ExitCode(err); code != tt.wantCode {
				t.Errorf("exit code %d, want %d", code, tt.wantCode)
			}
			if out.Len() != 0 {
				t.Errorf("nothing may be printed on error, got %q", out.String())
			}
		})
	}
}

func TestTokensFromStdin(t *testing.T) {
	ios, in, _, _ := cmdutil.Test()
	in.WriteString("[0, 1, 2, 3,\n 4, 5, 6, 7]")
	o := baseOptions(ios)
	o.TokensFile = "-"
	r := runJSON(t, o)
	if r.Tokens != 8 || len(r.Blocks) != 2 {
		t.Errorf("%+v", r)
	}

	ios, in, _, _ = cmdutil.Test()
	in.WriteString("[0, 1, 2, oops]")
	o = baseOptions(ios)
	o.TokensFile = "-"
	err := runHash(context.Background(), o)
	if cmdutil.ExitCode(err) != cmdutil.ExitValidation || !strings.Contains(err.Error(), "standard input") || !strings.Contains(err.Error(), "token 3") {
		t.Errorf("got %v, want a validation error naming standard input and token 3", err)
	}
}
