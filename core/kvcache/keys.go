package kvcache

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/kvctl/kvctl/core/keys"
)

// blockKey chains a block's tokens onto its parent's key: SHA-256 of the parent key and the
// tokens as u32 little-endian, cut to keys.HashSize. These keys name blocks inside one
// manager only (they are not pool keys), where 128 bits leave collisions out of reach.
func blockKey(parent keys.Hash, tokens []int32) keys.Hash {
	h := sha256.New()
	h.Write(parent[:])
	var b [4]byte
	for _, v := range tokens {
		binary.LittleEndian.PutUint32(b[:], uint32(v))
		h.Write(b[:])
	}
	var k keys.Hash
	copy(k[:], h.Sum(nil))
	return k
}

// chainKeys returns the keys of the full blocks of tokens, extending have (the keys already
// computed for a prefix of tokens).
func chainKeys(have []keys.Hash, tokens []int32, T int) []keys.Hash {
	var parent keys.Hash
	if len(have) > 0 {
		parent = have[len(have)-1]
	}
	for b := len(have); (b+1)*T <= len(tokens); b++ {
		parent = blockKey(parent, tokens[b*T:(b+1)*T])
		have = append(have, parent)
	}
	return have
}
