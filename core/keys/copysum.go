package keys

import (
	"encoding/binary"
	"math/bits"
)

// The pieces of XXH3-64 (seed 0, default secret) that CopyChecksum runs itself for pages longer
// than checksumChunk, so that each piece is hashed right after it is copied without the
// streaming hasher's extra copy of every byte into its own buffer. The digest is the one
// PageChecksum returns (TestCopyChecksumMatchesPageChecksum, FuzzCopyChecksum); the
// specification is https://github.com/Cyan4973/xxHash/blob/v0.8.2/doc/xxhash_spec.md.

const (
	xxh3Stripe       = 64                                // bytes one accumulate step reads
	xxh3SecretSize   = 192                               // the default secret's length
	xxh3StripesBlock = (xxh3SecretSize - xxh3Stripe) / 8 // stripes between scrambles (16)
	xxh3Block        = xxh3StripesBlock * xxh3Stripe     // bytes between scrambles (1024)
	xxh3Prime32_1    = 0x9E3779B1                        // PRIME32_1
	xxh3Prime64_1    = 0x9E3779B185EBCA87                // PRIME64_1
	xxh3LastStripe   = xxh3SecretSize - xxh3Stripe - 7   // secret offset of the last stripe
	xxh3MergeSecret  = 11                                // secret offset the merge reads
	xxh3Scramble     = xxh3SecretSize - xxh3Stripe       // secret offset the scramble reads
	xxh3LongMin      = 241                               // shortest input of the long hash
)

// xxh3Secret is XXH3's default secret ("kSecret" in the specification).
var xxh3Secret = [xxh3SecretSize]byte{
	0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
	0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
	0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
	0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
	0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
	0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
	0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
	0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
	0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
	0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
	0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
	0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
}

// xxh3Acc is the long hash's state: eight 64-bit lanes.
type xxh3Acc [8]uint64

func newXXH3Acc() xxh3Acc {
	return xxh3Acc{
		0xC2B2AE3D, 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
		0x85EBCA77C2B2AE63, 0x85EBCA77, 0x27D4EB2F165667C5, 0x9E3779B1,
	}
}

func secretWord(off int) uint64 { return binary.LittleEndian.Uint64(xxh3Secret[off:]) }

// stripe adds one 64-byte stripe p to the lanes with the secret read from byte sec.
func (a *xxh3Acc) stripe(p []byte, sec int) {
	_ = p[xxh3Stripe-1]
	for i := range 8 {
		v := binary.LittleEndian.Uint64(p[8*i:])
		k := v ^ secretWord(sec+8*i)
		a[i^1] += v
		a[i] += (k & 0xFFFFFFFF) * (k >> 32)
	}
}

// scramble mixes the lanes after every block.
func (a *xxh3Acc) scramble() {
	for i := range 8 {
		x := a[i]
		x ^= x >> 47
		x ^= secretWord(xxh3Scramble + 8*i)
		a[i] = x * xxh3Prime32_1
	}
}

// blocksGeneric adds len(p)/xxh3Block whole blocks, each followed by its scramble.
func (a *xxh3Acc) blocksGeneric(p []byte) {
	for ; len(p) >= xxh3Block; p = p[xxh3Block:] {
		for s := range xxh3StripesBlock {
			a.stripe(p[s*xxh3Stripe:], s*8)
		}
		a.scramble()
	}
}

// finish hashes what follows the last scrambled block (tail, at most one block) and returns the
// digest of an input of n bytes whose last 64 bytes are last.
func (a *xxh3Acc) finish(tail, last []byte, n int) uint64 {
	stripes := (len(tail) - 1) / xxh3Stripe
	for s := range stripes {
		a.stripe(tail[s*xxh3Stripe:], s*8)
	}
	a.stripe(last[len(last)-xxh3Stripe:], xxh3LastStripe)
	h := uint64(n) * xxh3Prime64_1
	for i := 0; i < 8; i += 2 {
		hi, lo := bits.Mul64(a[i]^secretWord(xxh3MergeSecret+8*i), a[i+1]^secretWord(xxh3MergeSecret+8*i+8))
		h += hi ^ lo
	}
	h ^= h >> 37
	h *= 0x165667919E3779F9
	return h ^ h>>32
}

// copyChecksumBlocks is CopyChecksum for inputs of xxh3LongMin bytes or more: it copies
// checksumChunk bytes at a time and adds each piece's whole blocks to the lanes while the piece
// is still in cache, reading the copy in dst.
func copyChecksumBlocks(dst, src []byte) Checksum {
	n := len(src)
	dst = dst[:n]
	scrambled := (n - 1) / xxh3Block // the blocks followed by a scramble; the rest is the tail
	a := newXXH3Acc()
	done := 0
	for off := 0; off < n; off += checksumChunk {
		end := min(off+checksumChunk, n)
		copy(dst[off:end], src[off:end])
		if upto := min(end/xxh3Block, scrambled); upto > done {
			accumBlocks(&a, dst[done*xxh3Block:upto*xxh3Block])
			done = upto
		}
	}
	return Checksum(a.finish(dst[done*xxh3Block:], dst, n))
}
