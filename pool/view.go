package pool

import (
	"context"
	"sync"
)

// Viewer is implemented by pools whose values live in this process's memory, so a caller can
// read them where they are instead of copying them out: the connector hands such views straight
// to the GPU's copy engines once the memory is registered with the driver (MemoryRegions).
// The embedded pool implements it; a pool reached over the network does not.
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

// ViewHolder is a backend's side of a View: what it holds for the view's values and how a
// failed check is counted.
type ViewHolder interface {
	// Corrupted is told that a value of size bytes the view offered failed the caller's check
	// (View.Corrupt), so the backend counts a checksum error instead of a hit.
	Corrupted(size int64)
	// Release gives back what the view held; it is called once, by View.Release.
	Release()
}

// View is the result of Viewer.BatchView. Bufs[i] is key i's value in pool memory, nil where
// Codes[i] is negative; Codes[i] is the value's size or a negative Code (ErrChecksumMismatch
// for a value that failed its check: its bytes are not offered). A view must not be written.
// A deferred view (DeferredViewer) also carries each value's checksum in Sums.
type View struct {
	Bufs  [][]byte
	Codes []int64
	Sums  []uint64

	holder    ViewHolder
	bufs      [][]byte // Bufs' array, kept past Release for Reset to reuse
	once      sync.Once
	mu        sync.Mutex
	onCorrupt []func()
}

// NewView returns a view of n values held by h (nil: nothing to give back), with Sums when
// deferred.
func NewView(n int, deferred bool, h ViewHolder) *View {
	v := &View{Bufs: make([][]byte, n), Codes: make([]int64, n), holder: h}
	v.bufs = v.Bufs
	if deferred {
		v.Sums = make([]uint64, n)
	}
	return v
}

// Reset readies v, new or released with its Corrupt calls made, for a deferred view of n values
// held by h: every list n long and zero, in the arrays it had where they are long enough, no
// OnCorrupt hook, not released. It is how a ReusingViewer fills a view its caller keeps.
func (v *View) Reset(n int, h ViewHolder) {
	v.bufs = Zeroed(v.bufs, n)
	v.Bufs = v.bufs
	v.Codes = Zeroed(v.Codes, n)
	v.Sums = Zeroed(v.Sums, n)
	v.holder = h
	v.once = sync.Once{}
	clear(v.onCorrupt)
	v.onCorrupt = v.onCorrupt[:0]
}

// Holder returns the ViewHolder v was last made or Reset with, so a backend can reuse its own.
func (v *View) Holder() ViewHolder { return v.holder }

// Zeroed returns s's array, or a new one when it is shorter than n, as a list of n zero values.
func Zeroed[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
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
	v.Codes[i] = int64(ErrChecksumMismatch)
	hooks := v.onCorrupt
	v.mu.Unlock()
	if v.holder != nil {
		v.holder.Corrupted(size)
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
		if v.holder != nil {
			v.holder.Release()
		}
		v.Bufs = nil
	})
}

// Reserver is implemented by pools whose values live in this process's memory, so a caller
// can write a value where it will be stored instead of handing over a copy: the connector
// gathers pages from the GPU straight into reserved pool memory once it is registered with the
// driver. It is the Mooncake master's PutStart / PutEnd / PutRevoke in one process.
type Reserver interface {
	// BatchPutStart allocates memory for every key of ks not stored yet (sizes[i] bytes) and
	// returns it to be written; the keys are not readable until PutReservation.End.
	BatchPutStart(ctx context.Context, ks []string, sizes []int64, cfg ReplicateConfig) *PutReservation
}

// Committer is a backend's side of a PutReservation.
type Committer interface {
	// Commit makes the written values readable and returns every key's final code.
	Commit() []Code
	// Revoke gives the memory back, makes nothing readable and returns every key's code.
	Revoke() []Code
}

// PutReservation is the result of Reserver.BatchPutStart. Bufs[i] is the memory key i's value
// is to be written to, nil where there is nothing to write: Codes[i] is OK for a key already
// stored or in flight (as BatchPut skips it) and a negative Code for a key that failed. Exactly
// one of End and Revoke must be called once the writes are done or abandoned.
type PutReservation struct {
	Bufs  [][]byte
	Codes []Code

	c    Committer
	once sync.Once
	done []Code
}

// NewPutReservation returns a reservation of bufs with codes, finished by c.
func NewPutReservation(bufs [][]byte, codes []Code, c Committer) *PutReservation {
	return &PutReservation{Bufs: bufs, Codes: codes, c: c}
}

// End makes the written values readable (Committer.Commit) and returns the final code of
// every key. A second call, or one after Revoke, returns the same codes and does nothing.
func (p *PutReservation) End() []Code {
	p.once.Do(func() {
		p.done = p.c.Commit()
		p.Bufs = nil
	})
	return p.done
}

// Revoke abandons the reservation: the memory goes back to the pool, nothing becomes readable,
// and every key that was to be written fails (ErrRPCFail for the embedded pool).
func (p *PutReservation) Revoke() []Code {
	p.once.Do(func() {
		p.done = p.c.Revoke()
		p.Bufs = nil
	})
	return p.done
}
