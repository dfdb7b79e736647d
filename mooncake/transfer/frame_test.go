package transfer_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"testing"

	"github.com/kvctl/kvctl/mooncake/transfer"
)

type frameFixtures struct {
	Headers []struct {
		From, Hex, Addr, Op string
		Size                uint64
		V2                  bool
	}
	Status []struct {
		From, Hex string
		Code      uint32
	}
}

func loadFrames(t *testing.T) frameFixtures {
	t.Helper()
	b, err := os.ReadFile("testdata/frames.json")
	if err != nil {
		t.Fatal(err)
	}
	var f frameFixtures
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Headers) == 0 || len(f.Status) == 0 {
		t.Fatal("no frames in testdata/frames.json")
	}
	return f
}

// Headers captured from the real engines decode to their fields, and kvctl encodes the same
// 24 bytes (padding aside: kvctl writes zeros, real initiators leave garbage).
func TestHeaderMatchesCapturedFrames(t *testing.T) {
	for _, fx := range loadFrames(t).Headers {
		t.Run(fx.From+"_"+fx.Op+"_"+strconv.FormatUint(fx.Size, 10), func(t *testing.T) {
			raw, err := hex.DecodeString(fx.Hex)
			if err != nil {
				t.Fatal(err)
			}
			h, err := transfer.DecodeHeader(raw)
			if err != nil {
				t.Fatal(err)
			}
			addr, _ := strconv.ParseUint(fx.Addr, 0, 64)
			if h.Size != fx.Size || h.Addr != addr || h.Op().String() != fx.Op || h.V2 != fx.V2 || !h.Valid() {
				t.Fatalf("decoded %+v (%s), want size %d addr %#x %s v2=%v", h, h.Op(), fx.Size, addr, fx.Op, fx.V2)
			}
			enc := transfer.AppendHeader(nil, h)
			if len(enc) != transfer.HeaderSize || !bytes.Equal(enc[:17], raw[:17]) {
				t.Fatalf("encoded %x, want %x in the first 17 bytes", enc, raw)
			}
			if !bytes.Equal(enc[17:], make([]byte, 7)) {
				t.Fatalf("padding %x, want zeros", enc[17:])
			}
		})
	}
}

func TestStatusMatchesCapturedFrames(t *testing.T) {
	for _, fx := range loadFrames(t).Status {
		raw, _ := hex.DecodeString(fx.Hex)
		code, err := transfer.DecodeStatus(raw)
		if err != nil || code != fx.Code {
			t.Errorf("%s: decoded code %d, %v; want %d", fx.Hex, code, err, fx.Code)
		}
		if enc := transfer.AppendStatus(nil, fx.Code); !bytes.Equal(enc, raw) {
			t.Errorf("status %d encoded %x, want %x", fx.Code, enc, raw)
		}
	}
}

func TestDecodeMalformed(t *testing.T) {
	for _, tc := range []struct {
		name string
		fn   func() error
	}{
		{"short header", func() error { _, err := transfer.DecodeHeader(make([]byte, 23)); return err }},
		{"short status", func() error { _, err := transfer.DecodeStatus(make([]byte, 7)); return err }},
		// What a v2 initiator sees from a v1 target that streams the payload at once.
		{"status without magic", func() error { _, err := transfer.DecodeStatus(bytes.Repeat([]byte{0x7b}, 8)); return err }},
		{"status with a wrong magic", func() error { _, err := transfer.DecodeStatus([]byte{0, 0, 0, 0, 'V', 'T', 'C', 'N'}); return err }},
	} {
		if err := tc.fn(); !errors.Is(err, transfer.ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", tc.name, err)
		}
	}
}

func TestHeaderValidity(t *testing.T) {
	for _, tc := range []struct {
		op    byte
		valid bool
		v2    bool
		name  string
	}{
		{0x00, true, false, "READ"}, {0x01, true, false, "WRITE"},
		{0x80, true, true, "READ"}, {0x81, true, true, "WRITE"},
		{0x02, false, false, "opcode(2)"}, {0xff, false, true, "opcode(127)"},
	} {
		raw := make([]byte, 24)
		raw[16] = tc.op
		h, _ := transfer.DecodeHeader(raw)
		if h.Valid() != tc.valid || h.V2 != tc.v2 || h.Op().String() != tc.name {
			t.Errorf("opcode %#x: valid=%v v2=%v %s", tc.op, h.Valid(), h.V2, h.Op())
		}
	}
	h := transfer.Header{Addr: 1<<64 - 10, Size: 20}
	if _, ok := h.End(); ok {
		t.Error("End did not report a range that wraps past 2^64")
	}
}
