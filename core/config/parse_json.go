package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// parseJSON reads a JSON document into a tree, keeping the line and column of every value.
// It accepts what Python's json module accepts (including NaN, Infinity and -Infinity, which
// the schema then refuses where a finite number is required), and stops at the first syntax
// error, which it records with its place.
func parseJSON(d *dec, data []byte) *node {
	if !utf8.Valid(data) {
		line, col := firstBadByte(data)
		d.add(SeverityError, line, col, "", "cannot parse JSON: the file is not valid UTF-8", "")
		return nil
	}
	p := &jsonParser{data: data, line: 1, col: 1, d: d}
	if strings.HasPrefix(string(data), "\ufeff") {
		d.add(SeverityError, 1, 1, "", "cannot parse JSON: the file starts with a UTF-8 byte order mark",
			"save the file without a BOM")
		return nil
	}
	p.space()
	if p.pos >= len(data) {
		d.add(SeverityError, 1, 1, "", "the file is empty", "")
		return nil
	}
	n := p.value("")
	if p.failed {
		return nil
	}
	p.space()
	if p.pos < len(data) {
		p.fail("extra data after the JSON value")
		return nil
	}
	return n
}

type jsonParser struct {
	data      []byte
	pos       int
	line, col int
	d         *dec
	depth     int
	failed    bool
}

func (p *jsonParser) fail(format string, args ...any) {
	if !p.failed {
		p.failed = true
		p.d.add(SeverityError, p.line, p.col, "", "cannot parse JSON: "+fmt.Sprintf(format, args...), "")
	}
}

func (p *jsonParser) advance() {
	c := p.data[p.pos]
	p.pos++
	if c == '\n' {
		p.line, p.col = p.line+1, 1
	} else if c < 0x80 || c >= 0xC0 {
		p.col++
	}
}

func (p *jsonParser) space() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.advance()
		default:
			return
		}
	}
}

func (p *jsonParser) peek() byte {
	if p.pos < len(p.data) {
		return p.data[p.pos]
	}
	return 0
}

func (p *jsonParser) lit(word string) bool {
	if strings.HasPrefix(string(p.data[p.pos:]), word) {
		for range word {
			p.advance()
		}
		return true
	}
	return false
}

func (p *jsonParser) value(path string) *node {
	if p.failed {
		return nil
	}
	n := &node{line: p.line, col: p.col}
	if p.pos >= len(p.data) {
		p.fail("unexpected end of file")
		return nil
	}
	switch c := p.peek(); {
	case c == '{':
		p.depth++
		if p.depth > maxDepth {
			p.fail("nesting is too deep")
			return nil
		}
		p.object(n, path)
		p.depth--
	case c == '[':
		p.depth++
		if p.depth > maxDepth {
			p.fail("nesting is too deep")
			return nil
		}
		p.array(n, path)
		p.depth--
	case c == '"':
		s, ok := p.str()
		if !ok {
			return nil
		}
		n.typ, n.text = scalarString, s
	case p.lit("true"):
		n.typ, n.b, n.text = scalarBool, true, "true"
	case p.lit("false"):
		n.typ, n.b, n.text = scalarBool, false, "false"
	case p.lit("null"):
		n.typ, n.text = scalarNull, "null"
	case p.lit("NaN"):
		n.typ, n.f, n.text = scalarFloat, math.NaN(), "NaN"
	case p.lit("Infinity"):
		n.typ, n.f, n.text = scalarFloat, math.Inf(1), "Infinity"
	case p.lit("-Infinity"):
		n.typ, n.f, n.text = scalarFloat, math.Inf(-1), "-Infinity"
	case c == '-' || (c >= '0' && c <= '9'):
		p.number(n)
	default:
		r, _ := utf8.DecodeRune(p.data[p.pos:])
		p.fail("unexpected character %q", r)
		return nil
	}
	if p.failed {
		return nil
	}
	return n
}

func (p *jsonParser) object(n *node, path string) {
	n.kind = nodeMap
	p.advance()
	p.space()
	if p.peek() == '}' {
		p.advance()
		return
	}
	for {
		p.space()
		if p.peek() != '"' {
			p.fail("expected a quoted key")
			return
		}
		k := &node{kind: nodeScalar, typ: scalarString, line: p.line, col: p.col}
		s, ok := p.str()
		if !ok {
			return
		}
		k.text = s
		p.space()
		if p.peek() != ':' {
			p.fail("expected ':' after key %q", s)
			return
		}
		p.advance()
		p.space()
		v := p.value(joinPath(path, s))
		if p.failed {
			return
		}
		p.d.putKey(n, k, v, path)
		p.space()
		switch p.peek() {
		case ',':
			p.advance()
		case '}':
			p.advance()
			return
		default:
			p.fail("expected ',' or '}' in an object")
			return
		}
	}
}

func (p *jsonParser) array(n *node, path string) {
	n.kind = nodeSeq
	p.advance()
	p.space()
	if p.peek() == ']' {
		p.advance()
		return
	}
	for {
		p.space()
		v := p.value(fmt.Sprintf("%s[%d]", path, len(n.items)))
		if p.failed {
			return
		}
		n.items = append(n.items, v)
		p.space()
		switch p.peek() {
		case ',':
			p.advance()
		case ']':
			p.advance()
			return
		default:
			p.fail("expected ',' or ']' in an array")
			return
		}
	}
}

func (p *jsonParser) str() (string, bool) {
	p.advance() // opening quote
	var b strings.Builder
	for {
		if p.pos >= len(p.data) {
			p.fail("unterminated string")
			return "", false
		}
		c := p.data[p.pos]
		switch {
		case c == '"':
			p.advance()
			return b.String(), true
		case c < 0x20:
			p.fail("control character %q in a string", rune(c))
			return "", false
		case c == '\\':
			p.advance()
			if p.pos >= len(p.data) {
				p.fail("unterminated string")
				return "", false
			}
			e := p.data[p.pos]
			switch e {
			case '"', '\\', '/':
				b.WriteByte(e)
			case 'b':
				b.WriteByte('\b')
			case 'f':
				b.WriteByte('\f')
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 't':
				b.WriteByte('\t')
			case 'u':
				r, ok := p.hex4()
				if !ok {
					return "", false
				}
				if utf16.IsSurrogate(r) && strings.HasPrefix(string(p.data[p.pos+1:]), "\\u") {
					if v, err := strconv.ParseUint(string(p.data[min(p.pos+3, len(p.data)):min(p.pos+7, len(p.data))]), 16, 32); err == nil &&
						p.pos+7 <= len(p.data) && utf16.DecodeRune(r, rune(v)) != utf8.RuneError {
						r = utf16.DecodeRune(r, rune(v))
						for range 6 {
							p.advance()
						}
					}
				}
				b.WriteRune(r)
			default:
				p.fail("invalid escape \\%c", e)
				return "", false
			}
			p.advance()
		default:
			r, size := utf8.DecodeRune(p.data[p.pos:])
			b.WriteRune(r)
			for range size {
				p.advance()
			}
		}
	}
}

// hex4 reads the four hex digits after \u, leaving pos on the last one.
func (p *jsonParser) hex4() (rune, bool) {
	if p.pos+4 >= len(p.data) {
		p.fail("invalid \\u escape")
		return 0, false
	}
	v, err := strconv.ParseUint(string(p.data[p.pos+1:p.pos+5]), 16, 32)
	if err != nil {
		p.fail("invalid \\u escape")
		return 0, false
	}
	for range 4 {
		p.advance()
	}
	return rune(v), true
}

func (p *jsonParser) number(n *node) {
	start := p.pos
	if p.peek() == '-' {
		p.advance()
	}
	digits := func() int {
		k := 0
		for p.pos < len(p.data) && p.data[p.pos] >= '0' && p.data[p.pos] <= '9' {
			p.advance()
			k++
		}
		return k
	}
	if p.peek() == '0' {
		p.advance()
	} else if digits() == 0 {
		p.fail("invalid number")
		return
	}
	isFloat := false
	if p.peek() == '.' {
		isFloat = true
		p.advance()
		if digits() == 0 {
			p.fail("invalid number: digits must follow the point")
			return
		}
	}
	if c := p.peek(); c == 'e' || c == 'E' {
		isFloat = true
		p.advance()
		if c := p.peek(); c == '+' || c == '-' {
			p.advance()
		}
		if digits() == 0 {
			p.fail("invalid number: digits must follow the exponent")
			return
		}
	}
	text := string(p.data[start:p.pos])
	n.kind, n.text = nodeScalar, text
	if isFloat {
		f, _ := strconv.ParseFloat(text, 64) // Python also yields inf for huge exponents
		n.typ, n.f = scalarFloat, f
		return
	}
	n.typ = scalarInt
	v, err := strconv.ParseInt(text, 10, 64)
	n.i, n.overflow = v, err != nil
}
