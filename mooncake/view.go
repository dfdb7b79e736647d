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

// BatchView implements Viewer. The checks of a batch run on up to GOMAXPROCS goroutines, as
// BatchGet's copies do.
func (e *Embedded) BatchView(ctx context.Context, ks []string) *View {
	out, held, misses := e.acquire(ctx, ks, nil)
	v := &View{Bufs: make([][]byte, len(ks)), Codes: out, e: e, held: held}
	var total int64
	for _, o := range held {
		if o != nil {
			total += o.size
		}
	}
	forEach(len(held), total, func(i int) {
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

var _ Viewer = (*Embedded)(nil)
