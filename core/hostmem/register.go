package hostmem

import (
	"io"

	"github.com/kvctl/kvctl/core/kvmem"
)

// nopCloser is the registration of a mover that needs none.
type nopCloser struct{}

func (nopCloser) Close() error { return nil }

// RegisterHost implements kvmem.HostRegistrar. Engine memory of the host backend is ordinary memory
// that any host buffer is copied to and from directly, so there is nothing to register.
func (h *hostMover) RegisterHost(_ []byte) (io.Closer, error) {
	if h.closed {
		return nil, kvmem.ErrClosed
	}
	return nopCloser{}, nil
}

var _ kvmem.HostRegistrar = (*hostMover)(nil)
