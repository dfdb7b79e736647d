package engineapi

import (
	"slices"
	"testing"
	"unsafe"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// TestCodecRoundTrip decodes what the codec encodes, from one buffer and from the many a
// message read off the socket in frames arrives in, and refuses what is not a protobuf message.
func TestCodecRoundTrip(t *testing.T) {
	toks := make([]int64, 32<<10)
	for i := range toks {
		toks[i] = int64(i*7919) - 5
	}
	small := &enginepb.LookupRequest{Engine: "e/rank0", Request: &enginepb.Request{Id: "a", Tokens: []int64{1, 2}}}
	big := &enginepb.LookupRequest{Engine: "e/rank0", Request: &enginepb.Request{Id: "b", TokensPacked: PackTokens(nil, toks)}, NumComputedTokens: 64}
	for _, m := range []*enginepb.LookupRequest{small, big} {
		data, err := codec{}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		flat := data.Materialize()
		data.Free()
		// The same bytes split as frames of 16 KiB and of 1000 bytes, and in one piece.
		for _, frame := range []int{len(flat), 16 << 10, 1000} {
			var bs mem.BufferSlice
			for off := 0; off < len(flat); off += frame {
				bs = append(bs, mem.SliceBuffer(slices.Clone(flat[off:min(off+frame, len(flat))])))
			}
			var got enginepb.LookupRequest
			if err := (codec{}).Unmarshal(bs, &got); err != nil {
				t.Fatalf("frames of %d: %v", frame, err)
			}
			if !proto.Equal(&got, m) {
				t.Fatalf("frames of %d: decoded message differs", frame)
			}
		}
	}
	if _, err := (codec{}).Marshal("not a message"); err == nil {
		t.Error("Marshal of a string succeeded")
	}
	if err := (codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{1})}, new(int)); err == nil {
		t.Error("Unmarshal into an int succeeded")
	}
	var r enginepb.Request
	if err := (codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0x4a, 0x05, 1})}, &r); err == nil {
		t.Error("Unmarshal of a truncated field succeeded")
	}
}

// TestDirtyPool checks the size classes: Get returns the length asked for with a power-of-two
// capacity that holds it, and Put keeps only buffers of a class's capacity.
func TestDirtyPool(t *testing.T) {
	p := newDirtyPool()
	for _, n := range []int{0, 1, 256, 257, 4096, 100000, 1 << 24} {
		b := p.Get(n)
		if len(*b) != n || cap(*b) < n || cap(*b)&(cap(*b)-1) != 0 {
			t.Errorf("Get(%d): len %d cap %d", n, len(*b), cap(*b))
		}
		p.Put(b)
	}
	if b := p.Get(1<<24 + 1); len(*b) != 1<<24+1 {
		t.Errorf("Get over the largest class: len %d", len(*b))
	}
	odd := make([]byte, 3000)
	p.Put(&odd) // not a class's capacity: dropped, not handed out later as a smaller class
	for range 10 {
		if b := p.Get(2048); cap(*b) != 2048 {
			t.Fatalf("Get(2048) cap %d", cap(*b))
		}
	}
}

// FuzzCodecUnmarshal: for any bytes, split into frames at any size, the codec decodes a
// LookupRequest exactly as proto.Unmarshal does (same message or an error in both), without
// panicking.
func FuzzCodecUnmarshal(f *testing.F) {
	seed, _ := proto.Marshal(&enginepb.LookupRequest{Engine: "e", Request: &enginepb.Request{Id: "r", TokensPacked: PackTokens(nil, []int64{1, 2, 3})}, NumComputedTokens: 16})
	f.Add(seed, uint16(7))
	f.Add([]byte{0x12, 0x02, 0x4a, 0x05}, uint16(1))
	f.Add([]byte{}, uint16(0))
	arena, _ := proto.Marshal(&enginepb.LookupRequest{Engine: "e", Request: &enginepb.Request{Id: "r", TokensArena: &enginepb.ArenaRange{Offset: 24, Count: 32768}}})
	f.Add(arena, uint16(3))
	// tokens_arena twice (merged), and an ArenaRange with an unknown field.
	f.Add(append(slices.Clone(arena), 0x12, 0x04, 0x52, 0x02, 0x08, 0x01), uint16(64))
	f.Add([]byte{0x12, 0x06, 0x52, 0x04, 0x08, 0x01, 0x18, 0x02}, uint16(5))
	f.Fuzz(func(t *testing.T, b []byte, frame uint16) {
		var want enginepb.LookupRequest
		wantErr := proto.Unmarshal(b, &want)
		var bs mem.BufferSlice
		step := int(frame)%64 + 1
		for off := 0; off < len(b); off += step {
			bs = append(bs, mem.SliceBuffer(slices.Clone(b[off:min(off+step, len(b))])))
		}
		var got enginepb.LookupRequest
		err := codec{}.Unmarshal(bs, &got)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("codec error %v, proto.Unmarshal error %v", err, wantErr)
		}
		if err == nil && !proto.Equal(&got, &want) {
			t.Fatalf("codec decoded %v, proto.Unmarshal %v", &got, &want)
		}
	})
}

// TestDecodeLookupAligns checks the point of decodeLookup: whatever the length of the fields
// before it, tokens_packed comes out 8-byte aligned, so RequestTokens uses it without a copy,
// and the message equals proto.Unmarshal's.
func TestDecodeLookupAligns(t *testing.T) {
	toks := []int64{3, 1, 4, 1, 5, 9, 2, 6}
	for _, engine := range []string{"", "e", "ab", "abc", "abcdefg", "a/rank0"} {
		m := &enginepb.LookupRequest{Engine: engine, Request: &enginepb.Request{Id: "req", TokensPacked: PackTokens(nil, toks), ContextOnly: true}, NumComputedTokens: 3}
		wire, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		var bs mem.BufferSlice
		for off := 0; off < len(wire); off += 5 {
			bs = append(bs, mem.SliceBuffer(wire[off:min(off+5, len(wire))]))
		}
		var got enginepb.LookupRequest
		if err := decodeLookup(bs, &got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&got, m) {
			t.Fatalf("engine %q: decoded %v, want %v", engine, &got, m)
		}
		p := got.GetRequest().GetTokensPacked()
		tk, err := RequestTokens(got.GetRequest())
		if err != nil || !slices.Equal(tk, toks) {
			t.Fatalf("engine %q: tokens %v, %v", engine, tk, err)
		}
		if littleEndian && unsafe.Pointer(&tk[0]) != unsafe.Pointer(&p[0]) {
			t.Errorf("engine %q: tokens_packed at offset %d was copied, not used in place", engine, uintptr(unsafe.Pointer(&p[0]))%8)
		}
	}
	if !decodeLookupFast([]byte{0x18, 0x05}, new(enginepb.LookupRequest)) {
		t.Error("fast path refused num_computed_tokens alone")
	}
	if decodeLookupFast([]byte{0x20, 0x05}, new(enginepb.LookupRequest)) {
		t.Error("fast path took an unknown field, which proto.Unmarshal keeps")
	}
}
