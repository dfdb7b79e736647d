package transfer

import (
	"io"
	"net"
	"syscall"
)

// readPieces fills the pieces b from conn, in order, and returns how many bytes it read. One
// piece is io.ReadFull; several are read with readv where conn has a file descriptor (TCP), so
// that a payload bound for many small pieces costs about as many system calls as one bound
// for a single buffer, and otherwise piece by piece. Like io.ReadFull it returns io.EOF when
// nothing was read and io.ErrUnexpectedEOF when the connection ended part way.
func readPieces(conn net.Conn, b [][]byte) (int, error) {
	if len(b) == 1 {
		return io.ReadFull(conn, b[0])
	}
	if sc, ok := conn.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			if n, ok, err := readvFull(raw, b); ok {
				return n, err
			}
		}
	}
	var n int
	for _, p := range b {
		k, err := io.ReadFull(conn, p)
		n += k
		if err != nil {
			if err == io.EOF && n > 0 {
				err = io.ErrUnexpectedEOF
			}
			return n, err
		}
	}
	return n, nil
}

// notEmpty returns the pieces of b that hold bytes, in a list of its own (readv advances it).
func notEmpty(b [][]byte) [][]byte {
	out := make([][]byte, 0, len(b))
	for _, p := range b {
		if len(p) > 0 {
			out = append(out, p)
		}
	}
	return out
}

// advance drops the first k bytes from the pieces rest and returns what is left.
func advance(rest [][]byte, k int) [][]byte {
	for k > 0 && len(rest) > 0 {
		if k < len(rest[0]) {
			rest[0] = rest[0][k:]
			return rest
		}
		k -= len(rest[0])
		rest = rest[1:]
	}
	return rest
}
