package keys

import (
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
)

// Engines, as Scheme.Engine names them.
const (
	EngineTRTLLM = "TensorRT-LLM"
	EngineKvctl  = "kvctl"
	EngineVLLM   = "vLLM"
	EngineSGLang = "SGLang"
)

var engineOrder = []string{EngineTRTLLM, EngineKvctl, EngineVLLM, EngineSGLang}

// Input names one key input a scheme may take. The names are the flags of kvctl hash and kvctl
// probe-pool that set them.
type Input string

// Key inputs.
const (
	InputTokensPerBlock  Input = "tokens-per-block"
	InputHashBlockSize   Input = "hash-block-size"
	InputPromptLookahead Input = "prompt-lookahead"
	InputPythonHashSeed  Input = "python-hash-seed"
	InputCacheSalt       Input = "cache-salt"
	InputLoRAID          Input = "lora-id"
	InputLoRAName        Input = "lora-name"
	InputLoRAPath        Input = "lora-path"
	InputVLLMExtraKeys   Input = "vllm-extra-keys"
	InputMMHash          Input = "mm-hash"
	InputHasMultimodal   Input = "has-multimodal"
	InputMMFeature       Input = "mm-feature"
	InputPromptEmbeds    Input = "prompt-embeds-digest"
	InputExtraKey        Input = "extra-key"
	InputBigram          Input = "bigram"
	InputPriorHash       Input = "prior-hash"
	InputNamespace       Input = "namespace"
	InputModelKey        Input = "model-key"
	InputModel           Input = "model"
	InputCachePrefix     Input = "cache-prefix"
	InputStoreNamespace  Input = "store-namespace"
	InputBackendTag      Input = "backend-tag"
	InputWorldSize       Input = "world-size"
	InputRank            Input = "rank"
	InputAttentionDP     Input = "attention-dp"
	InputLayerGroup      Input = "layer-group"
	InputReplicated      Input = "replicated"
	InputNumKVHeads      Input = "num-kv-heads"
	InputMLA             Input = "mla"
	InputPPRank          Input = "pp-rank"
	InputPPSize          Input = "pp-size"
	InputPCPRank         Input = "pcp-rank"
	InputPCPSize         Input = "pcp-size"
	InputDCPRank         Input = "dcp-rank"
	InputDCPSize         Input = "dcp-size"
	InputKVGroup         Input = "kv-group"
	InputTPLCMSize       Input = "tp-lcm-size"
)

// DigestInfo names a scheme's block digest and its length in bytes.
type DigestInfo struct {
	Name string
	Size int
}

// Scheme is one way an engine turns a prompt into block hashes and pool keys: its seed, its
// serializer, its digest and length, its key layout and the key inputs it takes. Every scheme
// is one value registered in the registry (RegisterScheme); kvctl's --format flag, its help,
// completion and validation all come from the registry, and a new scheme is one new file.
type Scheme struct {
	// Name is the --format value.
	Name string
	// Engine is the engine whose keys the scheme reproduces (EngineTRTLLM, …).
	Engine string
	// Summary is one line for help text.
	Summary string
	// Seed, Serializer and KeyLayout describe the derivation in words, for help and docs.
	Seed       string
	Serializer string
	Digest     DigestInfo
	KeyLayout  string
	// Inputs are the key inputs the scheme takes; any other input given is an error.
	Inputs []Input
	// Default marks the scheme used when none is named.
	Default bool
	// TokensPerBlock is the engine's default block (or page) size, for when none is given.
	TokensPerBlock int
	// Chain is set for the schemes with a 16-byte chain that kvctl serve's connector runs
	// (ChainConfig, Chain, Recipe); nil for the others.
	Chain *ChainRules

	// derive computes a prompt's blocks and keys.
	derive func(s *Scheme, p *Params, tokens []int64, set KeySet) (*Result, error)
}

// Takes reports whether the scheme takes input in.
func (s *Scheme) Takes(in Input) bool { return slices.Contains(s.Inputs, in) }

// CheckInputs returns an error naming every input of given the scheme does not take.
func (s *Scheme) CheckInputs(given []Input) error {
	var bad []string
	for _, in := range given {
		if !s.Takes(in) {
			bad = append(bad, "--"+string(in))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("format %s does not take %s (it takes %s)", s.Name, strings.Join(bad, ", "), s.inputList())
}

func (s *Scheme) inputList() string {
	names := make([]string, len(s.Inputs))
	for i, in := range s.Inputs {
		names[i] = "--" + string(in)
	}
	return strings.Join(names, " ")
}

// Derive computes the blocks of tokens and, unless set is KeySetNone, the keys of set for each.
func (s *Scheme) Derive(p *Params, tokens []int64, set KeySet) (*Result, error) {
	switch set {
	case KeySetNone, KeySetSave, KeySetLookup:
	default:
		return nil, fmt.Errorf("key set %q: want %q or %q", set, KeySetSave, KeySetLookup)
	}
	if p == nil {
		p = &Params{}
	}
	return s.derive(s, p, tokens, set)
}

var registry struct {
	sync.Mutex
	schemes []*Scheme
	byName  map[string]*Scheme
}

// RegisterScheme adds s to the registry. It panics on a duplicate or malformed scheme: schemes
// are registered at init time from constant values, so that is a programming error.
func RegisterScheme(s Scheme) {
	if s.Name == "" || s.derive == nil || !slices.Contains(engineOrder, s.Engine) || s.Digest.Size <= 0 {
		panic(fmt.Sprintf("keys: malformed scheme %q", s.Name))
	}
	registry.Lock()
	defer registry.Unlock()
	for _, o := range registry.schemes {
		if o.Name == s.Name {
			panic("keys: scheme registered twice: " + s.Name)
		}
		if o.Default && s.Default {
			panic("keys: two default schemes: " + o.Name + ", " + s.Name)
		}
	}
	registry.schemes = append(registry.schemes, &s)
	if registry.byName == nil {
		registry.byName = map[string]*Scheme{}
	}
	registry.byName[s.Name] = &s
	sort.SliceStable(registry.schemes, func(i, j int) bool {
		a, b := registry.schemes[i], registry.schemes[j]
		if a.Default != b.Default {
			return a.Default
		}
		return slices.Index(engineOrder, a.Engine) < slices.Index(engineOrder, b.Engine)
	})
}

// Schemes returns every registered scheme, the default first, then by engine in registration
// order.
func Schemes() []*Scheme {
	registry.Lock()
	defer registry.Unlock()
	return slices.Clone(registry.schemes)
}

// SchemeNames returns the names of every scheme, in the order of Schemes.
func SchemeNames() []string {
	var names []string
	for _, s := range Schemes() {
		names = append(names, s.Name)
	}
	return names
}

// DefaultScheme returns the default scheme.
func DefaultScheme() *Scheme {
	for _, s := range Schemes() {
		if s.Default {
			return s
		}
	}
	panic("keys: no default scheme")
}

// LookupScheme returns the scheme named name. An empty name is an error, so that an explicitly
// empty flag is not silently the default.
func LookupScheme(name string) (*Scheme, error) {
	if s := lookup(name); s != nil {
		return s, nil
	}
	return nil, fmt.Errorf("%w %q: want one of %s", ErrUnknownFormat, name, strings.Join(SchemeNames(), ", "))
}

func lookup(name string) *Scheme {
	registry.Lock()
	defer registry.Unlock()
	return registry.byName[name]
}

// Digest is a block hash of any scheme: 16 bytes (TensorRT-LLM, xxhash) or 32 (SHA-256).
type Digest []byte

// String returns the lowercase hex form used in pool keys.
func (d Digest) String() string { return hex.EncodeToString(d) }

// MarshalText writes the hex form, so that a Digest is hex in JSON.
func (d Digest) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// MMFeature is a multimodal item as vLLM hashes it: an identifier (vLLM's hash of the
// processed input) and its placeholder range [Offset, Offset+Length) in the prompt.
type MMFeature struct {
	Identifier string
	Offset     int
	Length     int
}

// Params are every key input a scheme may take. A scheme reads those it takes (Scheme.Inputs);
// callers reject the others with Scheme.CheckInputs.
type Params struct {
	// TokensPerBlock is the block, chunk or page size: TensorRT-LLM's tokens per block, vLLM's
	// KV block size (the store chunk), SGLang's page size.
	TokensPerBlock int
	// HashBlockSize is vLLM's hash block size; 0 means TokensPerBlock.
	HashBlockSize int
	// PromptLookahead is TensorRT-LLM's prompt lookahead.
	PromptLookahead int
	// PythonHashSeed is vLLM's PYTHONHASHSEED string; nil means it was unset.
	PythonHashSeed *string

	// Scope is TensorRT-LLM's reuse scope; Scope.CacheSalt is also vLLM's and SGLang's salt.
	Scope Scope
	// HasMultimodal marks a TensorRT-LLM prompt with multimodal positions.
	HasMultimodal bool
	// LoRAName is vLLM's LoRA adapter name; LoRAPath its path, which tagged extra keys hash too.
	LoRAName *string
	LoRAPath *string
	// VLLMExtraKeys is how vLLM writes a block's extra keys: VLLMExtraKeysUntagged ("", the
	// bare values, as in the engine-keys vectors) or VLLMExtraKeysTagged (vLLM 0.33: each value
	// in a tuple led by its kind, the LoRA path hashed too).
	VLLMExtraKeys string
	// MMFeatures are vLLM's multimodal items, sorted by offset.
	MMFeatures []MMFeature
	// PromptEmbeds are vLLM's per-block SHA-256 digests of the prompt embeddings, one per hash
	// block in order; nil when the prompt has none.
	PromptEmbeds [][]byte
	// ExtraKey is SGLang's request extra_key.
	ExtraKey *string
	// Bigram selects SGLang's EAGLE bigram pages.
	Bigram bool
	// PriorHash is the SGLang page hash a continued chain starts from (its parent node's last
	// page); nil starts a new chain.
	PriorHash []byte

	// Namespace and Groups are TensorRT-LLM's key namespace and layer-group page sizes.
	Namespace Namespace
	Groups    []LayerGroupPages

	// Model is vLLM's --model (its keys hold the basename) or SGLang's served model name.
	Model string
	// CachePrefix is vLLM's kv_connector_extra_config cache_prefix.
	CachePrefix string
	// StoreNamespace is vLLM's store_namespace (newest connector lineage), placed right after
	// the model name.
	StoreNamespace string
	// BackendTag is SGLang's extra_backend_tag.
	BackendTag string
	// TPRank and TPSize are the tensor-parallel rank and size (TensorRT-LLM's attention shard
	// uses Namespace instead).
	TPRank, TPSize int
	// NumKVHeads is the model's total KV head count; MLA marks a multi-head latent attention
	// model.
	NumKVHeads int
	MLA        bool
	// PP, PCP and DCP ranks and sizes; a size of 0 means 1.
	PPRank, PPSize   int
	PCPRank, PCPSize int
	DCPRank, DCPSize int
	// KVGroup is vLLM's KV cache group.
	KVGroup int
	// TPLCMSize is SGLang's tp_lcm_size (split heads); 0 means none.
	TPLCMSize int
}

func size1(n int) int { return max(n, 1) }

// Block is one block (hash block, page or chunk) of a derived prompt.
type Block struct {
	// Index is the block's number, from 0; [Start, End) is the token span its hash covers.
	Index, Start, End int
	// Hash is the block's hash.
	Hash Digest
	// ChunkStart and ChunkEnd are the tokens a keyed store chunk covers when it differs from
	// the block (vLLM with a hash block smaller than the KV block); both 0 otherwise.
	ChunkStart, ChunkEnd int
	// GroupKey and Keys are set when keys were asked for. A block without keys is one whose
	// hash keys no store chunk.
	GroupKey string
	Keys     []string
}

// Result is what a scheme gives for one prompt.
type Result struct {
	// Scheme is the scheme's name.
	Scheme string
	// Seed is the parent of block 0; nil when the scheme has none.
	Seed Digest
	// Bypassed is set when the prompt gets no keys (TensorRT-LLM's multimodal bypass).
	Bypassed bool
	// Blocks are the prompt's hashed blocks.
	Blocks []Block
	// UncoveredTokens are the tokens after the last block.
	UncoveredTokens int
	// KeyTokensPerBlock is the number of tokens a keyed unit covers (what a probe counts holes
	// in).
	KeyTokensPerBlock int
}

// KeyedBlocks returns the blocks that carry keys, in order.
func (r *Result) KeyedBlocks() []Block {
	var out []Block
	for _, b := range r.Blocks {
		if len(b.Keys) > 0 {
			out = append(out, b)
		}
	}
	return out
}

// ErrNoPythonHashSeed is returned (wrapped) for a vLLM scheme without a PYTHONHASHSEED.
var ErrNoPythonHashSeed = errors.New("vLLM's keys are random per process when PYTHONHASHSEED is unset: its NONE_HASH seed is os.urandom(32), so the pool's keys cannot be derived; give the PYTHONHASHSEED the engine ran with (--python-hash-seed; vLLM 0.33 with sha256 or sha256_cbor and PYTHONHASHSEED unset seeds from the fixed string \"vllm-none-hash\": --python-hash-seed vllm-none-hash)")

// ErrTokenOutOfRange is returned (wrapped) for a token id a scheme cannot encode.
var ErrTokenOutOfRange = errors.New("token id out of range")

// KeyModelName returns the model name a scheme's keys carry for p: the basename of vLLM's
// --model, SGLang's served model name with "/" as "-", or "" when the keys carry none.
func KeyModelName(s *Scheme, p *Params) string {
	switch {
	case !s.Takes(InputModel):
		return ""
	case s.Engine == EngineVLLM:
		return vllmModelName(p.Model)
	default:
		return strings.ReplaceAll(p.Model, "/", "-")
	}
}
