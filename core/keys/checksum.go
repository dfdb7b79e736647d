package keys

import "github.com/zeebo/xxh3"

// ChecksumSize is the size of a page checksum in bytes.
const ChecksumSize = 8

// Checksum is the XXH3-64 digest (seed 0) of a page payload. The pool takes it when a page is
// put and verifies it on every get, so a corrupted page is an error rather than wrong KV.
//
// XXH3 was chosen by measurement (docs/perf/checksum.md): it hashes at several times the speed
// of a memory copy, so a copy and its check together stay near the copy's speed, where
// BLAKE3-256 halved the pool's throughput. It detects accidental corruption (bit flips, torn or
// stale writes, a page read from the wrong place): two different pages share a digest with a
// probability of about 2^-64. It is not cryptographic: it does not protect against someone who
// can write pool memory on purpose, who could also rewrite the stored digest.
type Checksum uint64

// PageChecksum returns the XXH3-64 digest of a page payload.
func PageChecksum(page []byte) Checksum { return Checksum(xxh3.Hash(page)) }

// ChecksumWriter computes a page checksum over bytes written in pieces; after the last piece
// Sum returns what PageChecksum returns for the whole page. The zero value is not ready for
// use: take one from NewChecksumWriter.
type ChecksumWriter struct{ h *xxh3.Hasher }

// NewChecksumWriter returns a writer with nothing written.
func NewChecksumWriter() ChecksumWriter { return ChecksumWriter{h: xxh3.New()} }

// Write adds p to the page. It never fails.
func (w ChecksumWriter) Write(p []byte) { _, _ = w.h.Write(p) }

// Sum returns the checksum of everything written since the writer was made or Reset.
func (w ChecksumWriter) Sum() Checksum { return Checksum(w.h.Sum64()) }

// Reset forgets what was written.
func (w ChecksumWriter) Reset() { w.h.Reset() }

// checksumChunk is the piece CopyChecksum copies and then hashes while it is still in the
// core's cache: small enough for L2 on any current x86 or Arm server core, large enough that the
// per-piece overhead stays under 1 %.
const checksumChunk = 64 << 10

// CopyChecksum copies src into dst (which must be at least len(src) long) and returns the
// checksum of the bytes now in dst. It hashes each 64 KiB piece of dst right after copying it,
// so the hash reads from cache rather than memory: a copy and its check cost one pass over
// memory. Verifying the destination rather than the source also catches a fault in the copy.
// On x86-64 with AVX2 the pieces of a page longer than 64 KiB go straight into XXH3's lanes
// (copysum.go); the xxh3 package's streaming hasher would copy every byte once more into its
// own buffer.
func CopyChecksum(dst, src []byte) Checksum {
	dst = dst[:len(src)]
	if len(src) <= checksumChunk {
		copy(dst, src)
		return PageChecksum(dst)
	}
	if haveBlockAsm {
		return copyChecksumBlocks(dst, src)
	}
	w := NewChecksumWriter()
	for off := 0; off < len(src); off += checksumChunk {
		end := min(off+checksumChunk, len(src))
		copy(dst[off:end], src[off:end])
		w.Write(dst[off:end])
	}
	return w.Sum()
}
