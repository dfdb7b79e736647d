package masterrpc

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// peer is a scripted TCP server standing in for a master of another release or a hostile one:
// it reads each request header and body and answers with whatever respond returns.
func peer(t *testing.T, respond func(seq uint32, fid uint32) []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for {
					var h [reqHeaderLen]byte
					if _, err := io.ReadFull(c, h[:]); err != nil {
						return
					}
					body := make([]byte, binary.LittleEndian.Uint32(h[12:]))
					if _, err := io.ReadFull(c, body); err != nil {
						return
					}
					out := respond(binary.LittleEndian.Uint32(h[4:]), binary.LittleEndian.Uint32(h[8:]))
					if out == nil {
						continue // say nothing
					}
					if _, err := c.Write(out); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func frame(seq uint32, errCode uint8, body []byte) []byte {
	b := []byte{rpcMagic, 0, errCode, 0}
	b = binary.LittleEndian.AppendUint32(b, seq)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(body)))
	b = binary.LittleEndian.AppendUint32(b, 0)
	return append(b, body...)
}

func versionBody(v string) []byte {
	return pack(respString, func(e *encoder) { e.u8(1); e.str(v) })
}

// TestStartUpAgainstUnknownMasters: a master of another store protocol version, one whose
// ServiceReady has another type, one that refuses the call, one that is not coro_rpc and one
// that never answers each give a clear error at Dial, naming what kvctl speaks, and never hang.
func TestStartUpAgainstUnknownMasters(t *testing.T) {
	otherType := pack(expected(tU64), func(e *encoder) { e.u8(1); e.u64(7) })
	tests := []struct {
		name    string
		respond func(seq, fid uint32) []byte
		is      error
		want    []string
	}{
		{"other version", func(seq, _ uint32) []byte { return frame(seq, 0, versionBody("3.1.0")) },
			ErrProtocol, []string{`"3.1.0"`, `"2.0.0"`, MooncakeRelease}},
		{"other message type", func(seq, _ uint32) []byte { return frame(seq, 0, otherType) },
			ErrProtocol, []string{"ServiceReady", `"2.0.0"`, MooncakeRelease}},
		{"function not registered", func(seq, _ uint32) []byte { return frame(seq, 11, []byte("the rpc function not registered")) },
			ErrProtocol, []string{"coro_rpc error 11", MooncakeRelease}},
		{"not coro_rpc", func(uint32, uint32) []byte { return []byte("HTTP/1.1 400 Bad Request\r\n\r\n") },
			ErrProtocol, []string{"magic"}},
		{"header cut short", func(seq, _ uint32) []byte { return frame(seq, 0, nil)[:8:8] },
			ErrUnavailable, nil},
		{"announces 4 GiB", func(seq, _ uint32) []byte {
			f := frame(seq, 0, nil)
			binary.LittleEndian.PutUint32(f[8:], 0xffffffff)
			return f
		}, ErrProtocol, []string{"above the"}},
		{"silent", func(uint32, uint32) []byte { return nil }, ErrUnavailable, []string{"did not answer ServiceReady", "--rpc_port"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := peer(t, tt.respond)
			start := time.Now()
			c, err := Dial(context.Background(), Options{Addr: addr, DialTimeout: 500 * time.Millisecond})
			if err == nil {
				_ = c.Close()
				t.Fatal("Dial succeeded")
			}
			if !errors.Is(err, tt.is) {
				t.Fatalf("error %v is not %v", err, tt.is)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("Dial took %v", d)
			}
		})
	}
}

// TestHostileMasterAfterStartUp: a master that answers the handshake and then sends a
// malformed body, an answer to a request never made, or a mismatched batch fails those calls
// with an error, and the client keeps working.
func TestHostileMasterAfterStartUp(t *testing.T) {
	calls := 0
	addr := peer(t, func(seq, fid uint32) []byte {
		if fid == functionID("ServiceReady") {
			return frame(seq, 0, versionBody(ProtocolVersion))
		}
		calls++
		switch calls {
		case 1: // a truncated existence answer
			b := pack(respBatchExist, func(e *encoder) { e.length(3); e.u8(1); e.u8(1) })
			return frame(seq, 0, b)
		case 2: // fewer answers than keys
			b := pack(respBatchExist, func(e *encoder) { e.length(1); e.u8(1); e.u8(1) })
			return frame(seq, 0, b)
		case 3: // a response to another sequence number, then silence
			return frame(seq+1000, 0, pack(respBatchExist, func(e *encoder) { e.length(0) }))
		default:
			b := pack(respBatchExist, func(e *encoder) { e.length(2); e.u8(1); e.u8(1); e.u8(1); e.u8(0) })
			return frame(seq, 0, b)
		}
	})
	c, err := Dial(context.Background(), Options{Addr: addr, CallTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	keys := []string{"a", "b"}
	if _, err := c.BatchExistKey(context.Background(), keys, DefaultTenant); !errors.Is(err, ErrProtocol) || !errors.Is(err, ErrDecode) {
		t.Fatalf("truncated body: %v", err)
	}
	if _, err := c.BatchExistKey(context.Background(), keys, DefaultTenant); err == nil || !strings.Contains(err.Error(), "1 results for 2 keys") {
		t.Fatalf("short batch: %v", err)
	}
	if _, err := c.BatchExistKey(context.Background(), keys, DefaultTenant); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("unanswered call: %v", err)
	}
	got, err := c.BatchExistKey(context.Background(), keys, DefaultTenant)
	if err != nil || got[0] != 1 || got[1] != 0 {
		t.Fatalf("a good answer after the bad ones = %v, %v", got, err)
	}
}
