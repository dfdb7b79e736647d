package cmdutil

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvctl/kvctl/core/config"
	"github.com/kvctl/kvctl/core/keys"
)

// KeyFlags are the flags that decide a prompt's hashes and keys: the tokens, their scope, the
// key format and block geometry, the namespace and shard, the layer groups' page sizes and
// --from-config. kvctl hash and kvctl probe-pool register them with AddKeyFlags and turn them
// into the key recipe (keys.Recipe) with Recipe; every bad value is a usage error naming its flag.
type KeyFlags struct {
	// Args are the token arguments; TokensFile is --tokens-file ("-" for standard input).
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
	// KeySet is which keys each block lists: what this rank saves or what a lookup needs.
	KeySet keys.KeySet

	// FromConfig names config files whose key inputs fill the flags not given explicitly.
	FromConfig []string
	// Changed reports whether a flag was given explicitly (on the command line, in the
	// environment or in kvctl's config file).
	Changed func(name string) bool
}

// AddKeyFlags registers the flags that decide a prompt's hashes and keys (tokens, scope,
// layout, --from-config) on cmd, bound to k.
func AddKeyFlags(cmd *cobra.Command, k *KeyFlags) {
	fl := cmd.Flags()
	fl.StringVar(&k.TokensFile, "tokens-file", "", "read tokens from `FILE` (- for stdin)")
	fl.StringVar(&k.Format, "format", string(keys.FormatTRTLLM), "key format: trtllm, trtllm-lookahead-v2, trtllm-v1 or blake3")
	fl.IntVar(&k.TokensPerBlock, "tokens-per-block", 32, "tokens per KV block (T)")
	fl.IntVar(&k.PromptLookahead, "prompt-lookahead", 0, "prompt tokens past each block a one-model draft reads (L); block b covers tokens [bT, (b+1)T+L)")
	fl.StringVar(&k.CacheSalt, "cache-salt", "", "the request's cache salt")
	fl.Int64Var(&k.LoRAID, "lora-id", 0, "the request's LoRA task id (absent differs from 0)")
	fl.StringArrayVar(&k.MMHashes, "mm-hash", nil, "a multimodal item's hash, in prompt order: 8 int32 separated by commas, or 64 hex characters (repeatable)")
	fl.BoolVar(&k.HasMultimodal, "has-multimodal", false, "the prompt has multimodal positions: without --mm-hash it gets no keys, as in TensorRT-LLM")
	fl.StringVar(&k.Namespace, "namespace", keys.DefaultNamespace, "key namespace")
	fl.StringVar(&k.ModelKey, "model-key", "", "model key (required for keys)")
	fl.IntVar(&k.WorldSize, "world-size", 1, "tensor-parallel world size of the attention shard")
	fl.IntVar(&k.Rank, "rank", 0, "this rank in the attention shard")
	fl.BoolVar(&k.AttentionDP, "attention-dp", false, "attention data parallelism: every owner keys pages as w1r0")
	fl.StringArrayVar(&k.LayerGroups, "layer-group", nil, "a layer group and its page size, `g:bytes_per_page` (bytes or a binary size such as 128KiB; repeatable)")
	fl.StringArrayVar(&k.Replicated, "replicated", nil, "a layer group's replicated page size, `g:bytes` (repeatable)")
	fl.StringArrayVar(&k.FromConfig, "from-config", nil, "read namespace, model key, tokens per block, world size, attention DP and lookahead from a TensorRT-LLM YAML, mooncake.json or pool.json (repeatable); explicit flags win")
	_ = cmd.RegisterFlagCompletionFunc("format", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		var s []string
		for _, f := range keys.Formats() {
			s = append(s, string(f))
		}
		return s, cobra.ShellCompDirectiveNoFileComp
	})
}

// Bind records what the key flags of cmd cannot tell by their values alone (which flags were
// given, the token arguments) and checks that tokens were given exactly once.
func (k *KeyFlags) Bind(cmd *cobra.Command, args []string) error {
	k.Args = args
	k.HasCacheSalt = cmd.Flags().Changed("cache-salt")
	k.HasLoRAID = cmd.Flags().Changed("lora-id")
	k.Changed = cmd.Flags().Changed
	if len(args) > 0 && k.TokensFile != "" {
		return FlagErrorf("give tokens as arguments or with --tokens-file, not both")
	}
	if len(args) == 0 && k.TokensFile == "" {
		return FlagErrorf("no tokens: give them as arguments or with --tokens-file (- for stdin)")
	}
	return nil
}

// LoadPrompt fills the key inputs not given as flags from --from-config and reads the tokens.
// A --from-config file's diagnostics go to ios.ErrOut.
func (k *KeyFlags) LoadPrompt(ios *IOStreams) ([]int64, error) {
	if err := k.applyConfig(ios.ErrOut); err != nil {
		return nil, err
	}
	return k.readTokens(ios.In)
}

// applyConfig fills the key inputs that were not given as flags from --from-config files, loaded
// and checked by the same loader kvctl serve uses.
func (k *KeyFlags) applyConfig(diag io.Writer) error {
	if len(k.FromConfig) == 0 {
		return nil
	}
	var files []*config.File
	for _, name := range k.FromConfig {
		data, err := os.ReadFile(name)
		if err != nil {
			return err
		}
		f, diags := config.Load(name, data, config.LoadOptions{})
		if diags.HasErrors() {
			for _, d := range diags.Errors() {
				fmt.Fprintln(diag, d.String())
			}
			return ValidationErrorf("--from-config %s is invalid; see kvctl validate-config", name)
		}
		files = append(files, f)
	}
	in, err := config.KeyInputsFrom(files...)
	if err != nil {
		return ValidationErrorf("--from-config: %v", err)
	}
	changed := k.Changed
	if changed == nil {
		changed = func(string) bool { return false }
	}
	if !changed("namespace") && in.Namespace != "" {
		k.Namespace = in.Namespace
	}
	if !changed("model-key") && in.ModelKey != "" {
		k.ModelKey = in.ModelKey
	}
	if !changed("tokens-per-block") && in.TokensPerBlock > 0 {
		k.TokensPerBlock = int(in.TokensPerBlock)
	}
	if !changed("world-size") && in.WorldSize > 0 {
		k.WorldSize = int(in.WorldSize)
	}
	if !changed("attention-dp") {
		k.AttentionDP = k.AttentionDP || in.AttentionDP
	}
	if !changed("prompt-lookahead") && in.PromptLookahead > 0 {
		k.PromptLookahead = int(in.PromptLookahead)
	}
	return nil
}

func (k *KeyFlags) readTokens(stdin io.Reader) ([]int64, error) {
	if k.TokensFile == "" {
		toks, err := keys.ParseTokens(strings.NewReader(strings.Join(k.Args, " ")))
		if err != nil {
			return nil, FlagErrorf("tokens: %v", err)
		}
		return toks, nil
	}
	var r io.Reader
	name := k.TokensFile
	if name == "-" {
		r, name = stdin, "standard input"
	} else {
		f, err := OpenInput(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	toks, err := keys.ParseTokens(bufio.NewReaderSize(r, 256<<10))
	if err != nil {
		return nil, ValidationErrorf("%s: %v", name, err)
	}
	return toks, nil
}

// Bounds of the key flags' counts, far past any real deployment.
const (
	MaxWorldSize      = 4096
	MaxTokensPerBlock = 1 << 16
)

// Recipe turns the flags into the key recipe and the prompt's reuse scope. It checks the
// format, the scope and the chain's geometry and reads the layer groups; it does not ask for a
// namespace or a layer group, which only keys need (see CheckKeys). Every error is a usage error.
func (k *KeyFlags) Recipe() (keys.Recipe, keys.Scope, error) {
	// The counts first: a lookup lists a key per peer shard, so an unbounded world size
	// allocates without end.
	for _, b := range []struct {
		flag      string
		v, lo, hi int
	}{
		{"world-size", k.WorldSize, 1, MaxWorldSize},
		{"tokens-per-block", k.TokensPerBlock, 1, MaxTokensPerBlock},
		{"prompt-lookahead", k.PromptLookahead, 0, MaxTokensPerBlock},
	} {
		if err := CheckCount(b.flag, b.v, b.lo, b.hi); err != nil {
			return keys.Recipe{}, keys.Scope{}, err
		}
	}
	format, err := keys.ParseFormat(k.Format)
	if err != nil {
		return keys.Recipe{}, keys.Scope{}, FlagErrorf("--format: %v", err)
	}
	scope, err := k.scope()
	if err != nil {
		return keys.Recipe{}, keys.Scope{}, err
	}
	rec := keys.Recipe{
		Format: format, TokensPerBlock: k.TokensPerBlock, PromptLookahead: k.PromptLookahead,
		Namespace: keys.Namespace{Namespace: k.Namespace, ModelKey: k.ModelKey, WorldSize: k.WorldSize, Rank: k.Rank, AttentionDP: k.AttentionDP},
	}
	if err := rec.ChainConfig(scope).Validate(); err != nil {
		return keys.Recipe{}, keys.Scope{}, FlagErrorf("%v", err)
	}
	if rec.Groups, err = parseGroups(k.LayerGroups, k.Replicated); err != nil {
		return keys.Recipe{}, keys.Scope{}, err
	}
	return rec, scope, nil
}

// CheckKeys reports, as a usage error, what keeps rec from naming keys: a bad namespace or
// shard, or no --layer-group.
func CheckKeys(rec keys.Recipe) error {
	switch err := rec.ValidateKeys(); {
	case errors.Is(err, keys.ErrNoLayerGroups):
		return FlagErrorf("keys need at least one --layer-group g:bytes_per_page")
	case err != nil:
		return FlagErrorf("%v", err)
	}
	return nil
}

func (k *KeyFlags) scope() (keys.Scope, error) {
	var s keys.Scope
	if k.HasCacheSalt {
		salt := k.CacheSalt
		s.CacheSalt = &salt
	}
	if k.HasLoRAID {
		id := k.LoRAID
		s.LoRATaskID = &id
	}
	for i, m := range k.MMHashes {
		d, err := keys.ParseMultimodal(m)
		if err != nil {
			return s, FlagErrorf("--mm-hash #%d: %v", i+1, err)
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
			return nil, FlagErrorf("--layer-group %q: layer group %d given twice", s, g)
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
			return nil, FlagErrorf("--replicated %q: layer group %d has no --layer-group", s, g)
		}
		if out[i].ReplicatedBytesPerPage != 0 {
			return nil, FlagErrorf("--replicated %q: layer group %d given twice", s, g)
		}
		out[i].ReplicatedBytesPerPage = n
	}
	return out, nil
}

func parsePair(flag, s string) (int, uint64, error) {
	gs, bs, ok := strings.Cut(s, ":")
	if !ok {
		return 0, 0, FlagErrorf("%s %q: want g:bytes_per_page, for example 0:131072", flag, s)
	}
	g, err := strconv.Atoi(strings.TrimSpace(gs))
	if err != nil || g < 0 {
		return 0, 0, FlagErrorf("%s %q: layer group must be a non-negative integer", flag, s)
	}
	// A page size is a byte count or a binary size (128KiB), read as the config files read
	// sizes; the key always carries the decimal byte count.
	n, err := config.ParseSize(strings.TrimSpace(bs), true)
	if err != nil {
		return 0, 0, FlagErrorf("%s %q: page size: %v", flag, s, err)
	}
	if n <= 0 {
		return 0, 0, FlagErrorf("%s %q: page size must be a positive number of bytes", flag, s)
	}
	return g, uint64(n), nil
}
