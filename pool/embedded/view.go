package embedded

import (
	"context"
	"sync"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/pool"
)

// Viewer is implemented by pools whose values live in this process's memory, so a caller can
// read them where they are instead of copying them out: the connector hands such views straight
// to the GPU's copy engines once the memory is registered with the driver (MemoryRegions).
// Embedded implements it; a pool reached over the network does not.
type Viewer interface {
	// BatchView leases and verifies ks like BatchGet but copies nothing: each hit's bytes are
	// checked in place against the checksum taken at put and returned as a view of pool
	// memory. The views stay valid, and their memory is neither reused nor evicted, until
	// View.Release.
	BatchView(ctx context.Context, ks []string) *View
	// MemoryRegions returns every region values are stored in (the segments), for registering
	// with a device. The regions live as long as the pool.
	MemoryRegions() [][]byte
}

// DeferredViewer is implemented by Viewers that can hand out values unchecked, with the
// checksum taken at put, for a caller that checks each value where it copies it to (the CUDA
// mover checks pages on the GPU after copying them into engine memory, gpu.PageChecker), so the
// host does not read every value a second time while the copy engines read it.
type DeferredViewer interface {
	// BatchViewDeferred leases ks like BatchView but checks nothing: View.Sums[i] is the
	// checksum key i's value had when it was put (keys.PageChecksum). The caller must check
	// every value before using what it copied, and report one that fails with View.Corrupt.
	BatchViewDeferred(ctx context.Context, ks []string) *View
}

// ReusingViewer is implemented by DeferredViewers that also take keys as bytes and fill a View
// their caller keeps from call to call, so a caller that views a few hundred values per call (a
// load, before its first copy) makes neither a string per key nor the view's lists each call.
type ReusingViewer interface {
	DeferredViewer
	// BatchViewDeferredInto is BatchViewDeferred of ks into v. A key's bytes are only read
	// during the call. v is a new View, or one an earlier BatchViewDeferredInto filled that
	// has been released and whose Corrupt calls are all made: what it held is forgotten and
	// its lists are reused where they are long enough.
	BatchViewDeferredInto(ctx context.Context, ks [][]byte, v *View)
}

// View is the result of Viewer.BatchView. Bufs[i] is key i's value in pool memory, nil where
// Codes[i] is negative; Codes[i] is the value's size or a negative Code (ErrChecksumMismatch
// for a value that failed its check: its bytes are not offered). A view must not be written.
// A deferred view (DeferredViewer) also carries each value's checksum in Sums.
type View struct {
	Bufs  [][]byte
	Codes []int64
	Sums  []uint64

	e         *Embedded
	held      []*object
	bufs      [][]byte // Bufs' array, kept past Release for BatchViewDeferredInto to reuse
	once      sync.Once
	mu        sync.Mutex
	onCorrupt []func()
}

// Corrupt records that value i of a deferred view failed the caller's check: it counts as a
// checksum error instead of a hit, and Codes[i] becomes ErrChecksumMismatch. It may be called
// after Release; a second call for the same value, or one for a value that was not offered,
// does nothing.
func (v *View) Corrupt(i int) {
	v.mu.Lock()
	if i < 0 || i >= len(v.Codes) || v.Codes[i] < 0 || v.Sums == nil {
		v.mu.Unlock()
		return
	}
	size := v.Codes[i]
	v.Codes[i] = int64(pool.ErrChecksumMismatch)
	hooks := v.onCorrupt
	v.mu.Unlock()
	if v.e != nil {
		v.e.c.hits.Add(-1)
		v.e.c.bytesOut.Add(-size)
		v.e.c.checksumErrors.Add(1)
		v.e.c.getFailedItems.Add(1)
	}
	for _, f := range hooks {
		f()
	}
}

// OnCorrupt adds f to what Corrupt calls for each value it records, so a layer over the pool
// can count the failed check as it counts the failures BatchView reports.
func (v *View) OnCorrupt(f func()) {
	v.mu.Lock()
	v.onCorrupt = append(v.onCorrupt, f)
	v.mu.Unlock()
}

// Release ends the view: its buffers must not be used afterwards. Calling it again does nothing.
func (v *View) Release() {
	v.once.Do(func() {
		if v.e != nil {
			v.e.releaseRefs(v.held)
		}
		v.Bufs = nil
	})
}

// BatchView implements Viewer. The checks of a batch run on up to GOMAXPROCS-1 goroutines.
func (e *Embedded) BatchView(ctx context.Context, ks []string) *View {
	out, held, misses := e.acquire(ctx, ks, nil)
	v := &View{Bufs: make([][]byte, len(ks)), Codes: out, e: e, held: held}
	var total int64
	for _, o := range held {
		if o != nil {
			total += o.size
		}
	}
	e.forEachBeside(len(held), total, func(i int) {
		o := held[i]
		if o == nil {
			return
		}
		mem := o.seg.mem[o.off : o.off+o.size : o.off+o.size]
		if keys.PageChecksum(mem) != o.sum {
			out[i] = int64(pool.ErrChecksumMismatch)
			return
		}
		v.Bufs[i] = mem
		out[i] = o.size
	})
	e.finishGet(out, held, misses)
	return v
}

// BatchViewDeferred implements DeferredViewer.
func (e *Embedded) BatchViewDeferred(ctx context.Context, ks []string) *View {
	out, held, misses := e.acquire(ctx, ks, nil)
	v := &View{Bufs: make([][]byte, len(ks)), Codes: out, Sums: make([]uint64, len(ks)), e: e, held: held}
	e.offerDeferred(v, misses)
	return v
}

// BatchViewDeferredInto implements ReusingViewer.
func (e *Embedded) BatchViewDeferredInto(ctx context.Context, ks [][]byte, v *View) {
	v.reuse(e, len(ks))
	misses := acquireInto(e, ctx, ks, nil, v.Codes, v.held)
	e.offerDeferred(v, misses)
}

// offerDeferred fills a deferred view whose keys acquire looked up: each held value's memory,
// size and checksum at put.
func (e *Embedded) offerDeferred(v *View, misses int64) {
	for i, o := range v.held {
		if o == nil {
			continue
		}
		v.Bufs[i] = o.seg.mem[o.off : o.off+o.size : o.off+o.size]
		v.Sums[i] = uint64(o.sum)
		v.Codes[i] = o.size
	}
	e.finishGet(v.Codes, v.held, misses)
}

// reuse readies v, new or released with its Corrupt calls made, for a deferred view of n keys
// of e: every list n long and zero, in the arrays it had where they are long enough, no hook,
// not released.
func (v *View) reuse(e *Embedded, n int) {
	v.bufs = zeroed(v.bufs, n)
	v.Bufs = v.bufs
	v.Codes = zeroed(v.Codes, n)
	v.Sums = zeroed(v.Sums, n)
	v.held = zeroed(v.held, n)
	v.e = e
	v.once = sync.Once{}
	clear(v.onCorrupt)
	v.onCorrupt = v.onCorrupt[:0]
}

// zeroed returns s's array, or a new one when it is shorter than n, as a list of n zero values.
func zeroed[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// MemoryRegions implements Viewer.
func (e *Embedded) MemoryRegions() [][]byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([][]byte, len(e.segs))
	for i, s := range e.segs {
		out[i] = s.mem
	}
	return out
}

// Reserver is implemented by pools whose values live in this process's memory, so a caller
// can write a value where it will be stored instead of handing over a copy: the connector
// gathers pages from the GPU straight into reserved pool memory once it is registered with the
// driver. It is the master's PutStart / PutEnd / PutRevoke in one process.
type Reserver interface {
	// BatchPutStart allocates memory for every key of ks not stored yet (sizes[i] bytes) and
	// returns it to be written; the keys are not readable until PutReservation.End.
	BatchPutStart(ctx context.Context, ks []string, sizes []int64, cfg pool.ReplicateConfig) *PutReservation
}

// PutReservation is the result of Reserver.BatchPutStart. Bufs[i] is the memory key i's value
// is to be written to, nil where there is nothing to write: Codes[i] is OK for a key already
// stored or in flight (as BatchPut skips it) and a negative Code for a key that failed. Exactly
// one of End and Revoke must be called once the writes are done or abandoned.
type PutReservation struct {
	Bufs  [][]byte
	Codes []pool.Code

	r    *reservation
	once sync.Once
	done []pool.Code
}

// BatchPutStart implements Reserver. A call with len(sizes) != len(ks) fails every key.
func (e *Embedded) BatchPutStart(ctx context.Context, ks []string, sizes []int64, cfg pool.ReplicateConfig) *PutReservation {
	if len(sizes) != len(ks) {
		e.c.putCalls.Add(1)
		out := e.failPut(make([]pool.Code, len(ks)), pool.ErrInvalidParams)
		return &PutReservation{Bufs: make([][]byte, len(ks)), Codes: out, r: &reservation{e: e, out: out}}
	}
	r := e.reserve(ctx, ks, func(i int) int64 { return sizes[i] }, cfg)
	p := &PutReservation{Bufs: make([][]byte, len(ks)), Codes: r.out, r: r}
	for _, w := range r.work {
		o := w.o
		p.Bufs[w.i] = o.seg.mem[o.off : o.off+o.size : o.off+o.size]
	}
	return p
}

// End takes each written value's checksum where it lies (on up to GOMAXPROCS-1 goroutines for
// large batches) and makes the values readable, with a lease of now. It returns the final code
// of every key. A second call, or one after Revoke, returns the same codes and does nothing.
func (p *PutReservation) End() []pool.Code {
	p.once.Do(func() {
		r := p.r
		r.e.forEachBeside(len(r.work), r.bytes, func(j int) {
			o := r.work[j].o
			o.sum = keys.PageChecksum(o.seg.mem[o.off : o.off+o.size])
		})
		p.done = r.commit()
		p.Bufs = nil
	})
	return p.done
}

// Revoke abandons the reservation: the memory goes back to the pool, nothing becomes readable,
// and every key that was to be written fails with ErrRPCFail.
func (p *PutReservation) Revoke() []pool.Code {
	p.once.Do(func() {
		p.done = p.r.revoke()
		p.Bufs = nil
	})
	return p.done
}

var (
	_ Viewer         = (*Embedded)(nil)
	_ DeferredViewer = (*Embedded)(nil)
	_ ReusingViewer  = (*Embedded)(nil)
	_ Reserver       = (*Embedded)(nil)
)
