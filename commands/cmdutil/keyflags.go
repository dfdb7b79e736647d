package cmdutil

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/kvctl/kvctl/core/boundedio"
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

	// The inputs of vLLM's and SGLang's schemes (see keys.Params).
	HashBlockSize  int
	PythonHashSeed string
	LoRAName       string
	LoRAPath       string
	VLLMExtraKeys  string
	MMFeatures     []string
	PromptEmbeds   []string
	ExtraKey       string
	Bigram         bool
	PriorHash      string
	Model          string
	CachePrefix    string
	StoreNamespace string
	BackendTag     string
	NumKVHeads     int
	MLA            bool
	PPRank, PPSize int
	PCPRank        int
	PCPSize        int
	DCPRank        int
	DCPSize        int
	KVGroup        int
	TPLCMSize      int
	// engineConfig holds what --from-config read from an engine's JSON configuration.
	engineConfig *config.EngineKeyConfig

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
	fl.StringVar(&k.Format, "format", keys.DefaultScheme().Name, "key scheme: "+strings.Join(keys.SchemeNames(), ", "))
	fl.IntVar(&k.TokensPerBlock, "tokens-per-block", 32, "tokens per KV block (T); vLLM: its --block-size (default 16), SGLang: its --page-size (default 1)")
	fl.IntVar(&k.PromptLookahead, "prompt-lookahead", 0, "prompt tokens past each block a one-model draft reads (L); block b covers tokens [bT, (b+1)T+L)")
	fl.StringVar(&k.CacheSalt, "cache-salt", "", "the request's cache salt")
	fl.Int64Var(&k.LoRAID, "lora-id", 0, "the request's LoRA task id (absent differs from 0)")
	fl.StringArrayVar(&k.MMHashes, "mm-hash", nil, "a multimodal item's hash, in prompt order: 8 int32 separated by commas, or 64 hex characters (repeatable)")
	fl.BoolVar(&k.HasMultimodal, "has-multimodal", false, "the prompt has multimodal positions: without --mm-hash it gets no keys, as in TensorRT-LLM")
	fl.StringVar(&k.Namespace, "namespace", keys.DefaultNamespace, "key namespace")
	fl.StringVar(&k.ModelKey, "model-key", "", "model key (required for keys)")
	fl.IntVar(&k.WorldSize, "world-size", 1, "tensor-parallel world size of the attention shard (vLLM, SGLang: the TP size)")
	fl.IntVar(&k.Rank, "rank", 0, "this rank in the attention shard (vLLM, SGLang: the TP rank)")
	fl.BoolVar(&k.AttentionDP, "attention-dp", false, "attention data parallelism: every owner keys pages as w1r0")
	fl.StringArrayVar(&k.LayerGroups, "layer-group", nil, "a layer group and its page size, `g:bytes_per_page` (bytes or a binary size such as 128KiB; repeatable)")
	fl.StringArrayVar(&k.Replicated, "replicated", nil, "a layer group's replicated page size, `g:bytes` (repeatable)")
	fl.StringArrayVar(&k.FromConfig, "from-config", nil, "read namespace, model key, tokens per block, world size, attention DP and lookahead from a TensorRT-LLM YAML, mooncake.json or pool.json; with a vLLM or SGLang format, read cache_prefix from vLLM's --kv-transfer-config JSON or the tag and tp_lcm_size from SGLang's --hicache-storage-backend-extra-config JSON (a file, or the JSON itself) (repeatable); explicit flags win")
	fl.IntVar(&k.HashBlockSize, "hash-block-size", 0, "vLLM: tokens per prefix-cache hash block when smaller than the block size (0: the block size)")
	fl.StringVar(&k.PythonHashSeed, "python-hash-seed", "", "vLLM: the PYTHONHASHSEED the engine ran with, exactly as set (\"0\" and \"00\" differ); required, since without it vLLM's keys are random per process")
	fl.StringVar(&k.LoRAName, "lora-name", "", "vLLM: the request's LoRA adapter name")
	fl.StringVar(&k.LoRAPath, "lora-path", "", "vLLM with --vllm-extra-keys tagged: the LoRA adapter's path, hashed with its name")
	fl.StringVar(&k.VLLMExtraKeys, "vllm-extra-keys", keys.VLLMExtraKeysUntagged, "vLLM: how the engine writes a block's extra keys: untagged (bare values) or tagged (vLLM 0.33: (\"cache_salt\", salt), (\"lora\", name, path), (\"mm\", id, offset))")
	fl.StringArrayVar(&k.MMFeatures, "mm-feature", nil, "vLLM: a multimodal item, `ID:OFFSET:LENGTH` (its identifier and placeholder range; repeatable, in prompt order)")
	fl.StringArrayVar(&k.PromptEmbeds, "prompt-embeds-digest", nil, "vLLM: the SHA-256 of one hash block's prompt embeddings, 64 hex characters (repeatable, one per block)")
	fl.StringVar(&k.ExtraKey, "extra-key", "", "SGLang: the request's extra_key (namespace seed)")
	fl.BoolVar(&k.Bigram, "bigram", false, "SGLang: EAGLE bigram pages (unit j is tokens j and j+1)")
	fl.StringVar(&k.PriorHash, "prior-hash", "", "SGLang: the parent node's last page hash (64 hex characters) the chain continues from")
	fl.StringVar(&k.Model, "model", "", "vLLM: its --model (keys hold the basename); SGLang: its served model name")
	fl.StringVar(&k.CachePrefix, "cache-prefix", "", "vLLM: kv_connector_extra_config cache_prefix")
	fl.StringVar(&k.StoreNamespace, "store-namespace", "", "vLLM: the connector's store_namespace (newest lineage), after the model name")
	fl.StringVar(&k.BackendTag, "backend-tag", "", "SGLang: extra_backend_tag of the storage backend's extra config")
	fl.IntVar(&k.NumKVHeads, "num-kv-heads", 0, "vLLM: the model's KV head count (TP ranks that share heads share keys)")
	fl.BoolVar(&k.MLA, "mla", false, "vLLM, SGLang: a multi-head latent attention model (one key for every TP rank)")
	fl.IntVar(&k.PPRank, "pp-rank", 0, "vLLM, SGLang: pipeline-parallel stage of this rank")
	fl.IntVar(&k.PPSize, "pp-size", 1, "vLLM, SGLang: pipeline-parallel size")
	fl.IntVar(&k.PCPRank, "pcp-rank", 0, "vLLM: prefill context-parallel rank")
	fl.IntVar(&k.PCPSize, "pcp-size", 1, "vLLM: prefill context-parallel size")
	fl.IntVar(&k.DCPRank, "dcp-rank", 0, "vLLM: decode context-parallel rank")
	fl.IntVar(&k.DCPSize, "dcp-size", 1, "vLLM: decode context-parallel size")
	fl.IntVar(&k.KVGroup, "kv-group", 0, "vLLM: the KV cache group (hybrid and sliding-window models have several)")
	fl.IntVar(&k.TPLCMSize, "tp-lcm-size", 0, "SGLang: tp_lcm_size of split heads (0: none)")
	_ = cmd.RegisterFlagCompletionFunc("format", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		var s []string
		for _, sc := range keys.Schemes() {
			s = append(s, sc.Name+"\t"+sc.Summary)
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
	if s, err := keys.LookupScheme(k.Format); err == nil && (s.Engine == keys.EngineVLLM || s.Engine == keys.EngineSGLang) {
		return k.applyEngineConfig(s)
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

// applyEngineConfig fills the key inputs not given as flags from vLLM's --kv-transfer-config
// or SGLang's --hicache-storage-backend-extra-config: each --from-config is a file or, when it
// starts with "{", the JSON itself.
func (k *KeyFlags) applyEngineConfig(s *keys.Scheme) error {
	changed := k.Changed
	if changed == nil {
		changed = func(string) bool { return false }
	}
	for _, name := range k.FromConfig {
		data := []byte(name)
		if !strings.HasPrefix(strings.TrimSpace(name), "{") {
			var err error
			if data, err = boundedio.ReadFile(context.Background(), name, config.MaxEngineKeyConfigBytes); err != nil {
				return err
			}
		} else {
			name = "the JSON given"
		}
		c, err := config.ParseEngineKeyConfig(data)
		if err != nil {
			return ValidationErrorf("--from-config %s: %v", name, err)
		}
		want := config.EngineConfigVLLM
		if s.Engine == keys.EngineSGLang {
			want = config.EngineConfigSGLang
		}
		if c.Engine != want {
			return ValidationErrorf("--from-config %s: a %s configuration, but --format %s is %s's", name, c.Engine, s.Name, s.Engine)
		}
		if c.HasCachePrefix && !changed("cache-prefix") && s.Takes(keys.InputCachePrefix) {
			k.CachePrefix = c.CachePrefix
		}
		if c.HasBackendTag && !changed("backend-tag") {
			k.BackendTag = c.BackendTag
		}
		if c.TPLCMSize > 0 && !changed("tp-lcm-size") && s.Takes(keys.InputTPLCMSize) {
			k.TPLCMSize = c.TPLCMSize
		}
		k.engineConfig = &c
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
	if err = rec.ChainConfig(scope).Validate(); err != nil {
		return keys.Recipe{}, keys.Scope{}, FlagErrorf("%v", err)
	}
	if rec.Groups, err = parseGroups(k.LayerGroups, k.Replicated); err != nil {
		return keys.Recipe{}, keys.Scope{}, err
	}
	return rec, scope, nil
}

// Scheme returns the key scheme --format names, as a usage error when it names none.
func (k *KeyFlags) Scheme() (*keys.Scheme, error) {
	s, err := keys.LookupScheme(k.Format)
	if err != nil {
		return nil, FlagErrorf("--format: %v", err)
	}
	return s, nil
}

// givenInputs returns the key inputs given as flags.
func (k *KeyFlags) givenInputs() []keys.Input {
	changed := k.Changed
	if changed == nil {
		return nil
	}
	var out []keys.Input
	for _, in := range allInputs {
		if changed(string(in)) {
			out = append(out, in)
		}
	}
	return out
}

// allInputs are the key inputs with a flag of their own.
var allInputs = []keys.Input{
	keys.InputTokensPerBlock, keys.InputHashBlockSize, keys.InputPromptLookahead, keys.InputPythonHashSeed,
	keys.InputCacheSalt, keys.InputLoRAID, keys.InputLoRAName, keys.InputLoRAPath, keys.InputVLLMExtraKeys, keys.InputMMHash, keys.InputHasMultimodal,
	keys.InputMMFeature, keys.InputPromptEmbeds, keys.InputExtraKey, keys.InputBigram, keys.InputPriorHash,
	keys.InputNamespace, keys.InputModelKey, keys.InputModel, keys.InputCachePrefix, keys.InputStoreNamespace,
	keys.InputBackendTag, keys.InputWorldSize, keys.InputRank, keys.InputAttentionDP, keys.InputLayerGroup,
	keys.InputReplicated, keys.InputNumKVHeads, keys.InputMLA, keys.InputPPRank, keys.InputPPSize,
	keys.InputPCPRank, keys.InputPCPSize, keys.InputDCPRank, keys.InputDCPSize, keys.InputKVGroup, keys.InputTPLCMSize,
}

// Params turns the flags into the key inputs of scheme s. It rejects, as usage errors, an input
// s does not take and a value that does not parse. A TensorRT-LLM scheme's inputs are read by
// Recipe.
func (k *KeyFlags) Params(s *keys.Scheme) (*keys.Params, error) {
	if err := s.CheckInputs(k.givenInputs()); err != nil {
		return nil, FlagErrorf("%v", err)
	}
	changed := k.Changed
	if changed == nil {
		changed = func(string) bool { return false }
	}
	p := &keys.Params{
		TokensPerBlock: k.TokensPerBlock, HashBlockSize: k.HashBlockSize, Bigram: k.Bigram,
		Model: k.Model, CachePrefix: k.CachePrefix, StoreNamespace: k.StoreNamespace, BackendTag: k.BackendTag,
		TPRank: k.Rank, TPSize: k.WorldSize, NumKVHeads: k.NumKVHeads, MLA: k.MLA,
		PPRank: k.PPRank, PPSize: k.PPSize, PCPRank: k.PCPRank, PCPSize: k.PCPSize, DCPRank: k.DCPRank, DCPSize: k.DCPSize,
		KVGroup: k.KVGroup, TPLCMSize: k.TPLCMSize,
	}
	if !changed("tokens-per-block") && s.TokensPerBlock > 0 {
		p.TokensPerBlock = s.TokensPerBlock
	}
	str := func(name, v string) *string {
		if !changed(name) {
			return nil
		}
		return &v
	}
	p.PythonHashSeed = str("python-hash-seed", k.PythonHashSeed)
	p.LoRAName = str("lora-name", k.LoRAName)
	p.LoRAPath = str("lora-path", k.LoRAPath)
	p.VLLMExtraKeys = k.VLLMExtraKeys
	p.ExtraKey = str("extra-key", k.ExtraKey)
	p.Scope.CacheSalt = str("cache-salt", k.CacheSalt)
	for i, m := range k.MMFeatures {
		f, err := ParseMMFeature(m)
		if err != nil {
			return nil, FlagErrorf("--mm-feature #%d: %v", i+1, err)
		}
		p.MMFeatures = append(p.MMFeatures, f)
	}
	for i, d := range k.PromptEmbeds {
		b, err := hex.DecodeString(strings.TrimSpace(d))
		if err != nil || len(b) != sha256.Size {
			return nil, FlagErrorf("--prompt-embeds-digest #%d %q: want the 64 hex characters of a SHA-256", i+1, d)
		}
		p.PromptEmbeds = append(p.PromptEmbeds, b)
	}
	if k.PriorHash != "" {
		b, err := hex.DecodeString(strings.TrimSpace(k.PriorHash))
		if err != nil || len(b) != sha256.Size {
			return nil, FlagErrorf("--prior-hash %q: want a page hash, 64 hex characters", k.PriorHash)
		}
		p.PriorHash = b
	}
	if s.Chain != nil {
		rec, scope, err := k.Recipe()
		if err != nil {
			return nil, err
		}
		p.TokensPerBlock, p.PromptLookahead, p.Namespace, p.Groups, p.Scope = rec.TokensPerBlock, rec.PromptLookahead, rec.Namespace, rec.Groups, scope
		p.HasMultimodal = k.HasMultimodal
	}
	return p, nil
}

// ParseMMFeature reads a vLLM multimodal item, "ID:OFFSET:LENGTH"; the identifier may itself
// hold colons.
func ParseMMFeature(s string) (keys.MMFeature, error) {
	var f keys.MMFeature
	rest, length, ok1 := cutLast(s, ":")
	id, offset, ok2 := cutLast(rest, ":")
	if !ok1 || !ok2 {
		return f, fmt.Errorf("%q: want ID:OFFSET:LENGTH", s)
	}
	o, err1 := strconv.Atoi(strings.TrimSpace(offset))
	n, err2 := strconv.Atoi(strings.TrimSpace(length))
	if err1 != nil || err2 != nil || o < 0 || n < 0 || o > keys.MaxTokensPerBlock<<12 || n > keys.MaxTokensPerBlock<<12 {
		return f, fmt.Errorf("%q: offset and length must be non-negative integers", s)
	}
	if !utf8.ValidString(id) {
		return f, fmt.Errorf("%q: identifier not UTF-8", s)
	}
	return keys.MMFeature{Identifier: id, Offset: o, Length: n}, nil
}

func cutLast(s, sep string) (before, after string, ok bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
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

// SchemeError maps an error of keys.Scheme.Derive to its exit code: a missing PYTHONHASHSEED and
// bad inputs are usage errors (2), a token the engine cannot hash fails validation (3).
func SchemeError(err error) error {
	if errors.Is(err, keys.ErrTokenOutOfRange) {
		return ValidationErrorf("%v", err)
	}
	return FlagErrorf("%v", err)
}

// FormatHelp lists every key scheme of the registry with its one-line summary, for help text.
func FormatHelp() string {
	var b strings.Builder
	for _, s := range keys.Schemes() {
		name := s.Name
		if s.Default {
			name += " (default)"
		}
		fmt.Fprintf(&b, "  %-30s %s\n", name, s.Summary)
	}
	return strings.TrimRight(b.String(), "\n")
}
