package keys

import "github.com/zeebo/blake3"

// ChecksumSize is the size of a page checksum in bytes.
const ChecksumSize = 32

// Checksum is the BLAKE3-256 digest of a page payload. The pool takes it when a page is put and
// verifies it on every get, so a corrupted page is an error rather than wrong KV.
type Checksum [ChecksumSize]byte

// PageChecksum returns the BLAKE3-256 digest of a page payload.
func PageChecksum(page []byte) Checksum { return blake3.Sum256(page) }
