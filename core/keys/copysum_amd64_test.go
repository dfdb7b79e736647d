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
