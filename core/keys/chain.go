package keys

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"math"

	"github.com/zeebo/blake3"
	"golang.org/x/crypto/blake2b"
)

// Limits on a chain's geometry. They are far above any real block size and keep every byte
// count of a window within an int.
const (
	MaxTokensPerBlock  = 1 << 20
	MaxPromptLookahead = 1 << 20
)

// blake3Context is the BLAKE3 key-derivation context of the schemes whose ChainRules.BLAKE3 is
// set (FormatBLAKE3). Digesting in that mode
// separates its hashes from any plain hash of the same bytes.
const blake3Context = "kvctl 2026-11-30 block hash v1"

// encodeBatchBytes bounds the encoding buffer: newly completed blocks are encoded and digested
// in batches of about this many bytes, so the encoded bytes are still in cache when they are
// digested and a chain given a huge prompt holds no prompt-sized buffer afterwards. 16 KiB
// measured a little faster than 64 KiB. A tests hook; it must not change while chains are built.
var encodeBatchBytes = 16 << 10

// ErrTokensShrank is returned (wrapped) by Chain.Extend when the token list is shorter than the
// one it was given before. A chain is append-only.
var ErrTokensShrank = errors.New("token list shrank")

// ChainConfig describes a block hash chain.
type ChainConfig struct {
	// Format selects the derivation; "" means FormatTRTLLM.
	Format Format
	// TokensPerBlock (T) is the number of tokens a block holds, at least 1.
	TokensPerBlock int
	// PromptLookahead (L) is the number of tokens past each block that its hash also covers,
	// at least 0. Only FormatTRTLLMV1 has none.
	PromptLookahead int
	// Scope is the request's reuse scope.
	Scope Scope
}

func (c ChainConfig) format() Format {
	if c.Format == "" {
		return FormatTRTLLM
	}
	return c.Format
}

// Validate returns every problem with the configuration at once, or nil.
func (c ChainConfig) Validate() error {
	var errs []error
	f := c.format()
	rules, known := chainRules(f)
	if !known {
		errs = append(errs, fmt.Errorf("%w %q: want one of %s", ErrUnknownFormat, f, formatList()))
	}
	switch {
	case c.TokensPerBlock < 1:
		errs = append(errs, fmt.Errorf("tokens per block %d: must be at least 1", c.TokensPerBlock))
	case c.TokensPerBlock > MaxTokensPerBlock:
		errs = append(errs, fmt.Errorf("tokens per block %d: must be at most %d", c.TokensPerBlock, MaxTokensPerBlock))
	}
	switch {
	case c.PromptLookahead < 0:
		errs = append(errs, fmt.Errorf("prompt lookahead %d: must be at least 0", c.PromptLookahead))
	case c.PromptLookahead > MaxPromptLookahead:
		errs = append(errs, fmt.Errorf("prompt lookahead %d: must be at most %d", c.PromptLookahead, MaxPromptLookahead))
	case known && c.PromptLookahead > 0 && !rules.Lookahead:
		errs = append(errs, fmt.Errorf("prompt lookahead %d: format %s has no prompt lookahead", c.PromptLookahead, f))
	}
	if known && !rules.FullScope {
		if c.Scope.LoRATaskID != nil {
			errs = append(errs, fmt.Errorf("format %s cannot express a LoRA task id in its scope", f))
		}
		if len(c.Scope.Multimodal) > 0 {
			errs = append(errs, fmt.Errorf("format %s cannot express multimodal digests in its scope", f))
		}
	}
	if uint64(len(c.Scope.salt())) > math.MaxUint32 {
		errs = append(errs, fmt.Errorf("cache salt of %d bytes: must be under 4 GiB", len(c.Scope.salt())))
	}
	return errors.Join(errs...)
}

// Chain hashes a request's tokens block by block, each block's hash covering its parent's.
// It is append-only: Extend is given the whole token list each time and hashes only the blocks
// completed since the previous call. A Chain is not safe for concurrent use.
type Chain struct {
	format    Format
	t, l      int
	seed      Hash
	h         hash.Hash
	sum       [64]byte
	parent    Hash
	buf       []byte
	hashes    []Hash
	tokens    int
	batchBlks int
}

// NewChain validates cfg and returns an empty chain.
func NewChain(cfg ChainConfig) (*Chain, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Chain{format: cfg.format(), t: cfg.TokensPerBlock, l: cfg.PromptLookahead}
	rules, _ := chainRules(c.format)
	if rules.BLAKE3 {
		c.h = blake3.NewDeriveKey(blake3Context)
	} else {
		h, err := blake2b.New(HashSize, nil)
		if err != nil {
			return nil, fmt.Errorf("blake2b: %w", err)
		}
		c.h = h
	}
	c.seed = seedOf(c.h, c.sum[:], rules, cfg.Scope, c.l)
	c.batchBlks = max(1, encodeBatchBytes/(8*c.t))
	return c, nil
}

// Seed returns the scope seed, the parent of block 0.
func (c *Chain) Seed() Hash { return c.seed }

// Len returns the number of blocks hashed so far.
func (c *Chain) Len() int { return len(c.hashes) }

// Tokens returns the length of the token list last given to Extend (0 before the first call),
// including tokens not yet in a hashed block.
func (c *Chain) Tokens() int { return c.tokens }

// Hashes returns the hashes of all blocks so far, block 0 first. The slice shares memory with
// the chain and is not copied: the caller must not modify its elements. Later Extend calls
// never change elements already returned, and appending to the result cannot reach the chain.
func (c *Chain) Hashes() []Hash { return c.hashes[:len(c.hashes):len(c.hashes)] }

// BlockSpan returns the half-open token range [start, end) digested for block i: its own
// T tokens and the L lookahead tokens after them. It is defined for every i >= 0, hashed yet
// or not; for i < 0 it returns 0, 0.
func (c *Chain) BlockSpan(i int) (start, end int) {
	if i < 0 {
		return 0, 0
	}
	return i * c.t, (i+1)*c.t + c.l
}

// blocksFor returns how many full blocks n tokens give: a block is complete once its lookahead
// tokens exist.
func (c *Chain) blocksFor(n int) int {
	if n <= c.l {
		return 0
	}
	return (n - c.l) / c.t
}

// Extend takes the whole token list so far, hashes the blocks it completes and returns their
// hashes (nil when none is new). The returned slice shares memory with the chain, as Hashes
// does. The tokens already hashed must be the same as before; only the length is checked, and
// a shorter list than last time returns an error wrapping ErrTokensShrank and changes nothing.
//
// Newly completed blocks are encoded (int64, little-endian) in batches into one reused buffer
// and digested window by window, so a call allocates only to grow the chain's own storage.
func (c *Chain) Extend(tokens []int64) ([]Hash, error) {
	n := len(tokens)
	if n < c.tokens {
		return nil, fmt.Errorf("%w: %d tokens after %d", ErrTokensShrank, n, c.tokens)
	}
	c.tokens = n
	have, total := len(c.hashes), c.blocksFor(n)
	if total <= have {
		return nil, nil
	}
	if need := total - have; cap(c.hashes)-len(c.hashes) < need {
		grown := make([]Hash, len(c.hashes), len(c.hashes)+max(need, len(c.hashes)))
		copy(grown, c.hashes)
		c.hashes = grown
	}
	// parent lives in the chain: a local array handed to the hasher's interface methods
	// would escape and cost an allocation per call.
	parent := &c.parent
	*parent = c.seed
	if have > 0 {
		*parent = c.hashes[have-1]
	}
	t8, w8 := 8*c.t, 8*(c.t+c.l)
	for b := have; b < total; {
		k := min(c.batchBlks, total-b)
		window := tokens[b*c.t : (b+k)*c.t+c.l]
		c.buf = encode(c.buf, window)
		for off := 0; k > 0; k-- {
			c.h.Reset()
			c.h.Write(parent[:])
			c.h.Write(c.buf[off : off+w8])
			copy(parent[:], c.h.Sum(c.sum[:0]))
			c.hashes = append(c.hashes, *parent)
			off += t8
			b++
		}
	}
	return c.hashes[have:total:total], nil
}

// encode writes tokens as int64 little-endian into buf, growing it if needed, and returns it.
// Eight tokens per step with constant offsets let the compiler drop the bounds checks; this
// loop is a measurable part of a chain's time next to BLAKE2b.
func encode(buf []byte, tokens []int64) []byte {
	need := 8 * len(tokens)
	if cap(buf) < need {
		buf = make([]byte, need)
	}
	buf = buf[:need]
	b := buf
	for len(tokens) >= 8 && len(b) >= 64 {
		t, w := tokens[:8], b[:64]
		binary.LittleEndian.PutUint64(w[0:8], uint64(t[0]))
		binary.LittleEndian.PutUint64(w[8:16], uint64(t[1]))
		binary.LittleEndian.PutUint64(w[16:24], uint64(t[2]))
		binary.LittleEndian.PutUint64(w[24:32], uint64(t[3]))
		binary.LittleEndian.PutUint64(w[32:40], uint64(t[4]))
		binary.LittleEndian.PutUint64(w[40:48], uint64(t[5]))
		binary.LittleEndian.PutUint64(w[48:56], uint64(t[6]))
		binary.LittleEndian.PutUint64(w[56:64], uint64(t[7]))
		tokens, b = tokens[8:], b[64:]
	}
	for i, v := range tokens {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
	}
	return buf
}
