//go:build cgo && linux

package gpu

/*
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
typedef int CUresult;
CUresult kvDeviceGet(int *d, int ordinal);
CUresult kvDeviceName(char *buf, int len, int d);
CUresult kvDeviceAttr(int *v, int attr, int d);
CUresult kvPrimaryRetain(uintptr_t *ctx, int d);
CUresult kvPrimaryRelease(int d);
CUresult kvSetCurrent(uintptr_t ctx);
CUresult kvMemAlloc(uint64_t *p, size_t n);
CUresult kvMemFree(uint64_t p);
CUresult kvHostAlloc(void **p, size_t n, unsigned int flags);
CUresult kvFreeHost(uintptr_t p);
CUresult kvHostRegister(uintptr_t p, size_t n, unsigned int flags);
CUresult kvHostUnregister(uintptr_t p);
CUresult kvCopyHtoD(uint64_t dst, uintptr_t src, size_t n);
CUresult kvCopyDtoH(uintptr_t dst, uint64_t src, size_t n);
CUresult kvIpcOpen(uint64_t *p, const void *handle);
CUresult kvIpcClose(uint64_t p);
CUresult kvGranularity(size_t *g, int ordinal);
CUresult kvUnmap(uint64_t p, size_t size);
CUresult kvCreateExportable(uint64_t *p, int *fd, size_t size, int ordinal);
CUresult kvImportFD(uint64_t *p, int fd, size_t size, int ordinal);
int kvHasVMM(void);
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// cudaCaller runs kvctl's CUDA calls for one device, mover or stream: one function at a time,
// each on the calling goroutine's OS thread, locked to it for the call, with the context made
// current first (a context is current per OS thread, and Go moves goroutines between threads).
// Running on the caller's thread, rather than handing each call to a dedicated locked goroutine,
// saves a wake-up of another thread per call (17–19 µs on the H200 host).
type cudaCaller struct {
	ctx uintptr
	mu  sync.Mutex
}

// newCUDACaller checks that ctx can be made current and returns a caller for it.
func newCUDACaller(ctx uintptr) (*cudaCaller, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cuErr("cuCtxSetCurrent", C.kvSetCurrent(C.uintptr_t(ctx))); err != nil {
		return nil, err
	}
	return &cudaCaller{ctx: ctx}, nil
}

// do runs f with the context current and returns when it is done.
func (t *cudaCaller) do(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// Cannot fail for a context that was made current once (newCUDACaller) and is still
	// retained; if it did, the calls in f fail with CUDA_ERROR_INVALID_CONTEXT.
	_ = C.kvSetCurrent(C.uintptr_t(t.ctx))
	f()
}

// CUDADevice is one GPU opened through the driver API: its primary context retained and a
// caller that runs its CUDA calls. Methods are safe for concurrent use.
type CUDADevice struct {
	ordinal int
	dev     C.int
	ctx     uintptr
	name    string
	numa    int
	t       *cudaCaller

	mu     sync.RWMutex
	pinned []pinnedRange // sorted by base
	closed atomic.Bool

	// The page checksum kernel, loaded on first use (cuda_pagesum.go).
	sums pageSumKernel
}

type pinnedRange struct{ base, end uintptr }

// OpenCUDA opens device ordinal. Without a driver or device the error wraps ErrNoCUDA.
func OpenCUDA(ordinal int) (*CUDADevice, error) {
	n, err := CUDADeviceCount()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("%w: device %d of %d", ErrNoCUDA, ordinal, n)
	}
	d := &CUDADevice{ordinal: ordinal, numa: -1}
	if err = cuErr("cuDeviceGet", C.kvDeviceGet(&d.dev, C.int(ordinal))); err != nil {
		return nil, err
	}
	var name [256]C.char
	if C.kvDeviceName(&name[0], C.int(len(name)), d.dev) == 0 {
		d.name = C.GoString(&name[0])
	}
	d.numa = d.numaFromPCI()
	var ctx C.uintptr_t
	if err = cuErr("cuDevicePrimaryCtxRetain", C.kvPrimaryRetain(&ctx, d.dev)); err != nil {
		return nil, err
	}
	d.ctx = uintptr(ctx)
	if d.t, err = newCUDACaller(d.ctx); err != nil {
		C.kvPrimaryRelease(d.dev)
		return nil, err
	}
	return d, nil
}

// numaFromPCI finds the device's NUMA node through its PCI address in sysfs.
func (d *CUDADevice) numaFromPCI() int {
	const attrBus, attrDevice, attrDomain = 33, 34, 50 // CU_DEVICE_ATTRIBUTE_PCI_{BUS,DEVICE,DOMAIN}_ID
	var bus, dev, dom C.int
	if C.kvDeviceAttr(&bus, attrBus, d.dev) != 0 || C.kvDeviceAttr(&dev, attrDevice, d.dev) != 0 || C.kvDeviceAttr(&dom, attrDomain, d.dev) != 0 {
		return -1
	}
	return numaNodeOf(fmt.Sprintf("%04x:%02x:%02x.0", int(dom), int(bus), int(dev)))
}

// Ordinal is the device's CUDA ordinal.
func (d *CUDADevice) Ordinal() int { return d.ordinal }

// Name is the device's product name.
func (d *CUDADevice) Name() string { return d.name }

// NUMANode is the NUMA node the device is attached to, -1 when unknown.
func (d *CUDADevice) NUMANode() int { return d.numa }

// Close releases the primary context. Engine memory, movers and staging made from the device
// must be closed first.
func (d *CUDADevice) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	var err error
	d.t.do(func() {
		err = errors.Join(d.sums.unload(), cuErr("cuDevicePrimaryCtxRelease", C.kvPrimaryRelease(d.dev)))
	})
	return err
}

// call runs f with the device's context current (its cudaCaller) and returns its error.
func (d *CUDADevice) call(f func() error) error {
	var err error
	d.t.do(func() { err = f() })
	return err
}

// PinnedBuffer is page-locked host memory the device can copy to and from at full speed.
type PinnedBuffer struct {
	d          *CUDADevice
	data       []byte
	registered bool // mapped by kvctl and registered, rather than allocated by the driver
	once       sync.Once
}

// Bytes returns the buffer; it is valid until Close.
func (p *PinnedBuffer) Bytes() []byte { return p.data }

// Registered reports whether the memory was registered (on the device's NUMA node) rather than
// allocated by the driver.
func (p *PinnedBuffer) Registered() bool { return p.registered }

// AllocPinned allocates size bytes of page-locked host memory. Where the device's NUMA node is
// known, or register is set, the memory is mapped here, bound to that node and registered with
// the driver; otherwise the driver allocates it. Every buffer counts in PinnedAllocations until
// it is closed.
func (d *CUDADevice) AllocPinned(size int, register bool) (*PinnedBuffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("pinned memory: size must be positive, got %d", size)
	}
	if d.closed.Load() {
		return nil, fmt.Errorf("pinned memory: device is closed")
	}
	const portable = 1 // CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTREGISTER_PORTABLE
	p := &PinnedBuffer{d: d}
	if register || d.numa >= 0 {
		mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return nil, fmt.Errorf("pinned memory: map %d bytes: %w", size, err)
		}
		if d.numa >= 0 {
			bindToNode(mem, d.numa)
		}
		err = d.call(func() error {
			return cuErr("cuMemHostRegister", C.kvHostRegister(C.uintptr_t(ptrOf(mem)), C.size_t(size), portable|2)) // | CU_MEMHOSTREGISTER_DEVICEMAP
		})
		if err != nil {
			unix.Munmap(mem)
			return nil, fmt.Errorf("pinned memory: %w", err)
		}
		p.data, p.registered = mem, true
	} else {
		var ptr unsafe.Pointer
		err := d.call(func() error {
			return cuErr("cuMemHostAlloc", C.kvHostAlloc(&ptr, C.size_t(size), portable))
		})
		if err != nil {
			return nil, fmt.Errorf("pinned memory: %w", err)
		}
		p.data = unsafe.Slice((*byte)(ptr), size)
	}
	d.addPinned(ptrOf(p.data), size)
	liveStaging.Add(1)
	return p, nil
}

// bindToNode asks the kernel to place mem's pages on node. It is a hint: a failure only costs
// bandwidth.
func bindToNode(mem []byte, node int) {
	const mpolPreferred = 1
	mask := make([]uint64, node/64+1)
	mask[node/64] = 1 << (node % 64)
	// Placement is a preference: memory on another node still works, only slower.
	_, _, _ = unix.Syscall6(unix.SYS_MBIND, ptrOf(mem), uintptr(len(mem)), mpolPreferred,
		uintptr(unsafe.Pointer(&mask[0])), uintptr(len(mask)*64+1), 0)
	runtime.KeepAlive(mask)
}

// Close unpins and frees the buffer. A registered buffer whose unregistration fails is kept
// mapped, and the error returned.
func (p *PinnedBuffer) Close() error {
	var err error
	p.once.Do(func() {
		base := ptrOf(p.data)
		p.d.removePinned(base)
		if p.registered {
			err = p.d.call(func() error { return cuErr("cuMemHostUnregister", C.kvHostUnregister(C.uintptr_t(base))) })
			if err != nil {
				// Seed commit 17: memory whose unregistration failed may still be addressed by
				// the device, so it is kept mapped (and never reused) rather than unmapped.
				p.data = nil
				return
			}
			err = unix.Munmap(p.data)
		} else {
			err = p.d.call(func() error { return cuErr("cuMemFreeHost", C.kvFreeHost(C.uintptr_t(base))) })
		}
		p.data = nil
		liveStaging.Add(-1)
	})
	return err
}

func (d *CUDADevice) addPinned(base uintptr, size int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := pinnedRange{base, base + uintptr(size)}
	i := sort.Search(len(d.pinned), func(i int) bool { return d.pinned[i].base >= base })
	d.pinned = slices.Insert(d.pinned, i, r)
}

func (d *CUDADevice) removePinned(base uintptr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	i := sort.Search(len(d.pinned), func(i int) bool { return d.pinned[i].base >= base })
	if i < len(d.pinned) && d.pinned[i].base == base {
		d.pinned = slices.Delete(d.pinned, i, i+1)
	}
}

// isPinned reports whether all of b lies in pinned memory allocated through this device.
func (d *CUDADevice) isPinned(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	lo := ptrOf(b)
	hi := lo + uintptr(len(b))
	d.mu.RLock()
	defer d.mu.RUnlock()
	i := sort.Search(len(d.pinned), func(i int) bool { return d.pinned[i].end > lo })
	return i < len(d.pinned) && d.pinned[i].base <= lo && hi <= d.pinned[i].end
}

// EngineMemory is device memory holding an engine's KV pages: imported from the engine, or
// allocated here for tests and benchmarks. It stays mapped until its owner and every mover
// over it have closed.
type EngineMemory struct {
	d       *CUDADevice
	ptr     uint64
	size    uint64
	kind    string
	release func() error
	refs    atomic.Int32
	once    sync.Once
}

func (d *CUDADevice) newEngineMemory(ptr, size uint64, kind string, release func() error) *EngineMemory {
	m := &EngineMemory{d: d, ptr: ptr, size: size, kind: kind, release: release}
	m.refs.Store(1)
	return m
}

// Size is the number of bytes registered.
func (m *EngineMemory) Size() uint64 { return m.size }

// Kind says where the memory came from: "device", "ipc" or "fd".
func (m *EngineMemory) Kind() string { return m.kind }

// Pointer is the memory's device address.
func (m *EngineMemory) Pointer() uint64 { return m.ptr }

func (m *EngineMemory) check(off uint64, n int) error {
	if off > m.size || uint64(n) > m.size-off {
		return fmt.Errorf("engine memory: %d bytes at %d outside %d", n, off, m.size)
	}
	return nil
}

// CopyIn writes p to engine memory at off, synchronously and without a Mover.
func (m *EngineMemory) CopyIn(off uint64, p []byte) error {
	if err := m.check(off, len(p)); err != nil || len(p) == 0 {
		return err
	}
	return m.d.call(func() error {
		return cuErr("cuMemcpyHtoD", C.kvCopyHtoD(C.uint64_t(m.ptr+off), C.uintptr_t(ptrOf(p)), C.size_t(len(p))))
	})
}

// CopyOut reads engine memory at off into p, synchronously and without a Mover.
func (m *EngineMemory) CopyOut(off uint64, p []byte) error {
	if err := m.check(off, len(p)); err != nil || len(p) == 0 {
		return err
	}
	return m.d.call(func() error {
		return cuErr("cuMemcpyDtoH", C.kvCopyDtoH(C.uintptr_t(ptrOf(p)), C.uint64_t(m.ptr+off), C.size_t(len(p))))
	})
}

func (m *EngineMemory) retain() { m.refs.Add(1) }

func (m *EngineMemory) unref() error {
	if m.refs.Add(-1) != 0 {
		return nil
	}
	var err error
	m.once.Do(func() { err = m.d.call(m.release) })
	return err
}

// Close drops the owner's reference; the memory is released once movers over it have closed.
func (m *EngineMemory) Close() error { return m.unref() }

// AllocDeviceMemory allocates size bytes of device memory as an engine would (a plain
// allocation, never managed memory).
func (d *CUDADevice) AllocDeviceMemory(size uint64) (*EngineMemory, error) {
	if size == 0 {
		return nil, fmt.Errorf("device memory: size must be positive")
	}
	var p C.uint64_t
	if err := d.call(func() error { return cuErr("cuMemAlloc", C.kvMemAlloc(&p, C.size_t(size))) }); err != nil {
		return nil, err
	}
	ptr := uint64(p)
	return d.newEngineMemory(ptr, size, "device", func() error { return cuErr("cuMemFree", C.kvMemFree(C.uint64_t(ptr))) }), nil
}

// IPCHandleSize is the size of a CUDA IPC memory handle.
const IPCHandleSize = 64

// ImportIPC opens an engine's allocation from a legacy CUDA IPC handle and registers size bytes
// from offset within it. handle is the 64-byte cudaIpcMemHandle_t, or the 66 bytes PyTorch's
// _share_cuda_ returns (two bytes of its own, then the handle).
func (d *CUDADevice) ImportIPC(handle []byte, offset, size uint64) (*EngineMemory, error) {
	switch len(handle) {
	case IPCHandleSize:
	case IPCHandleSize + 2:
		handle = handle[2:]
	default:
		return nil, fmt.Errorf("ipc import: handle of %d bytes, want %d (or %d from PyTorch)", len(handle), IPCHandleSize, IPCHandleSize+2)
	}
	if size == 0 {
		return nil, fmt.Errorf("ipc import: size must be positive")
	}
	h := C.CBytes(handle)
	defer C.free(h)
	var base C.uint64_t
	if err := d.call(func() error { return cuErr("cuIpcOpenMemHandle", C.kvIpcOpen(&base, h)) }); err != nil {
		return nil, fmt.Errorf("ipc import: %w", err)
	}
	b := uint64(base)
	return d.newEngineMemory(b+offset, size, "ipc", func() error { return cuErr("cuIpcCloseMemHandle", C.kvIpcClose(C.uint64_t(b))) }), nil
}

// ErrNoVMM is returned where the driver lacks virtual memory management.
var ErrNoVMM = errors.New("driver has no virtual memory management")

// Granularity returns the size that exported and imported allocations are a multiple of.
func (d *CUDADevice) Granularity() (uint64, error) {
	if C.kvHasVMM() == 0 {
		return 0, ErrNoVMM
	}
	var g C.size_t
	err := d.call(func() error { return cuErr("cuMemGetAllocationGranularity", C.kvGranularity(&g, C.int(d.ordinal))) })
	return uint64(g), err
}

// ImportFD imports an engine's virtual-memory allocation from the POSIX file descriptor it
// exported (received over the unix socket), maps its size bytes and registers them. The caller
// keeps fd and may close it once ImportFD returns.
func (d *CUDADevice) ImportFD(fd int, size uint64) (*EngineMemory, error) {
	g, err := d.Granularity()
	if err != nil {
		return nil, fmt.Errorf("fd import: %w", err)
	}
	if size == 0 || size%g != 0 {
		return nil, fmt.Errorf("fd import: size %d is not a positive multiple of the %d-byte granularity", size, g)
	}
	var p C.uint64_t
	if err := d.call(func() error {
		return cuErr("cuMemImportFromShareableHandle/cuMemMap", C.kvImportFD(&p, C.int(fd), C.size_t(size), C.int(d.ordinal)))
	}); err != nil {
		return nil, fmt.Errorf("fd import: %w", err)
	}
	ptr := uint64(p)
	return d.newEngineMemory(ptr, size, "fd", func() error { return cuErr("cuMemUnmap", C.kvUnmap(C.uint64_t(ptr), C.size_t(size))) }), nil
}

// AllocExportable allocates device memory the way an engine with a virtual-memory pool does and
// exports it as a POSIX file descriptor for another process to import. size is rounded up to
// the granularity. The caller owns fd.
func (d *CUDADevice) AllocExportable(size uint64) (*EngineMemory, int, error) {
	g, err := d.Granularity()
	if err != nil {
		return nil, -1, fmt.Errorf("exportable memory: %w", err)
	}
	size = (size + g - 1) / g * g
	var p C.uint64_t
	var fd C.int
	if err := d.call(func() error {
		return cuErr("cuMemCreate/cuMemExportToShareableHandle", C.kvCreateExportable(&p, &fd, C.size_t(size), C.int(d.ordinal)))
	}); err != nil {
		return nil, -1, fmt.Errorf("exportable memory: %w", err)
	}
	ptr := uint64(p)
	return d.newEngineMemory(ptr, size, "fd", func() error { return cuErr("cuMemUnmap", C.kvUnmap(C.uint64_t(ptr), C.size_t(size))) }), int(fd), nil
}
