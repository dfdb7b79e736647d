package keys

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/zeebo/xxh3"
)

// vLLM's MooncakeStoreConnector schemes. The connector reuses the engine's prefix-cache block
// hashes: h[i] = hash_fn((h[i−1] or NONE_HASH, tuple(tokens of hash block i), extra keys)),
// with NONE_HASH = hash_fn(PYTHONHASHSEED string). hash_fn is --prefix-caching-hash-algo: a
// digest (SHA-256, or xxh3-128 in canonical big-endian form) of a serialization (pickle
// protocol 5, canonical CBOR or MessagePack). The extra keys of a block are, in order, the LoRA
// name (every block), (identifier, offset − block start) of every multimodal item overlapping
// the block, the cache salt (block 0 only, when not empty) and the SHA-256 of the block's
// prompt embeddings; None when there is none.
//
// Keys, lineage B (current): [cache_prefix "@"] model [store_namespace] "@tp_rank:" R "@pcp" P
// "@dcp" D "@pp_rank:" Q "@group:" G "@" hex(h), one per store chunk of block_size tokens, keyed
// by the last hash block of the chunk. Lineage A (first upstream form) has neither the group nor
// the cache prefix, and keys chunk c by h[c].

// vllmHashFn is one of vLLM's prefix-caching hash functions.
type vllmHashFn struct {
	algo   string // vLLM's name
	suffix string // the scheme name's suffix
	ser    pySerializer
	digest DigestInfo
	sum    func(dst, b []byte) []byte
}

func sha256Sum(dst, b []byte) []byte {
	s := sha256.Sum256(b)
	return append(dst, s[:]...)
}

func xxh3Sum(dst, b []byte) []byte {
	s := xxh3.Hash128(b).Bytes()
	return append(dst, s[:]...)
}

var (
	digestSHA256 = DigestInfo{Name: "sha256", Size: 32}
	digestXXH3   = DigestInfo{Name: "xxh3-128", Size: 16}
)

var vllmHashFns = []vllmHashFn{
	{"sha256", "", pickleSer{}, digestSHA256, sha256Sum},
	{"sha256_cbor", "-sha256-cbor", cborSer{}, digestSHA256, sha256Sum},
	{"xxhash", "-xxhash", pickleSer{}, digestXXH3, xxh3Sum},
	{"xxhash_cbor", "-xxhash-cbor", cborSer{}, digestXXH3, xxh3Sum},
	{"sha256_msgpack", "-sha256-msgpack", msgpackSer{}, digestSHA256, sha256Sum},
	{"xxhash_msgpack", "-xxhash-msgpack", msgpackSer{}, digestXXH3, xxh3Sum},
}

// vLLM key lineages.
const (
	vllmLineageA = "A"
	vllmLineageB = "B"
)

var vllmHashInputs = []Input{
	InputTokensPerBlock, InputHashBlockSize, InputPythonHashSeed, InputCacheSalt, InputLoRAName,
	InputMMFeature, InputPromptEmbeds, InputVLLMExtraKeys, InputLoRAPath,
}

// How vLLM writes a block's extra keys (Params.VLLMExtraKeys).
const (
	// VLLMExtraKeysUntagged: the LoRA name, (identifier, offset) per multimodal item, the
	// cache salt and the prompt-embeddings digest as bare values (the engine-keys vectors).
	VLLMExtraKeysUntagged = "untagged"
	// VLLMExtraKeysTagged: ("lora", name, path), ("mm", identifier, offset), ("cache_salt",
	// salt) and ("prompt_embeds", digest), with an item passed once a block starts at its end
	// (vLLM 0.33).
	VLLMExtraKeysTagged = "tagged"
)

// VLLMDefaultSeedSHA256 is the seed vLLM 0.33 hashes into NONE_HASH when PYTHONHASHSEED is
// unset and its hash function is SHA-256 (sha256, sha256_cbor); xxhash's stays random.
const VLLMDefaultSeedSHA256 = "vllm-none-hash"

func checkVLLMExtraKeys(p *Params) error {
	switch p.VLLMExtraKeys {
	case "", VLLMExtraKeysUntagged:
		if p.LoRAPath != nil {
			return fmt.Errorf("--lora-path enters the hashes only with --vllm-extra-keys %s", VLLMExtraKeysTagged)
		}
	case VLLMExtraKeysTagged:
		if p.LoRAName != nil && p.LoRAPath == nil {
			return fmt.Errorf("--vllm-extra-keys %s hashes the LoRA adapter's path with its name: give --lora-path", VLLMExtraKeysTagged)
		}
		if p.LoRAPath != nil && p.LoRAName == nil {
			return errors.New("--lora-path without --lora-name")
		}
	default:
		return fmt.Errorf("vLLM extra keys %q: want %s (the engine-keys vectors' vLLM) or %s (vLLM 0.33)", p.VLLMExtraKeys, VLLMExtraKeysUntagged, VLLMExtraKeysTagged)
	}
	return nil
}

func init() {
	for _, lineage := range []string{vllmLineageB, vllmLineageA} {
		for _, hf := range vllmHashFns {
			name, layout := "vllm"+hf.suffix, `[cache_prefix@]{model basename}[store_namespace]@tp_rank:{R}@pcp{P}@dcp{D}@pp_rank:{Q}@group:{G}@{hex}`
			inputs := append(append([]Input(nil), vllmHashInputs...), InputModel, InputCachePrefix, InputStoreNamespace,
				InputWorldSize, InputRank, InputNumKVHeads, InputMLA, InputPPRank, InputPPSize, InputPCPRank, InputPCPSize,
				InputDCPRank, InputDCPSize, InputKVGroup)
			summary := fmt.Sprintf("vLLM MooncakeStoreConnector, --prefix-caching-hash-algo %s", hf.algo)
			if lineage == vllmLineageA {
				name = "vllm-lineage-a" + hf.suffix
				layout = `{model basename}@tp_rank:{R}@pcp{P}@dcp{D}@pp_rank:{Q}@{hex}`
				inputs = append(append([]Input(nil), vllmHashInputs...), InputModel, InputWorldSize, InputRank,
					InputNumKVHeads, InputMLA, InputPPRank, InputPPSize, InputPCPRank, InputPCPSize, InputDCPRank, InputDCPSize)
				summary = fmt.Sprintf("vLLM MooncakeStoreConnector's first lineage (no @group, no cache_prefix), %s", hf.algo)
			}
			if strings.HasSuffix(hf.algo, "msgpack") {
				summary += " (a branch only)"
			}
			RegisterScheme(Scheme{
				Name: name, Engine: EngineVLLM, Summary: summary,
				Seed:       "NONE_HASH = hash_fn(PYTHONHASHSEED string); random per process when unset",
				Serializer: hf.ser.name() + " of (parent, tuple(tokens), extra keys)", Digest: hf.digest,
				KeyLayout: layout, Inputs: inputs, TokensPerBlock: 16,
				derive: func(s *Scheme, p *Params, tokens []int64, set KeySet) (*Result, error) {
					return deriveVLLM(s, hf, lineage, p, tokens, set)
				},
			})
		}
	}
}

// Bounds on vLLM's scope inputs, far above real values.
const (
	maxMMFeatures   = 1 << 12
	maxParallelSize = 1 << 16
)

// vllmChain is the block hashes of one prompt, with their preimages when asked for.
type vllmChain struct {
	noneHash         []byte
	noneHashPreimage []byte
	hashes           [][]byte
	preimages        [][]byte
	extras           [][]pyObj
	hashBlock        int
}

func checkVLLMScope(p *Params, tokens int, hb int) error {
	var errs []error
	if p.LoRAName != nil {
		if err := checkStr("LoRA name", *p.LoRAName); err != nil {
			errs = append(errs, err)
		}
	}
	if p.LoRAPath != nil {
		if err := checkStr("LoRA path", *p.LoRAPath); err != nil {
			errs = append(errs, err)
		}
	}
	if err := checkVLLMExtraKeys(p); err != nil {
		errs = append(errs, err)
	}
	if p.Scope.CacheSalt != nil {
		if err := checkStr("cache salt", *p.Scope.CacheSalt); err != nil {
			errs = append(errs, err)
		}
	}
	if len(p.MMFeatures) > maxMMFeatures {
		errs = append(errs, fmt.Errorf("%d multimodal items: at most %d", len(p.MMFeatures), maxMMFeatures))
	} else {
		for i, f := range p.MMFeatures {
			if err := checkStr("multimodal identifier", f.Identifier); err != nil {
				errs = append(errs, err)
			}
			if f.Offset < 0 || f.Length < 0 {
				errs = append(errs, fmt.Errorf("multimodal item %d: offset %d and length %d must not be negative", i, f.Offset, f.Length))
			}
			if i > 0 && f.Offset < p.MMFeatures[i-1].Offset {
				errs = append(errs, fmt.Errorf("multimodal item %d: offset %d before item %d's %d: vLLM keeps them sorted by offset", i, f.Offset, i-1, p.MMFeatures[i-1].Offset))
			}
		}
	}
	if p.PromptEmbeds != nil {
		if n := tokens / hb; len(p.PromptEmbeds) < n {
			errs = append(errs, fmt.Errorf("%d prompt-embeds digests for %d hash blocks: give one per block", len(p.PromptEmbeds), n))
		}
		for i, d := range p.PromptEmbeds {
			if len(d) != sha256.Size {
				errs = append(errs, fmt.Errorf("prompt-embeds digest %d: %d bytes, want the %d of a SHA-256", i, len(d), sha256.Size))
			}
		}
	}
	return errors.Join(errs...)
}

// hashVLLM computes the NONE_HASH and the block hashes of the full hash blocks of tokens.
func hashVLLM(hf vllmHashFn, p *Params, tokens []int64, keepPreimages bool) (*vllmChain, error) {
	if p.PythonHashSeed == nil {
		return nil, ErrNoPythonHashSeed
	}
	if err := checkStr("PYTHONHASHSEED", *p.PythonHashSeed); err != nil {
		return nil, err
	}
	hb := p.HashBlockSize
	if hb == 0 {
		hb = p.TokensPerBlock
	}
	if hb < 1 || hb > MaxTokensPerBlock {
		return nil, fmt.Errorf("hash block size %d: must be in [1, %d]", hb, MaxTokensPerBlock)
	}
	if err := checkVLLMScope(p, len(tokens), hb); err != nil {
		return nil, err
	}
	c := &vllmChain{hashBlock: hb}
	pre, err := hf.ser.appendStr(nil, *p.PythonHashSeed)
	if err != nil {
		return nil, err
	}
	c.noneHash = hf.sum(nil, pre)
	if keepPreimages {
		c.noneHashPreimage = pre
	}
	n := len(tokens) / hb
	c.hashes = make([][]byte, 0, n)
	parent := c.noneHash
	mmIdx := 0
	var buf []byte
	var extra []pyObj
	for i := 0; i < n; i++ {
		start, end := i*hb, (i+1)*hb
		extra, mmIdx = vllmExtraKeys(extra[:0], p, start, end, i, mmIdx)
		var e []pyObj
		if len(extra) > 0 {
			e = extra
		}
		buf, err = hf.ser.appendBlock(buf[:0], parent, tokens[start:end], e)
		if err != nil {
			return nil, fmt.Errorf("hash block %d: %w", i, err)
		}
		h := hf.sum(make([]byte, 0, hf.digest.Size), buf)
		c.hashes = append(c.hashes, h)
		if keepPreimages {
			c.preimages = append(c.preimages, append([]byte(nil), buf...))
			c.extras = append(c.extras, append([]pyObj(nil), e...))
		}
		parent = h
	}
	return c, nil
}

// vllmExtraKeys appends the extra keys of the hash block [start, end) (vLLM's
// generate_block_hash_extra_keys) and returns them with the multimodal cursor for the next block.
func vllmExtraKeys(dst []pyObj, p *Params, start, end, block, mmIdx int) ([]pyObj, int) {
	if p.VLLMExtraKeys == VLLMExtraKeysTagged {
		return vllmTaggedExtraKeys(dst, p, start, end, block, mmIdx)
	}
	if p.LoRAName != nil {
		dst = append(dst, pyStrOf(*p.LoRAName))
	}
	dst, mmIdx = vllmMMKeys(dst, p.MMFeatures, start, end, mmIdx)
	if start == 0 && p.Scope.CacheSalt != nil && *p.Scope.CacheSalt != "" {
		dst = append(dst, pyStrOf(*p.Scope.CacheSalt))
	}
	if p.PromptEmbeds != nil {
		dst = append(dst, pyBytesOf(p.PromptEmbeds[block]))
	}
	return dst, mmIdx
}

// vllmTaggedExtraKeys is vLLM 0.33's generate_block_hash_extra_keys: the LoRA adapter, the
// multimodal items, the cache salt and the prompt-embeddings digest, each a tuple led by its
// kind, in that order.
func vllmTaggedExtraKeys(dst []pyObj, p *Params, start, end, block, mmIdx int) ([]pyObj, int) {
	if p.LoRAName != nil && p.LoRAPath != nil {
		dst = append(dst, pyTupleOf(pyStrOf("lora"), pyStrOf(*p.LoRAName), pyStrOf(*p.LoRAPath)))
	}
	dst, mmIdx = vllmTaggedMMKeys(dst, p.MMFeatures, start, end, mmIdx)
	if start == 0 && p.Scope.CacheSalt != nil && *p.Scope.CacheSalt != "" {
		dst = append(dst, pyTupleOf(pyStrOf("cache_salt"), pyStrOf(*p.Scope.CacheSalt)))
	}
	if p.PromptEmbeds != nil {
		dst = append(dst, pyTupleOf(pyStrOf("prompt_embeds"), pyBytesOf(p.PromptEmbeds[block])))
	}
	return dst, mmIdx
}

// vllmTaggedMMKeys is vLLM 0.33's _gen_mm_extra_hash_keys: ("mm", identifier, offset − start)
// per item overlapping [start, end); an item is passed once a block starts at or after its end.
func vllmTaggedMMKeys(dst []pyObj, feats []MMFeature, start, end, idx int) ([]pyObj, int) {
	if len(feats) == 0 {
		return dst, idx
	}
	if last := feats[len(feats)-1]; last.Offset+last.Length <= start {
		return dst, idx
	}
	for idx < len(feats) {
		f := feats[idx]
		if end <= f.Offset {
			break
		}
		if start >= f.Offset+f.Length {
			idx++
			continue
		}
		dst = append(dst, pyTupleOf(pyStrOf("mm"), pyStrOf(f.Identifier), pyIntOf(int64(f.Offset-start))))
		if end < f.Offset+f.Length {
			break
		}
		idx++
	}
	return dst, idx
}

// vllmMMKeys is vLLM's _gen_mm_extra_hash_keys: the items overlapping [start, end) from the
// cursor on, as (identifier, offset − start), and the cursor for the next block. Its boundary
// rules are vLLM's, including that an item is passed only once start is beyond its end.
func vllmMMKeys(dst []pyObj, feats []MMFeature, start, end, idx int) ([]pyObj, int) {
	if len(feats) == 0 {
		return dst, idx
	}
	if last := feats[len(feats)-1]; last.Offset+last.Length < start {
		return dst, idx
	}
	for idx < len(feats) {
		f := feats[idx]
		if end <= f.Offset {
			break
		}
		if start > f.Offset+f.Length {
			idx++
			continue
		}
		dst = append(dst, pyTupleOf(pyStrOf(f.Identifier), pyIntOf(int64(f.Offset-start))))
		if end < f.Offset+f.Length {
			break
		}
		idx++
	}
	return dst, idx
}

// vllmModelName is the connector's model name: the basename of --model.
func vllmModelName(model string) string {
	m := strings.TrimRight(model, "/")
	if i := strings.LastIndexByte(m, '/'); i >= 0 {
		m = m[i+1:]
	}
	return m
}

// vllmKeyRank returns the TP rank a key carries for TP rank r.
func vllmKeyRank(lineage string, p *Params, r int) int {
	tp := size1(p.TPSize)
	if lineage == vllmLineageA {
		kvh := p.NumKVHeads
		if p.MLA {
			kvh = 1
		}
		if kvh >= 1 && kvh < tp {
			return r / (tp / kvh)
		}
		return r
	}
	switch {
	case size1(p.DCPSize) > 1:
		return r
	case p.MLA:
		return r / tp
	default:
		return r / max(1, tp/max(p.NumKVHeads, 1))
	}
}

func checkVLLMLayout(lineage string, p *Params) error {
	var errs []error
	if p.Model == "" {
		errs = append(errs, errors.New("--model is required for vLLM keys: they start with the basename of the engine's --model"))
	}
	tp := size1(p.TPSize)
	for _, rs := range []struct {
		name       string
		rank, size int
	}{{"tp", p.TPRank, p.TPSize}, {"pp", p.PPRank, p.PPSize}, {"pcp", p.PCPRank, p.PCPSize}, {"dcp", p.DCPRank, p.DCPSize}} {
		if rs.size < 0 || rs.size > maxParallelSize {
			errs = append(errs, fmt.Errorf("%s size %d: must be in [1, %d]", rs.name, rs.size, maxParallelSize))
		} else if rs.rank < 0 || rs.rank >= size1(rs.size) {
			errs = append(errs, fmt.Errorf("%s rank %d: must be in [0, %d)", rs.name, rs.rank, size1(rs.size)))
		}
	}
	if tp > 1 && !p.MLA && size1(p.DCPSize) == 1 && p.NumKVHeads < 1 {
		errs = append(errs, fmt.Errorf("tp size %d needs the model's KV head count (--num-kv-heads): vLLM collapses TP ranks that hold the same heads into one key rank", tp))
	}
	if p.NumKVHeads < 0 || p.KVGroup < 0 {
		errs = append(errs, fmt.Errorf("KV head count %d and KV group %d must not be negative", p.NumKVHeads, p.KVGroup))
	}
	if lineage == vllmLineageA && (p.CachePrefix != "" || p.KVGroup != 0 || p.StoreNamespace != "") {
		errs = append(errs, errors.New("the first vLLM connector lineage has no cache prefix, store namespace or KV group in its keys"))
	}
	return errors.Join(errs...)
}

// vllmKey appends one key.
func vllmKey(b []byte, lineage string, p *Params, model string, r, pcp, dcp, pp int, h []byte) []byte {
	if lineage == vllmLineageB && p.CachePrefix != "" {
		b = append(b, p.CachePrefix...)
		b = append(b, '@')
	}
	b = append(b, model...)
	if lineage == vllmLineageB {
		b = append(b, p.StoreNamespace...)
	}
	b = append(b, "@tp_rank:"...)
	b = strconv.AppendInt(b, int64(r), 10)
	b = append(b, "@pcp"...)
	b = strconv.AppendInt(b, int64(pcp), 10)
	b = append(b, "@dcp"...)
	b = strconv.AppendInt(b, int64(dcp), 10)
	b = append(b, "@pp_rank:"...)
	b = strconv.AppendInt(b, int64(pp), 10)
	if lineage == vllmLineageB {
		b = append(b, "@group:"...)
		b = strconv.AppendInt(b, int64(p.KVGroup), 10)
	}
	b = append(b, '@')
	return appendHexBytes(b, h)
}

func appendHexBytes(b, h []byte) []byte {
	const digits = "0123456789abcdef"
	for _, c := range h {
		b = append(b, digits[c>>4], digits[c&15])
	}
	return b
}

// vllmChunkKeys returns the keys of one chunk keyed by h: this rank's key (save), or the key
// of every rank namespace a lookup checks: every PCP × DCP rank × distinct key TP rank × PP
// stage.
func vllmChunkKeys(lineage string, p *Params, model string, set KeySet, h []byte) []string {
	if set == KeySetSave {
		return []string{string(vllmKey(nil, lineage, p, model, vllmKeyRank(lineage, p, p.TPRank), p.PCPRank, p.DCPRank, p.PPRank, h))}
	}
	var ranks []int
	for r := 0; r < size1(p.TPSize); r++ {
		if k := vllmKeyRank(lineage, p, r); len(ranks) == 0 || ranks[len(ranks)-1] != k {
			ranks = append(ranks, k)
		}
	}
	var out []string
	for pcp := 0; pcp < size1(p.PCPSize); pcp++ {
		for dcp := 0; dcp < size1(p.DCPSize); dcp++ {
			for _, r := range ranks {
				for pp := 0; pp < size1(p.PPSize); pp++ {
					out = append(out, string(vllmKey(nil, lineage, p, model, r, pcp, dcp, pp, h)))
				}
			}
		}
	}
	return out
}

func deriveVLLM(s *Scheme, hf vllmHashFn, lineage string, p *Params, tokens []int64, set KeySet) (*Result, error) {
	b := p.TokensPerBlock
	if b < 1 || b > MaxTokensPerBlock {
		return nil, fmt.Errorf("block size %d: must be in [1, %d]", b, MaxTokensPerBlock)
	}
	if hb := p.HashBlockSize; hb != 0 && lineage == vllmLineageB && (hb < 0 || b%hb != 0) {
		return nil, fmt.Errorf("hash block size %d: must divide the block size %d", hb, b)
	}
	if set != KeySetNone {
		if err := checkVLLMLayout(lineage, p); err != nil {
			return nil, err
		}
	}
	c, err := hashVLLM(hf, p, tokens, false)
	if err != nil {
		return nil, err
	}
	hb := c.hashBlock
	r := &Result{Scheme: s.Name, Seed: c.noneHash, Blocks: make([]Block, len(c.hashes)), KeyTokensPerBlock: b,
		UncoveredTokens: len(tokens) - len(c.hashes)*hb}
	for i, h := range c.hashes {
		r.Blocks[i] = Block{Index: i, Start: i * hb, End: (i + 1) * hb, Hash: h}
	}
	if set == KeySetNone {
		return r, nil
	}
	model := vllmModelName(p.Model)
	attach := func(blk, cs, ce int) {
		bl := &r.Blocks[blk]
		if cs != bl.Start || ce != bl.End {
			bl.ChunkStart, bl.ChunkEnd = cs, ce
		}
		bl.Keys = vllmChunkKeys(lineage, p, model, set, bl.Hash)
	}
	full := len(tokens) / b
	if lineage == vllmLineageA {
		for c := 0; c < full && c < len(r.Blocks); c++ {
			attach(c, c*b, (c+1)*b)
		}
		return r, nil
	}
	for c := 0; c < full; c++ {
		attach((c+1)*b/hb-1, c*b, (c+1)*b)
	}
	// A lookup may end on a partial chunk that ends on a hash block.
	if end := len(r.Blocks) * hb; set == KeySetLookup && end > full*b {
		attach(len(r.Blocks)-1, full*b, end)
	}
	return r, nil
}
