package disagg

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// maxEventBytes bounds one server-sent event a server sends; a longer one fails the stream.
const maxEventBytes = 8 << 20

var errEventTooLarge = fmt.Errorf("an event is larger than %d bytes", maxEventBytes)

// sseReader splits a text/event-stream body into events (the raw lines up to and including
// the blank line that ends them).
type sseReader struct {
	r *bufio.Reader
}

func newSSEReader(r io.Reader) *sseReader { return &sseReader{r: bufio.NewReaderSize(r, 64<<10)} }

// next returns the next event's raw bytes (ending with a blank line) and the concatenated
// payload of its data lines. A body that ends without a blank line yields its last event; io.EOF
// comes once nothing is left.
func (s *sseReader) next() (raw, data []byte, err error) {
	var buf, payload bytes.Buffer
	for {
		line, err := s.readLine(maxEventBytes - buf.Len())
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, nil, err
		}
		buf.Write(line)
		if errors.Is(err, io.EOF) {
			addData(&payload, line)
			return finish(buf.Bytes(), payload.Bytes())
		}
		if len(bytes.TrimRight(line, "\r\n")) == 0 {
			if buf.Len() == len(line) {
				buf.Reset() // a stray blank line between events
				continue
			}
			return buf.Bytes(), payload.Bytes(), nil
		}
		addData(&payload, line)
	}
}

// readLine reads one line of at most limit bytes, its newline included.
func (s *sseReader) readLine(limit int) ([]byte, error) {
	var line []byte
	for {
		frag, err := s.r.ReadSlice('\n')
		if len(line)+len(frag) > limit {
			return nil, errEventTooLarge
		}
		line = append(line, frag...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return line, err
	}
}

func finish(raw, data []byte) ([]byte, []byte, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil, io.EOF
	}
	if !bytes.HasSuffix(raw, []byte("\n\n")) {
		raw = append(bytes.TrimRight(raw, "\r\n"), '\n', '\n')
	}
	return raw, data, nil
}

func addData(payload *bytes.Buffer, line []byte) {
	t := bytes.TrimRight(line, "\r\n")
	if v, ok := bytes.CutPrefix(t, []byte("data:")); ok {
		if payload.Len() > 0 {
			payload.WriteByte('\n')
		}
		payload.Write(bytes.TrimPrefix(v, []byte(" ")))
	}
}
