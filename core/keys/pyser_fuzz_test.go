package keys

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"testing"
	"unicode/utf8"
)

// The fuzz targets build a block tuple from arbitrary bytes, serialize it with each encoder and
// read it back with a strict decoder written from the formats' specifications: the value must
// come back unchanged, every length and memo reference must be in bounds, and every integer,
// length and container head must use the shortest form the engine's encoder picks (so the
// encoders are canonical as well as decodable).

var errStrict = errors.New("not canonical")

// ---- a strict pickle reader for the opcodes a block preimage holds ----

func readPickle(b []byte) (pyObj, error) {
	if len(b) < 11 || b[0] != pkProto || b[1] != 5 || b[2] != pkFrame {
		return pyObj{}, errors.New("no PROTO 5 and FRAME")
	}
	if n := binary.LittleEndian.Uint64(b[3:11]); n != uint64(len(b)-11) {
		return pyObj{}, fmt.Errorf("frame of %d bytes, %d follow", n, len(b)-11)
	}
	var stack []pyObj
	var marks []int
	var memo []pyObj
	i := 11
	need := func(n int) ([]byte, error) {
		if i+n > len(b) {
			return nil, errors.New("truncated")
		}
		s := b[i : i+n]
		i += n
		return s, nil
	}
	for i < len(b) {
		op := b[i]
		i++
		switch op {
		case pkStop:
			if i != len(b) || len(stack) != 1 || len(marks) != 0 {
				return pyObj{}, errors.New("STOP with a stack of other than one value")
			}
			return stack[0], nil
		case pkMemoize:
			if len(stack) == 0 {
				return pyObj{}, errors.New("MEMOIZE on an empty stack")
			}
			memo = append(memo, stack[len(stack)-1])
		case pkBinGet:
			x, err := need(1)
			if err != nil || int(x[0]) >= len(memo) {
				return pyObj{}, errors.New("BINGET out of the memo")
			}
			stack = append(stack, memo[x[0]])
		case pkNone:
			stack = append(stack, pyObj{})
		case pkBinInt1:
			x, err := need(1)
			if err != nil {
				return pyObj{}, err
			}
			stack = append(stack, pyIntOf(int64(x[0])))
		case pkBinInt2:
			x, err := need(2)
			if err != nil {
				return pyObj{}, err
			}
			v := int64(binary.LittleEndian.Uint16(x))
			if v <= 0xff {
				return pyObj{}, errStrict
			}
			stack = append(stack, pyIntOf(v))
		case pkBinInt:
			x, err := need(4)
			if err != nil {
				return pyObj{}, err
			}
			v := int64(int32(binary.LittleEndian.Uint32(x)))
			if v >= 0 && v <= 0xffff {
				return pyObj{}, errStrict
			}
			stack = append(stack, pyIntOf(v))
		case pkLong1:
			x, err := need(1)
			if err != nil {
				return pyObj{}, err
			}
			raw, err := need(int(x[0]))
			if err != nil || len(raw) == 0 || len(raw) > 8 {
				return pyObj{}, errors.New("LONG1 of an unexpected length")
			}
			var w [8]byte
			copy(w[:], raw)
			if raw[len(raw)-1]&0x80 != 0 {
				for j := len(raw); j < 8; j++ {
					w[j] = 0xff
				}
			}
			v := int64(binary.LittleEndian.Uint64(w[:]))
			if v >= -1<<31 && v < 1<<31 || len(raw) != long1Len(v) {
				return pyObj{}, errStrict
			}
			stack = append(stack, pyIntOf(v))
		case pkShortBinBytes, pkShortBinUni, pkBinBytes, pkBinUnicode:
			var n int
			if op == pkShortBinBytes || op == pkShortBinUni {
				x, err := need(1)
				if err != nil {
					return pyObj{}, err
				}
				n = int(x[0])
			} else {
				x, err := need(4)
				if err != nil {
					return pyObj{}, err
				}
				n = int(binary.LittleEndian.Uint32(x))
				if n < 256 {
					return pyObj{}, errStrict
				}
			}
			s, err := need(n)
			if err != nil {
				return pyObj{}, err
			}
			if op == pkShortBinUni || op == pkBinUnicode {
				if !utf8.Valid(s) {
					return pyObj{}, errors.New("str not UTF-8")
				}
				stack = append(stack, pyStrOf(string(s)))
			} else {
				stack = append(stack, pyBytesOf(s))
			}
		case pkEmptyTuple:
			stack = append(stack, pyTupleOf())
		case pkTuple1, pkTuple2, pkTuple3:
			n := int(op-pkTuple1) + 1
			if len(stack) < n {
				return pyObj{}, errors.New("TUPLE on a short stack")
			}
			t := pyTupleOf(append([]pyObj{}, stack[len(stack)-n:]...)...)
			stack = append(stack[:len(stack)-n], t)
		case pkMark:
			marks = append(marks, len(stack))
		case pkTuple:
			if len(marks) == 0 {
				return pyObj{}, errors.New("TUPLE without MARK")
			}
			m := marks[len(marks)-1]
			marks = marks[:len(marks)-1]
			if len(stack)-m < 4 {
				return pyObj{}, errStrict
			}
			t := pyTupleOf(append([]pyObj{}, stack[m:]...)...)
			stack = append(stack[:m], t)
		default:
			return pyObj{}, fmt.Errorf("opcode %#x", op)
		}
	}
	return pyObj{}, errors.New("no STOP")
}

// long1Len is the length pickle's encode_long gives v: bit_length//8 + 1 bytes, less one
// redundant 0xff of a negative value.
func long1Len(v int64) int {
	n := new(big.Int).SetUint64(absInt64(v)).BitLen()/8 + 1
	var w [9]byte
	binary.LittleEndian.PutUint64(w[:8], uint64(v))
	if v < 0 {
		w[8] = 0xff
	}
	if v < 0 && n > 1 && w[n-1] == 0xff && w[n-2]&0x80 != 0 {
		n--
	}
	return n
}

// ---- a strict CBOR reader ----

func readCBOR(b []byte) (pyObj, []byte, error) {
	if len(b) == 0 {
		return pyObj{}, nil, errors.New("truncated")
	}
	major, info := b[0]>>5, b[0]&31
	b = b[1:]
	if major == 7 {
		if info != 22 {
			return pyObj{}, nil, fmt.Errorf("simple value %d", info)
		}
		return pyObj{}, b, nil
	}
	var v uint64
	switch {
	case info < 24:
		v = uint64(info)
	case info <= 27:
		n := 1 << (info - 24)
		if len(b) < n {
			return pyObj{}, nil, errors.New("truncated")
		}
		for _, c := range b[:n] {
			v = v<<8 | uint64(c)
		}
		b = b[n:]
		if floor := map[int]uint64{1: 24, 2: 1 << 8, 4: 1 << 16, 8: 1 << 32}[n]; v < floor {
			return pyObj{}, nil, errStrict
		}
	default:
		return pyObj{}, nil, errors.New("indefinite length")
	}
	switch major {
	case 0:
		if v > 1<<63-1 {
			return pyObj{}, nil, errors.New("int beyond int64")
		}
		return pyIntOf(int64(v)), b, nil
	case 1:
		if v > 1<<63-1 {
			return pyObj{}, nil, errors.New("int beyond int64")
		}
		return pyIntOf(-1 - int64(v)), b, nil
	case 2, 3:
		if uint64(len(b)) < v {
			return pyObj{}, nil, errors.New("truncated")
		}
		s := b[:v]
		if major == 3 {
			if !utf8.Valid(s) {
				return pyObj{}, nil, errors.New("text not UTF-8")
			}
			return pyStrOf(string(s)), b[v:], nil
		}
		return pyBytesOf(s), b[v:], nil
	case 4:
		if v > uint64(len(b)) {
			return pyObj{}, nil, errors.New("array longer than the input")
		}
		items := []pyObj{}
		for range v {
			var it pyObj
			var err error
			if it, b, err = readCBOR(b); err != nil {
				return pyObj{}, nil, err
			}
			items = append(items, it)
		}
		return pyTupleOf(items...), b, nil
	}
	return pyObj{}, nil, fmt.Errorf("major type %d", major)
}

// ---- a strict MessagePack reader ----

func readMsgpack(b []byte) (pyObj, []byte, error) {
	if len(b) == 0 {
		return pyObj{}, nil, errors.New("truncated")
	}
	c := b[0]
	b = b[1:]
	take := func(n int) (uint64, error) {
		if len(b) < n {
			return 0, errors.New("truncated")
		}
		var v uint64
		for _, x := range b[:n] {
			v = v<<8 | uint64(x)
		}
		b = b[n:]
		return v, nil
	}
	str := func(n uint64, isStr bool) (pyObj, []byte, error) {
		if uint64(len(b)) < n {
			return pyObj{}, nil, errors.New("truncated")
		}
		s := b[:n]
		if isStr {
			if !utf8.Valid(s) {
				return pyObj{}, nil, errors.New("str not UTF-8")
			}
			return pyStrOf(string(s)), b[n:], nil
		}
		return pyBytesOf(s), b[n:], nil
	}
	arr := func(n uint64) (pyObj, []byte, error) {
		if n > uint64(len(b)) {
			return pyObj{}, nil, errors.New("array longer than the input")
		}
		items := []pyObj{}
		for range n {
			var it pyObj
			var err error
			if it, b, err = readMsgpack(b); err != nil {
				return pyObj{}, nil, err
			}
			items = append(items, it)
		}
		return pyTupleOf(items...), b, nil
	}
	check := func(v, floor uint64) error {
		if v < floor {
			return errStrict
		}
		return nil
	}
	switch {
	case c <= 0x7f:
		return pyIntOf(int64(c)), b, nil
	case c >= 0xe0:
		return pyIntOf(int64(int8(c))), b, nil
	case c&0xf0 == 0x90:
		return arr(uint64(c & 15))
	case c&0xe0 == 0xa0:
		return str(uint64(c&31), true)
	case c == 0xc0:
		return pyObj{}, b, nil
	}
	widths := map[byte]int{0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8, 0xd0: 1, 0xd1: 2, 0xd2: 4, 0xd3: 8,
		0xd9: 1, 0xda: 2, 0xdb: 4, 0xc4: 1, 0xc5: 2, 0xc6: 4, 0xdc: 2, 0xdd: 4}
	w, ok := widths[c]
	if !ok {
		return pyObj{}, nil, fmt.Errorf("type byte %#x", c)
	}
	v, err := take(w)
	if err != nil {
		return pyObj{}, nil, err
	}
	mins := map[int]uint64{1: 0, 2: 1 << 8, 4: 1 << 16, 8: 1 << 32}
	switch c {
	case 0xcc, 0xcd, 0xce, 0xcf:
		if c == 0xcc {
			mins[1] = 0x80
		}
		if v > 1<<63-1 {
			return pyObj{}, nil, errors.New("int beyond int64")
		}
		return pyIntOf(int64(v)), b, check(v, mins[w])
	case 0xd0, 0xd1, 0xd2, 0xd3:
		s := int64(v<<(64-8*w)) >> (64 - 8*w)
		lim := map[int]int64{1: -32, 2: -1 << 7, 4: -1 << 15, 8: -1 << 31}[w]
		if s >= lim {
			return pyObj{}, nil, errStrict
		}
		return pyIntOf(s), b, nil
	case 0xd9, 0xda, 0xdb:
		if c == 0xd9 {
			mins[1] = 32
		}
		if err := check(v, mins[w]); err != nil {
			return pyObj{}, nil, err
		}
		return str(v, true)
	case 0xc4, 0xc5, 0xc6:
		return str(v, false)
	default:
		if err := check(v, map[int]uint64{2: 16, 4: 1 << 16}[w]); err != nil {
			return pyObj{}, nil, err
		}
		return arr(v)
	}
}

// blockFromBytes builds a block tuple from fuzz input: a parent digest, tokens from 8-byte
// words and extra keys of every kind.
func blockFromBytes(data []byte, nTokens, nExtra uint8) (parent []byte, tokens []int64, extra []pyObj) {
	parent = make([]byte, 16+16*int(nTokens&1))
	copy(parent, data)
	for len(data) >= 8 && len(tokens) < int(nTokens) {
		v := int64(binary.LittleEndian.Uint64(data))
		// Every width class, not only huge values.
		tokens = append(tokens, v>>(uint(data[0])%64))
		data = data[8:]
	}
	if nExtra == 0 {
		return parent, tokens, nil
	}
	extra = []pyObj{}
	for i := 0; i < int(nExtra%6) && len(data) > 0; i++ {
		k, n := data[0]%5, int(data[0]>>3)
		data = data[1:]
		n = min(n, len(data))
		switch k {
		case 0:
			extra = append(extra, pyObj{})
		case 1:
			s := string(data[:n])
			if !utf8.ValidString(s) {
				s = fmt.Sprintf("%x", data[:n])
			}
			extra = append(extra, pyStrOf(s))
		case 2:
			extra = append(extra, pyBytesOf(data[:n]))
		case 3:
			extra = append(extra, pyTupleOf(pyStrOf(fmt.Sprint(n)), pyIntOf(int64(n)-int64(len(data)))))
		default:
			extra = append(extra, pyIntOf(int64(n)<<(n%60)))
		}
		data = data[n:]
	}
	return parent, tokens, extra
}

func blockValue(parent []byte, tokens []int64, extra []pyObj) pyObj {
	ts := make([]pyObj, len(tokens))
	for i, t := range tokens {
		ts[i] = pyIntOf(t)
	}
	e := pyObj{}
	if extra != nil {
		e = pyTupleOf(extra...)
	}
	return pyTupleOf(pyBytesOf(parent), pyTupleOf(ts...), e)
}

// plain drops identities, so that values compare by content.
func plain(o pyObj) pyObj {
	o.id = 0
	if o.kind == pyTuple {
		items := make([]pyObj, len(o.items))
		for i, it := range o.items {
			items[i] = plain(it)
		}
		o.items = items
	}
	return o
}

func FuzzPySerializers(f *testing.F) {
	f.Add([]byte{}, uint8(0), uint8(0))
	f.Add([]byte("0123456789abcdef0123456789abcdef\xff\xff\xff\xff\xff\xff\xff\x7f\x00\x00\x00\x00\x00\x00\x00\x80"), uint8(4), uint8(3))
	f.Add([]byte("\x09a\x09a\x0aab\x0b\x00\x00\x01xx"), uint8(1), uint8(5))
	f.Add(make([]byte, 300), uint8(30), uint8(2))
	f.Fuzz(func(t *testing.T, data []byte, nTokens, nExtra uint8) {
		parent, tokens, extra := blockFromBytes(data, nTokens, nExtra)
		want := plain(blockValue(parent, tokens, extra))
		pk, err := pickleSer{}.appendBlock(nil, parent, tokens, extra)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := readPickle(pk); err != nil || !reflect.DeepEqual(plain(got), want) {
			t.Fatalf("pickle %x: %v\n got %+v\nwant %+v", pk, err, got, want)
		}
		cb, _ := cborSer{}.appendBlock(nil, parent, tokens, extra)
		if got, rest, err := readCBOR(cb); err != nil || len(rest) != 0 || !reflect.DeepEqual(got, want) {
			t.Fatalf("cbor %x: %v (rest %d)\n got %+v\nwant %+v", cb, err, len(rest), got, want)
		}
		mp, _ := msgpackSer{}.appendBlock(nil, parent, tokens, extra)
		if got, rest, err := readMsgpack(mp); err != nil || len(rest) != 0 || !reflect.DeepEqual(got, want) {
			t.Fatalf("msgpack %x: %v (rest %d)\n got %+v\nwant %+v", mp, err, len(rest), got, want)
		}
	})
}
