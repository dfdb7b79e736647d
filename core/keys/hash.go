package keys

import (
	"encoding/hex"
	"fmt"
)

// HashSize is the size of a block hash in bytes: BLAKE2b with a 16-byte digest.
const HashSize = 16

// Hash is one block's hash: the digest of its parent hash (or the scope seed) and its tokens.
type Hash [HashSize]byte

// String returns the 32-character lowercase hex form used in pool keys.
func (h Hash) String() string { return hex.EncodeToString(h[:]) }

// ParseHash reads the 32-character hex form of a block hash.
func ParseHash(s string) (Hash, error) {
	var h Hash
	if len(s) != 2*HashSize {
		return h, fmt.Errorf("block hash %q: want %d hex characters, got %d", s, 2*HashSize, len(s))
	}
	if _, err := hex.Decode(h[:], []byte(s)); err != nil {
		return h, fmt.Errorf("block hash %q: %w", s, err)
	}
	return h, nil
}
