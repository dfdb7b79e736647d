package gpu

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
)

// Page checks on the GPU (kernels/pagesum.cu) compute the XXH3-64 digest (seed 0) of every unit
// of a batch (a page under 128 KiB, or a 64 KiB piece of a longer one) where it lies in engine
// memory, after the pages were copied there, and the host combines a page's units into its
// checksum. The pool took the same checksum when the page was written (core/keys.PageChecksum),
// so a load can be checked without the host reading each page a second time.

// xxh3Secret is XXH3's default 192-byte secret, the "kSecret" of the specification
// (https://github.com/Cyan4973/xxHash/blob/v0.8.2/doc/xxhash_spec.md).
var xxh3Secret = [192]byte{
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

// pageSumSecret is the kernel's kvSecret: the secret's words the hash reads, in the kernel's
// layout (three arrays of little-endian words, 320 bytes).
type pageSumSecret struct {
	acc   [24]uint64 // word at byte 8k
	last  [8]uint64  // word at byte 121 + 8i
	merge [8]uint64  // word at byte 11 + 8i
}

func newPageSumSecret() pageSumSecret {
	var s pageSumSecret
	for k := range s.acc {
		s.acc[k] = binary.LittleEndian.Uint64(xxh3Secret[8*k:])
	}
	for i := range 8 {
		s.last[i] = binary.LittleEndian.Uint64(xxh3Secret[121+8*i:])
		s.merge[i] = binary.LittleEndian.Uint64(xxh3Secret[11+8*i:])
	}
	return s
}

// bytes returns the secret as the kernel parameter's bytes.
func (s pageSumSecret) bytes() []byte {
	out := make([]byte, 0, 320)
	for _, w := range s.acc {
		out = binary.LittleEndian.AppendUint64(out, w)
	}
	for _, w := range s.last {
		out = binary.LittleEndian.AppendUint64(out, w)
	}
	for _, w := range s.merge {
		out = binary.LittleEndian.AppendUint64(out, w)
	}
	return out
}

// minCheckedPage is the shortest page the kernel hashes: XXH3 takes another path at 240 bytes
// and below.
const minCheckedPage = 241

// errNotCheckable is wrapped by pageCheckable's reasons.
var errNotCheckable = errors.New("pages cannot be checked on the GPU")

// pageCheckable reports whether every page of l, in engine memory at base, can be checked by the
// kernel: longer than 240 bytes, every region a multiple of 64 bytes and 8-byte aligned, so that
// every 64-byte stripe lies inside one region. It returns nil or the reason it cannot.
func pageCheckable(l kvmem.Layout, base uint64) error {
	if base%8 != 0 {
		return fmt.Errorf("%w: engine memory at %#x is not 8-byte aligned", errNotCheckable, base)
	}
	for g, gl := range l.Groups {
		if n := gl.BytesPerPage(); n < minCheckedPage {
			return fmt.Errorf("%w: group %d pages hold %d bytes (at most 240 take another hash path)", errNotCheckable, g, n)
		}
		if n := gl.ReplicatedBytesPerPage(); n > 0 && n < minCheckedPage {
			return fmt.Errorf("%w: group %d replicated pages hold %d bytes (at most 240 take another hash path)", errNotCheckable, g, n)
		}
		for _, rs := range [][]kvmem.Region{gl.Regions, gl.ReplicatedRegions} {
			for _, r := range rs {
				if r.Size%64 != 0 || r.Offset%8 != 0 || r.Stride%8 != 0 {
					return fmt.Errorf("%w: group %d has a region of %d bytes at offset %d, stride %d (needs multiples of 64 bytes, 8-byte aligned)",
						errNotCheckable, g, r.Size, r.Offset, r.Stride)
				}
			}
		}
	}
	return nil
}

// checkChunkMin is the smallest batch a checked scatter splits into chunks.
var checkChunkMin = 16 << 20

// checkChunkEnds splits a checked scatter of pages (their sources) into chunks whose checks run
// while the next chunk is copied: the first holds about half the bytes, each next one half of
// what is left, and the last, whose check no copy overlaps, an eighth. It returns the index after
// each chunk's last page; a batch under checkChunkMin is one chunk.
func checkChunkEnds(src [][]byte) []int {
	var total int
	for _, b := range src {
		total += len(b)
	}
	if total < checkChunkMin {
		return []int{len(src)}
	}
	var ends []int
	acc, next := 0, total/2
	for i, b := range src {
		acc += len(b)
		if acc >= next && i+1 < len(src) && len(ends) < 3 {
			ends = append(ends, i+1)
			next += (total - next) / 2
		}
	}
	return append(ends, len(src))
}

// checkPiece is one region of a page to check: page index, device address, offset in the page,
// length.
type checkPiece struct {
	page           int
	addr, off, len uint64
}

// checkUnits appends to units the pieces of each page of src that its checksum hashes on its own
// (keys.ChecksumChunks: the whole page under 128 KiB, 64 KiB pieces beyond), which the kernels
// check as pages of their own; to first the index of each page's first unit, then the number of
// units; and to out the batch's regions (pieces, in page order) cut where units end, each with
// its unit as its page and its offset in the unit. The host combines a page's units' digests
// (keys.CombineChecksums).
func checkUnits(units [][]byte, first []int, out, pieces []checkPiece, src [][]byte) ([][]byte, []int, []checkPiece) {
	for _, b := range src {
		first = append(first, len(units))
		k := keys.ChecksumChunks(len(b))
		for i := range k {
			units = append(units, checkUnit(b, i, k))
		}
	}
	first = append(first, len(units))
	for _, pc := range pieces {
		n := len(src[pc.page])
		k, u0 := keys.ChecksumChunks(n), first[pc.page]
		if k == 1 {
			pc.page = u0
			out = append(out, pc)
			continue
		}
		for pc.len > 0 {
			i := min(int(pc.off/keys.ChecksumChunk), k-1)
			end := uint64(n)
			if i < k-1 {
				end = uint64(i+1) * keys.ChecksumChunk
			}
			l := min(pc.len, end-pc.off)
			out = append(out, checkPiece{page: u0 + i, addr: pc.addr, off: pc.off - uint64(i)*keys.ChecksumChunk, len: l})
			pc.addr, pc.off, pc.len = pc.addr+l, pc.off+l, pc.len-l
		}
	}
	return units, first, out
}

// Sizes of kvUnitCheck's descriptors (kernels/pagesum.cu): kvPage and kvPiece.
const (
	pageDescBytes  = 24
	pieceDescBytes = 24
)

// describeUnits writes kvUnitCheck's descriptors of units (their regions pieces, in unit order,
// each with its unit as its page) into buf: a kvPage per unit (length, first piece, number of
// pieces, and the address of its piece when it has only one, which spares the kernel reading the
// piece's descriptor before the unit's bytes), then a kvPiece per region. buf holds
// len(units)*pageDescBytes + len(pieces)*pieceDescBytes bytes.
func describeUnits(buf []byte, pieces []checkPiece, units [][]byte) {
	le := binary.LittleEndian
	piecesAt := len(units) * pageDescBytes
	for u, b := range units {
		d := buf[u*pageDescBytes:]
		le.PutUint64(d[0:], uint64(len(b)))
		le.PutUint64(d[8:], 0)
		le.PutUint64(d[16:], 0)
	}
	for k, pc := range pieces {
		q := buf[piecesAt+k*pieceDescBytes:]
		le.PutUint64(q[0:], pc.addr)
		le.PutUint64(q[8:], pc.off)
		le.PutUint64(q[16:], pc.len)
		d := buf[pc.page*pageDescBytes:]
		if pc.off == 0 {
			le.PutUint32(d[8:], uint32(k))
		}
		le.PutUint32(d[12:], le.Uint32(d[12:])+1)
	}
	for u := range units {
		d := buf[u*pageDescBytes:]
		if le.Uint32(d[12:]) == 1 {
			le.PutUint64(d[16:], pieces[le.Uint32(d[8:])].addr)
		}
	}
}

// unitBounds returns the most units and unit regions checkUnits can make of the pages src in
// pieces regions: a page has keys.ChecksumChunks units, and each boundary between two of a
// page's units splits at most one of its regions in two.
func unitBounds(src [][]byte, pieces int) (units, regions int) {
	regions = pieces
	for _, b := range src {
		k := keys.ChecksumChunks(len(b))
		units += k
		regions += k - 1
	}
	return units, regions
}

// checkUnit is unit i of the k units of page b (keys.ChecksumChunks).
func checkUnit(b []byte, i, k int) []byte {
	if i == k-1 {
		return b[i*keys.ChecksumChunk:]
	}
	return b[i*keys.ChecksumChunk : (i+1)*keys.ChecksumChunk]
}

// unitDigest is the checksum of page p (n bytes) from its units' digests: units first[p] to
// first[p+1] of digests (little-endian, 8 bytes each), combined as keys.CombineChecksums does;
// with first empty, every page is one unit, unit p.
func unitDigest(digests []byte, first []int, p, n int) uint64 {
	if len(first) == 0 {
		return binary.LittleEndian.Uint64(digests[8*p:])
	}
	a, b := first[p], first[p+1]
	if b-a == 1 {
		return binary.LittleEndian.Uint64(digests[8*a:])
	}
	var buf [64]uint64
	sums := buf[:0]
	for u := a; u < b; u++ {
		sums = append(sums, binary.LittleEndian.Uint64(digests[8*u:]))
	}
	return uint64(keys.CombineChecksums(n, sums))
}

// checkedCopy is one kvCheckedCopy record of kvCopyCheck (kernels/pagesum.cu): a copy of at most
// copyChunk bytes inside one page, and where its page's sums are.
type checkedCopy struct {
	src, dst, len uint64
	off           uint64 // offset in the page, a multiple of 64
	base          uint64 // the page's first sum, in groups of 8 (fusedSums of the pages before it)
	pageLen       uint64
	page          uint32 // the page's index in the batch
	pageCopies    uint32 // the page's number of copies
}

// fusedSums is how many sums a lane of a page of n bytes takes in a fused check: one per full
// 1024-byte block, one for the rest of the stripes but the last, one for the last stripe.
func fusedSums(n uint64) uint64 { return (n-1)/1024 + 2 }

// copyChunk is the most one block of the copy kernels moves.
const copyChunk = 64 << 10

// checkedCopies appends to dst the copy records that move a checked batch's pieces (in page
// order, every page of src listed) with kvCopyCheck: adjacent pieces of a page that are adjacent
// in engine memory too are one copy, and copies are cut at copyChunk bytes. A page's source is
// the len(src[p]) bytes at srcAddr(p). It reports false when the kernel cannot take the batch:
// a source, destination or length that is not a multiple of 16 bytes, or a piece at a page
// offset or a page length that is not a multiple of 64.
func checkedCopies(dst []checkedCopy, pieces []checkPiece, src [][]byte, srcAddr func(page int) uint64) ([]checkedCopy, bool) {
	first := len(dst)
	var base uint64 // the sums of the pages before page, in groups of 8
	page := 0
	var cur checkedCopy
	curPage := -1
	flush := func() bool {
		if curPage < 0 {
			return true
		}
		if (cur.src|cur.dst|cur.len)%16 != 0 || cur.off%64 != 0 {
			return false
		}
		for o := uint64(0); o < cur.len; o += copyChunk {
			c := cur
			c.src, c.dst, c.off, c.len = cur.src+o, cur.dst+o, cur.off+o, min(copyChunk, cur.len-o)
			dst = append(dst, c)
		}
		curPage = -1
		return true
	}
	for _, pc := range pieces {
		if pc.page < page || pc.page >= len(src) {
			return dst, false // not in page order
		}
		for ; page < pc.page; page++ {
			base += fusedSums(uint64(len(src[page])))
		}
		if curPage == pc.page && cur.dst+cur.len == pc.addr && cur.off+cur.len == pc.off {
			cur.len += pc.len
			continue
		}
		if !flush() {
			return dst, false
		}
		n := uint64(len(src[pc.page]))
		if n%64 != 0 || n < minCheckedPage {
			return dst, false
		}
		cur = checkedCopy{src: srcAddr(pc.page) + pc.off, dst: pc.addr, len: pc.len, off: pc.off, base: base, pageLen: n, page: uint32(pc.page)}
		curPage = pc.page
	}
	if !flush() {
		return dst, false
	}
	// Each page's copies are consecutive: count them into every one of them.
	for a := first; a < len(dst); {
		b := a + 1
		for b < len(dst) && dst[b].page == dst[a].page {
			b++
		}
		for k := a; k < b; k++ {
			dst[k].pageCopies = uint32(b - a)
		}
		a = b
	}
	return dst, true
}
