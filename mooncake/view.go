package mooncake

import (
	"context"
	"sync"

	"github.com/kvctl/kvctl/core/keys"
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

// View is the result of Viewer.BatchView. Bufs[i] is key i's value in pool memory, nil where
// Codes[i] is negative; Codes[i] is the value's size or a negative Code (ErrChecksumMismatch
// for a value that failed its check: its bytes are not offered). A view must not be written.
type View struct {
	Bufs  [][]byte
	Codes []int64

	e    *Embedded
	held []*object
	once sync.Once
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
			out[i] = int64(ErrChecksumMismatch)
			return
		}
		v.Bufs[i] = mem
		out[i] = o.size
	})
	e.finishGet(out, held, misses)
	return v
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
	BatchPutStart(ctx context.Context, ks []string, sizes []int64, cfg ReplicateConfig) *PutReservation
}

// PutReservation is the result of Reserver.BatchPutStart. Bufs[i] is the memory key i's value
// is to be written to, nil where there is nothing to write: Codes[i] is OK for a key already
// stored or in flight (as BatchPut skips it) and a negative Code for a key that failed. Exactly
// one of End and Revoke must be called once the writes are done or abandoned.
type PutReservation struct {
	Bufs  [][]byte
	Codes []Code

	r    *reservation
	once sync.Once
	done []Code
}

// BatchPutStart implements Reserver. A call with len(sizes) != len(ks) fails every key.
func (e *Embedded) BatchPutStart(ctx context.Context, ks []string, sizes []int64, cfg ReplicateConfig) *PutReservation {
	if len(sizes) != len(ks) {
		e.c.putCalls.Add(1)
		out := e.failPut(make([]Code, len(ks)), ErrInvalidParams)
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
func (p *PutReservation) End() []Code {
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
func (p *PutReservation) Revoke() []Code {
	p.once.Do(func() {
		p.done = p.r.revoke()
		p.Bufs = nil
	})
	return p.done
}

var (
	_ Viewer   = (*Embedded)(nil)
	_ Reserver = (*Embedded)(nil)
)
