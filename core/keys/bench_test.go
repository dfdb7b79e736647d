package keys

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/blake2b"
)

const benchPromptTokens = 128 << 10

var benchBlockSizes = []int{16, 32, 64, 128}

func benchTokens(n int) []int64 {
	r := rand.New(rand.NewPCG(1, 2))
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(r.IntN(152064))
	}
	return out
}

// BenchmarkChainExtend hashes a 128k-token prompt with a fresh chain per iteration, encoding
// included. MB/s counts 8 bytes per token.
func BenchmarkChainExtend(b *testing.B) {
	tokens := benchTokens(benchPromptTokens)
	for _, T := range benchBlockSizes {
		b.Run(fmt.Sprintf("T=%d", T), func(b *testing.B) {
			cfg := ChainConfig{TokensPerBlock: T}
			b.SetBytes(int64(8 * len(tokens)))
			b.ReportAllocs()
			for b.Loop() {
				c, err := NewChain(cfg)
				if err != nil {
					b.Fatal(err)
				}
				if hs, _ := c.Extend(tokens); len(hs) != len(tokens)/T {
					b.Fatal("short chain")
				}
			}
			b.ReportMetric(float64(len(tokens))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// BenchmarkRawBLAKE2b128 is the baseline for BenchmarkChainExtend: the same preimage bytes
// (16 bytes standing in for the parent, then the block's pre-encoded tokens), one BLAKE2b-128
// digest per block, with no encoding and no chain logic.
func BenchmarkRawBLAKE2b128(b *testing.B) {
	tokens := benchTokens(benchPromptTokens)
	enc := make([]byte, 8*len(tokens))
	for i, v := range tokens {
		binary.LittleEndian.PutUint64(enc[8*i:], uint64(v))
	}
	for _, T := range benchBlockSizes {
		b.Run(fmt.Sprintf("T=%d", T), func(b *testing.B) {
			h, err := blake2b.New(16, nil)
			if err != nil {
				b.Fatal(err)
			}
			var parent [16]byte
			sum := make([]byte, 0, 64)
			b.SetBytes(int64(len(enc)))
			b.ReportAllocs()
			for b.Loop() {
				for off := 0; off+8*T <= len(enc); off += 8 * T {
					h.Reset()
					h.Write(parent[:])
					h.Write(enc[off : off+8*T])
					sum = h.Sum(sum[:0])
				}
			}
			b.ReportMetric(float64(len(tokens))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

func rawBlake2b128(b *testing.B, enc []byte, T int) {
	h, err := blake2b.New(16, nil)
	if err != nil {
		b.Fatal(err)
	}
	var parent [16]byte
	sum := make([]byte, 0, 64)
	for off := 0; off+8*T <= len(enc); off += 8 * T {
		h.Reset()
		h.Write(parent[:])
		h.Write(enc[off : off+8*T])
		sum = h.Sum(sum[:0])
	}
}

// BenchmarkChainVsRaw alternates one chain run and one raw baseline run per iteration on the
// same prompt and reports raw time / chain time (1.0 = no overhead), both by wall clock
// ("raw/chain-wall") and by the CPU time of the benchmark's thread ("raw/chain-cpu"). Pairing
// the runs this closely, and counting only the time the thread ran, keeps a busy machine's
// noise out of the ratio; separate benchmarks run seconds apart do not. Garbage collection
// running on other threads is not counted in the CPU figure.
func BenchmarkChainVsRaw(b *testing.B) {
	tokens := benchTokens(benchPromptTokens)
	enc := encode(nil, tokens)
	for _, T := range benchBlockSizes {
		b.Run(fmt.Sprintf("T=%d", T), func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var chainWall, rawWall time.Duration
			var chainCPU, rawCPU int64
			for b.Loop() {
				start, startCPU := time.Now(), threadCPU()
				c, _ := NewChain(ChainConfig{TokensPerBlock: T})
				c.Extend(tokens)
				mid, midCPU := time.Now(), threadCPU()
				rawBlake2b128(b, enc, T)
				end, endCPU := time.Now(), threadCPU()
				chainWall += mid.Sub(start)
				rawWall += end.Sub(mid)
				chainCPU += midCPU - startCPU
				rawCPU += endCPU - midCPU
			}
			b.ReportMetric(float64(rawWall)/float64(chainWall), "raw/chain-wall")
			b.ReportMetric(float64(rawCPU)/float64(chainCPU), "raw/chain-cpu")
		})
	}
}

// BenchmarkParseTokens parses one million tokens in each input form.
func BenchmarkParseTokens(b *testing.B) {
	tokens := benchTokens(1 << 20)
	var plain, js strings.Builder
	js.WriteByte('[')
	for i, v := range tokens {
		if i > 0 {
			plain.WriteByte(' ')
			js.WriteString(", ")
		}
		plain.WriteString(strconv.FormatInt(v, 10))
		js.WriteString(strconv.FormatInt(v, 10))
	}
	js.WriteByte(']')
	for _, in := range []struct{ name, text string }{{"plain", plain.String()}, {"json", js.String()}} {
		b.Run(in.name, func(b *testing.B) {
			b.SetBytes(int64(len(in.text)))
			b.ReportAllocs()
			for b.Loop() {
				got, err := ParseTokens(strings.NewReader(in.text))
				if err != nil || len(got) != len(tokens) {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(tokens))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}
