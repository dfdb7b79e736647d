package keys

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestPageChecksumVectors pins the algorithm: XXH3-64 with seed 0, as published by the xxHash
// project (the empty input and its reference test vectors for short inputs).
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
}

// TestCopyChecksumMatchesPageChecksum checks that the fused copy gives the whole-page digest and
// the exact bytes at every size around the chunk boundaries.
func TestCopyChecksumMatchesPageChecksum(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 16, 240, 241, 1024, checksumChunk - 1, checksumChunk, checksumChunk + 1, 3*checksumChunk + 17, 1 << 20, 4<<20 + 3} {
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
		w := NewChecksumWriter()
		for off := 0; off < n; off += 1000 {
			w.Write(src[off:min(off+1000, n)])
		}
		if w.Sum() != got {
			t.Fatalf("n=%d: ChecksumWriter in 1000-byte pieces differs", n)
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
// the exact bytes, and that a writer fed the page in two pieces split anywhere agrees.
func FuzzCopyChecksum(f *testing.F) {
	f.Add([]byte("abc"), uint16(1))
	f.Add(bytes.Repeat([]byte{7, 1, 9}, 70000), uint16(65535))
	f.Fuzz(func(t *testing.T, page []byte, split uint16) {
		dst := make([]byte, len(page))
		got := CopyChecksum(dst, page)
		if want := PageChecksum(page); got != want {
			t.Fatalf("CopyChecksum %#x, PageChecksum %#x for %d bytes", uint64(got), uint64(want), len(page))
		}
		if !bytes.Equal(dst, page) {
			t.Fatal("copied bytes differ")
		}
		at := min(int(split), len(page))
		w := NewChecksumWriter()
		w.Write(page[:at])
		w.Write(page[at:])
		if w.Sum() != got {
			t.Fatalf("writer split at %d differs", at)
		}
	})
}
