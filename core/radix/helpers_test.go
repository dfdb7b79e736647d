package radix

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/kvctl/kvctl/core/keys"
)

// chainKey derives a test block key from its parent key and tokens.
func chainKey(parent keys.Hash, toks []int64) keys.Hash {
	h := sha256.New()
	h.Write(parent[:])
	var b [8]byte
	for _, v := range toks {
		binary.LittleEndian.PutUint64(b[:], uint64(v))
		h.Write(b[:])
	}
	var k keys.Hash
	copy(k[:], h.Sum(nil))
	return k
}

// blocksOf splits tokens into chained blocks; the last may be partial.
func blocksOf(tokens []int64, T int) []Block {
	var out []Block
	var parent keys.Hash
	for s := 0; s < len(tokens); s += T {
		e := min(s+T, len(tokens))
		k := chainKey(parent, tokens[s:e])
		out = append(out, Block{Key: k, Tokens: tokens[s:e]})
		parent = k
	}
	return out
}

// queryOf builds a query with the keys of the full blocks of tokens.
func queryOf(tokens []int64, T int) Query {
	var q Query
	q.Tokens = tokens
	for _, b := range blocksOf(tokens, T) {
		if len(b.Tokens) == T {
			q.Keys = append(q.Keys, b.Key)
		}
	}
	return q
}

func seq(start, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(start + i)
	}
	return out
}

func mustTree(tb interface {
	Fatalf(string, ...any)
	Helper()
}, cfg Config) *Tree {
	tb.Helper()
	tr, err := New(cfg)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return tr
}

func commit(tb interface {
	Fatalf(string, ...any)
	Helper()
}, tr *Tree, tokens []int64) []NodeID {
	tb.Helper()
	ids, err := tr.InsertChain(nil, Root, blocksOf(tokens, tr.TokensPerBlock()))
	if err != nil {
		tb.Fatalf("InsertChain: %v", err)
	}
	return ids
}
