package keys

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

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
