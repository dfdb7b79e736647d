package keys

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"unicode/utf8"
)

// The Python values vLLM hashes, and the three ways it serializes them before digesting: pickle
// protocol 5 as CPython's C pickler writes it, canonical CBOR as cbor2 writes it, and
// MessagePack as msgspec writes it. Only the shapes a block hash holds are modelled: int (here
// int64), bytes, str, None and tuples of those.

// pyKind is the Python type of a pyObj.
type pyKind uint8

const (
	pyNone pyKind = iota
	pyInt
	pyBytes
	pyStr
	pyTuple
)

// pyObj is one Python value. A str or bytes value is its own object: pickle memoizes by object
// identity, so two equal strings are written twice unless they are the same object (see
// sharedStr).
type pyObj struct {
	kind pyKind
	// id, when not 0, is the object's identity: two str values with the same id are one
	// object, which pickle writes once and then refers to by its memo index.
	id    int
	i     int64
	s     string // str, or the bytes of a bytes value
	items []pyObj
}

func pyIntOf(v int64) pyObj    { return pyObj{kind: pyInt, i: v} }
func pyStrOf(s string) pyObj   { return pyObj{kind: pyStr, s: s} }
func pyBytesOf(b []byte) pyObj { return pyObj{kind: pyBytes, s: string(b)} }
func pyTupleOf(items ...pyObj) pyObj {
	return pyObj{kind: pyTuple, items: items}
}

// Serializer names, as vLLM's hash function names use them.
const (
	SerializerPickle  = "pickle5"
	SerializerCBOR    = "cbor"
	SerializerMsgpack = "msgpack"
)

// pySerializer writes a block preimage (parent, tokens, extra) or a seed string.
type pySerializer interface {
	name() string
	// appendStr appends the serialization of the str s on its own (the seed preimage).
	appendStr(dst []byte, s string) ([]byte, error)
	// appendBlock appends the serialization of the tuple (parent, tuple(tokens), extra), where
	// extra is None when nil and otherwise a tuple.
	appendBlock(dst []byte, parent []byte, tokens []int64, extra []pyObj) ([]byte, error)
}

// maxPyString bounds a str or bytes value inside a preimage (LoRA names, salts, identifiers).
const maxPyString = 1 << 16

// ErrPreimageTooLarge is returned (wrapped) when a pickle preimage would need more than one
// frame: CPython splits a pickle into 64 KiB frames, which this encoder does not reproduce.
var ErrPreimageTooLarge = errors.New("preimage too large for one pickle frame")

func checkStr(what, s string) error {
	if len(s) > maxPyString {
		return fmt.Errorf("%s of %d bytes: must be at most %d", what, len(s), maxPyString)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s %q: not valid UTF-8", what, s)
	}
	return nil
}

// ---- pickle protocol 5 ----

const (
	pkProto          = 0x80
	pkFrame          = 0x95
	pkStop           = 0x2e
	pkMemoize        = 0x94
	pkBinGet         = 0x68
	pkLongBinGet     = 0x6a
	pkNone           = 0x4e
	pkBinInt1        = 0x4b
	pkBinInt2        = 0x4d
	pkBinInt         = 0x4a
	pkLong1          = 0x8a
	pkShortBinBytes  = 0x43
	pkBinBytes       = 0x42
	pkShortBinUni    = 0x8c
	pkBinUnicode     = 0x58
	pkEmptyTuple     = 0x29
	pkTuple1         = 0x85
	pkTuple2         = 0x86
	pkTuple3         = 0x87
	pkMark           = 0x28
	pkTuple          = 0x74
	pickleFrameLimit = 64 << 10
)

type pickleSer struct{}

func (pickleSer) name() string { return SerializerPickle }

// pickler writes one pickle. memo counts MEMOIZE opcodes; shared maps the strings CPython
// keeps as singletons (sharedStr) to their memo index, so a second occurrence is a BINGET.
type pickler struct {
	b      []byte
	memo   uint32
	shared map[string]uint32
	ids    map[int]uint32
	// emptyBytes is 1 + the memo index of b"", another CPython singleton; 0 before it is written.
	emptyBytes uint32
}

// sharedStr reports whether CPython represents every str equal to s by one object: the empty
// string and the one-character strings of code points below 256 (b"" is one object too; see
// pickler.bytes). Other equal strings may or
// may not be one object depending on the process; they are written as distinct objects.
func sharedStr(s string) bool {
	if s == "" {
		return true
	}
	r, n := utf8.DecodeRuneInString(s)
	return n == len(s) && r < 256
}

func (p *pickler) memoize() {
	p.b = append(p.b, pkMemoize)
	p.memo++
}

func (p *pickler) int(v int64) {
	switch {
	case v >= 0 && v <= 0xff:
		p.b = append(p.b, pkBinInt1, byte(v))
	case v >= 0 && v <= 0xffff:
		p.b = append(p.b, pkBinInt2, byte(v), byte(v>>8))
	case v >= -1<<31 && v < 1<<31:
		p.b = append(p.b, pkBinInt)
		p.b = binary.LittleEndian.AppendUint32(p.b, uint32(int32(v)))
	default:
		// LONG1: the minimal two's-complement little-endian bytes, as pickle's encode_long.
		n := bits.Len64(absInt64(v))/8 + 1
		var raw [9]byte
		binary.LittleEndian.PutUint64(raw[:8], uint64(v))
		if v < 0 {
			raw[8] = 0xff
		}
		if v < 0 && n > 1 && raw[n-1] == 0xff && raw[n-2]&0x80 != 0 {
			n--
		}
		p.b = append(p.b, pkLong1, byte(n))
		p.b = append(p.b, raw[:n]...)
	}
}

// absInt64 returns |v| as a uint64 (MinInt64 included).
func absInt64(v int64) uint64 {
	if v < 0 {
		return uint64(-(v + 1)) + 1
	}
	return uint64(v)
}

func (p *pickler) str(s string) {
	if sharedStr(s) {
		if i, ok := p.shared[s]; ok {
			p.get(i)
			return
		}
		if p.shared == nil {
			p.shared = map[string]uint32{}
		}
		p.shared[s] = p.memo
	}
	if len(s) < 256 {
		p.b = append(p.b, pkShortBinUni, byte(len(s)))
	} else {
		p.b = append(p.b, pkBinUnicode)
		p.b = binary.LittleEndian.AppendUint32(p.b, uint32(len(s)))
	}
	p.b = append(p.b, s...)
	p.memoize()
}

func (p *pickler) get(i uint32) {
	if i < 256 {
		p.b = append(p.b, pkBinGet, byte(i))
		return
	}
	p.b = append(p.b, pkLongBinGet)
	p.b = binary.LittleEndian.AppendUint32(p.b, i)
}

func (p *pickler) bytes(s string) {
	if s == "" {
		if p.emptyBytes > 0 {
			p.get(p.emptyBytes - 1)
			return
		}
		p.emptyBytes = p.memo + 1
	}
	if len(s) < 256 {
		p.b = append(p.b, pkShortBinBytes, byte(len(s)))
	} else {
		p.b = append(p.b, pkBinBytes)
		p.b = binary.LittleEndian.AppendUint32(p.b, uint32(len(s)))
	}
	p.b = append(p.b, s...)
	p.memoize()
}

// tupleEnd closes a tuple of n elements whose items were written.
func (p *pickler) tupleEnd(n int) {
	switch n {
	case 1:
		p.b = append(p.b, pkTuple1)
	case 2:
		p.b = append(p.b, pkTuple2)
	case 3:
		p.b = append(p.b, pkTuple3)
	default:
		p.b = append(p.b, pkTuple)
	}
	p.memoize()
}

func (p *pickler) tupleStart(n int) bool {
	if n == 0 {
		p.b = append(p.b, pkEmptyTuple)
		return false
	}
	if n > 3 {
		p.b = append(p.b, pkMark)
	}
	return true
}

func (p *pickler) obj(o pyObj) {
	switch o.kind {
	case pyNone:
		p.b = append(p.b, pkNone)
	case pyInt:
		p.int(o.i)
	case pyBytes:
		p.bytes(o.s)
	case pyStr:
		if o.id != 0 {
			if i, ok := p.ids[o.id]; ok {
				p.get(i)
				return
			}
			if p.ids == nil {
				p.ids = map[int]uint32{}
			}
			p.ids[o.id] = p.memo
		}
		p.str(o.s)
	case pyTuple:
		if p.tupleStart(len(o.items)) {
			for _, it := range o.items {
				p.obj(it)
			}
			p.tupleEnd(len(o.items))
		}
	}
}

// begin writes PROTO 5 and an open FRAME header; finish closes the frame and writes STOP.
func (p *pickler) begin(dst []byte) int {
	p.b = append(dst, pkProto, 5, pkFrame, 0, 0, 0, 0, 0, 0, 0, 0)
	return len(p.b)
}

func (p *pickler) finish(start int) ([]byte, error) {
	p.b = append(p.b, pkStop)
	n := len(p.b) - start
	// CPython commits a frame once it reaches 64 KiB and starts another; this encoder writes one
	// frame, which is exact only below that size.
	if n >= pickleFrameLimit {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrPreimageTooLarge, n, pickleFrameLimit-1)
	}
	binary.LittleEndian.PutUint64(p.b[start-8:start], uint64(n))
	return p.b, nil
}

func (pickleSer) appendStr(dst []byte, s string) ([]byte, error) {
	p := pickler{}
	start := p.begin(dst)
	p.str(s)
	return p.finish(start)
}

func (pickleSer) appendBlock(dst []byte, parent []byte, tokens []int64, extra []pyObj) ([]byte, error) {
	p := pickler{}
	start := p.begin(dst)
	p.bytes(string(parent))
	if p.tupleStart(len(tokens)) {
		for _, t := range tokens {
			p.int(t)
		}
		p.tupleEnd(len(tokens))
	}
	if extra == nil {
		p.b = append(p.b, pkNone)
	} else {
		p.obj(pyTupleOf(extra...))
	}
	p.tupleEnd(3)
	return p.finish(start)
}

// ---- canonical CBOR (cbor2, canonical=True) ----

type cborSer struct{}

func (cborSer) name() string { return SerializerCBOR }

func cborHead(b []byte, major byte, v uint64) []byte {
	m := major << 5
	switch {
	case v < 24:
		return append(b, m|byte(v))
	case v <= 0xff:
		return append(b, m|24, byte(v))
	case v <= 0xffff:
		return append(b, m|25, byte(v>>8), byte(v))
	case v <= 0xffffffff:
		b = append(b, m|26)
		return binary.BigEndian.AppendUint32(b, uint32(v))
	default:
		b = append(b, m|27)
		return binary.BigEndian.AppendUint64(b, v)
	}
}

func cborInt(b []byte, v int64) []byte {
	if v >= 0 {
		return cborHead(b, 0, uint64(v))
	}
	return cborHead(b, 1, uint64(-(v + 1)))
}

func cborObj(b []byte, o pyObj) []byte {
	switch o.kind {
	case pyNone:
		return append(b, 0xf6)
	case pyInt:
		return cborInt(b, o.i)
	case pyBytes:
		return append(cborHead(b, 2, uint64(len(o.s))), o.s...)
	case pyStr:
		return append(cborHead(b, 3, uint64(len(o.s))), o.s...)
	default:
		b = cborHead(b, 4, uint64(len(o.items)))
		for _, it := range o.items {
			b = cborObj(b, it)
		}
		return b
	}
}

func (cborSer) appendStr(dst []byte, s string) ([]byte, error) {
	return append(cborHead(dst, 3, uint64(len(s))), s...), nil
}

func (cborSer) appendBlock(dst []byte, parent []byte, tokens []int64, extra []pyObj) ([]byte, error) {
	b := append(dst, 0x83)
	b = append(cborHead(b, 2, uint64(len(parent))), parent...)
	b = cborHead(b, 4, uint64(len(tokens)))
	for _, t := range tokens {
		b = cborInt(b, t)
	}
	if extra == nil {
		return append(b, 0xf6), nil
	}
	return cborObj(b, pyTupleOf(extra...)), nil
}

// ---- MessagePack (msgspec) ----

type msgpackSer struct{}

func (msgpackSer) name() string { return SerializerMsgpack }

func msgpackInt(b []byte, v int64) []byte {
	switch {
	case v >= 0 && v <= 0x7f:
		return append(b, byte(v))
	case v >= 0 && v <= 0xff:
		return append(b, 0xcc, byte(v))
	case v >= 0 && v <= 0xffff:
		return append(b, 0xcd, byte(v>>8), byte(v))
	case v >= 0 && v <= 0xffffffff:
		b = append(b, 0xce)
		return binary.BigEndian.AppendUint32(b, uint32(v))
	case v >= 0:
		b = append(b, 0xcf)
		return binary.BigEndian.AppendUint64(b, uint64(v))
	case v >= -32:
		return append(b, byte(v))
	case v >= -1<<7:
		return append(b, 0xd0, byte(v))
	case v >= -1<<15:
		return append(b, 0xd1, byte(v>>8), byte(v))
	case v >= -1<<31:
		b = append(b, 0xd2)
		return binary.BigEndian.AppendUint32(b, uint32(v))
	default:
		b = append(b, 0xd3)
		return binary.BigEndian.AppendUint64(b, uint64(v))
	}
}

func msgpackHead(b []byte, fix byte, fixMax int, c8, c16, c32 byte, n int) []byte {
	switch {
	case n <= fixMax:
		return append(b, fix|byte(n))
	case c8 != 0 && n <= 0xff:
		return append(b, c8, byte(n))
	case n <= 0xffff:
		return append(b, c16, byte(n>>8), byte(n))
	default:
		b = append(b, c32)
		return binary.BigEndian.AppendUint32(b, uint32(n))
	}
}

func msgpackArray(b []byte, n int) []byte { return msgpackHead(b, 0x90, 15, 0, 0xdc, 0xdd, n) }
func msgpackStr(b []byte, s string) []byte {
	return append(msgpackHead(b, 0xa0, 31, 0xd9, 0xda, 0xdb, len(s)), s...)
}

func msgpackBin(b []byte, s string) []byte {
	return append(msgpackHead(b, 0, -1, 0xc4, 0xc5, 0xc6, len(s)), s...)
}

func msgpackObj(b []byte, o pyObj) []byte {
	switch o.kind {
	case pyNone:
		return append(b, 0xc0)
	case pyInt:
		return msgpackInt(b, o.i)
	case pyBytes:
		return msgpackBin(b, o.s)
	case pyStr:
		return msgpackStr(b, o.s)
	default:
		b = msgpackArray(b, len(o.items))
		for _, it := range o.items {
			b = msgpackObj(b, it)
		}
		return b
	}
}

func (msgpackSer) appendStr(dst []byte, s string) ([]byte, error) { return msgpackStr(dst, s), nil }

func (msgpackSer) appendBlock(dst []byte, parent []byte, tokens []int64, extra []pyObj) ([]byte, error) {
	b := append(dst, 0x93)
	b = msgpackBin(b, string(parent))
	b = msgpackArray(b, len(tokens))
	for _, t := range tokens {
		b = msgpackInt(b, t)
	}
	if extra == nil {
		return append(b, 0xc0), nil
	}
	return msgpackObj(b, pyTupleOf(extra...)), nil
}
