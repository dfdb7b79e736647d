package mooncake_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/pool"
)

// pieceSplits are how the tests lay a value out: K and V apart, per-layer pieces of 1 KiB with
// an empty piece among them, and pieces of odd sizes.
var pieceSplits = [][]int{{32 << 10}, {1024, 0}, {7, 4093, 1}}

// TestNativePiecesInterop: values that lie in pieces (pool.PieceCopier) against the real master
// and Mooncake's Python client, byte for byte, whichever segment holds them. kvctl reads what
// the Python client put in its own segment straight into pieces over the Transfer Engine
// (pieces that hold more than the value keep their extra bytes); kvctl writes pieces into the
// Python client's segment over the Transfer Engine and into its own segment, and the Python
// client reads each value whole; kvctl reads back into other pieces from its own segment.
func TestNativePiecesInterop(t *testing.T) {
	const size = 64 << 10
	ctx := context.Background()
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	py := mooncaketest.StartClient(t, m, mooncaketest.ClientOptions{SegmentSize: 64 << 20})
	remote := newNative(t, m, 0) // no segment: every value lies in the Python client's

	for s, split := range pieceSplits {
		key := fmt.Sprintf("py-pieces/%d", s)
		want := interopPage(key, size)
		if rc := py.Put(key, want, mooncaketest.PutOptions{}); rc != 0 {
			t.Fatalf("python put %s: rc %d", key, rc)
		}
		dst := bytes.Repeat([]byte{0xAA}, size+9)
		got := remote.BatchGetPieces(ctx, []string{key}, [][][]byte{mooncaketest.Pieces(dst, split...)})
		if got[0] != size || !bytes.Equal(dst[:size], want) {
			t.Fatalf("%s read into pieces %v: %d, first difference at %d", key, split, got[0], diffAt(dst[:size], want))
		}
		if !bytes.Equal(dst[size:], bytes.Repeat([]byte{0xAA}, 9)) {
			t.Fatalf("%s: the read wrote past the value's %d bytes into the pieces' rest", key, size)
		}

		key = fmt.Sprintf("kvctl-pieces/te/%d", s)
		want = interopPage(key, size)
		if c := remote.BatchPutPieces(ctx, []string{key}, [][][]byte{mooncaketest.Pieces(bytes.Clone(want), split...)}, pool.ReplicateConfig{}); c[0] != pool.OK {
			t.Fatalf("kvctl put of pieces %v into the Python client's segment: %v", split, c[0])
		}
		if got := py.Get(key); !bytes.Equal(got, want) {
			t.Fatalf("python read %d bytes for %s, not the pieces kvctl wrote", len(got), key)
		}
	}

	// Into and out of kvctl's own segment: the only segment but the Python client's, which is
	// full of the values above plus room, so the master places some here; every value is
	// checked wherever it went.
	own := newNative(t, m, 64<<20)
	for s, split := range pieceSplits {
		for k := range 4 {
			key := fmt.Sprintf("kvctl-pieces/own/%d/%d", s, k)
			want := interopPage(key, size)
			if c := own.BatchPutPieces(ctx, []string{key}, [][][]byte{mooncaketest.Pieces(bytes.Clone(want), split...)}, pool.ReplicateConfig{}); c[0] != pool.OK {
				t.Fatalf("kvctl put of pieces %v: %v", split, c[0])
			}
			if got := py.Get(key); !bytes.Equal(got, want) {
				t.Fatalf("python read %d bytes for %s, not the pieces kvctl wrote", len(got), key)
			}
			back := make([]byte, size)
			other := pieceSplits[(s+1)%len(pieceSplits)]
			if got := own.BatchGetPieces(ctx, []string{key}, [][][]byte{mooncaketest.Pieces(back, other...)}); got[0] != size || !bytes.Equal(back, want) {
				t.Fatalf("%s read back into pieces %v: %d, first difference at %d", key, other, got[0], diffAt(back, want))
			}
		}
	}
	segs, err := own.Segments(ctx)
	if err != nil {
		t.Fatal(err)
	}
	used := false
	for _, sg := range segs {
		if sg.Name == own.SegmentName() && sg.Used > 0 {
			used = true
		}
	}
	if !used {
		t.Fatalf("the master placed none of the values in kvctl's own segment (%+v): its local path was not exercised", segs)
	}
}

// TestNativePiecesChecksumAndBounds: with the object checksum on, a value put as pieces carries
// the checksum of its bytes end to end (a whole get verifies it, and so does a get into pieces
// of a value put whole); pieces that hold fewer bytes than the value are refused with
// ErrInvalidParams, a key without pieces or with no bytes in them is ErrInvalidParams, and a
// list of pieces per key that does not match the keys fails every key.
func TestNativePiecesChecksumAndBounds(t *testing.T) {
	ctx := context.Background()
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	n := checksumNative(t, m, 64<<20)
	const size = 4096 + 3
	want := interopPage("sum", size)
	if c := n.BatchPutPieces(ctx, []string{"sum", "whole"}, [][][]byte{mooncaketest.Pieces(bytes.Clone(want), 100, 0, 1), {bytes.Clone(want)}}, pool.ReplicateConfig{}); c[0] != pool.OK || c[1] != pool.OK {
		t.Fatalf("put: %v", c)
	}
	whole := make([]byte, size)
	if got := n.BatchGet(ctx, []string{"sum"}, [][]byte{whole}); got[0] != size || !bytes.Equal(whole, want) {
		t.Fatalf("a whole get of a value put as pieces, checksum verified: %d", got[0])
	}
	dst := make([]byte, size)
	if got := n.BatchGetPieces(ctx, []string{"whole"}, [][][]byte{mooncaketest.Pieces(dst, 5, 1000)}); got[0] != size || !bytes.Equal(dst, want) {
		t.Fatalf("a get into pieces of a value put whole, checksum verified: %d", got[0])
	}
	if st, err := n.Stats(ctx); err != nil || st.ChecksumErrors != 0 {
		t.Fatalf("checksum errors after reads of good values: %+v %v", st, err)
	}
	short := make([]byte, size-1)
	if got := n.BatchGetPieces(ctx, []string{"sum"}, [][][]byte{mooncaketest.Pieces(short, 1000)}); got[0] != int64(mooncake.ErrInvalidParams) {
		t.Fatalf("pieces one byte short: %d, want ErrInvalidParams", got[0])
	}
	if c := n.BatchPutPieces(ctx, []string{"a", "b"}, [][][]byte{nil, {{}}}, pool.ReplicateConfig{}); c[0] != pool.ErrInvalidParams || c[1] != pool.ErrInvalidParams {
		t.Fatalf("values of no bytes: %v", c)
	}
	if c := n.BatchPutPieces(ctx, []string{"a", "b"}, [][][]byte{{want}}, pool.ReplicateConfig{}); c[0] != pool.ErrInvalidParams || c[1] != pool.ErrInvalidParams {
		t.Fatalf("two keys, one value: %v", c)
	}
	if got := n.BatchGetPieces(ctx, []string{"sum", "whole"}, [][][]byte{{dst}}); got[0] != int64(mooncake.ErrInvalidParams) || got[1] != int64(mooncake.ErrInvalidParams) {
		t.Fatalf("two keys, one destination: %v", got)
	}
}

// diffAt is the first index where a and b differ, or -1.
func diffAt(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}
