//go:build cgo && linux

package gpu

/*
#include <stdint.h>
typedef int CUresult;
CUresult kvHostRegister(uintptr_t p, size_t n, unsigned int flags);
CUresult kvHostUnregister(uintptr_t p);
*/
import "C"

import (
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/kvctl/kvctl/core/kvmem"
)

// cudaErrHostMemoryAlreadyRegistered is CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: the range
// is registered already, by another context of the process (registrations are portable).
const cudaErrHostMemoryAlreadyRegistered = 712

// hostRegistration is one registered range of a context and who holds it. A range is
// registered with the driver once per context: every CUDADevice of one GPU shares its primary
// context, so the engines of one GPU (each with a device of its own) share the registration,
// and it must outlive every holder on every one of them.
type hostRegistration struct {
	size  int
	refs  int                 // holders over every device of the context
	devs  map[*CUDADevice]int // holders per device: the range is pinned memory of each
	owned bool                // registered here, so unregistered when the last holder closes
}

// regKey names a registration: the context and the range's first byte.
type regKey struct{ ctx, base uintptr }

// hostRegs holds every registration made through RegisterHost, by context.
var hostRegs struct {
	mu  sync.Mutex
	reg map[regKey]*hostRegistration
}

// RegisterHost page-locks mem and registers it with the driver, so the device copies to and
// from it at full speed, and counts it as pinned memory of this device until the returned
// Closer is closed. A range already registered through any device of the same GPU (they share
// its context) is counted once more, and the driver's registration is dropped only when the
// last holder on any of them closes: an engine that leaves does not unpin the pool under
// another engine still loading from it. A range registered by someone else in the process
// (outside RegisterHost) is used as it is and never unregistered here.
func (d *CUDADevice) RegisterHost(mem []byte) (io.Closer, error) {
	if len(mem) == 0 {
		return nil, errors.New("register host memory: empty range")
	}
	if d.closed.Load() {
		return nil, errors.New("register host memory: device is closed")
	}
	base := ptrOf(mem)
	key := regKey{d.ctx, base}
	hostRegs.mu.Lock()
	defer hostRegs.mu.Unlock()
	if hostRegs.reg == nil {
		hostRegs.reg = map[regKey]*hostRegistration{}
	}
	if r := hostRegs.reg[key]; r != nil {
		if r.size != len(mem) {
			return nil, fmt.Errorf("register host memory: %#x is registered with %d bytes, not %d", base, r.size, len(mem))
		}
		r.refs++
		if r.devs[d]++; r.devs[d] == 1 {
			d.addPinned(base, len(mem))
		}
		return &hostRegCloser{d: d, key: key}, nil
	}
	// Portable, and mapped into the device's address space (at the same address, with unified
	// addressing) so the mover's copy kernel can read it.
	const flags = 1 | 2 // CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP
	err := d.call(func() error {
		return cuErr("cuMemHostRegister", C.kvHostRegister(C.uintptr_t(base), C.size_t(len(mem)), flags))
	})
	owned := true
	if err != nil {
		var ce *CUDAError
		if !errors.As(err, &ce) || ce.Code != cudaErrHostMemoryAlreadyRegistered {
			return nil, fmt.Errorf("register %d bytes of host memory: %w", len(mem), err)
		}
		owned = false
	}
	hostRegs.reg[key] = &hostRegistration{size: len(mem), refs: 1, devs: map[*CUDADevice]int{d: 1}, owned: owned}
	d.addPinned(base, len(mem))
	return &hostRegCloser{d: d, key: key}, nil
}

// hostRegCloser is one holder of a registration.
type hostRegCloser struct {
	d    *CUDADevice
	key  regKey
	once sync.Once
}

func (c *hostRegCloser) Close() error {
	var err error
	c.once.Do(func() {
		hostRegs.mu.Lock()
		defer hostRegs.mu.Unlock()
		r := hostRegs.reg[c.key]
		if r == nil {
			return
		}
		if r.devs[c.d]--; r.devs[c.d] == 0 {
			delete(r.devs, c.d)
			c.d.removePinned(c.key.base)
		}
		if r.refs--; r.refs > 0 {
			return
		}
		delete(hostRegs.reg, c.key)
		// The last holder's device unregisters. Were it closed already, the context went with
		// it unless another device still retains it; the registration then lasts as long as
		// the context does.
		if r.owned && !c.d.closed.Load() {
			err = c.d.call(func() error { return cuErr("cuMemHostUnregister", C.kvHostUnregister(C.uintptr_t(c.key.base))) })
		}
	})
	return err
}

// RegisterHost implements HostRegistrar through the mover's device.
func (m *cudaMover) RegisterHost(mem []byte) (io.Closer, error) {
	if m.closed {
		return nil, kvmem.ErrClosed
	}
	return m.d.RegisterHost(mem)
}

var _ kvmem.HostRegistrar = (*cudaMover)(nil)
