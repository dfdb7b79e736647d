package gpu

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math/bits"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/zeebo/xxh3"

	"github.com/kvctl/kvctl/core/kvmem"
)

// pageSumModel computes a page's digest the way kernels/pagesum.cu does: per-block deltas, then
// the scrambles, over a page given as pieces. It exists so that the kernel's decomposition of
// XXH3 and the secret words the host hands it are checked against XXH3 itself on every machine,
// also where no GPU runs the kernel.
func pageSumModel(pieces [][]byte, sec pageSumSecret) uint64 {
	var total uint64
	for _, p := range pieces {
		total += uint64(len(p))
	}
	word := func(o uint64) uint64 {
		for _, p := range pieces {
			if o < uint64(len(p)) {
				return binary.LittleEndian.Uint64(p[o:])
			}
			o -= uint64(len(p))
		}
		panic("offset outside the page")
	}
	stripes := func(start uint64, n int, lane int) uint64 {
		var d uint64
		for s := range n {
			o := start + uint64(s)*64
			v, pair := word(o+uint64(8*lane)), word(o+uint64(8*(lane^1)))
			key := v ^ sec.acc[s+lane]
			d += pair + (key&0xFFFFFFFF)*(key>>32)
		}
		return d
	}
	acc := [8]uint64{0xC2B2AE3D, 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63, 0x85EBCA77, 0x27D4EB2F165667C5, 0x9E3779B1}
	blocks := (total - 1) / 1024
	for b := range blocks {
		for lane := range 8 {
			a := acc[lane] + stripes(b*1024, 16, lane)
			a ^= a >> 47
			a ^= sec.acc[16+lane]
			acc[lane] = a * 0x9E3779B1
		}
	}
	start := blocks * 1024
	n := int(((total - 1) - start) / 64)
	for lane := range 8 {
		acc[lane] += stripes(start, n, lane)
		o := total - 64
		v, pair := word(o+uint64(8*lane)), word(o+uint64(8*(lane^1)))
		key := v ^ sec.last[lane]
		acc[lane] += pair + (key&0xFFFFFFFF)*(key>>32)
	}
	h := total * 0x9E3779B185EBCA87
	for i := range 4 {
		a, c := acc[2*i]^sec.merge[2*i], acc[2*i+1]^sec.merge[2*i+1]
		hi, lo := bits.Mul64(a, c)
		h += hi ^ lo
	}
	h ^= h >> 37
	h *= 0x165667919E3779F9
	return h ^ h>>32
}

// TestPageSumModelIsXXH3 checks the kernel's algorithm, written out in Go, against XXH3-64 for
// page sizes around every boundary the kernel handles (blocks, stripes, the 32-block chunks)
// and pages split into pieces of many sizes.
func TestPageSumModelIsXXH3(t *testing.T) {
	sec := newPageSumSecret()
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int{256, 320, 960, 1024, 1088, 2048, 4096, 15 * 1024, 32 * 1024, 33 * 1024, 64*1024 - 64, 64 * 1024, 65 * 1024, 256 * 1024, 1 << 20, 1<<20 + 64*5}
	for range 20 {
		sizes = append(sizes, 64*(4+rng.IntN(3000)))
	}
	for _, n := range sizes {
		page := make([]byte, n)
		for i := range page {
			page[i] = byte(rng.Uint32())
		}
		want := xxh3.Hash(page)
		// Whole, then in pieces of random multiples of 64 bytes.
		splits := [][][]byte{{page}}
		for range 3 {
			var ps [][]byte
			for rest := page; len(rest) > 0; {
				k := min(len(rest), 64*(1+rng.IntN(40)))
				ps = append(ps, rest[:k])
				rest = rest[k:]
			}
			splits = append(splits, ps)
		}
		for _, ps := range splits {
			if got := pageSumModel(ps, sec); got != want {
				t.Fatalf("%d bytes in %d pieces: model %#x, XXH3 %#x", n, len(ps), got, want)
			}
		}
	}
}

// TestPageSumSecretBytes pins the kernel parameter's layout: 40 little-endian words.
func TestPageSumSecretBytes(t *testing.T) {
	b := newPageSumSecret().bytes()
	if len(b) != 320 {
		t.Fatalf("secret parameter is %d bytes, the kernel's kvSecret is 320", len(b))
	}
	if !bytes.Equal(b[:8], xxh3Secret[:8]) || !bytes.Equal(b[24*8:24*8+8], xxh3Secret[121:129]) || !bytes.Equal(b[32*8:32*8+8], xxh3Secret[11:19]) {
		t.Fatal("secret words out of place")
	}
}

// TestPTXMatchesSource fails when kernels/pagesum.cu changed and pagesum.ptx was not
// regenerated (`make ptx`).
func TestPTXMatchesSource(t *testing.T) {
	src, err := os.ReadFile("kernels/pagesum.cu")
	if err != nil {
		t.Fatal(err)
	}
	ptx, err := os.ReadFile("kernels/pagesum.ptx")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(src)
	if want := "// source sha256 " + hex.EncodeToString(sum[:]); !strings.Contains(string(ptx), want+"\n") {
		t.Fatalf("kernels/pagesum.ptx was not generated from the current pagesum.cu (want %q): run make ptx", want)
	}
	for _, k := range []string{"kvBlockDeltas", "kvPageFinish", "kvCopyPieces"} {
		if !strings.Contains(string(ptx), ".entry "+k+"(") {
			t.Fatalf("kernels/pagesum.ptx has no %s entry", k)
		}
	}
}

func TestPageCheckable(t *testing.T) {
	ok := kvmem.Layout{TokensPerBlock: 32, Groups: []kvmem.GroupLayout{{Slots: 4, Regions: []kvmem.Region{{Offset: 0, Stride: 4096, Size: 4096}, {Offset: 1 << 20, Stride: 1024, Size: 1024}}}}}
	if err := pageCheckable(ok, 4096); err != nil {
		t.Fatalf("checkable layout refused: %v", err)
	}
	cases := map[string]kvmem.Layout{
		"short page":    {TokensPerBlock: 32, Groups: []kvmem.GroupLayout{{Slots: 4, Regions: []kvmem.Region{{Stride: 192, Size: 192}}}}},
		"odd region":    {TokensPerBlock: 32, Groups: []kvmem.GroupLayout{{Slots: 4, Regions: []kvmem.Region{{Stride: 4096, Size: 4000}}}}},
		"odd offset":    {TokensPerBlock: 32, Groups: []kvmem.GroupLayout{{Slots: 4, Regions: []kvmem.Region{{Offset: 4, Stride: 4096, Size: 4096}}}}},
		"short replica": {TokensPerBlock: 32, Groups: []kvmem.GroupLayout{{Slots: 4, Regions: []kvmem.Region{{Stride: 4096, Size: 4096}}, ReplicatedRegions: []kvmem.Region{{Offset: 1 << 20, Stride: 64, Size: 64}}}}},
	}
	for name, l := range cases {
		if err := pageCheckable(l, 0); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := pageCheckable(ok, 4); err == nil {
		t.Error("unaligned engine memory accepted")
	}
}

func TestCheckChunkEnds(t *testing.T) {
	pages := func(n, size int) [][]byte {
		src := make([][]byte, n)
		for i := range src {
			src[i] = make([]byte, size)
		}
		return src
	}
	for _, c := range []struct {
		name string
		src  [][]byte
		want []int
	}{
		{"small batch, one chunk", pages(15, 1<<20), []int{15}},
		{"halves", pages(16, 1<<20), []int{8, 12, 14, 16}},
		{"168 pages", pages(168, 1<<20), []int{84, 126, 147, 168}},
		{"few large pages", pages(2, 16<<20), []int{1, 2}},
		{"one page", pages(1, 64<<20), []int{1}},
		{"uneven", [][]byte{make([]byte, 12<<20), make([]byte, 1<<20), make([]byte, 1<<20), make([]byte, 2<<20)}, []int{1, 2, 3, 4}},
	} {
		if got := checkChunkEnds(c.src); !slices.Equal(got, c.want) {
			t.Errorf("%s: chunk ends %v, want %v", c.name, got, c.want)
		}
	}
}
