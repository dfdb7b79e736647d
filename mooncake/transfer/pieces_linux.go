package transfer

import (
	"errors"
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// maxIovecs is how many pieces one readv names (the kernel's IOV_MAX).
const maxIovecs = 1024

// readvFull fills the pieces b from raw with readv, waiting for the connection to be readable
// through Go's poller, so that the connection's deadlines (and with them cancellation) hold as
// for a Read. ok is always true here.
func readvFull(raw syscall.RawConn, b [][]byte) (n int, ok bool, err error) {
	rest := notEmpty(b)
	var rerr error
	werr := raw.Read(func(fd uintptr) bool {
		for len(rest) > 0 {
			k, err := unix.Readv(int(fd), rest[:min(len(rest), maxIovecs)])
			switch {
			case errors.Is(err, unix.EINTR):
				continue
			case errors.Is(err, unix.EAGAIN):
				return false // wait until readable, or for the deadline
			case err != nil:
				rerr = os.NewSyscallError("readv", err)
				return true
			case k == 0:
				rerr = io.EOF
				if n > 0 {
					rerr = io.ErrUnexpectedEOF
				}
				return true
			}
			n += k
			rest = advance(rest, k)
		}
		return true
	})
	if werr != nil {
		return n, true, werr
	}
	return n, true, rerr
}
