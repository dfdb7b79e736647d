package gpu

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/zeebo/xxh3"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
)

// pageSumModel computes a unit's digest the way kvUnitCheck (kernels/pagesum.cu) does:
// per-block deltas, then the scrambles, over a unit given as pieces. It exists so that the kernel's decomposition of
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
	return pageSumFinish(total, word, func(lane int, b uint64) uint64 { return modelStripes(word, b*1024, 16, lane, sec) }, sec)
}

// modelStripes is what stripes [0, n) from page offset start add to lane: a block's delta, or a
// unit's rest but its last stripe.
func modelStripes(word func(uint64) uint64, start uint64, n int, lane int, sec pageSumSecret) uint64 {
	var d uint64
	for s := range n {
		o := start + uint64(s)*64
		v, pair := word(o+uint64(8*lane)), word(o+uint64(8*(lane^1)))
		key := v ^ sec.acc[s+lane]
		d += pair + (key&0xFFFFFFFF)*(key>>32)
	}
	return d
}

// pageSumFinish is kvUnitCheck's sequential part for a unit of total bytes read through word: the
// scrambles over the full blocks' deltas (delta(lane, b)), the rest (the last partial
// block, the last stripe), the merge.
func pageSumFinish(total uint64, word func(uint64) uint64, delta func(lane int, b uint64) uint64, sec pageSumSecret) uint64 {
	acc := [8]uint64{0xC2B2AE3D, 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63, 0x85EBCA77, 0x27D4EB2F165667C5, 0x9E3779B1}
	blocks := (total - 1) / 1024
	for b := range blocks {
		for lane := range 8 {
			a := acc[lane] + delta(lane, b)
			a ^= a >> 47
			a ^= sec.acc[16+lane]
			acc[lane] = a * 0x9E3779B1
		}
	}
	start := blocks * 1024
	n := int(((total - 1) - start) / 64)
	for lane := range 8 {
		acc[lane] += modelStripes(word, start, n, lane, sec)
		o := total - 64
		v, pair := word(o+uint64(8*lane)), word(o+uint64(8*(lane^1)))
		key := v ^ sec.last[lane]
		acc[lane] += pair + (key&0xFFFFFFFF)*(key>>32)
	}
	return modelMerge(acc, total, sec)
}

// modelMerge is XXH3's merge of the eight accumulators of a page of total bytes into its digest.
func modelMerge(acc [8]uint64, total uint64, sec pageSumSecret) uint64 {
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

// randomBytes is n bytes from rng.
func randomBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
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
		page := randomBytes(rng, n)
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

// unitCheckModel computes a unit's digest with kvUnitCheck's layout of the work, thread by
// thread: which 16 bytes each thread of each warp loads, which secret words it uses, the
// butterfly that sums a warp's terms and the delta each thread stores, then the chain. word reads
// the unit's word at an offset.
func unitCheckModel(word func(uint64) uint64, total uint64, sec pageSumSecret) uint64 {
	const warps = 16
	full := (total - 1) / 1024
	n := ((total - 1) - full*1024) / 64
	deltas := make([]uint64, 8*(full+1))
	written := make([]bool, len(deltas))
	for r := uint64(0); 64*r <= full; r++ {
		for w := range uint64(warps) {
			var v [32][8]uint64
			for t := range uint64(32) {
				j, s0 := 2*(t&3), t>>2
				for q := range uint64(4) {
					b := 64*r + 16*q + w
					var e, o uint64
					for h := range uint64(2) {
						s := s0 + 8*h
						inBlock := b < full || (b == full && s < n)
						last := b == full && s == n
						if !inBlock && !last {
							continue
						}
						at := b*1024 + 512*h + 16*t
						x0, x1 := word(at), word(at+8)
						k0, k1 := sec.acc[s+j], sec.acc[s+j+1]
						if last {
							k0, k1 = sec.last[j], sec.last[j+1]
						}
						e += modelTerm(x0, x1, k0)
						o += modelTerm(x1, x0, k1)
					}
					v[t][2*q], v[t][2*q+1] = e, o
				}
			}
			// The butterfly, one step at a time over the warp.
			var y [32][4]uint64
			for t := range 32 {
				hi := t&16 != 0
				for k := range 4 {
					keep, peer := v[t][k], v[t^16][k] // the peer keeps the other half and sends this one
					if hi {
						keep, peer = v[t][4+k], v[t^16][4+k]
					}
					y[t][k] = keep + peer
				}
			}
			var z [32][2]uint64
			for t := range 32 {
				hi := t&8 != 0
				for k := range 2 {
					keep, peer := y[t][k], y[t^8][k]
					if hi {
						keep, peer = y[t][2+k], y[t^8][2+k]
					}
					z[t][k] = keep + peer
				}
			}
			for t := range uint64(32) {
				d := z[t][0] + z[t^4][0]
				if t&4 != 0 {
					d = z[t][1] + z[t^4][1]
				}
				b := 64*r + 16*((t>>3)&3) + w
				if b <= full {
					i := 8*b + 2*(t&3) + (t>>2)&1
					if written[i] {
						panic("a delta stored twice")
					}
					deltas[i], written[i] = d, true
				}
			}
		}
	}
	for i, ok := range written {
		if !ok {
			panic(fmt.Sprintf("delta %d of %d never stored", i, len(written)))
		}
	}
	acc := [8]uint64{0xC2B2AE3D, 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63, 0x85EBCA77, 0x27D4EB2F165667C5, 0x9E3779B1}
	for lane := range 8 {
		for b := range full {
			a := acc[lane] + deltas[8*b+uint64(lane)]
			a ^= a >> 47
			a ^= sec.acc[16+lane]
			acc[lane] = a * 0x9E3779B1
		}
		acc[lane] += deltas[8*full+uint64(lane)]
	}
	return modelMerge(acc, total, sec)
}

// modelTerm is kvTerm: what word v adds to its lane, with its pair's word and its secret word.
func modelTerm(v, pair, key uint64) uint64 {
	x := v ^ key
	return pair + (x&0xFFFFFFFF)*(x>>32)
}

// TestUnitCheckModelIsXXH3 checks kvUnitCheck's layout of the work (unitCheckModel) against
// XXH3-64 for units of every length the kernel takes around its boundaries: one block, the
// rest's stripes, one round of 64 blocks, two rounds.
func TestUnitCheckModelIsXXH3(t *testing.T) {
	sec := newPageSumSecret()
	rng := rand.New(rand.NewPCG(5, 6))
	sizes := []int{256, 320, 960, 1024, 1088, 2048, 15 * 1024, 16 * 1024, 17*1024 + 64, 64*1024 - 64, 64 * 1024, 64*1024 + 64, 65 * 1024, 65*1024 + 64, 96 * 1024, 128*1024 - 64}
	for range 24 {
		sizes = append(sizes, 64*(4+rng.IntN(2040)))
	}
	for _, n := range sizes {
		unit := randomBytes(rng, n)
		word := func(o uint64) uint64 {
			if o+8 > uint64(n) {
				panic(fmt.Sprintf("a load at %d past the unit's %d bytes", o, n))
			}
			return binary.LittleEndian.Uint64(unit[o:])
		}
		if got, want := unitCheckModel(word, uint64(n), sec), xxh3.Hash(unit); got != want {
			t.Fatalf("%d bytes: model %#x, XXH3 %#x", n, got, want)
		}
	}
}

// pinnedCuts is a batch whose units and regions the tests pin: a 200 KiB page (three units: 64,
// 64, 72 KiB) in two regions of 100 KiB, and a 4 KiB page.
func pinnedCuts() ([][]byte, []checkPiece) {
	src := [][]byte{make([]byte, 200<<10), make([]byte, 4<<10)}
	return src, []checkPiece{
		{page: 0, addr: 0x10000000, off: 0, len: 100 << 10},
		{page: 0, addr: 0x20000000, off: 100 << 10, len: 100 << 10},
		{page: 1, addr: 0x30000000, off: 0, len: 4 << 10},
	}
}

// TestDescribeUnits pins kvUnitCheck's descriptors: a kvPage per unit (length, first piece,
// pieces, and the address of a unit of one piece), then a kvPiece per region.
func TestDescribeUnits(t *testing.T) {
	src, pieces := pinnedCuts()
	units, _, upieces := checkUnits(nil, nil, nil, pieces, src)
	if mu, mp := unitBounds(src, len(pieces)); mu != 4 || mp != 5 {
		t.Errorf("unitBounds = %d units, %d regions, want 4 and 5 (what checkUnits made)", mu, mp)
	}
	buf := bytes.Repeat([]byte{0xEE}, len(units)*pageDescBytes+len(upieces)*pieceDescBytes)
	describeUnits(buf, upieces, units)
	le := binary.LittleEndian
	type page struct {
		len          uint64
		first, count uint32
		base         uint64
	}
	want := []page{
		{64 << 10, 0, 1, 0x10000000},
		{64 << 10, 1, 2, 0},
		{72 << 10, 3, 1, 0x20000000 + 28<<10},
		{4 << 10, 4, 1, 0x30000000},
	}
	for u, w := range want {
		d := buf[u*pageDescBytes:]
		got := page{le.Uint64(d), le.Uint32(d[8:]), le.Uint32(d[12:]), le.Uint64(d[16:])}
		if got != w {
			t.Errorf("unit %d: kvPage %+v, want %+v", u, got, w)
		}
	}
	for k, pc := range upieces {
		q := buf[len(units)*pageDescBytes+k*pieceDescBytes:]
		if got := [3]uint64{le.Uint64(q), le.Uint64(q[8:]), le.Uint64(q[16:])}; got != [3]uint64{pc.addr, pc.off, pc.len} {
			t.Errorf("piece %d: kvPiece %v, want %v", k, got, [3]uint64{pc.addr, pc.off, pc.len})
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
	for _, k := range []string{"kvUnitCheck", "kvCopyPieces", "kvCopyCheck"} {
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

// copyCheckModel runs kvCopyCheck (kernels/pagesum.cu) in Go over copy records, thread by thread
// as the kernel's index arithmetic has it: read(addr) returns the 16 bytes at a source address;
// the page sums are added to sums. It fails t where a thread's fixed stripe (the kernel takes its
// secret words once) is not the stripe of a word it copies, or a warp's span reaches further
// than the kernel assumes.
func copyCheckModel(t *testing.T, copies []checkedCopy, read func(addr uint64) []byte, sec pageSumSecret, sums []uint64) {
	t.Helper()
	const threads = 256
	le := binary.LittleEndian
	for _, c := range copies {
		n := c.len / 16
		blocks := (c.pageLen - 1) / 1024
		final := c.pageLen - 64
		sum := func(l, k uint64) *uint64 { return &sums[(c.base+k)*8+l] } // lane l's sum k
		for u0 := uint64(0); u0 < n; u0 += 4 * threads {
			for q := range uint64(4) {
				for warp := range uint64(threads / 32) {
					w := u0 + q*threads + warp*32
					if w >= n {
						continue
					}
					span := c.off + 16*w
					b0 := span / 1024
					two, hasFinal := span%1024 > 512, span <= final && final < span+512
					var a, e, f [8]uint64 // per lane: to block b0, to b0 + 1, to the last stripe
					for tt := range uint64(32) {
						u, thread, j := w+tt, warp*32+tt, tt&3
						if u >= n {
							continue
						}
						o := c.off + 16*u
						stripe := (c.off/64 + thread/4) & 15
						if want := (o / 64) % 16; stripe != want {
							t.Fatalf("copy at page offset %d: thread %d takes stripe %d's secret for a word of stripe %d", c.off, thread, stripe, want)
						}
						v := read(c.src + 16*u)
						w0, w1 := le.Uint64(v), le.Uint64(v[8:])
						k0, k1 := sec.acc[stripe+2*j], sec.acc[stripe+2*j+1]
						isFinal := o&^63 == final
						if isFinal {
							k0, k1 = sec.last[2*j], sec.last[2*j+1]
						}
						x0, x1 := w0^k0, w1^k1
						t0, t1 := w1+(x0&0xFFFFFFFF)*(x0>>32), w0+(x1&0xFFFFFFFF)*(x1>>32)
						switch {
						case isFinal:
							if !hasFinal {
								t.Fatalf("the last stripe in a span at %d the kernel does not expect it in", span)
							}
							f[2*j] += t0
							f[2*j+1] += t1
						case o/1024 == b0:
							a[2*j] += t0
							a[2*j+1] += t1
						default:
							if o/1024 != b0+1 || !two || b0+1 > blocks {
								t.Fatalf("a warp's span at page offset %d reaches block %d", span, o/1024)
							}
							e[2*j] += t0
							e[2*j+1] += t1
						}
					}
					for l := range uint64(8) {
						*sum(l, b0) += a[l]
						if two && b0+1 <= blocks {
							*sum(l, b0+1) += e[l]
						}
						if hasFinal {
							*sum(l, blocks+1) += f[l]
						}
					}
				}
			}
		}
	}
}

// fusedFinishModel is kvFinishSums for a page of n bytes whose sums (fusedSums(n) of them, each
// eight words, one a lane) kvCopyCheck added.
func fusedFinishModel(n uint64, sums []uint64, sec pageSumSecret) uint64 {
	blocks := (n - 1) / 1024
	acc := [8]uint64{0xC2B2AE3D, 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63, 0x85EBCA77, 0x27D4EB2F165667C5, 0x9E3779B1}
	for l := range uint64(8) {
		d := func(k uint64) uint64 { return sums[8*k+l] }
		for b := range blocks {
			a := acc[l] + d(b)
			a ^= a >> 47
			a ^= sec.acc[16+l]
			acc[l] = a * 0x9E3779B1
		}
		acc[l] += d(blocks) + d(blocks+1)
	}
	return modelMerge(acc, n, sec)
}

// TestCopyCheckModelIsXXH3 checks the fused check's decomposition: pages split into pieces of
// random multiples of 64 bytes (some longer than a copy block, some adjacent in engine memory,
// many starting inside a block), turned into copy records by checkedCopies, their sums taken as
// kvCopyCheck's threads take them and finished as its finishing blocks do, give XXH3-64 of every page,
// without reading a page twice.
func TestCopyCheckModelIsXXH3(t *testing.T) {
	sec := newPageSumSecret()
	rng := rand.New(rand.NewPCG(11, 12))
	sizes := []int{256, 320, 960, 1024, 1088, 1536, 2048, 4096, 15 * 1024, 64*1024 - 64, 64 * 1024, 65 * 1024, 200*1024 + 64*3, 1 << 20}
	for range 12 {
		sizes = append(sizes, 64*(4+rng.IntN(3000)))
	}
	const srcBase = 1 << 40
	for round := range 4 {
		// One batch of every size; sources back to back, as in a pool slab.
		var flat []byte
		var src [][]byte
		var addrs []uint64
		for _, n := range sizes {
			addrs = append(addrs, srcBase+uint64(len(flat)))
			page := make([]byte, n)
			for i := range page {
				page[i] = byte(rng.Uint32())
			}
			flat = append(flat, page...)
			src = append(src, page)
		}
		var pieces []checkPiece
		dev := uint64(1 << 30)
		for p, page := range src {
			for off := 0; off < len(page); {
				k := len(page) - off // whole pages
				switch round {
				case 1: // long pieces, cut into several copies
					k = min(k, 64*(1+rng.IntN(2500)))
				case 2, 3: // short pieces, starting anywhere in a block
					k = min(k, 64*(1+rng.IntN(40)))
				}
				if rng.IntN(3) == 0 {
					dev += 16 * uint64(1+rng.IntN(100)) // not adjacent to the last piece
				}
				pieces = append(pieces, checkPiece{page: p, addr: dev, off: uint64(off), len: uint64(k)})
				dev += uint64(k)
				off += k
			}
		}
		copies, ok := checkedCopies(nil, pieces, src, func(p int) uint64 { return addrs[p] })
		if !ok {
			t.Fatal("checkedCopies refused 16-byte aligned pieces")
		}
		var words uint64
		for _, page := range src {
			words += fusedSums(uint64(len(page)))
		}
		perPage := map[uint32]uint32{}
		for _, c := range copies {
			if c.len == 0 || c.len > copyChunk {
				t.Fatalf("a copy of %d bytes", c.len)
			}
			perPage[c.page]++
		}
		for _, c := range copies {
			if c.pageCopies != perPage[c.page] {
				t.Fatalf("a copy of page %d says it has %d copies; it has %d", c.page, c.pageCopies, perPage[c.page])
			}
		}
		if len(perPage) != len(src) {
			t.Fatalf("copies for %d pages of %d", len(perPage), len(src))
		}
		sums := make([]uint64, 8*words)
		copyCheckModel(t, copies, func(a uint64) []byte { return flat[a-srcBase : a-srcBase+16] }, sec, sums)
		var base uint64
		for p, page := range src {
			n := uint64(len(page))
			got := fusedFinishModel(n, sums[base*8:], sec)
			if want := xxh3.Hash(page); got != want {
				t.Fatalf("round %d, page %d (%d bytes): fused model %#x, XXH3 %#x", round, p, len(page), got, want)
			}
			base += fusedSums(n)
		}
	}
}

// TestCheckedCopies pins how checked batches become kvCopyCheck records: pieces of a page that
// continue each other in engine memory are one copy, copies are cut at 64 KiB, a page's sums
// follow the earlier pages' (fusedSums), every copy knows its page and how many copies the page
// has (the kernel finishes a page when that many are done), and batches the kernel cannot take
// are refused.
func TestCheckedCopies(t *testing.T) {
	src := [][]byte{make([]byte, 3000), make([]byte, 200<<10)}
	addr := func(p int) uint64 { return uint64(0x10000 * (p + 1)) }
	pieces := []checkPiece{
		{page: 0, addr: 0x100000, off: 0, len: 1024},
		{page: 0, addr: 0x100400, off: 1024, len: 1976 - 8}, // continues the first
		{page: 0, addr: 0x200000, off: 3000 - 8, len: 8},
		{page: 1, addr: 0x300000, off: 0, len: 200 << 10},
	}
	// 1976 - 8 is a multiple of 16, 2992 is not a multiple of 64: refused.
	if _, ok := checkedCopies(nil, pieces, src, addr); ok {
		t.Fatal("a piece at page offset 2992 accepted")
	}
	src[0] = make([]byte, 3072)
	pieces[1].len, pieces[2].off, pieces[2].len = 1024, 2048, 1024
	got, ok := checkedCopies(nil, pieces, src, addr)
	if !ok {
		t.Fatal("aligned pieces refused")
	}
	want := []checkedCopy{
		{src: 0x10000, dst: 0x100000, len: 2048, off: 0, base: 0, pageLen: 3072, page: 0, pageCopies: 2},
		{src: 0x10000 + 2048, dst: 0x200000, len: 1024, off: 2048, base: 0, pageLen: 3072, page: 0, pageCopies: 2},
		{src: 0x20000, dst: 0x300000, len: 64 << 10, off: 0, base: 4, pageLen: 200 << 10, page: 1, pageCopies: 4},
		{src: 0x20000 + 64<<10, dst: 0x300000 + 64<<10, len: 64 << 10, off: 64 << 10, base: 4, pageLen: 200 << 10, page: 1, pageCopies: 4},
		{src: 0x20000 + 128<<10, dst: 0x300000 + 128<<10, len: 64 << 10, off: 128 << 10, base: 4, pageLen: 200 << 10, page: 1, pageCopies: 4},
		{src: 0x20000 + 192<<10, dst: 0x300000 + 192<<10, len: 8 << 10, off: 192 << 10, base: 4, pageLen: 200 << 10, page: 1, pageCopies: 4},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("records\n%+v\nwant\n%+v", got, want)
	}
	for _, bad := range []struct {
		name   string
		pieces []checkPiece
		addr   func(int) uint64
	}{
		{"destination 8-byte aligned", []checkPiece{{page: 0, addr: 0x100008, off: 0, len: 3072}}, addr},
		{"source 8-byte aligned", []checkPiece{{page: 0, addr: 0x100000, off: 0, len: 3072}}, func(int) uint64 { return 0x10008 }},
		{"length a multiple of 8", []checkPiece{{page: 0, addr: 0x100000, off: 0, len: 3064}}, addr},
		{"pages out of order", []checkPiece{{page: 1, addr: 0x100000, off: 0, len: 1024}, {page: 0, addr: 0x200000, off: 0, len: 1024}}, addr},
		{"page outside the batch", []checkPiece{{page: 2, addr: 0x100000, off: 0, len: 1024}}, addr},
	} {
		if _, ok := checkedCopies(nil, bad.pieces, src, bad.addr); ok {
			t.Errorf("%s: accepted", bad.name)
		}
	}
}

// TestCheckUnits: a checked batch's pages are checked as the units of their checksum
// (keys.ChecksumChunks), each a page to the kernels. Regions are cut where units end, with
// offsets in their unit; the units' digests, taken by kvCopyCheck's model (checkedCopies over
// the units) or by the separate kernels' model, and combined per page (unitDigest), give
// keys.PageChecksum of every page, for pages of one unit and of many, pieces long and short.
func TestCheckUnits(t *testing.T) {
	src, pieces := pinnedCuts()
	units, first, got := checkUnits(nil, nil, nil, pieces, src)
	want := []checkPiece{
		{page: 0, addr: 0x10000000, off: 0, len: 64 << 10},
		{page: 1, addr: 0x10000000 + 64<<10, off: 0, len: 36 << 10},
		{page: 1, addr: 0x20000000, off: 36 << 10, len: 28 << 10},
		{page: 2, addr: 0x20000000 + 28<<10, off: 0, len: 72 << 10},
		{page: 3, addr: 0x30000000, off: 0, len: 4 << 10},
	}
	if !slices.Equal(got, want) || !slices.Equal(first, []int{0, 3, 4}) {
		t.Fatalf("pieces %+v, first %v\nwant %+v, [0 3 4]", got, first, want)
	}
	for u, n := range []int{64 << 10, 64 << 10, 72 << 10, 4 << 10} {
		if len(units[u]) != n {
			t.Fatalf("unit %d: %d bytes, want %d", u, len(units[u]), n)
		}
	}
	if &units[2][0] != &src[0][128<<10] || &units[3][0] != &src[1][0] {
		t.Fatal("units are not their pages' bytes")
	}

	sec := newPageSumSecret()
	rng := rand.New(rand.NewPCG(21, 22))
	sizes := []int{256, 64 << 10, 128<<10 - 64, 128 << 10, 128<<10 + 64, 200*1024 + 64*3, 1 << 20, 1<<20 + 64*1001}
	for range 6 {
		sizes = append(sizes, 64*(4+rng.IntN(8000)))
	}
	const srcBase = 1 << 40
	for round := range 3 {
		// The pages back to back in flat, as in a pool slab.
		var flat []byte
		for _, n := range sizes {
			for range n {
				flat = append(flat, byte(rng.Uint32()))
			}
		}
		var src [][]byte
		at := 0
		for _, n := range sizes {
			src = append(src, flat[at:at+n])
			at += n
		}
		var pieces []checkPiece
		dev := uint64(1 << 30)
		for p, page := range src {
			for off := 0; off < len(page); {
				k := len(page) - off
				if round > 0 {
					k = min(k, 64*(1+rng.IntN(map[int]int{1: 3000, 2: 40}[round])))
				}
				if rng.IntN(3) == 0 {
					dev += 16 * uint64(1+rng.IntN(100))
				}
				pieces = append(pieces, checkPiece{page: p, addr: dev, off: uint64(off), len: uint64(k)})
				dev += uint64(k)
				off += k
			}
		}
		units, first, upieces := checkUnits(nil, nil, nil, pieces, src)
		if mu, mp := unitBounds(src, len(pieces)); len(units) > mu || len(upieces) > mp {
			t.Fatalf("round %d: %d units in %d regions, above unitBounds' %d and %d", round, len(units), len(upieces), mu, mp)
		}
		// Where each unit's bytes lie in flat, for the model's reads.
		addr := func(u int) uint64 {
			return srcBase + uint64(uintptr(unsafe.Pointer(&units[u][0]))-uintptr(unsafe.Pointer(&flat[0])))
		}
		copies, ok := checkedCopies(nil, upieces, units, addr)
		if !ok {
			t.Fatal("checkedCopies refused a batch of units")
		}
		var words uint64
		for _, u := range units {
			words += fusedSums(uint64(len(u)))
		}
		sums := make([]uint64, 8*words)
		copyCheckModel(t, copies, func(a uint64) []byte { return flat[a-srcBase : a-srcBase+16] }, sec, sums)
		fused, separate := make([]byte, 8*len(units)), make([]byte, 8*len(units))
		var base uint64
		for u, b := range units {
			binary.LittleEndian.PutUint64(fused[8*u:], fusedFinishModel(uint64(len(b)), sums[base*8:], sec))
			base += fusedSums(uint64(len(b)))
			// The separate kernels' model over the unit's regions, as kvPage and kvPiece describe them.
			var parts [][]byte
			for _, pc := range upieces {
				if pc.page == u {
					parts = append(parts, b[pc.off:pc.off+pc.len])
				}
			}
			binary.LittleEndian.PutUint64(separate[8*u:], pageSumModel(parts, sec))
		}
		// Pages of one unit each, as the mover leaves them (first empty): the digests are the
		// pages' own.
		short := 0
		for p, page := range src {
			if first[p+1]-first[p] == 1 {
				if got, want := unitDigest(fused[8*first[p]:], nil, 0, len(page)), uint64(keys.PageChecksum(page)); got != want {
					t.Fatalf("page %d of one unit: %#x, want %#x", p, got, want)
				}
				short++
			}
		}
		if short == 0 || short == len(src) {
			t.Fatalf("%d of %d pages of one unit; the batch should hold both kinds", short, len(src))
		}
		for p, page := range src {
			want := uint64(keys.PageChecksum(page))
			if got := unitDigest(fused, first, p, len(page)); got != want {
				t.Fatalf("round %d, page %d (%d bytes): fused units %#x, PageChecksum %#x", round, p, len(page), got, want)
			}
			if got := unitDigest(separate, first, p, len(page)); got != want {
				t.Fatalf("round %d, page %d (%d bytes): separate units %#x, PageChecksum %#x", round, p, len(page), got, want)
			}
		}
	}
}
