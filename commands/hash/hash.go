// Package hash implements `kvctl hash`: the block hashes and pool keys TensorRT-LLM derives for a
// prompt.
package hash

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/core/config"
	"github.com/kvctl/kvctl/core/keys"
)

// Key sets --key-set selects.
const (
	KeySetSave   = "save"
	KeySetLookup = "lookup"
)

// Options are the inputs of `kvctl hash`.
type Options struct {
	IO *cmdutil.IOStreams

	Args       []string
	TokensFile string

	Format          string
	TokensPerBlock  int
	PromptLookahead int
	CacheSalt       string
	HasCacheSalt    bool
	LoRAID          int64
	HasLoRAID       bool
	MMHashes        []string
	HasMultimodal   bool

	Namespace   string
	ModelKey    string
	WorldSize   int
	Rank        int
	AttentionDP bool
	LayerGroups []string
	Replicated  []string
	KeySet      string

	KeysOnly     bool
	OutputFormat string

	// FromConfig names config files whose key inputs fill the flags not given explicitly.
	FromConfig []string
	// Changed reports whether a flag was given explicitly (on the command line, in the
	// environment or in kvctl's config file).
	Changed func(name string) bool
}

// NewCmdHash returns `kvctl hash`. runF replaces the run function in tests.
func NewCmdHash(f *cmdutil.Factory, runF func(*Options) error) *cobra.Command {
	opts := &Options{IO: f.IOStreams}
	cmd := &cobra.Command{
		Use:   "hash [TOKEN...]",
		Short: "Print the block hashes and pool keys TensorRT-LLM derives for a prompt",
		Long: `Print the block hashes and Mooncake pool keys of a prompt, byte-identical to those
TensorRT-LLM's mooncake-store connector uses.

Tokens come from the arguments (separated by spaces or commas) or from --tokens-file: a JSON
array of integers, or integers separated by whitespace or commas; "-" reads standard input.
Token ids are signed 64-bit integers.

Only full blocks get a hash; the tail after the last full block is reported as uncovered.
Keys need --model-key and at least one --layer-group. By default each block lists the keys this
rank writes (--key-set save); --key-set lookup lists every key a lookup needs for the block to
count as a hit: every peer shard of every layer group, plus the replicated keys.

Formats: trtllm (default; TensorRT-LLM's main line with the prompt-lookahead rule),
trtllm-lookahead-v2, trtllm-v1, and blake3 (kvctl only: faster, never matches TensorRT-LLM).`,
		Example: `  # hashes of two 4-token blocks
  kvctl hash --tokens-per-block 4 0 1 2 3 4 5 6 7

  # the keys a rank writes, one per line, for a prompt in a file
  kvctl hash --tokens-file prompt.json --model-key llama-3-8b \
      --world-size 4 --rank 2 --layer-group 0:65536 --keys-only

  # what a lookup must find, as JSON
  kvctl hash --tokens-file - --model-key m --layer-group 0:131072 --key-set lookup -o json < prompt.txt`,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.OutputFormat = cmdutil.OutputFormat(cmd)
			if err := BindKeyFlags(cmd, args, opts); err != nil {
				return err
			}
			if opts.KeySet != KeySetSave && opts.KeySet != KeySetLookup {
				return cmdutil.FlagErrorf("invalid --key-set %q: want save or lookup", opts.KeySet)
			}
			if runF != nil {
				return runF(opts)
			}
			return Run(opts)
		},
	}
	AddKeyFlags(cmd, opts)
	fl := cmd.Flags()
	fl.StringVar(&opts.KeySet, "key-set", KeySetSave, "keys per block: save (what this rank writes) or lookup (what a hit needs)")
	fl.BoolVar(&opts.KeysOnly, "keys-only", false, "print only the keys, one per line")
	_ = cmd.RegisterFlagCompletionFunc("key-set", cobra.FixedCompletions([]string{KeySetSave, KeySetLookup}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// AddKeyFlags registers the flags that decide a prompt's hashes and keys (tokens, scope,
// layout, --from-config) on cmd, bound to opts. kvctl hash and kvctl probe-pool share them.
func AddKeyFlags(cmd *cobra.Command, opts *Options) {
	fl := cmd.Flags()
	fl.StringVar(&opts.TokensFile, "tokens-file", "", "read tokens from `FILE` (- for stdin)")
	fl.StringVar(&opts.Format, "format", string(keys.FormatTRTLLM), "key format: trtllm, trtllm-lookahead-v2, trtllm-v1 or blake3")
	fl.IntVar(&opts.TokensPerBlock, "tokens-per-block", 32, "tokens per KV block (T)")
	fl.IntVar(&opts.PromptLookahead, "prompt-lookahead", 0, "prompt tokens past each block a one-model draft reads (L); block b covers tokens [bT, (b+1)T+L)")
	fl.StringVar(&opts.CacheSalt, "cache-salt", "", "the request's cache salt")
	fl.Int64Var(&opts.LoRAID, "lora-id", 0, "the request's LoRA task id (absent differs from 0)")
	fl.StringArrayVar(&opts.MMHashes, "mm-hash", nil, "a multimodal item's hash, in prompt order: 8 int32 separated by commas, or 64 hex characters (repeatable)")
	fl.BoolVar(&opts.HasMultimodal, "has-multimodal", false, "the prompt has multimodal positions: without --mm-hash it gets no keys, as in TensorRT-LLM")
	fl.StringVar(&opts.Namespace, "namespace", keys.DefaultNamespace, "key namespace")
	fl.StringVar(&opts.ModelKey, "model-key", "", "model key (required for keys)")
	fl.IntVar(&opts.WorldSize, "world-size", 1, "tensor-parallel world size of the attention shard")
	fl.IntVar(&opts.Rank, "rank", 0, "this rank in the attention shard")
	fl.BoolVar(&opts.AttentionDP, "attention-dp", false, "attention data parallelism: every owner keys pages as w1r0")
	fl.StringArrayVar(&opts.LayerGroups, "layer-group", nil, "a layer group and its page size, `g:bytes_per_page` (bytes or a binary size such as 128KiB; repeatable)")
	fl.StringArrayVar(&opts.Replicated, "replicated", nil, "a layer group's replicated page size, `g:bytes` (repeatable)")
	fl.StringArrayVar(&opts.FromConfig, "from-config", nil, "read namespace, model key, tokens per block, world size, attention DP and lookahead from a TensorRT-LLM YAML, mooncake.json or pool.json (repeatable); explicit flags win")
	_ = cmd.RegisterFlagCompletionFunc("format", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		var s []string
		for _, f := range keys.Formats() {
			s = append(s, string(f))
		}
		return s, cobra.ShellCompDirectiveNoFileComp
	})
}

// BindKeyFlags records what the key flags of cmd cannot tell by their values alone (which
// flags were given, the token arguments) and checks that tokens were given exactly once.
func BindKeyFlags(cmd *cobra.Command, args []string, opts *Options) error {
	opts.Args = args
	opts.HasCacheSalt = cmd.Flags().Changed("cache-salt")
	opts.HasLoRAID = cmd.Flags().Changed("lora-id")
	opts.Changed = cmd.Flags().Changed
	if len(args) > 0 && opts.TokensFile != "" {
		return cmdutil.FlagErrorf("give tokens as arguments or with --tokens-file, not both")
	}
	if len(args) == 0 && opts.TokensFile == "" {
		return cmdutil.FlagErrorf("no tokens: give them as arguments or with --tokens-file (- for stdin)")
	}
	return nil
}

// LoadPrompt fills the key inputs not given as flags from --from-config and reads the tokens.
func LoadPrompt(opts *Options) ([]int64, error) {
	if err := applyConfig(opts); err != nil {
		return nil, err
	}
	return readTokens(opts)
}

// Block is one full block of the prompt.
type Block struct {
	Block    int      `json:"block"`
	Start    int      `json:"start"`
	End      int      `json:"end"`
	Hash     string   `json:"hash"`
	GroupKey string   `json:"group_key,omitempty"`
	Keys     []string `json:"keys,omitempty"`
}

// Result is the output of `kvctl hash`.
type Result struct {
	Format          string  `json:"format"`
	Tokens          int     `json:"tokens"`
	TokensPerBlock  int     `json:"tokens_per_block"`
	PromptLookahead int     `json:"prompt_lookahead"`
	Seed            string  `json:"seed"`
	Bypassed        bool    `json:"bypassed"`
	Namespace       string  `json:"namespace,omitempty"`
	ModelKey        string  `json:"model_key,omitempty"`
	Shard           string  `json:"shard,omitempty"`
	KeySet          string  `json:"key_set,omitempty"`
	UncoveredTokens int     `json:"uncovered_tokens"`
	Blocks          []Block `json:"blocks"`
}

// Run hashes the prompt and prints the result.
func Run(opts *Options) error {
	tokens, err := LoadPrompt(opts)
	if err != nil {
		return err
	}
	res, err := Compute(opts, tokens)
	if err != nil {
		return err
	}
	if opts.KeysOnly {
		w := bufio.NewWriterSize(opts.IO.Out, 64<<10)
		for _, b := range res.Blocks {
			for _, k := range b.Keys {
				w.WriteString(k)
				w.WriteByte('\n')
			}
		}
		return w.Flush()
	}
	return cmdutil.Print(opts.IO, opts.OutputFormat, res, func() cmdutil.Table { return rows(res) })
}

// applyConfig fills the key inputs that were not given as flags from --from-config files, loaded
// and checked by the same loader kvctl serve uses.
func applyConfig(opts *Options) error {
	if len(opts.FromConfig) == 0 {
		return nil
	}
	var files []*config.File
	for _, name := range opts.FromConfig {
		data, err := os.ReadFile(name)
		if err != nil {
			return err
		}
		f, diags := config.Load(name, data, config.LoadOptions{})
		if diags.HasErrors() {
			for _, d := range diags.Errors() {
				fmt.Fprintln(opts.IO.ErrOut, d.String())
			}
			return cmdutil.ValidationErrorf("--from-config %s is invalid; see kvctl validate-config", name)
		}
		files = append(files, f)
	}
	in, err := config.KeyInputsFrom(files...)
	if err != nil {
		return cmdutil.ValidationErrorf("--from-config: %v", err)
	}
	changed := opts.Changed
	if changed == nil {
		changed = func(string) bool { return false }
	}
	if !changed("namespace") && in.Namespace != "" {
		opts.Namespace = in.Namespace
	}
	if !changed("model-key") && in.ModelKey != "" {
		opts.ModelKey = in.ModelKey
	}
	if !changed("tokens-per-block") && in.TokensPerBlock > 0 {
		opts.TokensPerBlock = int(in.TokensPerBlock)
	}
	if !changed("world-size") && in.WorldSize > 0 {
		opts.WorldSize = int(in.WorldSize)
	}
	if !changed("attention-dp") {
		opts.AttentionDP = opts.AttentionDP || in.AttentionDP
	}
	if !changed("prompt-lookahead") && in.PromptLookahead > 0 {
		opts.PromptLookahead = int(in.PromptLookahead)
	}
	return nil
}

func readTokens(opts *Options) ([]int64, error) {
	if opts.TokensFile == "" {
		toks, err := keys.ParseTokens(strings.NewReader(strings.Join(opts.Args, " ")))
		if err != nil {
			return nil, cmdutil.FlagErrorf("tokens: %v", err)
		}
		return toks, nil
	}
	var r io.Reader
	name := opts.TokensFile
	if name == "-" {
		r, name = opts.IO.In, "standard input"
	} else {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	toks, err := keys.ParseTokens(bufio.NewReaderSize(r, 256<<10))
	if err != nil {
		return nil, cmdutil.ValidationErrorf("%s: %v", name, err)
	}
	return toks, nil
}

// Compute derives the hashes and keys of tokens as opts describe, through the key recipe
// (keys.Recipe) the connector and kvctl serve use. Bad key inputs are flag errors.
func Compute(opts *Options, tokens []int64) (*Result, error) {
	format, err := keys.ParseFormat(opts.Format)
	if err != nil {
		return nil, cmdutil.FlagErrorf("--format: %v", err)
	}
	scope, err := buildScope(opts)
	if err != nil {
		return nil, err
	}
	rec := keys.Recipe{
		Format: format, TokensPerBlock: opts.TokensPerBlock, PromptLookahead: opts.PromptLookahead,
		Namespace: keys.Namespace{Namespace: opts.Namespace, ModelKey: opts.ModelKey, WorldSize: opts.WorldSize, Rank: opts.Rank, AttentionDP: opts.AttentionDP},
	}
	if err := rec.ChainConfig(scope).Validate(); err != nil {
		return nil, cmdutil.FlagErrorf("%v", err)
	}
	if rec.Groups, err = parseGroups(opts.LayerGroups, opts.Replicated); err != nil {
		return nil, err
	}
	set := keys.KeySetNone
	if opts.ModelKey != "" || len(rec.Groups) > 0 || opts.KeysOnly {
		set = keys.KeySetSave
		if opts.KeySet == KeySetLookup {
			set = keys.KeySetLookup
		}
		switch err := rec.ValidateKeys(); {
		case errors.Is(err, keys.ErrNoLayerGroups):
			return nil, cmdutil.FlagErrorf("keys need at least one --layer-group g:bytes_per_page")
		case err != nil:
			return nil, cmdutil.FlagErrorf("%v", err)
		}
	}
	d, err := rec.Derive(keys.Prompt{Tokens: tokens, Scope: scope, HasMultimodal: opts.HasMultimodal}, set)
	if err != nil {
		return nil, err
	}
	res := &Result{
		Format: string(format), Tokens: len(tokens), TokensPerBlock: opts.TokensPerBlock,
		PromptLookahead: opts.PromptLookahead, Seed: d.Seed.String(), Bypassed: d.Bypassed,
		UncoveredTokens: d.UncoveredTokens, Blocks: make([]Block, len(d.Blocks)),
	}
	if set != keys.KeySetNone {
		ns := rec.Namespace
		res.Namespace, res.ModelKey, res.Shard, res.KeySet = ns.Namespace, ns.ModelKey, ns.Shard(), opts.KeySet
	}
	for i, b := range d.Blocks {
		res.Blocks[i] = Block{Block: b.Index, Start: b.Start, End: b.End, Hash: b.Hash.String(), GroupKey: b.GroupKey, Keys: b.Keys}
	}
	return res, nil
}

func buildScope(opts *Options) (keys.Scope, error) {
	var s keys.Scope
	if opts.HasCacheSalt {
		salt := opts.CacheSalt
		s.CacheSalt = &salt
	}
	if opts.HasLoRAID {
		id := opts.LoRAID
		s.LoRATaskID = &id
	}
	for i, m := range opts.MMHashes {
		d, err := keys.ParseMultimodal(m)
		if err != nil {
			return s, cmdutil.FlagErrorf("--mm-hash #%d: %v", i+1, err)
		}
		s.Multimodal = append(s.Multimodal, d)
	}
	return s, nil
}

// parseGroups reads --layer-group g:bytes and --replicated g:bytes into page geometries, in the
// order the layer groups were given.
func parseGroups(groups, replicated []string) ([]keys.LayerGroupPages, error) {
	var out []keys.LayerGroupPages
	index := map[int]int{}
	for _, s := range groups {
		g, n, err := parsePair("--layer-group", s)
		if err != nil {
			return nil, err
		}
		if _, dup := index[g]; dup {
			return nil, cmdutil.FlagErrorf("--layer-group %q: layer group %d given twice", s, g)
		}
		index[g] = len(out)
		out = append(out, keys.LayerGroupPages{Group: g, BytesPerPage: n})
	}
	for _, s := range replicated {
		g, n, err := parsePair("--replicated", s)
		if err != nil {
			return nil, err
		}
		i, ok := index[g]
		if !ok {
			return nil, cmdutil.FlagErrorf("--replicated %q: layer group %d has no --layer-group", s, g)
		}
		if out[i].ReplicatedBytesPerPage != 0 {
			return nil, cmdutil.FlagErrorf("--replicated %q: layer group %d given twice", s, g)
		}
		out[i].ReplicatedBytesPerPage = n
	}
	return out, nil
}

func parsePair(flag, s string) (int, uint64, error) {
	gs, bs, ok := strings.Cut(s, ":")
	if !ok {
		return 0, 0, cmdutil.FlagErrorf("%s %q: want g:bytes_per_page, for example 0:131072", flag, s)
	}
	g, err := strconv.Atoi(strings.TrimSpace(gs))
	if err != nil || g < 0 {
		return 0, 0, cmdutil.FlagErrorf("%s %q: layer group must be a non-negative integer", flag, s)
	}
	// A page size is a byte count or a binary size (128KiB), read as the config files read
	// sizes; the key always carries the decimal byte count.
	n, err := config.ParseSize(strings.TrimSpace(bs), true)
	if err != nil {
		return 0, 0, cmdutil.FlagErrorf("%s %q: page size: %v", flag, s, err)
	}
	if n <= 0 {
		return 0, 0, cmdutil.FlagErrorf("%s %q: page size must be a positive number of bytes", flag, s)
	}
	return g, uint64(n), nil
}

func rows(res *Result) cmdutil.Table {
	t := cmdutil.Table{Header: []string{"BLOCK", "TOKENS", "HASH"}}
	withKeys := res.ModelKey != ""
	if withKeys {
		t.Header = append(t.Header, "KEY")
	}
	for _, b := range res.Blocks {
		base := []string{strconv.Itoa(b.Block), fmt.Sprintf("%d-%d", b.Start, b.End), b.Hash}
		if !withKeys {
			t.Rows = append(t.Rows, base)
			continue
		}
		for _, k := range b.Keys {
			t.Rows = append(t.Rows, append(append([]string(nil), base...), k))
		}
	}
	if res.UncoveredTokens > 0 {
		// The tail after the last full block gets no hash; say so rather than leave it out.
		end := 0
		if n := len(res.Blocks); n > 0 {
			end = res.Blocks[n-1].End
		}
		row := []string{"-", fmt.Sprintf("%d-%d", end, end+res.UncoveredTokens), fmt.Sprintf("(uncovered: %d tokens, no hash)", res.UncoveredTokens)}
		if withKeys {
			row = append(row, "-")
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}
