package embedded_test

import (
	"bytes"
	"testing"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/pool"
)

// TestPieces puts values given as pieces and gets them into pieces: the pool stores each value's
// bytes in order under the checksum of those bytes (a plain BatchGet reads them back), a value
// put whole is got into pieces, a corrupted value is ErrChecksumMismatch and counted, pieces too
// short for the value are ErrInvalidParams, a length mismatch fails every key, and an existing
// key is OK without a write, as with BatchPut.
func TestPieces(t *testing.T) {
	p, _ := newPool(t, nil)
	value := func(n int, seed byte) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = seed + byte(i*13)
		}
		return b
	}
	a, b := value(3*unit+5, 1), value(2*unit, 2)
	srcA := [][]byte{a[:100], a[100:100], a[100 : 2*unit], a[2*unit:]}
	srcB := [][]byte{b}
	codes := p.BatchPutPieces(bg, []string{"a", "b"}, [][][]byte{srcA, srcB}, pool.ReplicateConfig{})
	if codes[0] != pool.OK || codes[1] != pool.OK {
		t.Fatalf("put pieces: %v", codes)
	}
	whole := [][]byte{make([]byte, len(a)), make([]byte, len(b))}
	if got := p.BatchGet(bg, []string{"a", "b"}, whole); got[0] != int64(len(a)) || got[1] != int64(len(b)) || !bytes.Equal(whole[0], a) || !bytes.Equal(whole[1], b) {
		t.Fatalf("get of values put as pieces: %v", got)
	}
	mustPut(t, p, "c", unit, pool.ReplicateConfig{})
	c := make([]byte, unit)
	if got := p.BatchGet(bg, []string{"c"}, [][]byte{c}); got[0] != unit {
		t.Fatal(got)
	}

	dA := [][]byte{make([]byte, 7), make([]byte, unit), make([]byte, 3*unit)} // longer than a
	dC := [][]byte{make([]byte, unit/2), make([]byte, unit/2)}
	got := p.BatchGetPieces(bg, []string{"a", "c", "missing"}, [][][]byte{dA, dC, {make([]byte, 1)}})
	if got[0] != int64(len(a)) || got[1] != unit || got[2] != int64(pool.ErrObjectNotFound) {
		t.Fatalf("get pieces: %v", got)
	}
	if !bytes.Equal(bytes.Join(dA, nil)[:len(a)], a) || !bytes.Equal(bytes.Join(dC, nil), c) {
		t.Fatal("pieces do not hold the values' bytes")
	}
	if keys.PageChecksum(bytes.Join(dC, nil)) != keys.PageChecksum(c) {
		t.Fatal("checksum of the pieces differs")
	}

	if got := p.BatchGetPieces(bg, []string{"b"}, [][][]byte{{make([]byte, unit), make([]byte, unit-1)}}); got[0] != int64(pool.ErrInvalidParams) {
		t.Fatalf("pieces one byte short: %d, want ErrInvalidParams", got[0])
	}
	if got := p.BatchGetPieces(bg, []string{"a", "b"}, [][][]byte{dA}); got[0] != int64(pool.ErrInvalidParams) || got[1] != int64(pool.ErrInvalidParams) {
		t.Fatalf("two keys, one destination: %v", got)
	}
	if codes := p.BatchPutPieces(bg, []string{"x", "y"}, [][][]byte{srcA}, pool.ReplicateConfig{}); codes[0] != pool.ErrInvalidParams || codes[1] != pool.ErrInvalidParams {
		t.Fatalf("two keys, one source: %v", codes)
	}
	if codes := p.BatchPutPieces(bg, []string{"a"}, [][][]byte{srcB}, pool.ReplicateConfig{}); codes[0] != pool.OK {
		t.Fatalf("put of an existing key: %v", codes)
	}
	if got := p.BatchGet(bg, []string{"a"}, whole[:1]); got[0] != int64(len(a)) || !bytes.Equal(whole[0], a) {
		t.Fatal("an existing key was overwritten")
	}

	before, _ := p.Stats(bg)
	if !p.CorruptForTest("b") {
		t.Fatal("corrupt hook found no object")
	}
	if got := p.BatchGetPieces(bg, []string{"b"}, [][][]byte{{make([]byte, unit), make([]byte, unit)}}); got[0] != int64(pool.ErrChecksumMismatch) {
		t.Fatalf("get pieces of a corrupted value: %d, want ErrChecksumMismatch", got[0])
	}
	if st, _ := p.Stats(bg); st.ChecksumErrors != before.ChecksumErrors+1 {
		t.Fatalf("checksum errors %d, want %d", st.ChecksumErrors, before.ChecksumErrors+1)
	}
}
