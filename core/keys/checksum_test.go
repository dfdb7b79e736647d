package keys

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/zeebo/xxh3"
)

// TestPageChecksumVectors pins the algorithm: XXH3-64 with seed 0, as published by the xxHash
// project (the empty input and its reference test vectors for short inputs), for every page of
// one piece; for longer pages, the digests of pages of a fixed pattern, which change only with
// the definition (a deliberate format change, docs/perf/checksum.md).
func TestPageChecksumVectors(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Checksum
	}{
		{"", 0x2d06800538d394c2},
		{"a", 0xe6c632b61e964e1f},
		{"abc", 0x78af5f94892f3950},
	} {
		if got := PageChecksum([]byte(c.in)); got != c.want {
			t.Errorf("PageChecksum(%q) = %#x, want %#x", c.in, uint64(got), uint64(c.want))
		}
	}
	pattern := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*7 + i>>8)
		}
		return b
	}
	for _, c := range []struct {
		n    int
		want Checksum
	}{
		{64 << 10, 0x9ae973f97c1f3eba},
		{128<<10 - 64, 0x076b66b733e24ef5},
		{128 << 10, 0x436fbc376d61d59c},
		{1 << 20, 0x492960aff737a65d},
		{1<<20 + 64, 0x80d3735b04015679},
	} {
		if got := PageChecksum(pattern(c.n)); got != c.want {
			t.Errorf("PageChecksum of the %d-byte pattern = %#x, want %#x", c.n, uint64(got), uint64(c.want))
		}
	}
}

// TestPageChecksumDefinition checks PageChecksum against its definition written out with the
// xxh3 package: one piece is the page's XXH3-64; more are XXH3-64 of the pieces' digests and the
// length, 8 little-endian bytes each, the last piece holding the rest of the page.
func TestPageChecksumDefinition(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{0, 1, 240, 241, 64 << 10, 128<<10 - 1, 128 << 10, 128<<10 + 1, 192<<10 - 1, 192 << 10, 1 << 20, 1<<20 + 65535, 4<<20 + 3, 5 << 20} {
		page := make([]byte, n)
		for i := range page {
			page[i] = byte(r.Uint32())
		}
		var want uint64
		if n < 128<<10 {
			want = xxh3.Hash(page)
			if ChecksumChunks(n) != 1 {
				t.Fatalf("n=%d: %d pieces, want 1", n, ChecksumChunks(n))
			}
		} else {
			k := n / (64 << 10)
			if ChecksumChunks(n) != k {
				t.Fatalf("n=%d: %d pieces, want %d", n, ChecksumChunks(n), k)
			}
			var b []byte
			for i := range k {
				end := (i + 1) << 16
				if i == k-1 {
					end = n
				}
				b = binary.LittleEndian.AppendUint64(b, xxh3.Hash(page[i<<16:end]))
			}
			want = xxh3.Hash(binary.LittleEndian.AppendUint64(b, uint64(n)))
		}
		if got := PageChecksum(page); uint64(got) != want {
			t.Fatalf("n=%d: PageChecksum %#x, definition %#x", n, uint64(got), want)
		}
	}
}

// TestCopyChecksumMatchesPageChecksum checks that the fused copy gives the whole-page digest and
// the exact bytes at every size around the pieces' boundaries.
func TestCopyChecksumMatchesPageChecksum(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 16, 240, 241, 1024, ChecksumChunk - 1, ChecksumChunk, ChecksumChunk + 1, 2*ChecksumChunk - 1, 2 * ChecksumChunk, 3*ChecksumChunk + 17, 1 << 20, 4<<20 + 3, 5 << 20} {
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(r.Uint32())
		}
		dst := make([]byte, n+5)
		for i := range dst {
			dst[i] = 0xEE
		}
		got := CopyChecksum(dst, src)
		if want := PageChecksum(src); got != want {
			t.Fatalf("n=%d: CopyChecksum = %#x, PageChecksum = %#x", n, uint64(got), uint64(want))
		}
		if !bytes.Equal(dst[:n], src) {
			t.Fatalf("n=%d: copied bytes differ", n)
		}
		if !bytes.Equal(dst[n:], []byte{0xEE, 0xEE, 0xEE, 0xEE, 0xEE}) {
			t.Fatalf("n=%d: CopyChecksum wrote past len(src)", n)
		}
	}
}

// TestChecksumDetectsCorruption flips every bit position class in a 1 MiB page and swaps two
// 64 KiB halves: each must change the digest.
func TestChecksumDetectsCorruption(t *testing.T) {
	page := make([]byte, 1<<20)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range page {
		page[i] = byte(r.Uint32())
	}
	want := PageChecksum(page)
	for _, off := range []int{0, 1, 4095, 4096, 65535, 65536, 1<<20 - 1} {
		for bit := range 8 {
			page[off] ^= 1 << bit
			if PageChecksum(page) == want {
				t.Fatalf("flip of bit %d at %d not detected", bit, off)
			}
			page[off] ^= 1 << bit
		}
	}
	swapped := bytes.Clone(page)
	copy(swapped[:65536], page[65536:131072])
	copy(swapped[65536:131072], page[:65536])
	if PageChecksum(swapped) == want {
		t.Fatal("swapped 64 KiB pieces not detected")
	}
	if PageChecksum(page[:len(page)-1]) == want {
		t.Fatal("truncated page not detected")
	}
}

// FuzzCopyChecksum checks, for any page, that the fused copy gives the whole-page digest and
// the exact bytes, and that a byte changed anywhere changes the digest.
func FuzzCopyChecksum(f *testing.F) {
	f.Add([]byte("abc"), uint32(1))
	f.Add(bytes.Repeat([]byte{7, 1, 9}, 70000), uint32(65535))
	f.Add(bytes.Repeat([]byte{7, 1, 9, 4}, 70000), uint32(200000))
	f.Fuzz(func(t *testing.T, page []byte, at uint32) {
		dst := make([]byte, len(page))
		got := CopyChecksum(dst, page)
		if want := PageChecksum(page); got != want {
			t.Fatalf("CopyChecksum %#x, PageChecksum %#x for %d bytes", uint64(got), uint64(want), len(page))
		}
		if !bytes.Equal(dst, page) {
			t.Fatal("copied bytes differ")
		}
		if len(page) == 0 {
			return
		}
		i := int(at) % len(page)
		page[i] ^= 0x40
		if PageChecksum(page) == got {
			t.Fatalf("byte %d of %d changed, digest the same", i, len(page))
		}
	})
}

// TestChecksumAllocatesNothing: the pool checks every page it puts and gets; pages of up to 4 MiB
// (64 pieces) take their pieces' digests on the stack.
func TestChecksumAllocatesNothing(t *testing.T) {
	for _, n := range []int{64 << 10, 1 << 20, 4 << 20} {
		src, dst := make([]byte, n), make([]byte, n)
		if a := testing.AllocsPerRun(10, func() { _ = CopyChecksum(dst, src); _ = PageChecksum(src) }); a != 0 {
			t.Errorf("%d-byte page: %v allocations a checksum", n, a)
		}
	}
}

// splitAt cuts n bytes into pieces at the given offsets (sorted, clamped to n, duplicates giving
// empty pieces), each piece a slice of its own backing array with guard bytes after it.
func splitAt(n int, cuts []int) [][]byte {
	var out [][]byte
	prev := 0
	for _, c := range append(cuts, n) {
		c = min(max(c, prev), n)
		b := make([]byte, c-prev+3)
		for i := range b {
			b[i] = 0xEE
		}
		out = append(out, b[:c-prev])
		prev = c
	}
	return out
}

// TestScatterAndGatherChecksum: a value copied into, or from, pieces of memory gets the
// PageChecksum of its bytes and the exact bytes, at sizes around the checksum's pieces and
// with cuts that fall inside, on and across them (empty pieces too), writing nothing past the
// pieces.
func TestScatterAndGatherChecksum(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{0, 1, 240, ChecksumChunk - 1, 2 * ChecksumChunk, 3*ChecksumChunk + 17, 1 << 20} {
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(r.Uint32())
		}
		want := PageChecksum(src)
		for _, cuts := range [][]int{nil, {0}, {n / 2}, {1, 1, n - 1}, {ChecksumChunk, ChecksumChunk + 5, 2*ChecksumChunk - 1}, {r.IntN(n + 1), r.IntN(n + 1), r.IntN(n + 1)}} {
			cuts = slices.Sorted(slices.Values(cuts))
			dst := splitAt(n, cuts)
			if got := ScatterChecksum(dst, src); got != want {
				t.Fatalf("n=%d cuts=%v: ScatterChecksum %#x, PageChecksum %#x", n, cuts, uint64(got), uint64(want))
			}
			if got := bytes.Join(dst, nil); !bytes.Equal(got, src) {
				t.Fatalf("n=%d cuts=%v: scattered bytes differ", n, cuts)
			}
			for _, p := range dst {
				if !bytes.Equal(p[len(p):cap(p)], []byte{0xEE, 0xEE, 0xEE}) {
					t.Fatalf("n=%d cuts=%v: ScatterChecksum wrote past a piece", n, cuts)
				}
			}
			out := make([]byte, n+4)
			if got := GatherChecksum(out, dst); got != want {
				t.Fatalf("n=%d cuts=%v: GatherChecksum %#x, PageChecksum %#x", n, cuts, uint64(got), uint64(want))
			}
			if !bytes.Equal(out[:n], src) || !bytes.Equal(out[n:], make([]byte, 4)) {
				t.Fatalf("n=%d cuts=%v: gathered bytes differ", n, cuts)
			}
		}
	}
	// Pieces longer than the value: the rest is left as it was.
	long := [][]byte{make([]byte, 10), make([]byte, 10)}
	if got := ScatterChecksum(long, []byte("0123456789abc")); got != PageChecksum([]byte("0123456789abc")) || string(long[1][:3]) != "abc" || long[1][3] != 0 {
		t.Fatalf("scatter into longer pieces: %q %q", long[0], long[1])
	}
}

// FuzzScatterGatherChecksum checks, for any value and any cut of it into pieces, that scattering
// and gathering give PageChecksum and the exact bytes.
func FuzzScatterGatherChecksum(f *testing.F) {
	f.Add([]byte("abc"), []byte{1})
	f.Add(bytes.Repeat([]byte{7, 1, 9}, 70000), []byte{3, 200, 0, 255})
	f.Fuzz(func(t *testing.T, page []byte, cutBytes []byte) {
		if len(cutBytes) > 64 {
			cutBytes = cutBytes[:64]
		}
		var cuts []int
		for i, c := range cutBytes {
			cuts = append(cuts, (int(c)*(i+1)*4099)%(len(page)+1))
		}
		slices.Sort(cuts)
		pieces := splitAt(len(page), cuts)
		want := PageChecksum(page)
		if got := ScatterChecksum(pieces, page); got != want || !bytes.Equal(bytes.Join(pieces, nil), page) {
			t.Fatalf("scatter of %d bytes at %v: %#x, want %#x", len(page), cuts, uint64(got), uint64(want))
		}
		out := make([]byte, len(page))
		if got := GatherChecksum(out, pieces); got != want || !bytes.Equal(out, page) {
			t.Fatalf("gather of %d bytes at %v: %#x, want %#x", len(page), cuts, uint64(got), uint64(want))
		}
	})
}
