package keys

import (
	"errors"
	"fmt"
	"io"
	"strconv"
)

// maxTokenText bounds how much of a rejected token an error message quotes.
const maxTokenText = 40

// ParseTokens reads token ids from r, in one of two forms chosen by the first non-space byte:
// a JSON array of integers ("[1, 2, 3]"), or integers separated by whitespace and/or single
// commas ("1 2,3\n4"). It reads r in chunks rather than whole. Every error names the 0-based
// position of the offending token and its text, e.g. "token 3: 9223372036854775808 is outside
// int64". Empty input (or "[]") gives no tokens.
func ParseTokens(r io.Reader) ([]int64, error) {
	s := &tokenScanner{r: r, buf: make([]byte, 64<<10), out: []int64{}}
	s.skipBOM()
	s.skipSpace()
	if c, ok := s.peek(); ok && c == '[' {
		s.pos++
		return s.parseJSON()
	}
	return s.parsePlain()
}

type tokenScanner struct {
	r        io.Reader
	buf      []byte
	pos, end int
	rerr     error // sticky error of r, io.EOF at the end
	out      []int64
}

// fill reads more input once the buffer is consumed; it reports whether a byte is available.
func (s *tokenScanner) fill() bool {
	if s.pos == s.end && s.rerr == nil {
		s.pos, s.end = 0, s.read(s.buf)
	}
	return s.pos < s.end
}

// read reads into p, retrying a reader that returns neither data nor an error a bounded
// number of times (as bufio does) before recording io.ErrNoProgress.
func (s *tokenScanner) read(p []byte) int {
	for range 100 {
		n, err := s.r.Read(p)
		if err != nil {
			s.rerr = err
		}
		if n > 0 || err != nil {
			return n
		}
	}
	s.rerr = io.ErrNoProgress
	return 0
}

func (s *tokenScanner) peek() (byte, bool) {
	if s.pos == s.end && !s.fill() {
		return 0, false
	}
	return s.buf[s.pos], true
}

// atEnd reports whether the input is exhausted; a read error other than io.EOF is returned.
func (s *tokenScanner) atEnd() (bool, error) {
	if _, ok := s.peek(); ok {
		return false, nil
	}
	if s.rerr != nil && !errors.Is(s.rerr, io.EOF) {
		return true, fmt.Errorf("token %d: reading input: %w", len(s.out), s.rerr)
	}
	return true, nil
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\v' || c == '\f'
}

func (s *tokenScanner) skipSpace() {
	for {
		c, ok := s.peek()
		if !ok || !isSpace(c) {
			return
		}
		s.pos++
	}
}

func (s *tokenScanner) skipBOM() {
	const bom = "\xef\xbb\xbf"
	// The mark may arrive split over several reads; gather its length first. This runs before
	// anything is consumed, so the buffer has room.
	for s.end-s.pos < len(bom) && s.rerr == nil {
		s.end += s.read(s.buf[s.end:])
		if s.end > 0 && s.buf[0] != bom[0] {
			return
		}
	}
	if s.end-s.pos >= len(bom) && string(s.buf[s.pos:s.pos+len(bom)]) == bom {
		s.pos += len(bom)
	}
}

// token scans one token: a run of bytes up to whitespace, a comma or (in a JSON array) a
// bracket. It parses the value on the fly and keeps only the start of the text, so a huge
// token costs no memory.
func (s *tokenScanner) token(inJSON bool) (int64, error) {
	var (
		text     [maxTokenText]byte
		textLen  int
		n        int
		neg      bool
		mag      uint64
		digits   int
		bad      bool
		overflow bool
	)
	limit := uint64(1<<63 - 1)
	for done := false; !done && s.fill(); {
		// Scan the buffered bytes directly; fill refills only when they run out.
		i := s.pos
		for ; i < s.end; i++ {
			c := s.buf[i]
			if isSpace(c) || c == ',' || (inJSON && (c == ']' || c == '[')) {
				done = true
				break
			}
			if textLen < len(text) {
				text[textLen] = c
				textLen++
			}
			switch {
			case n == 0 && c == '-':
				neg = true
				limit = 1 << 63
			case c >= '0' && c <= '9':
				d := uint64(c - '0')
				digits++
				if !overflow && mag > (limit-d)/10 {
					overflow = true
				}
				if !overflow {
					mag = mag*10 + d
				}
			default:
				bad = true
			}
			n++
		}
		s.pos = i
	}
	idx := len(s.out)
	shown := func() string {
		if n > textLen {
			return string(text[:textLen]) + "... (" + strconv.Itoa(n) + " bytes)"
		}
		return string(text[:textLen])
	}
	switch {
	case n == 0:
		c, ok := s.peek()
		if !ok {
			return 0, fmt.Errorf("token %d: unexpected end of input, want a value", idx)
		}
		return 0, fmt.Errorf("token %d: want a value, got %q", idx, c)
	case bad || digits == 0:
		return 0, fmt.Errorf("token %d: %q is not an integer", idx, shown())
	case overflow:
		return 0, fmt.Errorf("token %d: %s is outside int64", idx, shown())
	case neg:
		return int64(-mag), nil // mag <= 1<<63, so the negation is exact in two's complement
	default:
		return int64(mag), nil
	}
}

func (s *tokenScanner) parsePlain() ([]int64, error) {
	for {
		if end, err := s.atEnd(); end {
			if err != nil {
				return nil, err
			}
			return s.out, nil
		}
		if c, _ := s.peek(); c == ',' {
			return nil, fmt.Errorf("token %d: empty token before ','", len(s.out))
		}
		v, err := s.token(false)
		if err != nil {
			return nil, err
		}
		s.out = append(s.out, v)
		s.skipSpace()
		if c, ok := s.peek(); ok && c == ',' {
			s.pos++
			s.skipSpace()
			if end, err := s.atEnd(); end {
				if err != nil {
					return nil, err
				}
				return nil, fmt.Errorf("token %d: empty token after trailing ','", len(s.out))
			}
		}
	}
}

func (s *tokenScanner) parseJSON() ([]int64, error) {
	s.skipSpace()
	if c, ok := s.peek(); ok && c == ']' {
		s.pos++
		return s.jsonTail()
	}
	for {
		s.skipSpace()
		if end, err := s.atEnd(); end {
			if err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("token %d: unexpected end of input, want a value", len(s.out))
		}
		v, err := s.token(true)
		if err != nil {
			return nil, err
		}
		s.out = append(s.out, v)
		s.skipSpace()
		c, ok := s.peek()
		switch {
		case !ok:
			if _, err := s.atEnd(); err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("token %d: unexpected end of input, want ',' or ']'", len(s.out))
		case c == ',':
			s.pos++
			s.skipSpace()
			if next, more := s.peek(); more && next == ']' {
				return nil, fmt.Errorf("token %d: want a value after ',', got ']'", len(s.out))
			}
		case c == ']':
			s.pos++
			return s.jsonTail()
		default:
			return nil, fmt.Errorf("token %d: want ',' or ']' after the value, got %q", len(s.out), c)
		}
	}
}

func (s *tokenScanner) jsonTail() ([]int64, error) {
	s.skipSpace()
	end, err := s.atEnd()
	if err != nil {
		return nil, err
	}
	if !end {
		c, _ := s.peek()
		return nil, fmt.Errorf("token %d: unexpected %q after the closing ']'", len(s.out), c)
	}
	return s.out, nil
}
