package keys

import (
	"encoding/binary"

	"github.com/zeebo/xxh3"
)

// ChecksumSize is the size of a page checksum in bytes.
const ChecksumSize = 8

// Checksum is a page payload's digest: XXH3-64 (seed 0) of the page, taken in pieces of
// ChecksumChunk bytes when the page is long (PageChecksum). The pool takes it when a page is put
// and verifies it on every get, so a corrupted page is an error rather than wrong KV.
//
// XXH3 was chosen by measurement (docs/perf/checksum.md): it hashes at several times the speed
// of a memory copy, so a copy and its check together stay near the copy's speed, where
// BLAKE3-256 halved the pool's throughput. It detects accidental corruption (bit flips, torn or
// stale writes, a page read from the wrong place, pieces of a page swapped): two different pages
// share a digest with a probability of about 2^-64. It is not cryptographic: it does not protect
// against someone who can write pool memory on purpose, who could also rewrite the stored digest.
type Checksum uint64

// ChecksumChunk is the piece a long page's checksum hashes on its own. XXH3 over a whole page is
// one dependent chain of 64-bit steps, one per 1024 bytes, that nothing can split: on a GPU,
// which checks a load's pages after their copies, a 1 MiB page's chain alone took 37 us, 15-25 %
// of the copy of a 12 MiB load. Hashed in pieces of 64 KiB, each chain is 63 steps and the
// pieces of all pages run side by side; on a CPU the pieces cost the same as the whole.
const ChecksumChunk = 64 << 10

// ChecksumChunks is how many pieces the checksum of an n-byte page hashes on its own: one for a
// page shorter than 2 * ChecksumChunk (the page's plain XXH3-64), otherwise n / ChecksumChunk,
// piece i holding bytes [i * ChecksumChunk, (i + 1) * ChecksumChunk) and the last one the rest of
// the page too (ChecksumChunk to 2 * ChecksumChunk - 1 bytes), so that every piece is a long input
// of XXH3.
func ChecksumChunks(n int) int {
	if n < 2*ChecksumChunk {
		return 1
	}
	return n / ChecksumChunk
}

// PageChecksum returns a page payload's checksum: for a page of ChecksumChunks(len(page)) == 1
// piece, its XXH3-64 (seed 0); otherwise CombineChecksums of the XXH3-64 of each piece.
func PageChecksum(page []byte) Checksum {
	k := ChecksumChunks(len(page))
	if k == 1 {
		return Checksum(xxh3.Hash(page))
	}
	return checksumPieces(page, nil, k)
}

// checksumPieces returns the checksum of page, of k > 1 pieces, hashing one piece at a time;
// given src, it first copies each piece of src into page, so the hash reads it from cache.
func checksumPieces(page, src []byte, k int) Checksum {
	var buf [64]uint64
	sums := buf[:0]
	if k > len(buf) {
		sums = make([]uint64, 0, k)
	}
	for i := range k {
		p := checksumPiece(page, i, k)
		if src != nil {
			copy(p, checksumPiece(src, i, k))
		}
		sums = append(sums, xxh3.Hash(p))
	}
	return CombineChecksums(len(page), sums)
}

// checksumPiece returns piece i of the k pieces of page's checksum.
func checksumPiece(page []byte, i, k int) []byte {
	if i == k-1 {
		return page[i*ChecksumChunk:]
	}
	return page[i*ChecksumChunk : (i+1)*ChecksumChunk]
}

// CombineChecksums returns the checksum of an n-byte page of len(sums) pieces
// (ChecksumChunks(n)) from each piece's XXH3-64 digest, in page order: the one digest when there
// is one piece, otherwise the XXH3-64 (seed 0) of the digests and n, each as 8 little-endian
// bytes. A GPU that checks a load computes the pieces' digests; the host combines them.
func CombineChecksums(n int, sums []uint64) Checksum {
	if len(sums) == 1 {
		return Checksum(sums[0])
	}
	var buf [8 * 65]byte
	b := buf[:0]
	if len(sums) >= 65 {
		b = make([]byte, 0, 8*(len(sums)+1))
	}
	for _, s := range sums {
		b = binary.LittleEndian.AppendUint64(b, s)
	}
	b = binary.LittleEndian.AppendUint64(b, uint64(n))
	return Checksum(xxh3.Hash(b))
}

// CopyChecksum copies src into dst (which must be at least len(src) long) and returns the
// checksum of the bytes now in dst. It hashes each piece of the checksum (ChecksumChunks) right
// after copying it, so the hash reads from cache rather than memory: a copy and its check cost
// one pass over memory. Verifying the destination rather than the source also catches a fault in
// the copy.
func CopyChecksum(dst, src []byte) Checksum {
	dst = dst[:len(src)]
	k := ChecksumChunks(len(src))
	if k == 1 { // under 128 KiB: in cache once copied
		copy(dst, src)
		return Checksum(xxh3.Hash(dst))
	}
	return checksumPieces(dst, src, k)
}

// ScatterChecksum copies src into the pieces of dst in order, filling each before the next
// (their lengths must add up to at least len(src); what is past len(src) is left as it was), and
// returns src's checksum (PageChecksum). It hashes each piece of the checksum right after copying
// it, from cache, so a copy into several places (a value whose K and V lie in tensors of their
// own) and its check cost one pass over memory, as CopyChecksum does for one place.
func ScatterChecksum(dst [][]byte, src []byte) Checksum {
	c := pieceCursor{pieces: dst}
	return checksumEach(len(src), func(lo, hi int) uint64 {
		c.put(src[lo:hi])
		return xxh3.Hash(src[lo:hi])
	})
}

// GatherChecksum copies the pieces of src in order into dst (which must be at least as long as
// they are together) and returns the checksum of the bytes now in dst, hashing each piece of the
// checksum right after copying it: CopyChecksum for a value that lies in several places.
func GatherChecksum(dst []byte, src [][]byte) Checksum {
	n := 0
	for _, p := range src {
		n += len(p)
	}
	c := pieceCursor{pieces: src}
	return checksumEach(n, func(lo, hi int) uint64 {
		c.get(dst[lo:hi])
		return xxh3.Hash(dst[lo:hi])
	})
}

// checksumEach returns the checksum of an n-byte page whose checksum pieces' digests piece(lo,
// hi) takes in page order, for each piece [lo, hi) of ChecksumChunks(n).
func checksumEach(n int, piece func(lo, hi int) uint64) Checksum {
	k := ChecksumChunks(n)
	if k == 1 {
		return Checksum(piece(0, n))
	}
	var buf [64]uint64
	sums := buf[:0]
	if k > len(buf) {
		sums = make([]uint64, 0, k)
	}
	for i := range k {
		lo, hi := i*ChecksumChunk, (i+1)*ChecksumChunk
		if i == k-1 {
			hi = n
		}
		sums = append(sums, piece(lo, hi))
	}
	return CombineChecksums(n, sums)
}

// pieceCursor walks a list of byte slices as one run of bytes.
type pieceCursor struct {
	pieces [][]byte
	i, off int // the next byte: pieces[i][off]
}

// put copies b into the run from the cursor on and advances it.
func (c *pieceCursor) put(b []byte) {
	for len(b) > 0 {
		for c.off == len(c.pieces[c.i]) {
			c.i, c.off = c.i+1, 0
		}
		n := copy(c.pieces[c.i][c.off:], b)
		c.off += n
		b = b[n:]
	}
}

// get fills b from the run from the cursor on and advances it.
func (c *pieceCursor) get(b []byte) {
	for len(b) > 0 {
		for c.off == len(c.pieces[c.i]) {
			c.i, c.off = c.i+1, 0
		}
		n := copy(b, c.pieces[c.i][c.off:])
		c.off += n
		b = b[n:]
	}
}
