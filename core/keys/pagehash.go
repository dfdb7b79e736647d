package keys

import (
	"encoding/hex"
	"fmt"
)

// MaxDigestSize is the longest block digest of any scheme kvctl serve's connector runs: the
// 32 bytes of SHA-256 (vLLM's default). TensorRT-LLM's and xxh3's are 16.
const MaxDigestSize = 32

// PageHash is one block's hash as kvctl serve's connector carries it, whatever the scheme: the
// 16-byte Hash of TensorRT-LLM's schemes, or a vLLM digest of 16 (xxh3-128) or 32 (SHA-256)
// bytes. It is a comparable value (a map key) and holds its bytes inline. The zero value is
// empty (Len 0).
type PageHash struct {
	b [MaxDigestSize]byte
	n uint8
}

// PageHashOf returns h as a PageHash.
func PageHashOf(h Hash) PageHash {
	var p PageHash
	copy(p.b[:], h[:])
	p.n = HashSize
	return p
}

// ParsePageHash returns the digest b (16 or 32 bytes) as a PageHash.
func ParsePageHash(b []byte) (PageHash, error) {
	var p PageHash
	if len(b) != HashSize && len(b) != MaxDigestSize {
		return p, fmt.Errorf("block hash of %d bytes: want %d or %d", len(b), HashSize, MaxDigestSize)
	}
	copy(p.b[:], b)
	p.n = uint8(len(b))
	return p, nil
}

// Len returns the digest's length in bytes.
func (p PageHash) Len() int { return int(p.n) }

// Bytes returns a copy of the digest.
func (p PageHash) Bytes() []byte { return append([]byte(nil), p.b[:p.n]...) }

// Hash returns the digest as a TensorRT-LLM Hash, and false when it is not 16 bytes long.
func (p PageHash) Hash() (Hash, bool) {
	var h Hash
	if p.n != HashSize {
		return h, false
	}
	copy(h[:], p.b[:HashSize])
	return h, true
}

// AppendHex appends the digest in lowercase hex, as a key ends.
func (p PageHash) AppendHex(b []byte) []byte { return appendHexBytes(b, p.b[:p.n]) }

// String returns the lowercase hex form.
func (p PageHash) String() string { return hex.EncodeToString(p.b[:p.n]) }
