package keys

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// SGLang's HiCache schemes with the mooncake storage backend. Page hash i is
// SHA-256(prior ‖ u32le(t) for each token t of page i), where prior is the previous page's
// 32-byte hash, or for a new chain nothing, or (after SGLang PR #38577) a namespace seed
// SHA-256("sglang-cache-namespace-v1" ‖ part(extra_key) ‖ part(cache_salt)) when either is set,
// part(None) = 00 and part(s) = 01 ‖ u64le(len) ‖ utf8(s). With EAGLE bigram keys a unit is
// the pair (t_j, t_{j+1}). Each page is stored as a K and a V object per TP rank (MHA) or one
// object (MLA), named after the page hash with the served model name and backend tag in front.

const sglangNamespaceDomain = "sglang-cache-namespace-v1"

// SGLang key lineages.
const (
	sglangNewest = "newest"
	sglangOlder  = "older"
)

func init() {
	base := []Input{InputTokensPerBlock, InputBigram, InputPriorHash, InputBackendTag, InputWorldSize, InputRank, InputMLA}
	newest := append(append([]Input(nil), base...), InputModel, InputPPRank, InputPPSize, InputTPLCMSize)
	RegisterScheme(Scheme{
		Name: "sglang", Engine: EngineSGLang,
		Summary:    "SGLang HiCache on Mooncake: page hashes seeded by extra_key and cache_salt (PR #38577), model-prefixed keys",
		Seed:       `SHA-256("sglang-cache-namespace-v1" ‖ part(extra_key) ‖ part(cache_salt)) when either is set; none otherwise`,
		Serializer: "u32le tokens", Digest: digestSHA256, TokensPerBlock: 1,
		KeyLayout: "[tag_][served model, / as -_]{hex64}_{tp}[_{pp}]_k|_v (MHA), …__k or …_{pp}_k (MLA)",
		Inputs:    append(append([]Input(nil), newest...), InputExtraKey, InputCacheSalt),
		derive: func(s *Scheme, p *Params, tokens []int64, set KeySet) (*Result, error) {
			return deriveSGLang(s, sglangNewest, true, p, tokens, set)
		},
	})
	RegisterScheme(Scheme{
		Name: "sglang-pre-38577", Engine: EngineSGLang,
		Summary:    "SGLang HiCache on Mooncake before PR #38577: no namespace seed (extra_key and cache_salt share pages)",
		Seed:       "none",
		Serializer: "u32le tokens", Digest: digestSHA256, TokensPerBlock: 1,
		KeyLayout: "as sglang",
		Inputs:    newest,
		derive: func(s *Scheme, p *Params, tokens []int64, set KeySet) (*Result, error) {
			return deriveSGLang(s, sglangNewest, false, p, tokens, set)
		},
	})
	RegisterScheme(Scheme{
		Name: "sglang-legacy", Engine: EngineSGLang,
		Summary:    "SGLang's older mooncake_store key layout: no model name, no PP, no namespace seed",
		Seed:       "none",
		Serializer: "u32le tokens", Digest: digestSHA256, TokensPerBlock: 1,
		KeyLayout: "[tag_]{hex64}_{tp}_k|_v (MHA), [tag_]{hex64}_k (MLA)",
		Inputs:    base,
		derive: func(s *Scheme, p *Params, tokens []int64, set KeySet) (*Result, error) {
			return deriveSGLang(s, sglangOlder, false, p, tokens, set)
		},
	})
}

func appendNSPart(b []byte, s *string) []byte {
	if s == nil {
		return append(b, 0)
	}
	b = append(b, 1)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(*s)))
	return append(b, *s...)
}

// sglangNamespaceSeed returns the namespace seed of a new chain, nil when neither is set.
func sglangNamespaceSeed(extraKey, salt *string) []byte {
	if extraKey == nil && salt == nil {
		return nil
	}
	b := appendNSPart([]byte(sglangNamespaceDomain), extraKey)
	b = appendNSPart(b, salt)
	s := sha256.Sum256(b)
	return s[:]
}

// sglangUnits returns the number of hashed units: tokens, or bigrams (n tokens give n−1).
func sglangUnits(n int, bigram bool) int {
	if bigram {
		return max(n-1, 0)
	}
	return n
}

// sglangPagePreimage appends page i's bytes after prior.
func sglangPagePreimage(b []byte, prior []byte, tokens []int64, page, size int, bigram bool) []byte {
	b = append(b, prior...)
	for u := page * size; u < (page+1)*size; u++ {
		b = binary.LittleEndian.AppendUint32(b, uint32(tokens[u]))
		if bigram {
			b = binary.LittleEndian.AppendUint32(b, uint32(tokens[u+1]))
		}
	}
	return b
}

func checkU32Tokens(tokens []int64) error {
	for i, t := range tokens {
		if t < 0 || t > math.MaxUint32 {
			return fmt.Errorf("%w: token %d at position %d: SGLang hashes ids as unsigned 32-bit (its get_hash_str raises OverflowError)", ErrTokenOutOfRange, t, i)
		}
	}
	return nil
}

func checkSGLangLayout(lineage string, p *Params) error {
	var errs []error
	tp := size1(p.TPSize)
	if p.TPSize < 0 || p.TPSize > maxParallelSize || p.TPRank < 0 || p.TPRank >= tp {
		errs = append(errs, fmt.Errorf("tp rank %d of %d: want 0 <= rank < size <= %d", p.TPRank, p.TPSize, maxParallelSize))
	}
	if p.PPSize < 0 || p.PPSize > maxParallelSize || p.PPRank < 0 || p.PPRank >= size1(p.PPSize) {
		errs = append(errs, fmt.Errorf("pp rank %d of %d: want 0 <= rank < size <= %d", p.PPRank, p.PPSize, maxParallelSize))
	}
	if p.TPLCMSize != 0 {
		if p.MLA {
			errs = append(errs, errors.New("tp_lcm_size splits heads of an MHA model; an MLA model has one object per page"))
		}
		if p.TPLCMSize < tp || p.TPLCMSize%tp != 0 || p.TPLCMSize > maxParallelSize {
			errs = append(errs, fmt.Errorf("tp_lcm_size %d: must be a multiple of the tp size %d, at most %d", p.TPLCMSize, tp, maxParallelSize))
		}
	}
	if lineage == sglangOlder && size1(p.PPSize) > 1 {
		errs = append(errs, errors.New("the older SGLang key layout has no PP stage"))
	}
	return errors.Join(errs...)
}

// sglangPrefix is the part of every key before the page hash.
func sglangPrefix(lineage string, p *Params) string {
	var parts []string
	if p.BackendTag != "" {
		parts = append(parts, p.BackendTag)
	}
	if lineage == sglangNewest && p.Model != "" {
		parts = append(parts, strings.ReplaceAll(p.Model, "/", "-"))
	}
	if len(parts) == 0 {
		return ""
	}
	return strings.Join(parts, "_") + "_"
}

// sglangRankKeys appends the objects TP rank tp of PP stage pp writes for one page.
func sglangRankKeys(dst []string, lineage string, p *Params, base string, tp, pp int) []string {
	if lineage == sglangOlder {
		if p.MLA {
			return append(dst, base+"_k")
		}
		r := strconv.Itoa(tp)
		return append(dst, base+"_"+r+"_k", base+"_"+r+"_v")
	}
	multiPP := size1(p.PPSize) > 1
	if p.MLA {
		if multiPP {
			return append(dst, base+"_"+strconv.Itoa(pp)+"_k")
		}
		return append(dst, base+"__k")
	}
	lo, hi := tp, tp+1
	if p.TPLCMSize != 0 {
		f := p.TPLCMSize / size1(p.TPSize)
		lo, hi = tp*f, tp*f+f
	}
	for r := lo; r < hi; r++ {
		suffix := "_" + strconv.Itoa(r)
		if multiPP {
			suffix += "_" + strconv.Itoa(pp)
		}
		dst = append(dst, base+suffix+"_k", base+suffix+"_v")
	}
	return dst
}

// sglangPageKeys returns a page's keys: this rank's objects (save), or every rank's and
// stage's (lookup). MLA pages are the same object on every TP rank.
func sglangPageKeys(lineage string, p *Params, set KeySet, prefix string, h []byte) []string {
	base := string(appendHexBytes([]byte(prefix), h))
	if set == KeySetSave {
		return sglangRankKeys(nil, lineage, p, base, p.TPRank, p.PPRank)
	}
	var out []string
	tps := size1(p.TPSize)
	if p.MLA {
		tps = 1
	}
	pps := size1(p.PPSize)
	if lineage == sglangOlder {
		pps = 1
	}
	for pp := 0; pp < pps; pp++ {
		for tp := 0; tp < tps; tp++ {
			out = sglangRankKeys(out, lineage, p, base, tp, pp)
		}
	}
	return out
}

// hashSGLang computes the namespace seed (nil when none) and the page hashes.
func hashSGLang(p *Params, tokens []int64, namespaced bool, keepPreimages bool) (seed []byte, hashes, preimages [][]byte, err error) {
	size := p.TokensPerBlock
	if size < 1 || size > MaxTokensPerBlock {
		return nil, nil, nil, fmt.Errorf("page size %d: must be in [1, %d]", size, MaxTokensPerBlock)
	}
	if err := checkU32Tokens(tokens); err != nil {
		return nil, nil, nil, err
	}
	for _, s := range []*string{p.ExtraKey, p.Scope.CacheSalt} {
		if s != nil {
			if err := checkStr("namespace string", *s); err != nil {
				return nil, nil, nil, err
			}
		}
	}
	prior := p.PriorHash
	if prior != nil && len(prior) != sha256.Size {
		return nil, nil, nil, fmt.Errorf("prior page hash of %d bytes: want %d", len(prior), sha256.Size)
	}
	if prior == nil && namespaced {
		seed = sglangNamespaceSeed(p.ExtraKey, p.Scope.CacheSalt)
		prior = seed
	}
	pages := sglangUnits(len(tokens), p.Bigram) / size
	hashes = make([][]byte, 0, pages)
	var buf []byte
	for i := 0; i < pages; i++ {
		buf = sglangPagePreimage(buf[:0], prior, tokens, i, size, p.Bigram)
		h := sha256.Sum256(buf)
		hashes = append(hashes, h[:])
		if keepPreimages {
			preimages = append(preimages, append([]byte(nil), buf...))
		}
		prior = hashes[i]
	}
	return seed, hashes, preimages, nil
}

func deriveSGLang(s *Scheme, lineage string, namespaced bool, p *Params, tokens []int64, set KeySet) (*Result, error) {
	if set != KeySetNone {
		if err := checkSGLangLayout(lineage, p); err != nil {
			return nil, err
		}
	}
	seed, hashes, _, err := hashSGLang(p, tokens, namespaced, false)
	if err != nil {
		return nil, err
	}
	size := p.TokensPerBlock
	r := &Result{Scheme: s.Name, Seed: seed, Blocks: make([]Block, len(hashes)), KeyTokensPerBlock: size,
		UncoveredTokens: len(tokens) - len(hashes)*size}
	prefix := sglangPrefix(lineage, p)
	for i, h := range hashes {
		r.Blocks[i] = Block{Index: i, Start: i * size, End: (i + 1) * size, Hash: h}
		if set != KeySetNone {
			r.Blocks[i].Keys = sglangPageKeys(lineage, p, set, prefix, h)
		}
	}
	return r, nil
}
