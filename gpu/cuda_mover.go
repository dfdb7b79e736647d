//go:build cgo && linux

package gpu

/*
#include <stdint.h>
typedef int CUresult;
CUresult kvStreamCreate(uintptr_t *s);
CUresult kvStreamDestroy(uintptr_t s);
CUresult kvStreamSync(uintptr_t s);
CUresult kvCopies(int toDevice, int n, const uint64_t *dev, const uint64_t *host, const uint64_t *size,
                  const int32_t *stream, const uintptr_t *streams, int *failed);
CUresult kvCopiesBatch(int toDevice, int n, uint64_t *dev, uint64_t *host, uint64_t *size, uintptr_t s, int ordinal);
int kvHasBatch(void);
CUresult kvEventRecord(uintptr_t e, uintptr_t s);
CUresult kvEventSync(uintptr_t e);
CUresult kvEventCreate(uintptr_t *e);
CUresult kvEventDestroy(uintptr_t e);
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	rtrace "runtime/trace"
	"sync"
	"unsafe"

	"github.com/kvctl/kvctl/core/kvmem"
)

// CUDAMoverOptions tune a CUDA mover. The zero value picks the defaults.
type CUDAMoverOptions struct {
	// Streams is the number of streams one batch is spread over, so that several copies are in
	// flight at once; 0 means DefaultCUDAStreams.
	Streams int
	// PerCopy issues one cuMemcpyAsync per copy even where the driver offers
	// cuMemcpyBatchAsync, which otherwise issues each stream's copies with one call; on an H200
	// the batched call moved 64 KiB pages about twice as fast (docs/perf/gpu.md).
	PerCopy bool
	// BounceBytes is the size of the pinned buffer used for host buffers that are not pinned
	// (not from NewStaging); 0 means 16 MiB.
	BounceBytes int
	// Scatter picks how Scatter copies host memory to the device; the zero value is
	// ScatterAuto.
	Scatter ScatterPath
}

// ScatterPath is how a CUDA mover's Scatter copies.
type ScatterPath int

const (
	// ScatterAuto copies a batch with the copy kernel when its copies average less than
	// kernelCopyBelow bytes, otherwise with the copy engines.
	ScatterAuto ScatterPath = iota
	// ScatterCopyEngines issues one copy-engine command per contiguous piece.
	ScatterCopyEngines
	// ScatterKernel copies with a kernel of kvctl's own (kernels/pagesum.cu), its threads
	// reading the pinned host memory through the device's mapping: one launch however many
	// pieces a batch has.
	ScatterKernel
)

// kernelCopyBelow is where ScatterAuto switches to the copy engines. On an H200 the kernel
// scattered 32 KiB pieces at 43-45 GB/s against 32-33 GB/s for the copy engines, and 128 KiB
// and 512 KiB pieces at 45-48 against 50-51 GB/s (docs/perf/serve-gpu.md).
const kernelCopyBelow = 128 << 10

// DefaultCUDAStreams is the number of streams a CUDA mover uses unless told otherwise.
const DefaultCUDAStreams = 4

// HasBatchCopy reports whether the driver offers cuMemcpyBatchAsync.
func HasBatchCopy() bool { return loadDriver() == nil && C.kvHasBatch() != 0 }

// cudaMover moves pages between engine memory on one GPU and host buffers. It owns a thread with
// the device's context current, its streams and a pinned bounce buffer.
type cudaMover struct {
	d      *CUDADevice
	mem    *EngineMemory
	layout kvmem.Layout
	opts   CUDAMoverOptions
	t      *cudaCaller
	// batchAPI: issue copies with cuMemcpyBatchAsync.
	batchAPI bool

	streams []uintptr
	bounce  *PinnedBuffer

	// The current batch, reused between calls.
	dev, host, size []uint64
	stream          []int32
	pending         []pendingOut

	// Page checks on the GPU (cuda_pagesum.go).
	checks pageChecks
	pieces []checkPiece
	// units, unitFirst and unitPieces are a checked batch's units (checkUnits).
	units      [][]byte
	unitFirst  []int
	unitPieces []checkPiece
	// fused lists a checked batch's kvCopyCheck records, when it has them.
	fused []checkedCopy
	// The copy kernel's descriptors (CUDAMoverOptions.Scatter).
	copyHost *PinnedBuffer
	copyDev  uint64
	copyCap  int
	// descIssued is recorded on the first stream once a launch's descriptors are copied to the
	// device (descRecorded): a call that did not wait for its copies (IssueChecked) may leave
	// that copy queued, and the next call must not rewrite the host buffer before it ran.
	descIssued   uintptr
	descRecorded bool

	// afterIssue, when set, runs inside the mover's CUDA call (its cudaCaller) once the last copies of a transfer are
	// issued on the first ns streams, before the host waits for them: ScatterChecked queues
	// its check behind them there.
	afterIssue func(chunk, ns int) error
	// startEvent, when set, is recorded on the first stream before the next copies are issued,
	// once (markStart): the start of a checked scatter as the device sees it.
	startEvent uintptr
	// wakeDesc holds the one empty copy WakeDevice launches the copy kernel over.
	wakeDesc *PinnedBuffer
	// fence, when set, is the engine's fence WaitFence armed: the next transfer's streams wait
	// for it before their first copy (markStart).
	fence *cudaFence

	mu     sync.Mutex
	closed bool
}

// pendingOut is gathered data that went through the bounce buffer and still has to be copied to
// its destination once the batch completes.
type pendingOut struct {
	dst []byte
	off int
}

// NewMover returns a Mover over mem for layout. The mover holds a reference on mem, so the
// memory stays mapped until the mover (and its clones) are closed too.
func (d *CUDADevice) NewMover(mem *EngineMemory, layout kvmem.Layout, opts CUDAMoverOptions) (kvmem.Mover, error) {
	if mem == nil || mem.d != d {
		return nil, fmt.Errorf("cuda mover: engine memory belongs to another device")
	}
	if err := layout.Validate(mem.size); err != nil {
		return nil, fmt.Errorf("cuda mover: %w", err)
	}
	if opts.Streams <= 0 {
		opts.Streams = DefaultCUDAStreams
	}
	if opts.BounceBytes <= 0 {
		opts.BounceBytes = 16 << 20
	}
	m := &cudaMover{d: d, mem: mem, layout: layout, opts: opts, batchAPI: !opts.PerCopy && HasBatchCopy()}
	t, err := newCUDACaller(d.ctx)
	if err != nil {
		return nil, fmt.Errorf("cuda mover: %w", err)
	}
	m.t = t
	var serr error
	t.do(func() {
		for range opts.Streams {
			var s C.uintptr_t
			if serr = cuErr("cuStreamCreate", C.kvStreamCreate(&s)); serr != nil {
				return
			}
			m.streams = append(m.streams, uintptr(s))
		}
		m.initChecks()
		if opts.Scatter != ScatterCopyEngines {
			// Without the kernels, copies go through the copy engines.
			_ = m.d.sums.load(m.d.dev)
		}
	})
	if serr != nil {
		m.destroyStreams()
		return nil, fmt.Errorf("cuda mover: %w", serr)
	}
	m.reserve()
	mem.retain()
	return m, nil
}

func (m *cudaMover) destroyStreams() {
	m.t.do(func() {
		for _, s := range m.streams {
			C.kvStreamDestroy(C.uintptr_t(s))
		}
	})
	m.streams = nil
}

func (m *cudaMover) Layout() kvmem.Layout { return m.layout }

func (m *cudaMover) Gather(ctx context.Context, pages []kvmem.PageRef, dst [][]byte) error {
	return m.transfer(ctx, false, pages, dst)
}

func (m *cudaMover) Scatter(ctx context.Context, src [][]byte, pages []kvmem.PageRef) error {
	return m.transfer(ctx, true, pages, src)
}

func (m *cudaMover) transfer(ctx context.Context, toDevice bool, pages []kvmem.PageRef, bufs [][]byte) error {
	if m.closed {
		return kvmem.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := kvmem.WalkPages(m.layout, pages, bufs, nil); err != nil {
		return err
	}
	m.reset()
	var err error
	bounceUsed := 0
	pinnedPage, lastPage := false, -1
	// The batch was checked above, so this walk cannot fail.
	_ = kvmem.WalkPages(m.layout, pages, bufs, func(p int, eo, vo, n uint64) {
		if err != nil {
			return
		}
		if p != lastPage {
			lastPage, pinnedPage = p, m.d.isPinned(bufs[p])
		}
		piece := bufs[p][vo : vo+n]
		devAddr := m.mem.ptr + eo
		if pinnedPage {
			m.add(devAddr, uint64(ptrOf(piece)), n)
			return
		}
		// Not pinned: go through the bounce buffer, in chunks when the piece is larger.
		for len(piece) > 0 {
			if bounceUsed == m.opts.BounceBytes {
				if err = m.flush(ctx, toDevice, false); err != nil {
					return
				}
				bounceUsed = 0
			}
			if m.bounce == nil {
				if m.bounce, err = m.d.AllocPinned(m.opts.BounceBytes, false); err != nil {
					return
				}
			}
			c := min(len(piece), m.opts.BounceBytes-bounceUsed)
			b := m.bounce.Bytes()[bounceUsed : bounceUsed+c]
			if toDevice {
				copy(b, piece[:c])
			} else {
				m.pending = append(m.pending, pendingOut{dst: piece[:c], off: bounceUsed})
			}
			m.add(devAddr, uint64(ptrOf(b)), uint64(c))
			bounceUsed += c
			devAddr += uint64(c)
			piece = piece[c:]
		}
	})
	if err != nil {
		return err
	}
	return m.flush(ctx, toDevice, true)
}

// markStart queues the wait for a fence WaitFence armed, if any, on every stream, then
// records startEvent on the first stream, if set, and clears both. It runs inside the mover's
// CUDA call, before copies are issued.
func (m *cudaMover) markStart() error {
	if f := m.fence; f != nil {
		m.fence = nil
		err := f.waitOn(m.streams)
		if err != nil {
			return fmt.Errorf("wait for the engine's event: %w", err)
		}
	}
	if m.startEvent != 0 {
		_ = C.kvEventRecord(C.uintptr_t(m.startEvent), C.uintptr_t(m.streams[0]))
		m.startEvent = 0
	}
	return nil
}

func (m *cudaMover) reset() {
	m.dev, m.host, m.size, m.stream, m.pending = m.dev[:0], m.host[:0], m.size[:0], m.stream[:0], m.pending[:0]
}

// add appends one copy, merging it into the previous one where both sides continue it.
func (m *cudaMover) add(dev, host, n uint64) {
	if k := len(m.dev) - 1; k >= 0 && m.dev[k]+m.size[k] == dev && m.host[k]+m.size[k] == host {
		m.size[k] += n
		return
	}
	m.dev = append(m.dev, dev)
	m.host = append(m.host, host)
	m.size = append(m.size, n)
}

// useKernel reports whether copies [a, b) of the batch go through the copy kernel.
func (m *cudaMover) useKernel(a, b int) bool {
	switch m.opts.Scatter {
	case ScatterKernel:
		return true
	case ScatterCopyEngines:
		return false
	}
	var total uint64
	for _, s := range m.size[a:b] {
		total += s
	}
	return total < kernelCopyBelow*uint64(b-a)
}

// flush issues the batch's copies spread over the streams, waits for them and, for a gather,
// copies what went through the bounce buffer to its destination.
func (m *cudaMover) flush(ctx context.Context, toDevice, last bool) error {
	defer m.reset()
	n := len(m.dev)
	if n == 0 {
		if last && m.afterIssue != nil {
			var err error
			m.t.do(func() { err = m.afterIssue(0, 0) })
			return err
		}
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if toDevice && m.d.sums.copyFn != 0 && m.useKernel(0, n) {
		return m.flushKernel(last)
	}
	var err error
	m.t.do(func() {
		if err = m.markStart(); err != nil {
			return
		}
		if last && m.afterIssue != nil {
			trace(checkStart, C.uintptr_t(m.streams[0]))
		}
		var ns int
		ns, err = m.issueEngines(toDevice, 0, n)
		if err == nil && last && m.afterIssue != nil {
			err = m.afterIssue(0, ns)
		}
		// Wait for every stream, also after an error, so no copy is still running on return.
		for _, s := range m.streams[:ns] {
			err = errors.Join(err, cuErr("cuStreamSynchronize", C.kvStreamSync(C.uintptr_t(s))))
		}
	})
	if err != nil {
		return fmt.Errorf("cuda mover: %w", err)
	}
	for _, p := range m.pending {
		copy(p.dst, m.bounce.Bytes()[p.off:])
	}
	return nil
}

// issueHook, when set, runs as issueEngines starts: benchmarks note when a batch's first copy
// is issued.
var issueHook func()

// issueEngines queues copies [a, b) of the batch on the copy engines, each stream a contiguous
// run of them with about the same number of bytes, and returns how many streams it used. It
// runs inside the mover's CUDA call and does not wait.
func (m *cudaMover) issueEngines(toDevice bool, a, b int) (int, error) {
	if issueHook != nil {
		issueHook()
	}
	var total uint64
	for _, s := range m.size[a:b] {
		total += s
	}
	ns := min(len(m.streams), b-a)
	m.stream = m.stream[:0]
	var acc uint64
	for _, s := range m.size[a:b] {
		m.stream = append(m.stream, int32(acc*uint64(ns)/total))
		acc += s
	}
	dir := C.int(0)
	if toDevice {
		dir = 1
	}
	dev, host, size := m.dev[a:b], m.host[a:b], m.size[a:b]
	n := b - a
	if m.batchAPI {
		for start := 0; start < n; {
			end := start
			for end < n && m.stream[end] == m.stream[start] {
				end++
			}
			if err := cuErr("cuMemcpyBatchAsync", C.kvCopiesBatch(dir, C.int(end-start),
				(*C.uint64_t)(unsafe.Pointer(&dev[start])), (*C.uint64_t)(unsafe.Pointer(&host[start])), (*C.uint64_t)(unsafe.Pointer(&size[start])),
				C.uintptr_t(m.streams[m.stream[start]]), C.int(m.d.ordinal))); err != nil {
				return ns, err
			}
			start = end
		}
		return ns, nil
	}
	var failed C.int
	if r := C.kvCopies(dir, C.int(n), (*C.uint64_t)(unsafe.Pointer(&dev[0])), (*C.uint64_t)(unsafe.Pointer(&host[0])), (*C.uint64_t)(unsafe.Pointer(&size[0])),
		(*C.int32_t)(unsafe.Pointer(&m.stream[0])), (*C.uintptr_t)(unsafe.Pointer(&m.streams[0])), &failed); r != 0 {
		return ns, fmt.Errorf("copy %d of %d: %w", int(failed), n, cuErr("cuMemcpyAsync", r))
	}
	return ns, nil
}

// scatterPieces copies pages to the device from pinned memory in chunks, the pages' regions
// being m.pieces (in page order, as scatterChecked lists them) and ends[k] the page after chunk
// k, all queued without waiting in between: after chunk k's copies are issued on the first ns
// streams, queued(k, ns) runs (inside the mover's CUDA call), so work queued behind one chunk
// runs while the next is copied. With wait it returns once every copy is done; without, once
// they are queued (an error still waits, so nothing runs on return).
func (m *cudaMover) scatterPieces(ctx context.Context, src [][]byte, ends []int, queued func(k, ns int) error, wait bool) error {
	if m.closed {
		return kvmem.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	m.reset()
	defer m.reset()
	starts := make([]int, len(ends)+1)
	at := 0
	for k, hi := range ends {
		starts[k] = len(m.dev)
		first := true
		for ; at < len(m.pieces) && m.pieces[at].page < hi; at++ {
			pc := m.pieces[at]
			dev, host := pc.addr, uint64(ptrOf(src[pc.page]))+pc.off
			if first { // never merged into the previous chunk's last copy
				m.dev, m.host, m.size = append(m.dev, dev), append(m.host, host), append(m.size, pc.len)
				first = false
				continue
			}
			m.add(dev, host, pc.len)
		}
	}
	starts[len(ends)] = len(m.dev)
	kernel := make([]bool, len(ends))
	blocks := 0
	for k := range ends {
		a, b := starts[k], starts[k+1]
		if kernel[k] = b > a && m.d.sums.copyFn != 0 && m.useKernel(a, b); kernel[k] {
			blocks += m.kernelCopies(a, b)
		}
	}
	if err := m.growCopies(blocks); err != nil {
		return err
	}
	var err error
	m.t.do(func() {
		if err = m.markStart(); err != nil {
			return
		}
		trace(checkStart, C.uintptr_t(m.streams[0]))
		issue := rtrace.StartRegion(ctx, "gpu.issue")
		used, at := 0, 0
		for k := range ends {
			a, b := starts[k], starts[k+1]
			ns := 0
			copies := rtrace.StartRegion(ctx, "gpu.copies")
			switch {
			case b == a:
			case kernel[k]:
				at, err = m.issueKernel(a, b, at)
				ns = 1
			default:
				ns, err = m.issueEngines(true, a, b)
			}
			copies.End()
			used = max(used, ns)
			if err == nil {
				q := rtrace.StartRegion(ctx, "gpu.queue")
				err = queued(k, ns)
				q.End()
			}
			if err != nil {
				break
			}
		}
		issue.End()
		if !wait && err == nil {
			return // IssueChecked: the check's wait waits for the copies
		}
		r := rtrace.StartRegion(ctx, "gpu.sync")
		for _, s := range m.streams[:used] {
			err = errors.Join(err, cuErr("cuStreamSynchronize", C.kvStreamSync(C.uintptr_t(s))))
		}
		r.End()
	})
	if err != nil {
		return fmt.Errorf("cuda mover: %w", err)
	}
	return nil
}

// NewStaging allocates slots pinned buffers of slotBytes each as one allocation.
func (m *cudaMover) NewStaging(slots int, slotBytes int) (kvmem.Staging, error) {
	if m.closed {
		return nil, kvmem.ErrClosed
	}
	if err := kvmem.CheckStagingShape(slots, slotBytes); err != nil {
		return nil, err
	}
	p, err := m.d.AllocPinned(slots*slotBytes, false)
	if err != nil {
		return nil, fmt.Errorf("staging: %w", err)
	}
	return &pinnedStaging{p: p, slots: slots, slotBytes: slotBytes}, nil
}

func (m *cudaMover) Clone() (kvmem.Mover, error) {
	if m.closed {
		return nil, kvmem.ErrClosed
	}
	return m.d.NewMover(m.mem, m.layout, m.opts)
}

func (m *cudaMover) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	var errs []error
	if m.bounce != nil {
		errs = append(errs, m.bounce.Close())
	}
	errs = append(errs, m.freeChecks(), m.freeCopies())
	if m.wakeDesc != nil {
		errs = append(errs, m.wakeDesc.Close())
		m.wakeDesc = nil
	}
	if f := m.fence; f != nil {
		f.Release()
		m.fence = nil
	}
	if e := m.descIssued; e != 0 {
		m.t.do(func() { errs = append(errs, cuErr("cuEventDestroy", C.kvEventDestroy(C.uintptr_t(e)))) })
		m.descIssued = 0
	}
	m.destroyStreams()
	errs = append(errs, m.mem.unref())
	return errors.Join(errs...)
}

type pinnedStaging struct {
	p         *PinnedBuffer
	slots     int
	slotBytes int
}

func (s *pinnedStaging) Slots() int     { return s.slots }
func (s *pinnedStaging) SlotBytes() int { return s.slotBytes }
func (s *pinnedStaging) Slot(i int) []byte {
	o := i * s.slotBytes
	return s.p.Bytes()[o : o+s.slotBytes : o+s.slotBytes]
}
func (s *pinnedStaging) Close() error { return s.p.Close() }

// Stream is one CUDA stream with its own thread, for raw copies outside a Mover (benchmark
// baselines and tools).
type Stream struct {
	d      *CUDADevice
	t      *cudaCaller
	h      uintptr
	dev    []uint64
	host   []uint64
	size   []uint64
	stream []int32
}

// NewStream creates a stream on the device.
func (d *CUDADevice) NewStream() (*Stream, error) {
	t, err := newCUDACaller(d.ctx)
	if err != nil {
		return nil, err
	}
	s := &Stream{d: d, t: t}
	t.do(func() {
		var h C.uintptr_t
		err = cuErr("cuStreamCreate", C.kvStreamCreate(&h))
		s.h = uintptr(h)
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// CopyChunks copies host to or from device memory at dev in chunks of chunk bytes, one
// asynchronous copy per chunk, all in flight on the stream, and waits once at the end. host must
// be pinned memory from this device.
func (s *Stream) CopyChunks(toDevice bool, dev uint64, host []byte, chunk int) error {
	if chunk <= 0 || len(host) == 0 {
		return fmt.Errorf("copy chunks: chunk %d of %d bytes", chunk, len(host))
	}
	if !s.d.isPinned(host) {
		return fmt.Errorf("copy chunks: host buffer is not pinned memory of this device")
	}
	s.dev, s.host, s.size, s.stream = s.dev[:0], s.host[:0], s.size[:0], s.stream[:0]
	base := uint64(ptrOf(host))
	for o := 0; o < len(host); o += chunk {
		n := min(chunk, len(host)-o)
		s.dev = append(s.dev, dev+uint64(o))
		s.host = append(s.host, base+uint64(o))
		s.size = append(s.size, uint64(n))
		s.stream = append(s.stream, 0)
	}
	dir := C.int(0)
	if toDevice {
		dir = 1
	}
	var err error
	s.t.do(func() {
		var failed C.int
		h := C.uintptr_t(s.h)
		if r := C.kvCopies(dir, C.int(len(s.dev)), (*C.uint64_t)(unsafe.Pointer(&s.dev[0])), (*C.uint64_t)(unsafe.Pointer(&s.host[0])),
			(*C.uint64_t)(unsafe.Pointer(&s.size[0])), (*C.int32_t)(unsafe.Pointer(&s.stream[0])), &h, &failed); r != 0 {
			err = cuErr("cuMemcpyAsync", r)
		}
		err = errors.Join(err, cuErr("cuStreamSynchronize", C.kvStreamSync(h)))
	})
	return err
}

// Close destroys the stream.
func (s *Stream) Close() error {
	var err error
	s.t.do(func() { err = cuErr("cuStreamDestroy", C.kvStreamDestroy(C.uintptr_t(s.h))) })
	return err
}
