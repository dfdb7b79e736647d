package keys

import "golang.org/x/sys/cpu"

// haveBlockAsm reports whether accumBlocks runs assembly (AVX2 or AVX-512); without it
// CopyChecksum keeps to the xxh3 package's streaming hasher, which has its own vector code for
// every CPU.
var haveBlockAsm = cpu.X86.HasAVX2

// useAVX512 picks the AVX-512 loop where the CPU and the OS support it.
var useAVX512 = cpu.X86.HasAVX512F

// accumBlocksAVX2 adds blocks whole blocks at p to the lanes, as blocksGeneric does.
//
//go:noescape
func accumBlocksAVX2(a *xxh3Acc, p *byte, blocks int)

// accumBlocksAVX512 is accumBlocksAVX2 with 512-bit registers.
//
//go:noescape
func accumBlocksAVX512(a *xxh3Acc, p *byte, blocks int)

// accumBlocks adds len(p)/xxh3Block whole blocks of p to the lanes, each followed by its scramble.
func accumBlocks(a *xxh3Acc, p []byte) {
	n := len(p) / xxh3Block
	switch {
	case n == 0:
	case !haveBlockAsm:
		a.blocksGeneric(p)
	case useAVX512:
		accumBlocksAVX512(a, &p[0], n)
	default:
		accumBlocksAVX2(a, &p[0], n)
	}
}
