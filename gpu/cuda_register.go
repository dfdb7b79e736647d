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

// hostRegistration is one registered range of a device and how many holders it has.
type hostRegistration struct {
	size  int
	refs  int
	owned bool // registered by this device, so unregistered by it
}

// hostRegs holds every device's registrations made through RegisterHost.
var hostRegs struct {
	mu  sync.Mutex
	reg map[*CUDADevice]map[uintptr]*hostRegistration
}

// RegisterHost page-locks mem and registers it with the driver, so the device copies to and
// from it at full speed, and counts it as pinned memory of this device until the returned
// Closer is closed. A range already registered through this device is counted once more; a
// range registered by another device (registrations are portable) is used as it is.
func (d *CUDADevice) RegisterHost(mem []byte) (io.Closer, error) {
	if len(mem) == 0 {
		return nil, errors.New("register host memory: empty range")
	}
	if d.closed.Load() {
		return nil, errors.New("register host memory: device is closed")
	}
	base := ptrOf(mem)
	hostRegs.mu.Lock()
	defer hostRegs.mu.Unlock()
	if hostRegs.reg == nil {
		hostRegs.reg = map[*CUDADevice]map[uintptr]*hostRegistration{}
	}
	regs := hostRegs.reg[d]
	if regs == nil {
		regs = map[uintptr]*hostRegistration{}
		hostRegs.reg[d] = regs
	}
	if r := regs[base]; r != nil {
		if r.size != len(mem) {
			return nil, fmt.Errorf("register host memory: %#x is registered with %d bytes, not %d", base, r.size, len(mem))
		}
		r.refs++
		return &hostRegCloser{d: d, base: base}, nil
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
	regs[base] = &hostRegistration{size: len(mem), refs: 1, owned: owned}
	d.addPinned(base, len(mem))
	return &hostRegCloser{d: d, base: base}, nil
}

// hostRegCloser is one holder of a registration.
type hostRegCloser struct {
	d    *CUDADevice
	base uintptr
	once sync.Once
}

func (c *hostRegCloser) Close() error {
	var err error
	c.once.Do(func() {
		hostRegs.mu.Lock()
		defer hostRegs.mu.Unlock()
		regs := hostRegs.reg[c.d]
		r := regs[c.base]
		if r == nil {
			return
		}
		if r.refs--; r.refs > 0 {
			return
		}
		delete(regs, c.base)
		c.d.removePinned(c.base)
		if r.owned && !c.d.closed.Load() {
			err = c.d.call(func() error { return cuErr("cuMemHostUnregister", C.kvHostUnregister(C.uintptr_t(c.base))) })
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
