//go:build cgo && linux

package gpu

/*
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
typedef int CUresult;
int kvHasKernels(void);
CUresult kvLoadModule(uintptr_t *mod, const char *image);
CUresult kvGetFunction(uintptr_t *fn, uintptr_t mod, const char *name);
CUresult kvLaunchCopies(uintptr_t fn, unsigned int n, uintptr_t s, uint64_t copies);
CUresult kvUnloadModule(uintptr_t mod);
CUresult kvLaunchPageSums(uintptr_t fn, unsigned int n, uintptr_t s, uint64_t pages, uint64_t pieces, const void *secret, uint64_t out);
CUresult kvCopyHtoDAsync(uint64_t dst, uintptr_t src, size_t n, uintptr_t s);
CUresult kvCopyDtoHAsync(uintptr_t dst, uint64_t src, size_t n, uintptr_t s);
CUresult kvStreamSync(uintptr_t s);
CUresult kvMemAlloc(uint64_t *p, size_t n);
CUresult kvMemFree(uint64_t p);
CUresult kvStreamCreate(uintptr_t *s);
CUresult kvEventCreate(uintptr_t *e);
CUresult kvEventDestroy(uintptr_t e);
CUresult kvEventRecord(uintptr_t e, uintptr_t s);
CUresult kvEventSync(uintptr_t e);
CUresult kvStreamWaitEvent(uintptr_t s, uintptr_t e);
CUresult kvStreamDestroy(uintptr_t s);
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

	"github.com/kvctl/kvctl/core/kvmem"
)

//go:embed kernels/pagesum.ptx
var pageSumPTX string

// pageSumKernel is kvctl's kernels module (kernels/pagesum.cu) on one device, loaded into its
// primary context the first time a mover asks for it: the page checksum kernel (fn) and the
// copy kernel (copyFn).
type pageSumKernel struct {
	once   sync.Once
	mod    uintptr
	fn     uintptr
	copyFn uintptr
	err    error
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
		var mod C.uintptr_t
		if err := cuErr("cuModuleLoadData", C.kvLoadModule(&mod, image)); err != nil {
			k.err = fmt.Errorf("%w: loading the kernels: %w", errNotCheckable, err)
			return
		}
		var fn, copyFn C.uintptr_t
		for _, f := range []struct {
			name string
			out  *C.uintptr_t
		}{{"kvPageSums", &fn}, {"kvCopyPieces", &copyFn}} {
			name := C.CString(f.name)
			err := cuErr("cuModuleGetFunction", C.kvGetFunction(f.out, mod, name))
			C.free(unsafe.Pointer(name))
			if err != nil {
				C.kvUnloadModule(mod)
				k.err = fmt.Errorf("%w: kernel %s: %w", errNotCheckable, f.name, err)
				return
			}
		}
		k.copyFn = uintptr(copyFn)
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
// it can), the stream the checks run on, and two sets of pinned and device buffers the
// descriptors and digests travel through, so one batch's check can run while the next batch is
// copied.
type pageChecks struct {
	err    error
	secret []byte
	stream uintptr
	// copied[i] is recorded on copy stream i after a checked scatter's copies are issued, and
	// the check stream waits for it, so a check is queued before the host waits for the copies.
	copied []uintptr
	sets   [2]checkSet
	next   int
	gen    uint64
	mu     sync.Mutex
}

// checkSet is one set of check buffers and the check that last used it.
type checkSet struct {
	host *PinnedBuffer
	dev  uint64
	cap  int
	// done is recorded on the checks' stream after the set's digests are copied back.
	done uintptr
	// The check in flight on this set, if any.
	pending *pendingCheck
}

// checkPiece is one region of a page to check: page index, device address, offset in the page,
// length.
type checkPiece struct {
	page           int
	addr, off, len uint64
}

// pendingCheck is a launched check whose digests have not been read yet.
type pendingCheck struct {
	seq   uint64 // launch order
	set   int
	outAt int
	sums  []uint64
	done  bool
	bad   []bool
	err   error
}

// PageCheckError reports whether ScatterChecked can check this mover's pages on the GPU: nil
// when it can, otherwise why not (the layout's regions, the driver, or the kernel failing to
// load on this GPU). A mover that cannot check leaves the checks to the host.
func (m *cudaMover) PageCheckError() error { return m.checks.err }

// initChecks decides whether the mover's pages can be checked on the GPU, loads the kernel and
// creates the checks' stream. It runs on the mover's thread.
func (m *cudaMover) initChecks() {
	if err := pageCheckable(m.layout, m.mem.ptr); err != nil {
		m.checks.err = err
		return
	}
	if err := m.d.sums.load(); err != nil {
		m.checks.err = err
		return
	}
	var s C.uintptr_t
	if err := cuErr("cuStreamCreate", C.kvStreamCreate(&s)); err != nil {
		m.checks.err = fmt.Errorf("%w: %w", errNotCheckable, err)
		return
	}
	m.checks.stream = uintptr(s)
	for i := range m.checks.sets {
		var e C.uintptr_t
		if err := cuErr("cuEventCreate", C.kvEventCreate(&e)); err != nil {
			m.checks.err = fmt.Errorf("%w: %w", errNotCheckable, err)
			return
		}
		m.checks.sets[i].done = uintptr(e)
	}
	for range m.streams {
		var e C.uintptr_t
		if err := cuErr("cuEventCreate", C.kvEventCreate(&e)); err != nil {
			m.checks.err = fmt.Errorf("%w: %w", errNotCheckable, err)
			return
		}
		m.checks.copied = append(m.checks.copied, uintptr(e))
	}
	m.checks.secret = newPageSumSecret().bytes()
}

// ScatterChecked is Scatter followed by a check of every page where it landed in engine
// memory: the XXH3-64 digest of page i's bytes, computed on the GPU, is compared with sums[i],
// the digest taken when the page was written. It returns once the copies are done and the
// check is launched; wait returns the check's result, bad[i] true where the digests differ (that
// slot's bytes must not be used). The check runs on a stream of its own, so it overlaps the next
// call's copies; at most two checks are in flight (a third call first waits for the ones in
// flight, keeping their results for their wait). It
// fails with the reason from PageCheckError when the mover cannot check.
func (m *cudaMover) ScatterChecked(ctx context.Context, src [][]byte, pages []kvmem.PageRef, sums []uint64) (wait func() ([]bool, error), err error) {
	if m.checks.err != nil {
		return nil, m.checks.err
	}
	if len(sums) != len(pages) {
		return nil, fmt.Errorf("%w: %d pages but %d checksums", kvmem.ErrBadPage, len(pages), len(sums))
	}
	if err := kvmem.WalkPages(m.layout, pages, src, nil); err != nil {
		return nil, err
	}
	if len(pages) == 0 {
		if err := m.transfer(ctx, true, pages, src); err != nil {
			return nil, err
		}
		return func() ([]bool, error) { return nil, nil }, nil
	}
	c := &m.checks
	c.mu.Lock()
	defer c.mu.Unlock()
	j := c.next
	set := &c.sets[j]
	if set.pending != nil && !set.pending.done {
		c.syncLocked(m, set.pending)
	}
	// The descriptors: kvPage per page, then kvPiece per region, then room for the digests.
	// The walk above checked every reference, so this one cannot fail.
	m.pieces = m.pieces[:0]
	_ = kvmem.WalkPages(m.layout, pages, src, func(p int, eo, vo, n uint64) {
		m.pieces = append(m.pieces, checkPiece{page: p, addr: m.mem.ptr + eo, off: vo, len: n})
	})
	piecesAt := len(pages) * pageDescBytes
	outAt := piecesAt + len(m.pieces)*pieceDescBytes
	need := outAt + 8*len(pages)
	if err := m.growSet(set, need); err != nil {
		return nil, err
	}
	buf := set.host.Bytes()[:need]
	le := binary.LittleEndian
	for k, pc := range m.pieces {
		q := buf[piecesAt+k*pieceDescBytes:]
		le.PutUint64(q[0:], pc.addr)
		le.PutUint64(q[8:], pc.off)
		le.PutUint64(q[16:], pc.len)
		d := buf[pc.page*pageDescBytes:]
		if pc.off == 0 {
			le.PutUint32(d[8:], uint32(k))
			le.PutUint32(d[12:], 0)
			le.PutUint64(d[0:], 0)
		}
		le.PutUint32(d[12:], le.Uint32(d[12:])+1)
		le.PutUint64(d[0:], pc.off+pc.len)
	}
	// The check is queued on its stream right after the last copies are issued, behind them
	// (an event per copy stream), so the host's work to launch it overlaps the copies.
	launched := false
	m.afterIssue = func(ns int) error {
		s := C.uintptr_t(c.stream)
		for i := range ns {
			ev := C.uintptr_t(c.copied[i])
			if err := cuErr("cuEventRecord", C.kvEventRecord(ev, C.uintptr_t(m.streams[i]))); err != nil {
				return err
			}
			if err := cuErr("cuStreamWaitEvent", C.kvStreamWaitEvent(s, ev)); err != nil {
				return err
			}
		}
		host := C.uintptr_t(ptrOf(buf))
		dev := C.uint64_t(set.dev)
		launched = true
		if err := cuErr("cuMemcpyHtoDAsync", C.kvCopyHtoDAsync(dev, host, C.size_t(outAt), s)); err != nil {
			return err
		}
		if err := cuErr("cuLaunchKernel", C.kvLaunchPageSums(C.uintptr_t(m.d.sums.fn), C.uint(len(pages)), s,
			dev, dev+C.uint64_t(piecesAt), unsafe.Pointer(&c.secret[0]), dev+C.uint64_t(outAt))); err != nil {
			return err
		}
		if err := cuErr("cuMemcpyDtoHAsync", C.kvCopyDtoHAsync(host+C.uintptr_t(outAt), dev+C.uint64_t(outAt), C.size_t(8*len(pages)), s)); err != nil {
			return err
		}
		return cuErr("cuEventRecord", C.kvEventRecord(C.uintptr_t(set.done), s))
	}
	err = m.transfer(ctx, true, pages, src)
	m.afterIssue = nil
	if err != nil {
		if launched {
			// Nothing may still read or write the buffers once this returns.
			s := C.uintptr_t(c.stream)
			m.t.do(func() { _ = C.kvStreamSync(s) })
		}
		return nil, fmt.Errorf("cuda mover: page check: %w", err)
	}
	c.gen++
	pc := &pendingCheck{set: j, outAt: outAt, sums: sums, seq: c.gen}
	set.pending = pc
	c.next ^= 1
	return func() ([]bool, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if !pc.done {
			c.syncLocked(m, pc)
		}
		return pc.bad, pc.err
	}, nil
}

// syncLocked waits for check pc (and so for every check launched before it on the checks'
// stream), not for the ones launched after it, and reads the digests of those that are done.
func (c *pageChecks) syncLocked(m *cudaMover, pc *pendingCheck) {
	var err error
	ev := C.uintptr_t(c.sets[pc.set].done)
	m.t.do(func() { err = cuErr("cuEventSynchronize", C.kvEventSync(ev)) })
	c.harvest(pc, err)
	// An older check on the other set is done too: the stream runs checks in order.
	if other := c.sets[pc.set^1].pending; other != nil && !other.done && other.seq < pc.seq {
		c.harvest(other, err)
	}
}

// harvest reads a finished check's digests.
func (c *pageChecks) harvest(pc *pendingCheck, err error) {
	pc.done = true
	if err != nil {
		pc.err = fmt.Errorf("cuda mover: page check: %w", err)
		return
	}
	out := c.sets[pc.set].host.Bytes()[pc.outAt:]
	pc.bad = make([]bool, len(pc.sums))
	for k := range pc.sums {
		pc.bad[k] = binary.LittleEndian.Uint64(out[8*k:]) != pc.sums[k]
	}
}

// growSet makes a set's buffers hold at least n bytes. The set has no check in flight.
func (m *cudaMover) growSet(set *checkSet, n int) error {
	if n <= set.cap {
		return nil
	}
	n = max(n, 2*set.cap, 64<<10)
	if err := m.freeSet(set); err != nil {
		return err
	}
	host, err := m.d.AllocPinned(n, false)
	if err != nil {
		return fmt.Errorf("page check buffers: %w", err)
	}
	var dev C.uint64_t
	m.t.do(func() { err = cuErr("cuMemAlloc", C.kvMemAlloc(&dev, C.size_t(n))) })
	if err != nil {
		_ = host.Close()
		return fmt.Errorf("page check buffers: %w", err)
	}
	set.host, set.dev, set.cap = host, uint64(dev), n
	return nil
}

// freeSet releases a set's buffers.
func (m *cudaMover) freeSet(set *checkSet) error {
	var err error
	if set.host != nil {
		err = set.host.Close()
	}
	if set.dev != 0 {
		dev := C.uint64_t(set.dev)
		m.t.do(func() { err = errors.Join(err, cuErr("cuMemFree", C.kvMemFree(dev))) })
	}
	set.host, set.dev, set.cap = nil, 0, 0
	return err
}

// freeChecks waits for the checks in flight and releases their buffers and stream.
func (m *cudaMover) freeChecks() error {
	c := &m.checks
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stream == 0 {
		return nil
	}
	var err error
	s0 := C.uintptr_t(c.stream)
	m.t.do(func() { err = cuErr("cuStreamSynchronize", C.kvStreamSync(s0)) })
	for i := range c.sets {
		if pc := c.sets[i].pending; pc != nil && !pc.done {
			c.harvest(pc, err)
		}
		if e := c.sets[i].done; e != 0 {
			m.t.do(func() { err = errors.Join(err, cuErr("cuEventDestroy", C.kvEventDestroy(C.uintptr_t(e)))) })
			c.sets[i].done = 0
		}
	}
	for _, e := range c.copied {
		m.t.do(func() { err = errors.Join(err, cuErr("cuEventDestroy", C.kvEventDestroy(C.uintptr_t(e)))) })
	}
	c.copied = nil
	for i := range c.sets {
		err = errors.Join(err, m.freeSet(&c.sets[i]))
	}
	s := C.uintptr_t(c.stream)
	m.t.do(func() { err = errors.Join(err, cuErr("cuStreamDestroy", C.kvStreamDestroy(s))) })
	c.stream = 0
	return err
}

// copyChunk is the most one block of the copy kernel moves.
const copyChunk = 64 << 10

// flushKernel issues the batch's copies (host to device) as one launch of the copy kernel on
// the first stream, waits for it and resets the batch. It runs instead of the copy engines when
// the mover chooses the copy kernel (CUDAMoverOptions.Scatter).
func (m *cudaMover) flushKernel(last bool) error {
	n := 0
	for _, s := range m.size {
		n += int((s + copyChunk - 1) / copyChunk)
	}
	need := n * 24
	if need > m.copyCap {
		if err := m.freeCopies(); err != nil {
			return err
		}
		c := max(need, 2*m.copyCap, 64<<10)
		host, err := m.d.AllocPinned(c, false)
		if err != nil {
			return fmt.Errorf("copy kernel buffers: %w", err)
		}
		var dev C.uint64_t
		m.t.do(func() { err = cuErr("cuMemAlloc", C.kvMemAlloc(&dev, C.size_t(c))) })
		if err != nil {
			_ = host.Close()
			return fmt.Errorf("copy kernel buffers: %w", err)
		}
		m.copyHost, m.copyDev, m.copyCap = host, uint64(dev), c
	}
	buf := m.copyHost.Bytes()
	le := binary.LittleEndian
	k := 0
	for i := range m.dev {
		for o := uint64(0); o < m.size[i]; o += copyChunk {
			q := buf[k*24:]
			le.PutUint64(q[0:], m.host[i]+o)
			le.PutUint64(q[8:], m.dev[i]+o)
			le.PutUint64(q[16:], min(copyChunk, m.size[i]-o))
			k++
		}
	}
	var err error
	m.t.do(func() {
		s := C.uintptr_t(m.streams[0])
		err = cuErr("cuMemcpyHtoDAsync", C.kvCopyHtoDAsync(C.uint64_t(m.copyDev), C.uintptr_t(ptrOf(buf)), C.size_t(need), s))
		if err == nil {
			err = cuErr("cuLaunchKernel", C.kvLaunchCopies(C.uintptr_t(m.d.sums.copyFn), C.uint(n), s, C.uint64_t(m.copyDev)))
		}
		if err == nil && last && m.afterIssue != nil {
			err = m.afterIssue(1)
		}
		err = errors.Join(err, cuErr("cuStreamSynchronize", C.kvStreamSync(s)))
	})
	if err != nil {
		return fmt.Errorf("cuda mover: copy kernel: %w", err)
	}
	return nil
}

// freeCopies releases the copy kernel's descriptor buffers.
func (m *cudaMover) freeCopies() error {
	var err error
	if m.copyHost != nil {
		err = m.copyHost.Close()
	}
	if m.copyDev != 0 {
		dev := C.uint64_t(m.copyDev)
		m.t.do(func() { err = errors.Join(err, cuErr("cuMemFree", C.kvMemFree(dev))) })
	}
	m.copyHost, m.copyDev, m.copyCap = nil, 0, 0
	return err
}
