//go:build cgo && linux

package gpu

/*
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
typedef int CUresult;
int kvHasKernels(void);
CUresult kvLoadFunction(uintptr_t *mod, uintptr_t *fn, const char *image, const char *name);
CUresult kvUnloadModule(uintptr_t mod);
CUresult kvLaunchPageSums(uintptr_t fn, unsigned int n, uintptr_t s, uint64_t pages, uint64_t pieces, const void *secret, uint64_t out);
CUresult kvCopyHtoDAsync(uint64_t dst, uintptr_t src, size_t n, uintptr_t s);
CUresult kvCopyDtoHAsync(uintptr_t dst, uint64_t src, size_t n, uintptr_t s);
CUresult kvStreamSync(uintptr_t s);
CUresult kvMemAlloc(uint64_t *p, size_t n);
CUresult kvMemFree(uint64_t p);
*/
import "C"

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"unsafe"
)

//go:embed kernels/pagesum.ptx
var pageSumPTX string

// pageSumKernel is the page checksum kernel of one device, loaded into its primary context the
// first time a mover asks for it.
type pageSumKernel struct {
	once sync.Once
	mod  uintptr
	fn   uintptr
	err  error
}

// load loads the module; it must run on a thread with the device's context current.
func (k *pageSumKernel) load() error {
	k.once.Do(func() {
		if C.kvHasKernels() == 0 {
			k.err = fmt.Errorf("%w: the driver has no cuModuleLoadData or cuLaunchKernel", errNotCheckable)
			return
		}
		image := C.CString(pageSumPTX)
		defer C.free(unsafe.Pointer(image))
		name := C.CString("kvPageSums")
		defer C.free(unsafe.Pointer(name))
		var mod, fn C.uintptr_t
		if err := cuErr("cuModuleLoadData", C.kvLoadFunction(&mod, &fn, image, name)); err != nil {
			k.err = fmt.Errorf("%w: loading the kernel: %w", errNotCheckable, err)
			return
		}
		k.mod, k.fn = uintptr(mod), uintptr(fn)
	})
	return k.err
}

// unload releases the module, if it was loaded; it runs on the device's thread at Close.
func (k *pageSumKernel) unload() error {
	if k.mod == 0 {
		return nil
	}
	err := cuErr("cuModuleUnload", C.kvUnloadModule(C.uintptr_t(k.mod)))
	k.mod, k.fn = 0, 0
	return err
}

// Sizes of the kernel's descriptors (kernels/pagesum.cu): kvPage and kvPiece.
const (
	pageDescBytes  = 16
	pieceDescBytes = 24
)

// pageChecks is a mover's state for checking pages on the GPU: the reason it cannot (nil when
// it can), and the pinned and device buffers the descriptors and digests travel through.
type pageChecks struct {
	err    error
	secret []byte
	host   *PinnedBuffer
	dev    uint64
	cap    int
}

// PageCheckError reports whether ScatterChecked can check this mover's pages on the GPU: nil
// when it can, otherwise why not (the layout's regions, the driver, or the kernel failing to
// load on this GPU). A mover that cannot check leaves the checks to the host.
func (m *cudaMover) PageCheckError() error { return m.checks.err }

// initChecks decides whether the mover's pages can be checked on the GPU and loads the kernel.
// It runs on the mover's thread.
func (m *cudaMover) initChecks() {
	if err := pageCheckable(m.layout, m.mem.ptr); err != nil {
		m.checks.err = err
		return
	}
	if err := m.d.sums.load(); err != nil {
		m.checks.err = err
		return
	}
	m.checks.secret = newPageSumSecret().bytes()
}

// ScatterChecked is Scatter followed by a check of every page where it landed in engine
// memory: the XXH3-64 digest of page i's bytes, computed on the GPU, is compared with sums[i],
// the digest taken when the page was written. bad[i] is true where they differ: that page's
// slot holds bytes that must not be used. It fails with the reason from PageCheckError when the
// mover cannot check.
func (m *cudaMover) ScatterChecked(ctx context.Context, src [][]byte, pages []PageRef, sums []uint64) ([]bool, error) {
	if m.checks.err != nil {
		return nil, m.checks.err
	}
	if len(sums) != len(pages) {
		return nil, fmt.Errorf("%w: %d pages but %d checksums", ErrBadPage, len(pages), len(sums))
	}
	if err := m.transfer(ctx, true, pages, src); err != nil {
		return nil, err
	}
	if len(pages) == 0 {
		return nil, nil
	}
	// The descriptors: kvPage per page, then kvPiece per region, then room for the digests.
	nPieces := 0
	for _, ref := range pages {
		rs, _ := m.layout.regions(ref) // transfer checked every reference
		nPieces += len(rs)
	}
	piecesAt := len(pages) * pageDescBytes
	outAt := piecesAt + nPieces*pieceDescBytes
	need := outAt + 8*len(pages)
	if err := m.growChecks(need); err != nil {
		return nil, err
	}
	buf := m.checks.host.Bytes()[:need]
	le := binary.LittleEndian
	piece := 0
	for i, ref := range pages {
		rs, _ := m.layout.regions(ref)
		var off uint64
		p := buf[i*pageDescBytes:]
		le.PutUint32(p[8:], uint32(piece))
		le.PutUint32(p[12:], uint32(len(rs)))
		for _, r := range rs {
			q := buf[piecesAt+piece*pieceDescBytes:]
			le.PutUint64(q[0:], m.mem.ptr+r.Offset+r.Stride*uint64(ref.Slot))
			le.PutUint64(q[8:], off)
			le.PutUint64(q[16:], r.Size)
			off += r.Size
			piece++
		}
		le.PutUint64(p[0:], off)
	}
	var err error
	m.t.do(func() {
		s := C.uintptr_t(m.streams[0])
		host := C.uintptr_t(ptrOf(buf))
		dev := C.uint64_t(m.checks.dev)
		err = cuErr("cuMemcpyHtoDAsync", C.kvCopyHtoDAsync(dev, host, C.size_t(outAt), s))
		if err == nil {
			err = cuErr("cuLaunchKernel", C.kvLaunchPageSums(C.uintptr_t(m.d.sums.fn), C.uint(len(pages)), s,
				dev, dev+C.uint64_t(piecesAt), unsafe.Pointer(&m.checks.secret[0]), dev+C.uint64_t(outAt)))
		}
		if err == nil {
			err = cuErr("cuMemcpyDtoHAsync", C.kvCopyDtoHAsync(host+C.uintptr_t(outAt), dev+C.uint64_t(outAt), C.size_t(8*len(pages)), s))
		}
		// Wait also after an error, so nothing reads the buffers once this returns.
		err = errors.Join(err, cuErr("cuStreamSynchronize", C.kvStreamSync(s)))
	})
	if err != nil {
		return nil, fmt.Errorf("cuda mover: page check: %w", err)
	}
	bad := make([]bool, len(pages))
	for i := range pages {
		bad[i] = le.Uint64(buf[outAt+8*i:]) != sums[i]
	}
	return bad, nil
}

// growChecks makes the descriptor buffers hold at least n bytes.
func (m *cudaMover) growChecks(n int) error {
	if n <= m.checks.cap {
		return nil
	}
	n = max(n, 2*m.checks.cap, 64<<10)
	m.freeChecks()
	host, err := m.d.AllocPinned(n, false)
	if err != nil {
		return fmt.Errorf("page check buffers: %w", err)
	}
	var dev C.uint64_t
	m.t.do(func() { err = cuErr("cuMemAlloc", C.kvMemAlloc(&dev, C.size_t(n))) })
	if err != nil {
		host.Close()
		return fmt.Errorf("page check buffers: %w", err)
	}
	m.checks.host, m.checks.dev, m.checks.cap = host, uint64(dev), n
	return nil
}

// freeChecks releases the descriptor buffers.
func (m *cudaMover) freeChecks() error {
	var err error
	if m.checks.host != nil {
		err = m.checks.host.Close()
	}
	if m.checks.dev != 0 {
		dev := C.uint64_t(m.checks.dev)
		m.t.do(func() { err = errors.Join(err, cuErr("cuMemFree", C.kvMemFree(dev))) })
	}
	m.checks.host, m.checks.dev, m.checks.cap = nil, 0, 0
	return err
}
