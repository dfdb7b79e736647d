package engineapi

import (
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// TestCopyArenaTokens checks the range decode of tokens_arena: ranges inside the arena (aligned
// or not, empty, ending exactly at the end) give the tokens written there; every range that is
// not inside it, or names more tokens than allowed, is refused with ErrArenaRange naming the
// problem, without reading the arena, including ranges whose end overflows 64 bits.
func TestCopyArenaTokens(t *testing.T) {
	arena := make([]byte, 1024)
	for i := range arena {
		arena[i] = byte(i * 31)
	}
	want := func(off, count uint64) []int64 {
		out := make([]int64, count)
		for i := range out {
			out[i] = int64(binary.LittleEndian.Uint64(arena[off+uint64(i)*8:]))
		}
		return out
	}
	for _, tc := range []struct {
		name       string
		off, count uint64
		max        int
	}{
		{"start", 0, 16, 1000},
		{"unaligned offset", 5, 3, 1000},
		{"ends at the end", 1024 - 8*10, 10, 1000},
		{"whole arena", 0, 128, 128},
		{"empty", 1024, 0, 1000},
	} {
		got, err := CopyArenaTokens(nil, arena, tc.off, tc.count, tc.max)
		if err != nil || !slices.Equal(got, want(tc.off, tc.count)) {
			t.Errorf("%s: %v, %v; want %v", tc.name, got, err, want(tc.off, tc.count))
		}
	}
	for _, tc := range []struct {
		name       string
		off, count uint64
		max        int
		msg        string
	}{
		{"offset past the end", 1025, 0, 1000, "offset 1025 is past the end of the 1024-byte arena"},
		{"offset far past the end", math.MaxUint64, 1, 1000, "past the end"},
		{"one byte too long", 1024 - 8*10 + 1, 10, 1000, "of 10 tokens at offset 945 ends past the end of the 1024-byte arena"},
		{"too many for the arena", 0, 129, 1000, "ends past the end"},
		{"over the token limit", 0, 17, 16, "names 17 tokens, more than the 16 allowed"},
		{"count that overflows 8*count", 8, 1 << 61, math.MaxInt, "ends past the end"},
		{"count of 2^64-1", 0, math.MaxUint64, math.MaxInt, "more than the 9223372036854775807 allowed"},
		{"negative limit", 0, 1, -1, "more than the 0 allowed"},
	} {
		got, err := CopyArenaTokens(make([]int64, 4), arena, tc.off, tc.count, tc.max)
		if !errors.Is(err, ErrArenaRange) || !strings.Contains(err.Error(), tc.msg) || len(got) != 0 {
			t.Errorf("%s: %v, %v; want ErrArenaRange naming %q", tc.name, got, err, tc.msg)
		}
	}
	// dst is reused when it is large enough.
	dst := make([]int64, 0, 64)
	got, err := CopyArenaTokens(dst, arena, 8, 4, 100)
	if err != nil || &got[0] != &dst[:1][0] {
		t.Errorf("dst with room was not reused: %v", err)
	}
}

// FuzzCopyArenaTokens feeds arbitrary ranges and limits: the decode never panics, succeeds
// exactly when the range lies inside the arena and within the limit, and then returns the bytes
// there.
func FuzzCopyArenaTokens(f *testing.F) {
	f.Add(uint16(64), uint64(0), uint64(8), 100)
	f.Add(uint16(64), uint64(3), uint64(7), 7)
	f.Add(uint16(0), uint64(0), uint64(0), 0)
	f.Add(uint16(4096), uint64(math.MaxUint64-7), uint64(1), 1<<22)
	f.Add(uint16(16), uint64(8), uint64(1<<61), math.MaxInt)
	f.Fuzz(func(t *testing.T, size uint16, off, count uint64, limit int) {
		arena := make([]byte, size)
		for i := range arena {
			arena[i] = byte(i*7 + 1)
		}
		got, err := CopyArenaTokens(nil, arena, off, count, limit)
		// A negative limit allows no tokens.
		inside := off <= uint64(size) && count <= (uint64(size)-off)/8 && count <= uint64(max(limit, 0))
		if (err == nil) != inside {
			t.Fatalf("size %d offset %d count %d limit %d: err %v, inside %v", size, off, count, limit, err, inside)
		}
		if err != nil {
			if !errors.Is(err, ErrArenaRange) {
				t.Fatalf("error %v is not ErrArenaRange", err)
			}
			return
		}
		if uint64(len(got)) != count {
			t.Fatalf("got %d tokens, want %d", len(got), count)
		}
		for i, v := range got {
			if w := int64(binary.LittleEndian.Uint64(arena[off+uint64(i)*8:])); v != w {
				t.Fatalf("token %d = %d, want %d", i, v, w)
			}
		}
	})
}

// TestPromptArena checks the engine's side: the memfd carries the seals the daemon requires,
// ranges are 8-byte aligned, first fit reuses freed space, a full arena says so, what is
// written reads back in the tokens_packed encoding, and a closed arena allocates and writes
// nothing.
func TestPromptArena(t *testing.T) {
	a, err := NewPromptArena(5000)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.Size() != 8192 {
		t.Errorf("size %d, want 5000 rounded up to 8192 (two pages)", a.Size())
	}
	seals, err := unix.FcntlInt(uintptr(a.FD()), unix.F_GET_SEALS, 0)
	if err != nil || seals&unix.F_SEAL_SHRINK == 0 || seals&unix.F_SEAL_GROW == 0 {
		t.Errorf("seals %#x, %v; want F_SEAL_SHRINK and F_SEAL_GROW", seals, err)
	}
	alloc := func(n uint64) uint64 {
		t.Helper()
		off, ok := a.Alloc(n)
		if !ok {
			t.Fatalf("alloc %d: no room (held %d)", n, a.HeldBytes())
		}
		return off
	}
	o1, o2, o3 := alloc(100), alloc(3), alloc(4000)
	if o1 != 0 || o2 != 104 || o3 != 112 {
		t.Errorf("offsets %d %d %d, want 0 104 112 (8-byte aligned, first fit)", o1, o2, o3)
	}
	if _, ok := a.Alloc(8192); ok {
		t.Error("an allocation larger than the free space succeeded")
	}
	if _, ok := a.Alloc(0); ok {
		t.Error("an empty allocation succeeded")
	}
	a.Free(o1)
	if o := alloc(96); o != 0 {
		t.Errorf("freed range not reused: offset %d", o)
	}
	if o := alloc(16); o != 4112 {
		t.Errorf("offset %d, want 4112 after the last range", o)
	}
	if got := a.HeldBytes(); got != 96+8+4000+16 {
		t.Errorf("held %d bytes", got)
	}
	toks := []int64{1, -2, math.MaxInt64, math.MinInt64}
	if !a.Write(o3, toks) {
		t.Fatal("write failed")
	}
	got, err := CopyArenaTokens(nil, a.Bytes(), o3, uint64(len(toks)), 10)
	if err != nil || !slices.Equal(got, toks) {
		t.Errorf("read back %v, %v; want %v", got, err, toks)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Alloc(8); ok || a.Write(0, toks) {
		t.Error("a closed arena allocated or wrote")
	}
	if err := a.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
}

// TestPromptArenaWireContract pins what engines in other languages build against: the field
// numbers and types of tokens_arena, ArenaRange and PromptArenaRequest, the RPC's name and
// types, and the bytes of one request.
func TestPromptArenaWireContract(t *testing.T) {
	type field struct {
		msg, name string
		num       protowire.Number
		kind      protoreflect.Kind
	}
	for _, f := range []field{
		{"Request", "tokens_packed", 9, protoreflect.BytesKind},
		{"Request", "tokens_arena", 10, protoreflect.MessageKind},
		{"ArenaRange", "offset", 1, protoreflect.Uint64Kind},
		{"ArenaRange", "count", 2, protoreflect.Uint64Kind},
		{"PromptArenaRequest", "engine", 1, protoreflect.StringKind},
		{"PromptArenaRequest", "fd_token", 2, protoreflect.StringKind},
		{"PromptArenaRequest", "size", 3, protoreflect.Uint64Kind},
	} {
		md := enginepb.File_engine_proto.Messages().ByName(protoreflect.Name(f.msg))
		if md == nil {
			t.Fatalf("message %s is gone", f.msg)
		}
		fd := md.Fields().ByName(protoreflect.Name(f.name))
		if fd == nil || fd.Number() != f.num || fd.Kind() != f.kind {
			t.Errorf("%s.%s: %v; want number %d, kind %v", f.msg, f.name, fd, f.num, f.kind)
		}
	}
	if fd := enginepb.File_engine_proto.Messages().ByName("Request").Fields().ByName("tokens_arena"); fd.Message().Name() != "ArenaRange" {
		t.Errorf("tokens_arena is a %s", fd.Message().Name())
	}
	m := enginepb.File_engine_proto.Services().ByName("Engine").Methods().ByName("RegisterPromptArena")
	if m == nil || m.Input().Name() != "PromptArenaRequest" || m.Output().Name() != "Empty" {
		t.Errorf("RegisterPromptArena: %v", m)
	}
	b, err := proto.Marshal(&enginepb.LookupRequest{Engine: "e", Request: &enginepb.Request{Id: "r", TokensArena: &enginepb.ArenaRange{Offset: 24, Count: 300}}})
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{0x0a, 0x01, 'e', 0x12, 0x0a, 0x0a, 0x01, 'r', 0x52, 0x05, 0x08, 24, 0x10, 0xac, 0x02}
	if !slices.Equal(b, want) {
		t.Errorf("encoded % x, want % x", b, want)
	}
}

// TestCopyArenaTokensFault maps a memfd, then truncates it under the mapping (what the seal the
// daemon requires rules out): reading the lost pages faults, and CopyArenaTokens returns
// ErrArenaFault instead of the process dying of SIGBUS.
func TestCopyArenaTokensFault(t *testing.T) {
	fd, err := unix.MemfdCreate("arena-fault", unix.MFD_CLOEXEC)
	if err != nil {
		t.Skip(err)
	}
	defer unix.Close(fd)
	page := unix.Getpagesize()
	if err := unix.Ftruncate(fd, int64(2*page)); err != nil {
		t.Fatal(err)
	}
	data, err := unix.Mmap(fd, 0, 2*page, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(data)
	if got, err := CopyArenaTokens(nil, data, 0, 4, 100); err != nil || len(got) != 4 {
		t.Fatalf("before the truncation: %v, %v", got, err)
	}
	if err := unix.Ftruncate(fd, 0); err != nil {
		t.Fatal(err)
	}
	_, err = CopyArenaTokens(nil, data, uint64(page), 4, 100)
	if !errors.Is(err, ErrArenaFault) {
		t.Errorf("reading a truncated arena: %v, want ErrArenaFault", err)
	}
}
