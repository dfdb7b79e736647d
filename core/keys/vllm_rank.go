package keys

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// VLLMRankSchemes are the vLLM schemes kvctl serve's connector runs: the current lineage of
// vLLM's MooncakeStoreConnector with each of vLLM's released prefix-caching hash functions.
var VLLMRankSchemes = []string{"vllm", "vllm-sha256-cbor", "vllm-xxhash", "vllm-xxhash-cbor"}

// IsVLLMScheme reports whether name is a registered vLLM scheme (any lineage or hash function).
func IsVLLMScheme(name string) bool {
	s := lookup(name)
	return s != nil && s.Engine == EngineVLLM
}

// VLLMRank is one vLLM engine rank's keys on kvctl serve: the scheme and the registration-wide
// inputs of its keys (the seed, the model, the cache prefix and store namespace, the
// tensor-parallel rank and size and the KV head count). Each request adds its own scope with
// NewChain. A VLLMRank is immutable and safe for concurrent use.
type VLLMRank struct {
	scheme string
	hf     vllmHashFn
	p      Params // registration-wide; no request scope
	model  string
	block  int // tokens per connector block (vLLM's block_size, the store chunk)
	hb     int // tokens per hash block
	noneH  []byte
}

// NewVLLMRank validates the registration-wide inputs p of scheme for one rank: p.TPRank of
// p.TPSize, p.TokensPerBlock (vLLM's block_size) and p.HashBlockSize, the seed, the model and
// the key rank inputs. Pipeline, prefill-context and decode-context parallelism (sizes above 1)
// are refused: kvctl serve's deployments are tensor-parallel. p's request scope (salt, LoRA,
// multimodal items, prompt embeddings) must be empty; requests give theirs to NewChain.
func NewVLLMRank(scheme string, p Params) (*VLLMRank, error) {
	if !slices.Contains(VLLMRankSchemes, scheme) {
		return nil, fmt.Errorf("%w %q for a vLLM engine rank: want one of %s", ErrUnknownFormat, scheme, strings.Join(VLLMRankSchemes, ", "))
	}
	hf, ok := vllmHashFnOf(scheme)
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownFormat, scheme)
	}
	if p.Scope.CacheSalt != nil || p.LoRAName != nil || p.LoRAPath != nil || p.MMFeatures != nil || p.PromptEmbeds != nil {
		return nil, errors.New("a vLLM rank's inputs carry no request scope: give it to each request")
	}
	var errs []error
	if size1(p.PPSize) > 1 || size1(p.PCPSize) > 1 || size1(p.DCPSize) > 1 {
		errs = append(errs, fmt.Errorf("pipeline, prefill-context and decode-context parallel sizes %d, %d and %d: kvctl serve runs tensor-parallel vLLM deployments only (each size 1)", size1(p.PPSize), size1(p.PCPSize), size1(p.DCPSize)))
	}
	b := p.TokensPerBlock
	if b < 1 || b > MaxTokensPerBlock {
		errs = append(errs, fmt.Errorf("block size %d: must be in [1, %d]", b, MaxTokensPerBlock))
	}
	hb := p.HashBlockSize
	if hb == 0 {
		hb = b
	}
	if hb < 1 || (b >= 1 && b%hb != 0) {
		errs = append(errs, fmt.Errorf("hash block size %d: must divide the block size %d", p.HashBlockSize, b))
	}
	if p.PythonHashSeed == nil {
		errs = append(errs, ErrNoPythonHashSeed)
	} else if err := checkStr("PYTHONHASHSEED", *p.PythonHashSeed); err != nil {
		errs = append(errs, err)
	}
	if err := checkVLLMLayout(vllmLineageB, &p); err != nil {
		errs = append(errs, err)
	}
	if err := checkVLLMExtraKeys(&p); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	pre, err := hf.ser.appendStr(nil, *p.PythonHashSeed)
	if err != nil {
		return nil, err
	}
	return &VLLMRank{scheme: scheme, hf: hf, p: p, model: vllmModelName(p.Model), block: b, hb: hb, noneH: hf.sum(nil, pre)}, nil
}

func vllmHashFnOf(scheme string) (vllmHashFn, bool) {
	for _, hf := range vllmHashFns {
		if "vllm"+hf.suffix == scheme {
			return hf, true
		}
	}
	return vllmHashFn{}, false
}

// Scheme returns the scheme's name.
func (v *VLLMRank) Scheme() string { return v.scheme }

// BlockSize returns the tokens of one block (vLLM's block_size).
func (v *VLLMRank) BlockSize() int { return v.block }

// DigestSize returns the length of the rank's block hashes in bytes.
func (v *VLLMRank) DigestSize() int { return v.hf.digest.Size }

// keyRank is the TP rank vLLM writes into the keys of TP rank r.
func (v *VLLMRank) keyRank(r int) int { return vllmKeyRank(vllmLineageB, &v.p, r) }

// PageKeyPrefix returns the key of layer group group's page of TP rank r without its hash:
// the key of block h is the prefix followed by PageHash.AppendHex of h. vLLM's KV cache group
// is the layer group.
func (v *VLLMRank) PageKeyPrefix(r, group int) string {
	p := v.p
	p.KVGroup = group
	return string(vllmKey(nil, vllmLineageB, &p, v.model, v.keyRank(r), p.PCPRank, p.DCPRank, p.PPRank, nil))
}

// LookupKeyPrefixes returns the key prefixes (as PageKeyPrefix) of every page a hit on a block
// of group needs: one per distinct key rank of the tensor-parallel group, in rank order.
func (v *VLLMRank) LookupKeyPrefixes(group int) []string {
	var out []string
	last := -1
	for r := range size1(v.p.TPSize) {
		if k := v.keyRank(r); k != last {
			out = append(out, v.PageKeyPrefix(r, group))
			last = k
		}
	}
	return out
}

// WritesPages reports whether this rank writes its pages: vLLM maps the TP ranks that hold the
// same KV heads to one key rank, and of those only the first writes, so that one key is
// written once.
func (v *VLLMRank) WritesPages() bool {
	r := v.p.TPRank
	return r == 0 || v.keyRank(r-1) != v.keyRank(r)
}

// VLLMScope is one request's key scope under vLLM: its cache salt, LoRA adapter name (and path,
// which tagged extra keys hash too) and multimodal items (sorted by offset). Prompt embeddings
// are not supported.
type VLLMScope struct {
	CacheSalt  *string
	LoRAName   *string
	LoRAPath   *string
	MMFeatures []MMFeature
}

// NewChain validates a request's scope and returns its empty chain.
func (v *VLLMRank) NewChain(s VLLMScope) (*VLLMChain, error) {
	p := v.p
	p.Scope.CacheSalt, p.LoRAName, p.LoRAPath, p.MMFeatures = s.CacheSalt, s.LoRAName, s.LoRAPath, slices.Clone(s.MMFeatures)
	if err := checkVLLMScope(&p, 0, v.hb); err != nil {
		return nil, err
	}
	c := &VLLMChain{r: v, p: p}
	c.parent.n = uint8(copy(c.parent.b[:], v.noneH))
	return c, nil
}

// VLLMChain is one request's vLLM block hashes, extended as its tokens grow: the hash of each
// full block (vLLM's block_size tokens, one store chunk) is the hash of its last hash block,
// the hash that keys the chunk in vLLM's connector.
type VLLMChain struct {
	r      *VLLMRank
	p      Params
	parent PageHash // the last hash block's hash, NONE_HASH at first
	hashed int      // hash blocks hashed
	tokens int
	mmIdx  int
	blocks []PageHash
	buf    []byte
	extra  []pyObj
}

// Extend hashes the full hash blocks of tokens not hashed yet and returns the number of new
// full blocks. tokens is the whole token list so far; its head must be what earlier calls were
// given (a chain is append-only), and a shorter list is ErrTokensShrank.
func (c *VLLMChain) Extend(tokens []int64) (int, error) {
	n := len(tokens)
	if n < c.tokens {
		return 0, fmt.Errorf("%w: %d tokens after %d", ErrTokensShrank, n, c.tokens)
	}
	c.tokens = n
	hb, per := c.r.hb, c.r.block/c.r.hb
	before := len(c.blocks)
	for c.hashed < n/hb {
		i := c.hashed
		start, end := i*hb, (i+1)*hb
		var e []pyObj
		c.extra, c.mmIdx = vllmExtraKeys(c.extra[:0], &c.p, start, end, i, c.mmIdx)
		if len(c.extra) > 0 {
			e = c.extra
		}
		var err error
		c.buf, err = c.r.hf.ser.appendBlock(c.buf[:0], c.parent.b[:c.parent.n], tokens[start:end], e)
		if err != nil {
			return len(c.blocks) - before, fmt.Errorf("hash block %d: %w", i, err)
		}
		var h PageHash
		h.n = uint8(c.r.hf.digest.Size)
		c.r.hf.sum(h.b[:0], c.buf)
		c.parent = h
		c.hashed++
		if c.hashed%per == 0 {
			c.blocks = append(c.blocks, h)
		}
	}
	return len(c.blocks) - before, nil
}

// Len returns the number of full blocks hashed so far.
func (c *VLLMChain) Len() int { return len(c.blocks) }

// At returns the hash of block i (i < Len).
func (c *VLLMChain) At(i int) PageHash { return c.blocks[i] }
