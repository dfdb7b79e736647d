package masterrpc

import (
	"crypto/md5" //nolint:gosec // struct_pack's type hash is MD5; it is an identifier, not security
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
)

// ErrDecode reports a message body kvctl could not decode: truncated, with trailing bytes, a
// length that does not fit, or a value outside its type.
var ErrDecode = errors.New("malformed struct_pack body")

// MaxItems bounds every container a peer sends: no vector or string in a response may claim
// more elements than this, whatever bytes follow.
const MaxItems = 1 << 20

// literal is a struct_pack type literal: the bytes naming a message's type, from which its
// 32-bit type hash is derived.
type literal []byte

// hash returns the type hash struct_pack writes in the first four bytes of a body: the first
// four bytes of the literal's MD5 read big-endian, low bit cleared, then set to mark that a
// metainfo byte follows. Hashes are computed once per literal.
func (l literal) hash() uint32 {
	hashMu.RLock()
	h, ok := hashes[string(l)]
	hashMu.RUnlock()
	if ok {
		return h
	}
	sum := md5.Sum(l) //nolint:gosec // see import
	h = binary.BigEndian.Uint32(sum[:4])&^1 | 1
	hashMu.Lock()
	hashes[string(l)] = h
	hashMu.Unlock()
	return h
}

var (
	hashMu sync.RWMutex
	hashes = map[string]uint32{}
)

// Type literal building blocks (struct_pack's codes).
const (
	litI32    = 0x01
	litU32    = 0x02
	litI64    = 0x03
	litU64    = 0x04
	litU8     = 0x06
	litBool   = 0x0b
	litChar   = 0x0c
	litString = 0x80
	litVector = 0x84
	litOpt    = 0x85
	litVar    = 0x86
	litExp    = 0x87
	litVoid   = 0xfa
	litStruct = 0xfd
	litEnd    = 0xff
)

func cat(parts ...[]byte) literal {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func tuple(fields ...[]byte) literal {
	return cat([]byte{litStruct}, cat(fields...), []byte{litEnd})
}

func vec(elem []byte) literal        { return cat([]byte{litVector}, elem) }
func opt(elem []byte) literal        { return cat([]byte{litOpt}, elem) }
func expected(val []byte) literal    { return cat([]byte{litExp}, val, []byte{litI32}) }
func prim(code byte) literal         { return literal{code} }
func variant(alts ...[]byte) literal { return cat([]byte{litVar}, cat(alts...), []byte{litEnd}) }

var (
	tString = literal{litString, litChar}
	tU64    = prim(litU64)
	tI32    = prim(litI32)
	tBool   = prim(litBool)
	tU8     = prim(litU8)
	// A trivially copyable pair<u64,u64> (UUID) carries its pack alignment and alignment.
	tUUID = literal{litStruct, litU64, litU64, 0x89, 0x89, litEnd}
)

// encoder writes a struct_pack body. Every container and string length in one body has the
// same width, chosen from the largest length: the body is built in two passes, the first only
// measuring.
type encoder struct {
	measure bool
	maxLen  uint64
	size    int // measuring: an upper bound of the data's size
	width   int
	buf     []byte
}

func (e *encoder) u8(v uint8) {
	if e.measure {
		e.size++
		return
	}
	e.buf = append(e.buf, v)
}

func (e *encoder) boolean(v bool) {
	if v {
		e.u8(1)
	} else {
		e.u8(0)
	}
}

func (e *encoder) u32(v uint32) {
	if e.measure {
		e.size += 4
		return
	}
	e.buf = binary.LittleEndian.AppendUint32(e.buf, v)
}

func (e *encoder) i32(v int32) { e.u32(uint32(v)) }

func (e *encoder) u64(v uint64) {
	if e.measure {
		e.size += 8
		return
	}
	e.buf = binary.LittleEndian.AppendUint64(e.buf, v)
}

func (e *encoder) length(n int) {
	if e.measure {
		e.maxLen = max(e.maxLen, uint64(n))
		e.size += 8
		return
	}
	switch e.width {
	case 1:
		e.buf = append(e.buf, byte(n))
	case 2:
		e.buf = binary.LittleEndian.AppendUint16(e.buf, uint16(n))
	case 4:
		e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(n))
	default:
		e.buf = binary.LittleEndian.AppendUint64(e.buf, uint64(n))
	}
}

func (e *encoder) str(s string) {
	e.length(len(s))
	if e.measure {
		e.size += len(s)
		return
	}
	e.buf = append(e.buf, s...)
}

func (e *encoder) strs(v []string) {
	e.length(len(v))
	for _, s := range v {
		e.str(s)
	}
}

func (e *encoder) uuid(u UUID) {
	e.u64(u[0])
	e.u64(u[1])
}

// widthFor returns the length width struct_pack uses when the largest length is n, and the
// metainfo bits that announce it.
func widthFor(n uint64) (width int, bits byte) {
	switch {
	case n < 1<<8:
		return 1, 0
	case n < 1<<16:
		return 2, 1
	case n < 1<<32:
		return 4, 2
	default:
		return 8, 3
	}
}

// pack builds a body of type lit whose data fn writes: hash, metainfo (type literal present,
// length width), the literal and its terminating zero, then the data.
func pack(lit literal, fn func(e *encoder)) []byte {
	m := &encoder{measure: true}
	fn(m)
	width, bits := widthFor(m.maxLen)
	e := &encoder{width: width, buf: getBuf(6 + len(lit) + m.size)}
	e.buf = binary.LittleEndian.AppendUint32(e.buf, lit.hash())
	e.buf = append(e.buf, 0x04|bits<<3)
	e.buf = append(e.buf, lit...)
	e.buf = append(e.buf, 0)
	fn(e)
	return e.buf
}

// reqBufs recycles the buffers pack builds request bodies in: the client gives a body back
// once it is written (putBuf). A 3,000-key existence check is a 40 KiB body; allocated afresh
// for every call, the garbage collector's share of the client's time per call was about a
// third.
var reqBufs sync.Pool // of *[]byte

// maxPooledBuf is the largest buffer reqBufs keeps, so a rare huge request does not stay
// allocated.
const maxPooledBuf = 1 << 20

// getBuf returns an empty buffer of capacity n or more.
func getBuf(n int) []byte {
	if p, ok := reqBufs.Get().(*[]byte); ok && cap(*p) >= n {
		return (*p)[:0]
	}
	return make([]byte, 0, n)
}

// putBuf gives b back for reuse; the caller must not touch it after.
func putBuf(b []byte) {
	if cap(b) == 0 || cap(b) > maxPooledBuf {
		return
	}
	b = b[:0]
	reqBufs.Put(&b)
}

// decoder reads a struct_pack body. After the first error every read returns zero values and
// the error sticks, so a decode function checks err once at the end.
type decoder struct {
	b     []byte
	off   int
	width int
	err   error

	// The strings a message repeats (a replica's protocol and endpoint: one peer's for every
	// page it holds), kept to be shared rather than allocated again (strAgain).
	again [2]string
}

// open checks a body's type hash (and its type literal when present) against lit and returns
// a decoder positioned at the data.
func open(body []byte, lit literal) (*decoder, error) {
	if len(body) < 4 {
		return nil, fmt.Errorf("%w: %d bytes, shorter than a type hash", ErrDecode, len(body))
	}
	got := binary.LittleEndian.Uint32(body)
	want := lit.hash()
	if got|1 != want {
		return nil, &TypeError{Got: got, Want: want}
	}
	d := &decoder{b: body, off: 4, width: 1}
	if got&1 == 0 {
		return d, nil
	}
	if len(body) < 5 {
		return nil, fmt.Errorf("%w: no metainfo byte after the type hash", ErrDecode)
	}
	meta := body[4]
	d.off = 5
	d.width = 1 << ((meta >> 3) & 3)
	if meta&0x04 != 0 {
		end := d.off
		for end < len(body) && body[end] != 0 {
			end++
		}
		if end == len(body) {
			return nil, fmt.Errorf("%w: type literal not terminated", ErrDecode)
		}
		if string(body[d.off:end]) != string(lit) {
			return nil, &TypeError{Got: got, Want: want, Literal: body[d.off:end]}
		}
		d.off = end + 1
	}
	if meta&0x03 != 0 {
		return nil, fmt.Errorf("%w: metainfo %#02x asks for struct_pack's compatible fields, which no master message uses", ErrDecode, meta)
	}
	return d, nil
}

// TypeError reports a body whose type hash or literal is not the one kvctl expects: the
// master speaks a different version of the message.
type TypeError struct {
	Got, Want uint32
	Literal   []byte
}

func (e *TypeError) Error() string {
	if e.Literal != nil {
		return fmt.Sprintf("struct_pack type literal %x does not match the expected type (hash %08x)", e.Literal, e.Want)
	}
	return fmt.Sprintf("struct_pack type hash %08x, want %08x", e.Got, e.Want)
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrDecode}, args...)...)
	}
}

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b)-d.off {
		d.fail("need %d bytes at offset %d, body has %d", n, d.off, len(d.b))
		return nil
	}
	p := d.b[d.off : d.off+n]
	d.off += n
	return p
}

func (d *decoder) u8() uint8 {
	if p := d.take(1); p != nil {
		return p[0]
	}
	return 0
}

func (d *decoder) boolean() bool {
	v := d.u8()
	if v > 1 {
		d.fail("bool byte %d", v)
	}
	return v == 1
}

func (d *decoder) u32() uint32 {
	if p := d.take(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (d *decoder) i32() int32 { return int32(d.u32()) }

func (d *decoder) u64() uint64 {
	if p := d.take(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

// length reads a container length and checks it against what the body can still hold
// (minElem bytes per element at least) and MaxItems.
func (d *decoder) length(minElem int) int {
	var n uint64
	switch d.width {
	case 1:
		n = uint64(d.u8())
	case 2:
		if p := d.take(2); p != nil {
			n = uint64(binary.LittleEndian.Uint16(p))
		}
	case 4:
		n = uint64(d.u32())
	default:
		n = d.u64()
	}
	if d.err != nil {
		return 0
	}
	rest := uint64(len(d.b) - d.off)
	if n > MaxItems || n > math.MaxInt32 || (minElem > 0 && n*uint64(minElem) > rest) {
		d.fail("length %d at offset %d: the body has %d bytes left", n, d.off, rest)
		return 0
	}
	return int(n)
}

func (d *decoder) str() string {
	n := d.length(1)
	return string(d.take(n))
}

// strAgain is str, returning the string it returned last time for slot when the bytes are the
// same: a batch's replicas mostly name one protocol and a few endpoints.
func (d *decoder) strAgain(slot int) string {
	b := d.take(d.length(1))
	if string(b) != d.again[slot] {
		d.again[slot] = string(b)
	}
	return d.again[slot]
}

func (d *decoder) uuid() UUID { return UUID{d.u64(), d.u64()} }

// expect reads an expected<T, ErrorCode> discriminator: true when a value follows, false when
// the error code was read into *code.
func (d *decoder) expect(code *int32) bool {
	switch d.u8() {
	case 1:
		return true
	case 0:
		*code = d.i32()
		if d.err == nil && *code >= 0 {
			// Mooncake's error codes are negative; anything else would read as success or as
			// a count to a caller.
			d.fail("an error result with code %d, not a negative error code", *code)
		}
		return false
	default:
		d.fail("expected<> discriminator at offset %d is not 0 or 1", d.off-1)
		return false
	}
}

// done fails the decode unless every byte was consumed.
func (d *decoder) done() error {
	if d.err == nil && d.off != len(d.b) {
		d.fail("%d trailing bytes", len(d.b)-d.off)
	}
	return d.err
}
