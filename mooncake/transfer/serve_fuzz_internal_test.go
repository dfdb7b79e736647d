package transfer

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"
	"time"
)

// streamConn is a connection whose peer sent in and then closed its side; what the server
// writes collects in out. The real-socket tests cover deadlines and the network itself.
type streamConn struct {
	in  *bytes.Reader
	out bytes.Buffer
}

func (c *streamConn) Read(b []byte) (int, error)       { return c.in.Read(b) }
func (c *streamConn) Write(b []byte) (int, error)      { return c.out.Write(b) }
func (c *streamConn) Close() error                     { return nil }
func (c *streamConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *streamConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *streamConn) SetDeadline(time.Time) error      { return nil }
func (c *streamConn) SetReadDeadline(time.Time) error  { return nil }
func (c *streamConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzServeConn feeds arbitrary byte streams to the server's connection handler: it must never
// panic, must answer only with well-formed status frames and payload, and must change memory
// only through WRITEs it accepted whole.
func FuzzServeConn(f *testing.F) {
	const base = 0x10000
	hdr := func(size, addr uint64, op byte) []byte {
		b := make([]byte, 24)
		binary.LittleEndian.PutUint64(b, size)
		binary.LittleEndian.PutUint64(b[8:], addr)
		b[16] = op
		return b
	}
	f.Add(hdr(16, base, 0x80))
	f.Add(append(hdr(4, base+8, 0x81), "abcd"...))
	f.Add(append(append(hdr(4, base, 0x01), "wxyz"...), hdr(8, base, 0x00)...))
	f.Add(hdr(1<<40, base, 0x81))
	f.Add(hdr(^uint64(0), 1, 0x80))
	f.Add(hdr(16, base, 0x42))
	f.Add(hdr(16, base, 0x80)[:11])
	f.Fuzz(func(t *testing.T, in []byte) {
		s, err := NewServer(ServerOptions{IdleTimeout: 50 * time.Millisecond, ReadTimeout: 50 * time.Millisecond,
			WriteTimeout: 200 * time.Millisecond, MaxRequestSize: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		mem := make([]byte, 4096)
		if err := s.Register(base, mem); err != nil {
			t.Fatal(err)
		}
		c := &streamConn{in: bytes.NewReader(in)}
		if !s.track(c) {
			t.Fatal("not tracked")
		}
		s.serveConn(c)
		out := c.out.Bytes()

		// Replay the accepted requests on a model to know what the reply and memory must be.
		model := make([]byte, len(mem))
		var want []byte
		for rest := in; len(rest) >= HeaderSize; {
			h, _ := DecodeHeader(rest)
			rest = rest[HeaderSize:]
			end, ok := h.End()
			if !h.Valid() || h.Size == 0 || h.Size > 1<<20 || !ok || h.Addr < base || end > base+uint64(len(mem)) {
				if h.V2 {
					want = AppendStatus(want, StatusAddrRejected)
				}
				break
			}
			off := h.Addr - base
			if h.Op() == OpWrite {
				if uint64(len(rest)) < h.Size {
					break // cut off: nothing applied
				}
				copy(model[off:], rest[:h.Size])
				rest = rest[h.Size:]
				if h.V2 {
					want = AppendStatus(want, StatusOK)
				}
				continue
			}
			if h.V2 {
				want = AppendStatus(want, StatusOK)
			}
			want = append(want, model[off:off+h.Size]...)
		}
		if !bytes.Equal(out, want) {
			t.Fatalf("server answered %x, want %x", out, want)
		}
		got := make([]byte, len(mem))
		if err := s.ReadAt(base, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, model) {
			t.Fatalf("memory differs from the accepted writes:\n got %x\nwant %x", got, model)
		}
	})
}
