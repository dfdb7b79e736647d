package engineapi

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// TestPackTokensWireFormat pins the encoding: 8 bytes a token, little-endian two's complement.
func TestPackTokensWireFormat(t *testing.T) {
	toks := []int64{0, 1, -1, 150000, math.MaxInt64, math.MinInt64}
	got := PackTokens(nil, toks)
	want := make([]byte, 0, 8*len(toks))
	for _, v := range toks {
		want = binary.LittleEndian.AppendUint64(want, uint64(v))
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("PackTokens = %x, want %x", got, want)
	}
	if got := PackTokens([]byte("ab"), []int64{2}); !bytes.Equal(got, []byte{'a', 'b', 2, 0, 0, 0, 0, 0, 0, 0}) {
		t.Errorf("PackTokens appends: %x", got)
	}
	back, err := UnpackTokens(nil, want)
	if err != nil || !slices.Equal(back, toks) {
		t.Errorf("UnpackTokens = %v, %v, want %v", back, err, toks)
	}
	if got, err := UnpackTokens(nil, nil); err != nil || len(got) != 0 {
		t.Errorf("UnpackTokens(empty) = %v, %v", got, err)
	}
	// dst is reused when it is large enough.
	dst := make([]int64, 0, 16)
	back, _ = UnpackTokens(dst, want)
	if &back[0] != &dst[:1][0] {
		t.Error("UnpackTokens did not reuse dst")
	}
}

func TestUnpackTokensMalformed(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    int
		msg  string
	}{
		{"one byte", 1, "1 bytes, not a multiple of 8"},
		{"seven bytes", 7, "7 bytes, not a multiple of 8"},
		{"nine bytes", 9, "9 bytes, not a multiple of 8"},
		{"a token and a half", 12, "12 bytes, not a multiple of 8"},
		{"over the bound", (MaxRequestTokens + 1) * TokenBytes, "4194305 tokens, more than the 4194304 allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := make([]byte, tc.n)
			_, err := UnpackTokens(nil, b)
			if !errors.Is(err, ErrPackedTokens) || !bytes.Contains([]byte(err.Error()), []byte(tc.msg)) {
				t.Errorf("UnpackTokens(%d bytes) = %v, want ErrPackedTokens with %q", tc.n, err, tc.msg)
			}
			_, err = RequestTokens(&enginepb.Request{TokensPacked: b})
			if !errors.Is(err, ErrPackedTokens) {
				t.Errorf("RequestTokens(%d bytes) = %v, want ErrPackedTokens", tc.n, err)
			}
		})
	}
	// Exactly at the bound is accepted.
	if got, err := UnpackTokens(nil, make([]byte, MaxRequestTokens*TokenBytes)); err != nil || len(got) != MaxRequestTokens {
		t.Errorf("UnpackTokens at the bound = %d tokens, %v", len(got), err)
	}
}

func TestRequestTokens(t *testing.T) {
	toks := []int64{5, 6, 7, -8}
	if got, err := RequestTokens(&enginepb.Request{Tokens: toks}); err != nil || !slices.Equal(got, toks) {
		t.Errorf("repeated field: %v, %v", got, err)
	}
	if got, err := RequestTokens(&enginepb.Request{TokensPacked: PackTokens(nil, toks)}); err != nil || !slices.Equal(got, toks) {
		t.Errorf("packed field: %v, %v", got, err)
	}
	// Unaligned packed bytes (a sub-slice one byte in) decode through the copying path.
	buf := append([]byte{0}, PackTokens(nil, toks)...)
	if got, err := RequestTokens(&enginepb.Request{TokensPacked: buf[1:]}); err != nil || !slices.Equal(got, toks) {
		t.Errorf("unaligned packed field: %v, %v", got, err)
	}
	_, err := RequestTokens(&enginepb.Request{Tokens: toks, TokensPacked: PackTokens(nil, toks)})
	if !errors.Is(err, ErrPackedTokens) || !bytes.Contains([]byte(err.Error()), []byte("both tokens")) {
		t.Errorf("both fields: %v", err)
	}
	if got, err := RequestTokens(&enginepb.Request{}); err != nil || len(got) != 0 {
		t.Errorf("no tokens: %v, %v", got, err)
	}
	// After a protobuf round trip (the daemon's case) the decoded field gives the same tokens.
	r := &enginepb.Request{Id: "x"}
	SetRequestTokens(r, toks)
	wire, err := proto.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back enginepb.Request
	if err := proto.Unmarshal(wire, &back); err != nil {
		t.Fatal(err)
	}
	if got, err := RequestTokens(&back); err != nil || !slices.Equal(got, toks) {
		t.Errorf("after a round trip: %v, %v", got, err)
	}
	r.Tokens = toks
	SetRequestTokens(r, toks[:1])
	if len(r.Tokens) != 0 || !bytes.Equal(r.TokensPacked, PackTokens(nil, toks[:1])) {
		t.Errorf("SetRequestTokens: tokens %v, packed %x", r.Tokens, r.TokensPacked)
	}
	if !bytes.Equal(TokensView(toks), PackTokens(nil, toks)) || TokensView(nil) != nil {
		t.Errorf("TokensView(%v) = %x", toks, TokensView(toks))
	}
}

// FuzzUnpackTokens: any byte string either decodes to len/8 tokens that pack back to the same
// bytes, or is refused with ErrPackedTokens because its length is not a multiple of 8; it never
// panics, and RequestTokens agrees with UnpackTokens.
func FuzzUnpackTokens(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 2, 3})
	f.Add(PackTokens(nil, []int64{1, -1, math.MaxInt64}))
	f.Add(make([]byte, 17))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := UnpackTokens(nil, b)
		if len(b)%TokenBytes != 0 {
			if !errors.Is(err, ErrPackedTokens) {
				t.Fatalf("%d bytes: err = %v, want ErrPackedTokens", len(b), err)
			}
			return
		}
		if err != nil {
			t.Fatalf("%d bytes: %v", len(b), err)
		}
		if len(got) != len(b)/TokenBytes || !bytes.Equal(PackTokens(nil, got), b) {
			t.Fatalf("round trip of %x gave %v", b, got)
		}
		viaReq, err := RequestTokens(&enginepb.Request{TokensPacked: b})
		if err != nil || (len(b) > 0 && !slices.Equal(viaReq, got)) {
			t.Fatalf("RequestTokens(%x) = %v, %v; UnpackTokens gave %v", b, viaReq, err, got)
		}
	})
}
