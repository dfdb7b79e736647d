package keys

import (
	"math/rand/v2"
	"testing"

	"golang.org/x/sys/cpu"
)

// TestAccumBlocksEachLoop checks both assembly loops, not only the one this CPU picks, against
// the Go version of the same steps.
func TestAccumBlocksEachLoop(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	p := randomBytes(r, 40*xxh3Block)
	loops := []struct {
		name string
		ok   bool
		fn   func(a *xxh3Acc, p *byte, blocks int)
	}{
		{"avx2", cpu.X86.HasAVX2, accumBlocksAVX2},
		{"avx512", cpu.X86.HasAVX512F, accumBlocksAVX512},
	}
	for _, l := range loops {
		if !l.ok {
			t.Logf("%s: not supported by this CPU", l.name)
			continue
		}
		for _, blocks := range []int{0, 1, 3, 16, 40} {
			want := newXXH3Acc()
			want.blocksGeneric(p[:blocks*xxh3Block])
			got := newXXH3Acc()
			l.fn(&got, &p[0], blocks)
			if got != want {
				t.Fatalf("%s, %d blocks: lanes %x, want %x", l.name, blocks, got, want)
			}
		}
	}
}

// TestCopyChecksumBlocksWithoutAsm runs the block-wise path on the Go lanes, as a CPU without
// AVX2 would.
func TestCopyChecksumBlocksWithoutAsm(t *testing.T) {
	defer func(v bool) { haveBlockAsm = v }(haveBlockAsm)
	haveBlockAsm = false
	r := rand.New(rand.NewPCG(13, 14))
	src := randomBytes(r, 3*checksumChunk+777)
	dst := make([]byte, len(src))
	for _, n := range []int{xxh3LongMin, xxh3Block, xxh3Block + 1, checksumChunk + 1, len(src)} {
		if got, want := copyChecksumBlocks(dst, src[:n]), PageChecksum(src[:n]); got != want {
			t.Fatalf("n=%d: %#x, want %#x", n, uint64(got), uint64(want))
		}
	}
}

// BenchmarkBlockLanes hashes a 64 KiB piece already in cache with each lane loop and with
// xxh3.Hash: the cost CopyChecksum adds to a copy, per core.
func BenchmarkBlockLanes(b *testing.B) {
	p := make([]byte, checksumChunk)
	loops := []struct {
		name string
		ok   bool
		fn   func(a *xxh3Acc)
	}{
		{"avx2", cpu.X86.HasAVX2, func(a *xxh3Acc) { accumBlocksAVX2(a, &p[0], len(p)/xxh3Block) }},
		{"avx512", cpu.X86.HasAVX512F, func(a *xxh3Acc) { accumBlocksAVX512(a, &p[0], len(p)/xxh3Block) }},
		{"go", true, func(a *xxh3Acc) { a.blocksGeneric(p) }},
		{"xxh3.Hash", true, func(*xxh3Acc) { checksumSink += uint64(PageChecksum(p)) }},
	}
	for _, l := range loops {
		b.Run(l.name, func(b *testing.B) {
			if !l.ok {
				b.Skip("not supported by this CPU")
			}
			b.SetBytes(int64(len(p)))
			for b.Loop() {
				a := newXXH3Acc()
				l.fn(&a)
			}
		})
	}
}
