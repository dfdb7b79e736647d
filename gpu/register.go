package gpu

import "io"

// HostRegistrar is implemented by movers that can copy straight between engine memory and any
// host memory registered with them, not only their own staging. The connector registers an
// in-process pool's segments this way, so a load copies each page once, from the pool to the
// GPU, instead of through a staging buffer.
//
// RegisterHost registers mem (page-locked on a GPU host, which also makes every page of it
// resident) until the returned Closer is closed. Registering the same memory again, from this
// mover, a clone or another mover of the same device, is counted and costs nothing; the memory
// is unregistered when the last registration closes. mem must stay mapped until then.
type HostRegistrar interface {
	RegisterHost(mem []byte) (io.Closer, error)
}

// nopCloser is the registration of a mover that needs none.
type nopCloser struct{}

func (nopCloser) Close() error { return nil }

// RegisterHost implements HostRegistrar. Engine memory of the host backend is ordinary memory
// that any host buffer is copied to and from directly, so there is nothing to register.
func (h *hostMover) RegisterHost(mem []byte) (io.Closer, error) {
	if h.closed {
		return nil, ErrClosed
	}
	return nopCloser{}, nil
}

var _ HostRegistrar = (*hostMover)(nil)
