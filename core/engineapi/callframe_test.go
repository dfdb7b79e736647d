package engineapi

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// The frame header's bytes are a contract with engines in other languages.
func TestCallHeaderBytesPinned(t *testing.T) {
	h := CallHeader{Method: enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_START_LOAD, Flags: CallFrameMore, Status: 5, CallID: 0x0102030405060708}
	got := hex.EncodeToString(AppendCallHeader(nil, h))
	if want := "4b5643310b0001050807060504030201"; got != want {
		t.Fatalf("header bytes %s, want %s", got, want)
	}
	back, frag, err := ParseCallFrame(append(AppendCallHeader(nil, h), 'x'))
	if err != nil || back != h || string(frag) != "x" {
		t.Fatalf("parse: %+v %q %v", back, frag, err)
	}
}

// Method numbers are a contract: pinned here, and every method of the service but
// OpenCallChannel has one.
func TestCallMethodsPinned(t *testing.T) {
	pinned := map[string]int32{
		"Register": 1, "Unregister": 2, "Lookup": 3, "AdmissionQuery": 4, "CancelLoad": 5,
		"UpdateStateAfterAlloc": 6, "BuildMeta": 7, "RequestFinished": 8, "RequestReset": 9,
		"BindMeta": 10, "StartLoad": 11, "WaitForSave": 12, "GetFinished": 13, "TakeFailedLoads": 14,
		"TakeFailedAsyncLoads": 15, "TakeSubmittedSaves": 16, "DropBoundSaves": 17, "RegisterPromptArena": 18,
		"AttachScheduler": 50,
	}
	seen := 0
	for _, m := range enginepb.Engine_ServiceDesc.Methods {
		full := "/" + enginepb.Engine_ServiceDesc.ServiceName + "/" + m.MethodName
		id, ok := CallMethodOf(full)
		if m.MethodName == "OpenCallChannel" {
			if ok {
				t.Errorf("OpenCallChannel has channel number %d; a channel must not open channels", id)
			}
			continue
		}
		seen++
		if !ok || int32(id) != pinned[m.MethodName] {
			t.Errorf("%s: channel number %d (%v), want %d", m.MethodName, id, ok, pinned[m.MethodName])
		}
		if CallMethodName(id) != full {
			t.Errorf("%d names %q, want %q", id, CallMethodName(id), full)
		}
	}
	if seen != len(pinned) || len(callMethods) != len(pinned) {
		t.Errorf("the service has %d channel methods, the table %d, pinned %d", seen, len(callMethods), len(pinned))
	}
	if CallMethodName(0) != "" || CallMethodName(999) != "" {
		t.Error("numbers without a method name one")
	}
}

func TestParseCallFrameRefuses(t *testing.T) {
	good := AppendCallHeader(nil, CallHeader{Method: 3, CallID: 9})
	cases := []struct {
		name  string
		frame []byte
		want  string
	}{
		{"short", good[:15], "shorter than the 16-byte header"},
		{"magic", append([]byte("KVC2"), good[4:]...), "magic"},
		{"flags", func() []byte { b := bytes.Clone(good); b[6] = 0x82; return b }(), "unknown flags 0x82"},
		{"long", append(bytes.Clone(good), make([]byte, MaxCallFragmentBytes+1)...), "above the 65536-byte limit"},
	}
	for _, c := range cases {
		_, _, err := ParseCallFrame(c.frame)
		if !errors.Is(err, ErrCallFrame) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an ErrCallFrame naming %q", c.name, err, c.want)
		}
	}
}

// frames splits msg the way a sender does.
func frames(t *testing.T, h CallHeader, msg []byte) [][]byte {
	t.Helper()
	var out [][]byte
	if _, err := AppendCallFrames(nil, h, msg, func(f []byte) error { out = append(out, bytes.Clone(f)); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestCallAssemblerJoins(t *testing.T) {
	a := NewCallAssembler(1 << 20)
	for _, n := range []int{0, 1, MaxCallFragmentBytes - 1, MaxCallFragmentBytes, MaxCallFragmentBytes + 1, 3*MaxCallFragmentBytes + 7, 1 << 20} {
		msg := make([]byte, n)
		for i := range msg {
			msg[i] = byte(i*7 + n)
		}
		fs := frames(t, CallHeader{Method: 7, CallID: uint64(n)}, msg)
		if want := max(1, (n+MaxCallFragmentBytes-1)/MaxCallFragmentBytes); len(fs) != want {
			t.Fatalf("%d bytes: %d frames, want %d", n, len(fs), want)
		}
		for i, f := range fs {
			if len(f) > MaxCallFrameBytes {
				t.Fatalf("frame of %d bytes", len(f))
			}
			m, _, err := a.Add(f)
			if err != nil {
				t.Fatalf("%d bytes, frame %d: %v", n, i, err)
			}
			if (m != nil) != (i == len(fs)-1) {
				t.Fatalf("%d bytes, frame %d of %d: message %v", n, i, len(fs), m != nil)
			}
			if m != nil && (!bytes.Equal(m.Body, msg) || m.Header.CallID != uint64(n) || m.Header.Flags != 0) {
				t.Fatalf("%d bytes: joined %d bytes, header %+v", n, len(m.Body), m.Header)
			}
		}
		if a.Pending() {
			t.Fatal("pending after the last frame")
		}
	}
}

func TestCallAssemblerBoundsAndRecovers(t *testing.T) {
	a := NewCallAssembler(100 << 10)
	big := frames(t, CallHeader{Method: 5, CallID: 1}, make([]byte, 300<<10))
	var err error
	var h CallHeader
	for _, f := range big {
		var m *CallMessage
		m, h, err = a.Add(f)
		if m != nil {
			t.Fatal("an oversized message was delivered")
		}
	}
	if !errors.Is(err, ErrCallFrame) || !strings.Contains(err.Error(), "a message of 307200 bytes, above the limit of 102400") || h.CallID != 1 {
		t.Fatalf("oversized: %v (call %d)", err, h.CallID)
	}
	// The next message goes through.
	m, _, err := a.Add(frames(t, CallHeader{Method: 5, CallID: 2}, []byte("ok"))[0])
	if err != nil || m == nil || string(m.Body) != "ok" {
		t.Fatalf("after an oversized message: %v %v", m, err)
	}

	// A message cut short by another call's frame is refused, naming the cut one, and the
	// assembler starts over on the next message.
	first := frames(t, CallHeader{Method: 3, CallID: 10}, make([]byte, 2*MaxCallFragmentBytes))
	if _, _, err := a.Add(first[0]); err != nil {
		t.Fatal(err)
	}
	_, h, err = a.Add(frames(t, CallHeader{Method: 3, CallID: 11}, []byte("x"))[0])
	if !errors.Is(err, ErrCallFrame) || h.CallID != 10 || !strings.Contains(err.Error(), "call 10") {
		t.Fatalf("interleaved: %v (call %d)", err, h.CallID)
	}
	if m, _, err := a.Add(frames(t, CallHeader{Method: 3, CallID: 12}, []byte("y"))[0]); err != nil || string(m.Body) != "y" {
		t.Fatalf("after an interleaved frame: %v %v", m, err)
	}
}

// FuzzCallAssembler feeds arbitrary frames: the assembler never panics, never holds more than
// its bound, and delivers only messages whose frames it was given in order.
func FuzzCallAssembler(f *testing.F) {
	f.Add(AppendCallHeader(nil, CallHeader{Method: 11, CallID: 1}), uint8(1))
	f.Add(append(AppendCallHeader(nil, CallHeader{Method: 3, Flags: CallFrameMore, CallID: 2}), "abc"...), uint8(3))
	f.Add([]byte("KVC1"), uint8(2))
	f.Fuzz(func(t *testing.T, frame []byte, repeat uint8) {
		const bound = 1000
		a := NewCallAssembler(bound)
		for range int(repeat%8) + 1 {
			m, _, err := a.Add(frame)
			if err != nil && m != nil {
				t.Fatal("a message and an error")
			}
			if m != nil && len(m.Body) > bound {
				t.Fatalf("delivered %d bytes over a bound of %d", len(m.Body), bound)
			}
			if len(a.buf) > bound {
				t.Fatalf("holds %d bytes over a bound of %d", len(a.buf), bound)
			}
		}
	})
}
