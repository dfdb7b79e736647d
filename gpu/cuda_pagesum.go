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
int kvHasLinker(void);
CUresult kvCompilePTX(const char *ptx, void **out, size_t *n);
CUresult kvDeviceAttr(int *v, int attr, int d);
CUresult kvLaunchCopies(uintptr_t fn, unsigned int n, uintptr_t s, uint64_t copies);
CUresult kvLaunchCopyCheck(uintptr_t fn, unsigned int n, uintptr_t s, uint64_t copies, const void *secret, uint64_t sums, uint64_t counts, uint64_t out);
CUresult kvMemZero(uint64_t p, size_t n);
CUresult kvMemZeroAsync(uint64_t p, size_t n, uintptr_t s);
CUresult kvUnloadModule(uintptr_t mod);
CUresult kvLaunchUnitCheck(uintptr_t fn, unsigned int n, unsigned int threads, uintptr_t s, uint64_t pages, uint64_t pieces, const void *secret, uint64_t out);
CUresult kvCopyHtoDAsync(uint64_t dst, uintptr_t src, size_t n, uintptr_t s);
CUresult kvCopyDtoHAsync(uintptr_t dst, uint64_t src, size_t n, uintptr_t s);
CUresult kvEventQuery(uintptr_t e);
CUresult kvStreamSync(uintptr_t s);
CUresult kvMemAlloc(uint64_t *p, size_t n);
CUresult kvMemFree(uint64_t p);
CUresult kvStreamCreate(uintptr_t *s);
CUresult kvEventCreate(uintptr_t *e);
CUresult kvEventCreateTimed(uintptr_t *e);
CUresult kvEventElapsed(float *ms, uintptr_t a, uintptr_t b);
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
	rtrace "runtime/trace"
	"sync"
	"time"
	"unsafe"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
)

//go:embed kernels/pagesum.ptx
var pageSumPTX string

// pageSumKernel is kvctl's kernels module (kernels/pagesum.cu) on one device, loaded into its
// primary context the first time a mover asks for it: the checksum kernel (unitFn), the copy
// kernel (copyFn), and the copy kernel that checks the pages it copies (copyCheckFn).
type pageSumKernel struct {
	once        sync.Once
	mod         uintptr
	unitFn      uintptr
	copyFn      uintptr
	copyCheckFn uintptr
	err         error
}

// compiledKernels holds the kernels compiled from pageSumPTX for each compute capability seen
// by this process, so loading them into a new context (an engine registering after the last
// one left, or another device) does not compile the PTX again: the driver's JIT took about
// 0.14 s a registration on the H200.
var compiledKernels struct {
	mu     sync.Mutex
	images map[[2]int][]byte
}

// kernelImage returns the kernels compiled for device dev's compute capability, compiling them
// the first time; it must run with a context of that device current. It returns nil where the
// driver has no linker or compiling fails: the caller loads the PTX, which the driver compiles.
func kernelImage(dev C.int) []byte {
	const attrMajor, attrMinor = 75, 76 // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_{MAJOR,MINOR}
	var major, minor C.int
	if C.kvHasLinker() == 0 || C.kvDeviceAttr(&major, attrMajor, dev) != 0 || C.kvDeviceAttr(&minor, attrMinor, dev) != 0 {
		return nil
	}
	cc := [2]int{int(major), int(minor)}
	compiledKernels.mu.Lock()
	defer compiledKernels.mu.Unlock()
	if img, ok := compiledKernels.images[cc]; ok {
		return img
	}
	ptx := C.CString(pageSumPTX)
	defer C.free(unsafe.Pointer(ptx))
	var out unsafe.Pointer
	var n C.size_t
	if C.kvCompilePTX(ptx, &out, &n) != 0 {
		return nil
	}
	img := C.GoBytes(out, C.int(n))
	C.free(out)
	if compiledKernels.images == nil {
		compiledKernels.images = map[[2]int][]byte{}
	}
	compiledKernels.images[cc] = img
	return img
}

// load loads the module; it must run with the device's context current.
func (k *pageSumKernel) load(dev C.int) error {
	k.once.Do(func() {
		if C.kvHasKernels() == 0 {
			k.err = fmt.Errorf("%w: the driver has no cuModuleLoadData or cuLaunchKernel", errNotCheckable)
			return
		}
		var image *C.char
		if img := kernelImage(dev); img != nil {
			image = (*C.char)(C.CBytes(img))
		} else {
			image = C.CString(pageSumPTX)
		}
		defer C.free(unsafe.Pointer(image))
		var mod C.uintptr_t
		if err := cuErr("cuModuleLoadData", C.kvLoadModule(&mod, image)); err != nil {
			k.err = fmt.Errorf("%w: loading the kernels: %w", errNotCheckable, err)
			return
		}
		var unitFn, copyFn, copyCheckFn C.uintptr_t
		for _, f := range []struct {
			name string
			out  *C.uintptr_t
		}{{"kvUnitCheck", &unitFn}, {"kvCopyPieces", &copyFn}, {"kvCopyCheck", &copyCheckFn}} {
			name := C.CString(f.name)
			err := cuErr("cuModuleGetFunction", C.kvGetFunction(f.out, mod, name))
			C.free(unsafe.Pointer(name))
			if err != nil {
				C.kvUnloadModule(mod)
				k.err = fmt.Errorf("%w: kernel %s: %w", errNotCheckable, f.name, err)
				return
			}
		}
		k.mod, k.unitFn, k.copyFn = uintptr(mod), uintptr(unitFn), uintptr(copyFn)
		k.copyCheckFn = uintptr(copyCheckFn)
	})
	return k.err
}

// unload releases the module, if it was loaded; it runs in the device's CUDA call at Close.
func (k *pageSumKernel) unload() error {
	if k.mod == 0 {
		return nil
	}
	err := cuErr("cuModuleUnload", C.kvUnloadModule(C.uintptr_t(k.mod)))
	k.mod, k.unitFn, k.copyFn, k.copyCheckFn = 0, 0, 0, 0
	return err
}

// unitThreads is UNIT_THREADS in kernels/pagesum.cu: kvUnitCheck's threads a block.
const unitThreads = 512

// The steps of a check, as a check trace sees them.
const (
	checkStart       = iota // before the batch's copies are issued (on the first copy stream)
	checkWaited             // the check stream waits for the copies
	checkDescriptors        // descriptors in place
	checkKernel             // kvUnitCheck queued
	checkDigests            // digests back on the host
	checkSteps
)

// checkTrace, when set (by a benchmark), is called inside the mover's CUDA call at each step of
// a check with the stream the step is queued on, to record an event there.
var checkTrace func(step int, stream C.uintptr_t)

func trace(step int, s C.uintptr_t) {
	if checkTrace != nil {
		checkTrace(step, s)
	}
}

// checkTimer records a timed event at each step of the checks it traces, to see where a
// check's time goes on the GPU (benchmarks).
type checkTimer struct {
	m      *cudaMover
	events [checkSteps]uintptr
}

func (m *cudaMover) newCheckTimer() (*checkTimer, error) {
	t := &checkTimer{m: m}
	var err error
	m.t.do(func() {
		for i := range t.events {
			var e C.uintptr_t
			if err = cuErr("cuEventCreate", C.kvEventCreateTimed(&e)); err != nil {
				return
			}
			t.events[i] = uintptr(e)
		}
	})
	return t, err
}

// record is a checkTrace: it records step's event on stream s.
func (t *checkTimer) record(step int, s C.uintptr_t) {
	_ = C.kvEventRecord(C.uintptr_t(t.events[step]), s)
}

// since returns the milliseconds from the start event to each step's event, once the traced
// check is done.
func (t *checkTimer) since() (ms [checkSteps]float64, err error) {
	t.m.t.do(func() {
		for i := 1; i < checkSteps; i++ {
			var f C.float
			if err = cuErr("cuEventElapsedTime", C.kvEventElapsed(&f, C.uintptr_t(t.events[0]), C.uintptr_t(t.events[i]))); err != nil {
				return
			}
			ms[i] = float64(f)
		}
	})
	return ms, err
}

func (t *checkTimer) close() {
	t.m.t.do(func() {
		for _, e := range t.events {
			if e != 0 {
				_ = C.kvEventDestroy(C.uintptr_t(e))
			}
		}
	})
}

// kernelChunkMin is the smallest checked batch copied by the copy kernel that is copied and
// checked in chunks.
var kernelChunkMin = 128 << 20

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
	// gpu is the device time of every check read so far (GPUTime).
	gpu kvmem.GPUTime
	mu  sync.Mutex
}

// checkSet is one set of check buffers and the check that last used it.
type checkSet struct {
	host *PinnedBuffer
	dev  uint64
	cap  int
	// deltas is device memory for a fused check's sums (fusedSums, 64 bytes each) and copy counts
	// (4 bytes a unit). A fused check needs it zero and leaves it so (kvCopyCheck adds to it and
	// its finishing blocks clear it); dirty says it may not be: a fused check failed.
	deltas, deltaCap uint64
	dirty            bool
	// done is recorded on the checks' stream after the set's digests are copied back.
	done uintptr
	// Timed events of the set's check: started on the first copy stream before the copies,
	// copied on the checks' stream once the copies are done, checked after the digests.
	started, copied, checked uintptr
	// The check in flight on this set, if any.
	pending *pendingCheck
	// The check's units (checkUnits): each page's first unit, then their number (empty when each
	// page is one unit), and the pages' lengths, which the digests of a page's units are
	// combined with.
	first []int
	lens  []int
}

// pendingCheck is a launched check whose digests have not been read yet.
type pendingCheck struct {
	seq    uint64  // launch order
	stream uintptr // the stream its check runs on
	ended  uintptr // the event recorded once its digests are written
	fused  bool    // checked by the copies themselves (scatterFused): no check time after them
	set    int
	outAt  int
	sums   []uint64
	done   bool
	bad    []bool
	err    error
}

// PageCheckError reports whether ScatterChecked can check this mover's pages on the GPU: nil
// when it can, otherwise why not (the layout's regions, the driver, or the kernel failing to
// load on this GPU). A mover that cannot check leaves the checks to the host.
func (m *cudaMover) PageCheckError() error { return m.checks.err }

// initChecks decides whether the mover's pages can be checked on the GPU, loads the kernel and
// creates the checks' stream. It runs inside the mover's CUDA call.
func (m *cudaMover) initChecks() {
	if err := pageCheckable(m.layout, m.mem.ptr); err != nil {
		m.checks.err = err
		return
	}
	// The check kernel writes each digest into pinned host memory at its host address.
	const attrUnified, attrHostPointer = 41, 91 // CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, _CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
	var unified, hostPointer C.int
	if C.kvDeviceAttr(&unified, attrUnified, m.d.dev) != 0 || C.kvDeviceAttr(&hostPointer, attrHostPointer, m.d.dev) != 0 || unified == 0 || hostPointer == 0 {
		m.checks.err = fmt.Errorf("%w: the device cannot address pinned host memory at its host address (unified addressing %d, host pointers for registered memory %d)", errNotCheckable, unified, hostPointer)
		return
	}
	if err := m.d.sums.load(m.d.dev); err != nil {
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
		for _, ev := range []*uintptr{&m.checks.sets[i].started, &m.checks.sets[i].copied, &m.checks.sets[i].checked} {
			if err := cuErr("cuEventCreate", C.kvEventCreateTimed(&e)); err != nil {
				m.checks.err = fmt.Errorf("%w: %w", errNotCheckable, err)
				return
			}
			*ev = uintptr(e)
		}
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

// ScatterChecked is Scatter with a check of every page it moves into engine memory: the
// checksum of page i's bytes (keys.PageChecksum), computed on the GPU, is compared with sums[i],
// the checksum taken when the page was written. It returns once the copies are done and the
// check is launched; wait returns the check's result, bad[i] true where the digests differ (that
// slot's bytes must not be used). A batch the copy kernel moves from pinned memory is checked by
// the copies themselves (scatterFused); any other batch's check runs on a stream of its own, so
// it overlaps the next call's copies. At most two checks are in flight (a third call first waits
// for the ones in flight, keeping their results for their wait). It fails with the reason from
// PageCheckError when the mover cannot check.
func (m *cudaMover) ScatterChecked(ctx context.Context, src [][]byte, pages []kvmem.PageRef, sums []uint64) (wait func() ([]bool, error), err error) {
	return m.scatterChecked(ctx, src, pages, sums, true)
}

// IssueChecked is ScatterChecked returning once the copies and the check are queued: wait then
// waits for both (the check's stream waits for the copies), and src must stay unchanged until it
// returns. Batches issued without waiting may be copied in any order (the copy engines use
// several streams), so they must not write the same pages. Sources that are not pinned go
// through the bounce buffer and are copied before it returns, as ScatterChecked does.
func (m *cudaMover) IssueChecked(ctx context.Context, src [][]byte, pages []kvmem.PageRef, sums []uint64) (wait func() ([]bool, error), err error) {
	return m.scatterChecked(ctx, src, pages, sums, false)
}

var _ kvmem.AsyncPageChecker = (*cudaMover)(nil)

func (m *cudaMover) scatterChecked(ctx context.Context, src [][]byte, pages []kvmem.PageRef, sums []uint64, waitCopies bool) (wait func() ([]bool, error), err error) {
	if m.checks.err != nil {
		return nil, m.checks.err
	}
	// Regions for `go tool trace`: what the host does before the copies are issued.
	cs := &checkedScatter{m: m, ctx: ctx, src: src, pages: pages, sums: sums, waitCopies: waitCopies, prepare: rtrace.StartRegion(ctx, "gpu.prepare")}
	defer cs.endPrepare()
	if len(sums) != len(pages) {
		return nil, fmt.Errorf("%w: %d pages but %d checksums", kvmem.ErrBadPage, len(pages), len(sums))
	}
	// One walk checks every reference and lists the regions, in page order: the check's
	// descriptors and the copies are both made from it (scatterPieces).
	m.pieces = m.pieces[:0]
	if err := kvmem.WalkPages(m.layout, pages, src, func(p int, eo, vo, n uint64) {
		m.pieces = append(m.pieces, checkPiece{page: p, addr: m.mem.ptr + eo, off: vo, len: n})
	}); err != nil {
		return nil, err
	}
	if len(pages) == 0 {
		if err := m.transfer(ctx, true, pages, src); err != nil {
			return nil, err
		}
		return func() ([]bool, error) { return nil, nil }, nil
	}
	cs.pinned = m.allPinned(src)
	// The kernels check the units of the pages' checksums (checkUnits) as pages; the copies move
	// the pages' regions (m.pieces) as they are. A batch of pages under 128 KiB is its own units
	// (m.unitFirst left empty). Only the fused path needs them before the copies; the other lists
	// them once its first copies are issued (makeUnits, from describe).
	cs.units, cs.unitPieces = src, m.pieces
	m.unitFirst = m.unitFirst[:0]
	fused := cs.fuse()
	c := &m.checks
	c.mu.Lock()
	defer c.mu.Unlock()
	cs.takeSet()
	if fused {
		cs.set.first = append(cs.set.first[:0], m.unitFirst...)
		cs.endPrepare()
		return m.scatterFused(ctx, cs.j, cs.units, sums, waitCopies)
	}
	m.fused = m.fused[:0]
	if err := cs.plan(); err != nil {
		return nil, err
	}
	return cs.issue()
}

// checkedScatter is one scatterChecked call: its batch, the check's units (made once, by
// makeUnits) and the check set it takes (j); for a batch its copies do not check themselves
// (not fused), also where the check's descriptors and digests lie in the set's buffer, the
// chunks it is copied and checked in, and whether a check was queued. It runs with the checks'
// lock held from takeSet on.
type checkedScatter struct {
	m          *cudaMover
	ctx        context.Context
	src        [][]byte
	pages      []kvmem.PageRef
	sums       []uint64
	waitCopies bool
	pinned     bool // every source is pinned: copied by scatterPieces, not the bounce buffer

	prepare  *rtrace.Region // what the host does before the copies are issued
	prepared bool

	units      [][]byte
	unitPieces []checkPiece
	unitsMade  bool

	j   int
	set *checkSet
	buf []byte // the set's host buffer: descriptors, then the units' digests at outAt

	piecesAt, outAt int
	host            C.uintptr_t    // buf
	descs           C.uint64_t     // the set's device copy of the descriptors
	secret          unsafe.Pointer // the checksum's key
	ends            []int          // the page after each chunk (checkChunkEnds)
	launched        bool
}

// endPrepare ends the call's gpu.prepare region, once.
func (cs *checkedScatter) endPrepare() {
	if !cs.prepared {
		cs.prepared = true
		cs.prepare.End()
	}
}

// allPinned reports whether every buffer of src is pinned memory of the mover's device.
func (m *cudaMover) allPinned(src [][]byte) bool {
	for _, b := range src {
		if !m.d.isPinned(b) {
			return false
		}
	}
	return true
}

// makeUnits lists the batch's check units, the first time it is called: each page its own
// unit, unless a page has more than one checksum chunk (checkUnits).
func (cs *checkedScatter) makeUnits() {
	if cs.unitsMade {
		return
	}
	cs.unitsMade = true
	m := cs.m
	for _, b := range cs.src {
		if keys.ChecksumChunks(len(b)) > 1 {
			m.units, m.unitFirst, m.unitPieces = checkUnits(m.units[:0], m.unitFirst, m.unitPieces[:0], m.pieces, cs.src)
			cs.units, cs.unitPieces = m.units, m.unitPieces
			break
		}
	}
}

// unitOf returns the first unit of page p.
func (cs *checkedScatter) unitOf(p int) int {
	if len(cs.m.unitFirst) == 0 {
		return p
	}
	return cs.m.unitFirst[p]
}

// fuse reports whether the batch's copies take the check's sums on the way (kvCopyCheck,
// scatterFused): from pinned memory through the copy kernel, where the pieces allow it. Its
// copies are then m.fused.
func (cs *checkedScatter) fuse() bool {
	m := cs.m
	m.fused = m.fused[:0]
	if !cs.pinned || !fuseChecks || m.d.sums.copyCheckFn == 0 || !m.fusedScatters(uint64(len(m.pieces)), cs.src) {
		return false
	}
	cs.makeUnits()
	units := cs.units
	var fused bool
	m.fused, fused = checkedCopies(m.fused, cs.unitPieces, units, func(u int) uint64 { return uint64(ptrOf(units[u])) })
	return fused
}

// takeSet takes the checks' next set for the batch, once the check it last held is read, and
// records the batch's page lengths in it. It runs with the checks' lock held.
func (cs *checkedScatter) takeSet() {
	c := &cs.m.checks
	cs.j = c.next
	cs.set = &c.sets[cs.j]
	if cs.set.pending != nil && !cs.set.pending.done {
		c.syncLocked(cs.m, cs.set.pending)
	}
	cs.set.lens = cs.set.lens[:0]
	for _, b := range cs.src {
		cs.set.lens = append(cs.set.lens, len(b))
	}
}

// plan grows the set's buffers for the check's descriptors and digests and chooses the chunks
// the batch is copied and checked in.
func (cs *checkedScatter) plan() error {
	m, c := cs.m, &cs.m.checks
	// The descriptors: kvPage per unit, then kvPiece per region of a unit, then room for the
	// units' digests. The set's buffer grows before the copies (growing allocates through the
	// mover's CUDA call, which issuing the copies holds), for as many units and unit regions as
	// the batch can have (unitBounds); describe lays them out.
	maxUnits, maxPieces := unitBounds(cs.src, len(m.pieces))
	buf, err := m.growSet(cs.set, maxUnits*pageDescBytes+maxPieces*pieceDescBytes+8*maxUnits)
	if err != nil {
		return err
	}
	cs.buf = buf
	// Each chunk's check is queued on the checks' stream right after the chunk's copies are
	// issued, behind them (an event per copy stream), so it runs while the next chunk is copied
	// and only the last chunk's check is left when the copies are done.
	cs.ends = checkChunkEnds(cs.src)
	// The descriptors go to device memory once, while the first chunk is copied: kernels that
	// read them in mapped host memory instead slowed a 180 MiB batch's copies by 6 %
	// (BenchmarkCUDACheckSteps), for every stripe looks its piece up. The digests, 8 bytes a
	// page written once, go straight into the set's host buffer through the device's mapping of
	// it (the same address under unified addressing), which saves a copy after the last kernel.
	cs.host = C.uintptr_t(ptrOf(buf))
	cs.descs = C.uint64_t(cs.set.dev)
	cs.secret = unsafe.Pointer(&c.secret[0])
	// Chunks pay where the copy engines copy. The copy kernel's copies slow down when split (16
	// MiB of 64 KiB pages: 0.43 ms in one launch, 0.47 in chunks; 64 MiB: 1.60 against 1.66),
	// so its batches are chunked only from kernelChunkMin on, where the check left after the
	// copies weighs more (256 MiB: 6.06 ms in chunks, 6.26 in one).
	if len(cs.ends) > 1 && m.kernelScatters(uint64(len(m.pieces)), cs.src) {
		var total int
		for _, b := range cs.src {
			total += len(b)
		}
		if total < kernelChunkMin {
			cs.ends = cs.ends[len(cs.ends)-1:]
		}
	}
	return nil
}

// describe lists the units and writes the descriptors into the set's host buffer. It runs
// once the first copies are issued, so the copy engines do not wait for it.
func (cs *checkedScatter) describe() {
	cs.makeUnits()
	cs.set.first = append(cs.set.first[:0], cs.m.unitFirst...)
	cs.piecesAt = len(cs.units) * pageDescBytes
	cs.outAt = cs.piecesAt + len(cs.unitPieces)*pieceDescBytes
	describeUnits(cs.buf[:cs.outAt], cs.unitPieces, cs.units)
}

// issue issues the batch's copies, from pinned memory in chunks (scatterPieces) or through the
// bounce buffer in one, each chunk's check queued behind its copies (queued), and returns the
// check's wait. An error waits for the checks' stream, so nothing reads or writes the buffers
// on return.
func (cs *checkedScatter) issue() (func() ([]bool, error), error) {
	m, c := cs.m, &cs.m.checks
	m.startEvent = cs.set.started
	defer func() { m.startEvent = 0 }()
	cs.endPrepare()
	var err error
	if cs.pinned {
		err = m.scatterPieces(cs.ctx, cs.src, cs.ends, cs.queued, cs.waitCopies)
	} else {
		// Through the bounce buffer, in one chunk.
		cs.ends = cs.ends[len(cs.ends)-1:]
		m.afterIssue = func(_, ns int) error { return cs.queued(0, ns) }
		err = m.transfer(cs.ctx, true, cs.pages, cs.src)
		m.afterIssue = nil
	}
	if err != nil {
		if cs.launched {
			// Nothing may still read or write the buffers once this returns.
			s := C.uintptr_t(c.stream)
			m.t.do(func() { _ = C.kvStreamSync(s) })
		}
		return nil, fmt.Errorf("cuda mover: page check: %w", err)
	}
	return c.pendLocked(m, cs.j, cs.outAt, cs.sums, c.stream, cs.set.done, false), nil
}

// queued queues chunk k's check on the checks' stream once the chunk's copies are issued on
// the first ns copy streams (scatterPieces' queued, inside the mover's CUDA call): the first
// chunk sends the descriptors, the stream waits for the copies, and the chunk's units are
// checked; the last chunk records the set's events.
func (cs *checkedScatter) queued(k, ns int) error {
	c := &cs.m.checks
	s := C.uintptr_t(c.stream)
	if k == 0 {
		// Before the waits below, so the descriptors travel while the copies run.
		cs.describe()
		if err := cuErr("cuMemcpyHtoDAsync", C.kvCopyHtoDAsync(cs.descs, cs.host, C.size_t(cs.outAt), s)); err != nil {
			return err
		}
	}
	if err := cs.waitForCopies(s, ns); err != nil {
		return err
	}
	last := k == len(cs.ends)-1
	if last {
		_ = C.kvEventRecord(C.uintptr_t(cs.set.copied), s)
		trace(checkWaited, s)
	}
	cs.launched = true
	if last {
		trace(checkDescriptors, s)
	}
	if err := cs.launchUnits(k, s); err != nil {
		return err
	}
	if !last {
		return nil
	}
	trace(checkKernel, s)
	trace(checkDigests, s) // written by kvUnitCheck into the host buffer
	_ = C.kvEventRecord(C.uintptr_t(cs.set.checked), s)
	return cuErr("cuEventRecord", C.kvEventRecord(C.uintptr_t(cs.set.done), s))
}

// waitForCopies makes the checks' stream s wait for the copies issued so far on the first ns
// copy streams.
func (cs *checkedScatter) waitForCopies(s C.uintptr_t, ns int) error {
	m, c := cs.m, &cs.m.checks
	for i := range ns {
		ev := C.uintptr_t(c.copied[i])
		if err := cuErr("cuEventRecord", C.kvEventRecord(ev, C.uintptr_t(m.streams[i]))); err != nil {
			return err
		}
		if err := cuErr("cuStreamWaitEvent", C.kvStreamWaitEvent(s, ev)); err != nil {
			return err
		}
	}
	return nil
}

// launchUnits launches the check of chunk k's units on the checks' stream s.
func (cs *checkedScatter) launchUnits(k int, s C.uintptr_t) error {
	// The chunk's pages' units.
	lo := 0
	if k > 0 {
		lo = cs.unitOf(cs.ends[k-1])
	}
	hi := cs.unitOf(cs.ends[k])
	// The chunk's units, a thread block each.
	if hi <= lo {
		return nil
	}
	return cuErr("cuLaunchKernel", C.kvLaunchUnitCheck(C.uintptr_t(cs.m.d.sums.unitFn), C.uint(hi-lo), unitThreads, s,
		cs.descs+C.uint64_t(lo*pageDescBytes), cs.descs+C.uint64_t(cs.piecesAt), cs.secret, cs.host+C.uint64_t(cs.outAt+8*lo)))
}

// pendLocked records the check just queued on set j (its digests at outAt of the set's host
// buffer, on stream s, written once event done is) as the set's pending check, makes the other
// set the next one, and returns the check's wait.
func (c *pageChecks) pendLocked(m *cudaMover, j, outAt int, sums []uint64, s, done uintptr, fused bool) func() ([]bool, error) {
	c.gen++
	pc := &pendingCheck{set: j, outAt: outAt, sums: sums, seq: c.gen, stream: s, ended: done, fused: fused}
	c.sets[j].pending = pc
	c.next ^= 1
	return func() ([]bool, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if !pc.done {
			c.syncLocked(m, pc)
		}
		return pc.bad, pc.err
	}
}

// syncLocked waits for check pc (and so for every check launched before it on the checks'
// stream), not for the ones launched after it, and reads the digests of those that are done.
func (c *pageChecks) syncLocked(m *cudaMover, pc *pendingCheck) {
	var err error
	ev := C.uintptr_t(pc.ended)
	// An older check on the other set is done too when it ran on the same stream: a stream runs
	// its work in order.
	other := c.sets[pc.set^1].pending
	older := other != nil && !other.done && other.seq < pc.seq && other.stream == pc.stream
	// Regions for `go tool trace`: the wait for the device, then the digests read.
	wait := rtrace.StartRegion(context.Background(), "gpu.wait")
	m.t.do(func() {
		if err = cuErr("cuEventSynchronize", C.kvEventSync(ev)); err != nil {
			return
		}
		wait.End()
		if older {
			c.timeLocked(other)
		}
		c.timeLocked(pc)
	})
	if err != nil {
		wait.End()
	}
	defer rtrace.StartRegion(context.Background(), "gpu.harvest").End()
	c.harvest(pc, err)
	if older {
		c.harvest(other, err)
	}
}

// timeLocked adds a finished check's device times to the totals. It runs inside the mover's
// CUDA call; a time the driver cannot tell (an event never recorded) adds nothing.
func (c *pageChecks) timeLocked(pc *pendingCheck) {
	set := &c.sets[pc.set]
	var copyMs, checkMs C.float
	if pc.fused {
		// The check ended with the copies.
		if C.kvEventElapsed(&copyMs, C.uintptr_t(set.started), C.uintptr_t(set.copied)) == 0 && copyMs >= 0 {
			c.gpu.Copy += time.Duration(float64(copyMs) * float64(time.Millisecond))
		}
		return
	}
	if C.kvEventElapsed(&copyMs, C.uintptr_t(set.started), C.uintptr_t(set.copied)) != 0 ||
		C.kvEventElapsed(&checkMs, C.uintptr_t(set.copied), C.uintptr_t(set.checked)) != 0 || copyMs < 0 || checkMs < 0 {
		return
	}
	c.gpu.Copy += time.Duration(float64(copyMs) * float64(time.Millisecond))
	c.gpu.Check += time.Duration(float64(checkMs) * float64(time.Millisecond))
}

// GPUTime returns the device time of every checked scatter whose check has been read: from
// before its first copy to its last copy done, and from then to its digests back on the host.
func (m *cudaMover) GPUTime() kvmem.GPUTime {
	m.checks.mu.Lock()
	defer m.checks.mu.Unlock()
	return m.checks.gpu
}

var _ kvmem.GPUTimer = (*cudaMover)(nil)

// harvest reads a finished check's digests.
func (c *pageChecks) harvest(pc *pendingCheck, err error) {
	pc.done = true
	if err != nil {
		pc.err = fmt.Errorf("cuda mover: page check: %w", err)
		return
	}
	set := &c.sets[pc.set]
	out := set.host.Bytes()[pc.outAt:]
	pc.bad = make([]bool, len(pc.sums))
	for k := range pc.sums {
		pc.bad[k] = unitDigest(out, set.first, k, set.lens[k]) != pc.sums[k]
	}
}

// reserveBatchBytes is the batch a new mover sizes its copy kernel's descriptors and the fused
// check's sums for, so that a load of up to this many bytes (what a StartLoad usually moves)
// allocates nothing on the device: each pinned or device allocation and free costs 0.1 ms or
// more, and the buffers used to grow during an engine's first loads (both check sets, then
// again as loads grew). Larger batches still grow them. The sums take 64 bytes for each KiB of
// a batch (4 MiB of device memory a set at 64 MiB), so they are not sized for more.
const reserveBatchBytes = 64 << 20

// reserveSetBatchBytes is the batch a new mover sizes its check sets' descriptors and digests
// for: a checked load issues up to 256 MiB in one batch (the connector's checked batch), and
// StartLoads of about 190 pages of 1 MiB each grew the sets at 64 MiB, 0.15–0.77 ms each time,
// in four of an engine's first seventeen loads on the H200 (docs/perf/serve-gpu.md). The
// descriptors and digests of 256 MiB take 256 KiB a set for 1 MiB pages of two regions, 480 KiB
// for 64 KiB pages of two (a fused check's records, 56 bytes a copy, and 8 bytes a unit).
const reserveSetBatchBytes = 256 << 20

// batchNeeds is what the check and copy kernel buffers must hold for a batch of pages of one
// group's regions.
type batchNeeds struct {
	pages, pieces, blocks, copies uint64
}

// reserveNeeds is the most a batch of up to batch bytes of one group's pages (sharded or
// replicated) needs, over the layout's groups: pages counts the units the kernels check
// (checkUnits), pieces the regions cut at units, blocks the units' full blocks, copies the
// fused check's records.
func reserveNeeds(l kvmem.Layout, batch uint64) batchNeeds {
	var most batchNeeds
	for _, g := range l.Groups {
		for _, rs := range [][]kvmem.Region{g.Regions, g.ReplicatedRegions} {
			var size uint64
			for _, r := range rs {
				size += r.Size
			}
			if size == 0 || g.Slots <= 0 {
				continue
			}
			n := min(uint64(g.Slots), (batch+size-1)/size)
			// What one page takes, checked as its checksum's units (checkUnits).
			k := keys.ChecksumChunks(int(size))
			var pieces, blocks, copies uint64
			for u := range k {
				lo := uint64(u) * keys.ChecksumChunk
				hi := lo + keys.ChecksumChunk
				if u == k-1 {
					hi = size
				}
				blocks += (hi - lo - 1) / 1024
				var at uint64
				for _, r := range rs {
					if a, b := max(at, lo), min(at+r.Size, hi); a < b {
						pieces++
						copies += (b - a + copyChunk - 1) / copyChunk
					}
					at += r.Size
				}
			}
			most.pages = max(most.pages, n*uint64(k))
			most.pieces = max(most.pieces, n*pieces)
			most.blocks = max(most.blocks, n*blocks)
			most.copies = max(most.copies, n*copies)
		}
	}
	return most
}

// reserve sizes the check sets' descriptors for a batch of reserveSetBatchBytes, and the fused
// check's sums and the copy kernel's descriptors for one of reserveBatchBytes (reserveNeeds).
// It is best effort: where device or pinned memory is short, the buffers are left to grow when
// a load needs them, as before.
func (m *cudaMover) reserve() {
	n := reserveNeeds(m.layout, reserveBatchBytes)
	if n.pages == 0 {
		return
	}
	if m.checks.err == nil {
		set := reserveSetBytes(reserveNeeds(m.layout, reserveSetBatchBytes))
		for i := range m.checks.sets {
			s := &m.checks.sets[i]
			if _, err := m.growSet(s, set); err != nil {
				_ = m.freeSet(s)
				break
			}
			// Deltas of the blocks, or a fused check's sums (two more a page) and counts.
			if err := m.growDeltas(s, (n.blocks+2*n.pages)*64+4*n.pages); err != nil {
				_ = m.freeSet(s)
				break
			}
		}
	}
	if m.d.sums.copyFn != 0 && m.opts.Scatter != ScatterCopyEngines {
		_ = m.growCopies(int(n.copies))
	}
}

// reserveSetBytes is what a check set's buffers must hold for a batch that needs n: the
// descriptors and digests of a check after the copies, or of a fused one (a kvCheckedCopy per
// copy of at most copyChunk bytes), whichever is more.
func reserveSetBytes(n batchNeeds) int {
	separate := int(n.pages)*pageDescBytes + int(n.pieces)*pieceDescBytes
	fused := int(n.copies) * checkedCopyBytes
	return max(separate, fused) + 8*int(n.pages)
}

// growSet makes a set's descriptor buffers hold at least n bytes and returns the host side's
// first n. Buffers it replaces grow by half as much again as needed (or to twice what they
// held, if more), so loads a little larger than the last do not grow them once more; the fused
// check's sums (growDeltas) are left as they are. The set has no check in flight.
func (m *cudaMover) growSet(set *checkSet, n int) ([]byte, error) {
	if n > set.cap {
		n2 := n
		if set.cap > 0 {
			n2 = max(n+n/2, 2*set.cap)
		}
		n2 = max(n2, 64<<10)
		if err := m.freeSetBuffers(set); err != nil {
			return nil, err
		}
		host, err := m.d.AllocPinned(n2, false)
		if err != nil {
			return nil, fmt.Errorf("page check buffers: %w", err)
		}
		var dev C.uint64_t
		m.t.do(func() { err = cuErr("cuMemAlloc", C.kvMemAlloc(&dev, C.size_t(n2))) })
		if err != nil {
			_ = host.Close()
			return nil, fmt.Errorf("page check buffers: %w", err)
		}
		set.host, set.dev, set.cap = host, uint64(dev), n2
	}
	return set.host.Bytes()[:n], nil
}

// growDeltas makes a set's device buffer for block deltas hold at least n bytes. The set has no
// check in flight.
func (m *cudaMover) growDeltas(set *checkSet, n uint64) error {
	if n <= set.deltaCap {
		return nil
	}
	n = max(n, 2*set.deltaCap, 1<<20)
	var err error
	if set.deltas != 0 {
		old := C.uint64_t(set.deltas)
		m.t.do(func() { err = cuErr("cuMemFree", C.kvMemFree(old)) })
		set.deltas, set.deltaCap = 0, 0
		if err != nil {
			return fmt.Errorf("page check buffers: %w", err)
		}
	}
	var dev C.uint64_t
	m.t.do(func() {
		if err = cuErr("cuMemAlloc", C.kvMemAlloc(&dev, C.size_t(n))); err != nil {
			return
		}
		// kvCopyCheck adds to the deltas: they start zero.
		if err = cuErr("cuMemsetD8", C.kvMemZero(dev, C.size_t(n))); err != nil {
			_ = C.kvMemFree(dev)
		}
	})
	if err != nil {
		return fmt.Errorf("page check buffers: %w", err)
	}
	set.deltas, set.deltaCap, set.dirty = uint64(dev), n, false
	return nil
}

// freeSet releases a set's buffers.
func (m *cudaMover) freeSet(set *checkSet) error {
	err := m.freeSetBuffers(set)
	if set.deltas != 0 {
		dev := C.uint64_t(set.deltas)
		m.t.do(func() { err = errors.Join(err, cuErr("cuMemFree", C.kvMemFree(dev))) })
	}
	set.deltas, set.deltaCap = 0, 0
	return err
}

// freeSetBuffers releases a set's descriptor buffers (host and device), not its sums.
func (m *cudaMover) freeSetBuffers(set *checkSet) error {
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
		for _, ev := range []*uintptr{&c.sets[i].done, &c.sets[i].started, &c.sets[i].copied, &c.sets[i].checked} {
			if e := *ev; e != 0 {
				m.t.do(func() { err = errors.Join(err, cuErr("cuEventDestroy", C.kvEventDestroy(C.uintptr_t(e)))) })
				*ev = 0
			}
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

// kernelScatters reports whether a scatter of src in pieces copies would go through the copy
// kernel (before merging adjacent pieces, which the choice for the whole batch may differ by).
func (m *cudaMover) kernelScatters(pieces uint64, src [][]byte) bool {
	if m.d.sums.copyFn == 0 || m.opts.Scatter == ScatterCopyEngines {
		return false
	}
	if m.opts.Scatter == ScatterKernel {
		return true
	}
	var total uint64
	for _, b := range src {
		total += uint64(len(b))
	}
	return total < kernelCopyBelow*pieces
}

// fusedKernelBelow is the batch size under which a checked batch of pieces the copy engines would
// move (CUDAMoverOptions.Scatter left to choose) goes through kvCopyCheck instead, when its
// pieces average less than fusedPieceBelow: the kernel copies large pieces a little slower than
// the copy engines, but a small batch's check after the copies costs more than that (12 MiB of
// 128 KiB pieces: 0.30-0.31 ms checked on the way against 0.32-0.33 after the copy engines; of
// 512 KiB pieces no gain, 0.32 against 0.31-0.32; docs/perf/serve-gpu.md). Zero turns it off
// (benchmarks).
var fusedKernelBelow uint64 = 32 << 20

// fusedPieceBelow: see fusedKernelBelow.
const fusedPieceBelow = 512 << 10

// fusedScatters reports whether a checked batch of src in pieces copies is copied by kvCopyCheck
// (when its pieces allow): where the copy kernel moves it anyway, or where the mover chooses, the
// batch is under fusedKernelBelow and its pieces average under fusedPieceBelow.
func (m *cudaMover) fusedScatters(pieces uint64, src [][]byte) bool {
	if m.kernelScatters(pieces, src) {
		return true
	}
	if m.opts.Scatter != ScatterAuto || m.d.sums.copyFn == 0 {
		return false
	}
	var total uint64
	for _, b := range src {
		total += uint64(len(b))
	}
	return total < fusedKernelBelow && total < fusedPieceBelow*pieces
}

// WakeDevice implements kvmem.DeviceWaker: it launches the copy kernel over one empty copy
// (its descriptor in pinned host memory, read through the device's mapping) on the first
// stream, where the batch's copies follow. On a GPU another process used last (an engine's
// kernels), the device switches to this process's context for it, and that switch, with the
// driver's first calls after an idle spell, then overlaps the host's work on the batch rather
// than delaying its first copy (docs/perf/serve-gpu.md). It does not wait for the kernel.
func (m *cudaMover) WakeDevice() error {
	// Under the mover's lock, so a Close from another goroutine waits for the launch.
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return kvmem.ErrClosed
	}
	if m.d.sums.copyFn == 0 {
		return nil // no copy kernel: nothing cheap to launch, and the copies start the device
	}
	if m.wakeDesc == nil {
		b, err := m.d.AllocPinned(64, false)
		if err != nil {
			return fmt.Errorf("wake device: %w", err)
		}
		clear(b.Bytes()) // an empty copy: source, destination and length 0
		m.wakeDesc = b
	}
	var err error
	desc := C.uint64_t(ptrOf(m.wakeDesc.Bytes()))
	m.t.do(func() {
		err = cuErr("cuLaunchKernel", C.kvLaunchCopies(C.uintptr_t(m.d.sums.copyFn), 1, C.uintptr_t(m.streams[0]), desc))
	})
	if err != nil {
		return fmt.Errorf("wake device: %w", err)
	}
	return nil
}

var _ kvmem.DeviceWaker = (*cudaMover)(nil)

// growCopies makes the copy kernel's descriptor buffers hold n copies of at most copyChunk
// bytes. Nothing may be reading them.
func (m *cudaMover) growCopies(n int) error {
	need := n * 24
	if need <= m.copyCap {
		return nil
	}
	var err error
	s0 := C.uintptr_t(m.streams[0])
	m.t.do(func() {
		if m.descIssued == 0 {
			var e C.uintptr_t
			if err = cuErr("cuEventCreate", C.kvEventCreate(&e)); err == nil {
				m.descIssued = uintptr(e)
			}
		}
		if err == nil && m.descRecorded {
			// A launch that was not waited for (IssueChecked) may still read the buffers.
			err = cuErr("cuStreamSynchronize", C.kvStreamSync(s0))
		}
	})
	if err != nil {
		return fmt.Errorf("copy kernel buffers: %w", err)
	}
	if err = m.freeCopies(); err != nil {
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
	return nil
}

// kernelCopies is how many copy kernel blocks copies [a, b) of the batch take.
func (m *cudaMover) kernelCopies(a, b int) int {
	n := 0
	for _, s := range m.size[a:b] {
		n += int((s + copyChunk - 1) / copyChunk)
	}
	return n
}

// issueKernel queues copies [a, b) of the batch (host to device) as one launch of the copy
// kernel on the first stream, its descriptors at descriptor slot at of the buffers (grown
// beforehand), and returns the slot after them. It runs inside the mover's CUDA call.
func (m *cudaMover) issueKernel(a, b, at int) (int, error) {
	if at == 0 && m.descRecorded {
		// The previous launch's descriptors may still be queued for the device (IssueChecked).
		// Mostly they are long copied, and asking costs less than a synchronize.
		ev := C.uintptr_t(m.descIssued)
		if r := C.kvEventQuery(ev); r != 0 {
			if err := cuErr("cuEventSynchronize", C.kvEventSync(ev)); err != nil {
				return at, err
			}
		}
	}
	buf := m.copyHost.Bytes()
	le := binary.LittleEndian
	k := at
	for i := a; i < b; i++ {
		for o := uint64(0); o < m.size[i]; o += copyChunk {
			q := buf[k*24:]
			le.PutUint64(q[0:], m.host[i]+o)
			le.PutUint64(q[8:], m.dev[i]+o)
			le.PutUint64(q[16:], min(copyChunk, m.size[i]-o))
			k++
		}
	}
	s := C.uintptr_t(m.streams[0])
	dev := C.uint64_t(m.copyDev) + C.uint64_t(at*24)
	if err := cuErr("cuMemcpyHtoDAsync", C.kvCopyHtoDAsync(dev, C.uintptr_t(ptrOf(buf[at*24:])), C.size_t((k-at)*24), s)); err != nil {
		return k, err
	}
	if err := cuErr("cuEventRecord", C.kvEventRecord(C.uintptr_t(m.descIssued), s)); err != nil {
		return k, err
	}
	m.descRecorded = true
	return k, cuErr("cuLaunchKernel", C.kvLaunchCopies(C.uintptr_t(m.d.sums.copyFn), C.uint(k-at), s, dev))
}

// flushKernel issues the batch's copies (host to device) as one launch of the copy kernel on
// the first stream, waits for it and resets the batch. It runs instead of the copy engines when
// the mover chooses the copy kernel (CUDAMoverOptions.Scatter).
func (m *cudaMover) flushKernel(last bool) error {
	if err := m.growCopies(m.kernelCopies(0, len(m.dev))); err != nil {
		return err
	}
	var err error
	m.t.do(func() {
		s := C.uintptr_t(m.streams[0])
		if err = m.markStart(); err != nil {
			return
		}
		if last && m.afterIssue != nil {
			trace(checkStart, s)
		}
		_, err = m.issueKernel(0, len(m.dev), 0)
		if err == nil && last && m.afterIssue != nil {
			err = m.afterIssue(0, 1)
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

// fuseChecks turns on copies that take the check's sums on the way (kvCopyCheck, scatterFused)
// where the mover copies pinned pages with its kernel; off, such batches are checked by
// kvUnitCheck after their copies (benchmarks compare the two).
var fuseChecks = true

// checkedCopyBytes is the size of a kvCheckedCopy record (kernels/pagesum.cu).
const checkedCopyBytes = 56

// scatterFused queues a checked batch of units (checkUnits) whose copies are m.fused on the first
// stream, on check set j (its previous check read): kvCopyCheck, reading the copy records from
// the set's host buffer through the device's mapping, copies the pages, adds their units' sums
// and, in the block that finishes a unit's last copy, writes the unit's digest into that buffer,
// with the set's events around it (three driver calls). The copies and the check need no other stream to wait for
// them, nothing reads the pages a second time, and nothing is left to run after the copies. With
// waitCopies it returns once the copies are done; an error waits for the stream, so nothing
// reads the buffers on return. It runs with the checks' lock held.
func (m *cudaMover) scatterFused(ctx context.Context, j int, units [][]byte, sums []uint64, waitCopies bool) (func() ([]bool, error), error) {
	if m.closed {
		return nil, kvmem.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c := &m.checks
	set := &c.sets[j]
	outAt := len(m.fused) * checkedCopyBytes
	buf, err := m.growSet(set, outAt+8*len(units))
	if err != nil {
		return nil, err
	}
	var words uint64
	for _, b := range units {
		words += fusedSums(uint64(len(b)))
	}
	countsAt := words * 64
	if err = m.growDeltas(set, countsAt+4*uint64(len(units))); err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	for k, fc := range m.fused {
		q := buf[k*checkedCopyBytes:]
		le.PutUint64(q[0:], fc.src)
		le.PutUint64(q[8:], fc.dst)
		le.PutUint64(q[16:], fc.len)
		le.PutUint64(q[24:], fc.off)
		le.PutUint64(q[32:], fc.base)
		le.PutUint64(q[40:], fc.pageLen)
		le.PutUint32(q[48:], fc.page)
		le.PutUint32(q[52:], fc.pageCopies)
	}
	// The kernel reads its records where they were written, in pinned host memory through the
	// device's mapping (as it writes the digests): each thread block reads its 56-byte record
	// next to the up to 64 KiB it copies from pinned memory anyway, and the batch is one driver
	// call shorter (the copy of the records to the device cost the host 16 µs on the H200 host,
	// run 65).
	// The set is not written again until this batch's check is read (scatterChecked).
	host := C.uint64_t(ptrOf(buf))
	descs, digests := host, host+C.uint64_t(outAt)
	secret := unsafe.Pointer(&c.secret[0])
	sumsAt := C.uint64_t(set.deltas)
	m.t.do(func() {
		s := C.uintptr_t(m.streams[0])
		issue := rtrace.StartRegion(ctx, "gpu.issue")
		queued := false
		defer func() {
			issue.End()
			if err != nil && queued {
				_ = C.kvStreamSync(s)
			}
		}()
		_ = C.kvEventRecord(C.uintptr_t(set.started), s)
		trace(checkStart, s)
		if set.dirty {
			if err = cuErr("cuMemsetD8Async", C.kvMemZeroAsync(sumsAt, C.size_t(set.deltaCap), s)); err != nil {
				return
			}
			set.dirty = false
		}
		queued = true
		set.dirty = true // until the kernel is queued: a failed launch may leave sums behind
		if err = cuErr("cuLaunchKernel", C.kvLaunchCopyCheck(C.uintptr_t(m.d.sums.copyCheckFn), C.uint(len(m.fused)), s,
			descs, secret, sumsAt, sumsAt+C.uint64_t(countsAt), digests)); err != nil {
			return
		}
		set.dirty = false
		// The copies and the check end together: one event marks both (the check's wait waits
		// for it).
		for _, step := range []int{checkWaited, checkDescriptors, checkKernel, checkDigests} {
			trace(step, s)
		}
		if err = cuErr("cuEventRecord", C.kvEventRecord(C.uintptr_t(set.copied), s)); err != nil {
			return
		}
		if waitCopies {
			r := rtrace.StartRegion(ctx, "gpu.sync")
			err = cuErr("cuEventSynchronize", C.kvEventSync(C.uintptr_t(set.copied)))
			r.End()
		}
	})
	if err != nil {
		return nil, fmt.Errorf("cuda mover: page check: %w", err)
	}
	return c.pendLocked(m, j, outAt, sums, m.streams[0], set.copied, true), nil
}
