package transfer

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// HeaderSize is the length of a request header on the wire.
const HeaderSize = 24

// StatusFrameSize is the length of a v2 status frame on the wire.
const StatusFrameSize = 8

// Op is a request's operation, without the v2 flag.
type Op uint8

// The operations a Transfer Engine TCP target understands.
const (
	OpRead  Op = 0
	OpWrite Op = 1
)

// String names the operation as the wire reference does.
func (o Op) String() string {
	switch o {
	case OpRead:
		return "READ"
	case OpWrite:
		return "WRITE"
	default:
		return fmt.Sprintf("opcode(%d)", uint8(o))
	}
}

// opcodeV2Flag marks a request that expects v2 status frames.
const opcodeV2Flag = 0x80

// statusMagic sits in the high 32 bits of every v2 status frame ("MCTV").
const statusMagic = uint64(0x4D435456) << 32

// Status codes carried in the low 32 bits of a v2 status frame.
const (
	StatusOK           uint32 = 0
	StatusAddrRejected uint32 = 1
)

// ErrMalformed reports bytes that are not a valid header or status frame.
var ErrMalformed = errors.New("malformed transfer frame")

// Header is one decoded request header.
type Header struct {
	Size uint64
	Addr uint64
	// Opcode is the raw opcode byte without the v2 flag; Op() interprets it.
	Opcode uint8
	// V2 is set when the initiator asked for status frames.
	V2 bool
}

// Op returns the request's operation. Values other than OpRead and OpWrite are possible on
// the wire; Valid reports whether the header names a known one.
func (h Header) Op() Op { return Op(h.Opcode) }

// Valid reports whether the opcode is READ or WRITE.
func (h Header) Valid() bool { return h.Opcode == uint8(OpRead) || h.Opcode == uint8(OpWrite) }

// End returns addr+size and whether it fits in 64 bits.
func (h Header) End() (uint64, bool) {
	end := h.Addr + h.Size
	return end, end >= h.Addr
}

// AppendHeader appends the 24-byte encoding of h. The padding bytes are zero.
func AppendHeader(dst []byte, h Header) []byte {
	var b [HeaderSize]byte
	binary.LittleEndian.PutUint64(b[0:8], h.Size)
	binary.LittleEndian.PutUint64(b[8:16], h.Addr)
	b[16] = h.Opcode &^ opcodeV2Flag
	if h.V2 {
		b[16] |= opcodeV2Flag
	}
	return append(dst, b[:]...)
}

// DecodeHeader decodes a request header. It fails only when b is shorter than HeaderSize; the
// padding bytes (17..23) are ignored, as real initiators leave them uninitialised. Whether the
// request is acceptable (opcode, bounds) is for the caller to check.
func DecodeHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, fmt.Errorf("%w: header of %d bytes, want %d", ErrMalformed, len(b), HeaderSize)
	}
	op := b[16]
	return Header{
		Size:   binary.LittleEndian.Uint64(b[0:8]),
		Addr:   binary.LittleEndian.Uint64(b[8:16]),
		Opcode: op &^ opcodeV2Flag,
		V2:     op&opcodeV2Flag != 0,
	}, nil
}

// AppendStatus appends the 8-byte v2 status frame carrying code.
func AppendStatus(dst []byte, code uint32) []byte {
	return binary.LittleEndian.AppendUint64(dst, statusMagic|uint64(code))
}

// DecodeStatus decodes a v2 status frame and returns its code. A frame without the magic (a
// v1 target streaming payload, or garbage) is ErrMalformed.
func DecodeStatus(b []byte) (uint32, error) {
	if len(b) < StatusFrameSize {
		return 0, fmt.Errorf("%w: status frame of %d bytes, want %d", ErrMalformed, len(b), StatusFrameSize)
	}
	v := binary.LittleEndian.Uint64(b[:StatusFrameSize])
	if v&0xFFFFFFFF00000000 != statusMagic {
		return 0, fmt.Errorf("%w: status frame %#016x lacks the MCTV magic (peer speaks v1 framing?)", ErrMalformed, v)
	}
	return uint32(v), nil
}
