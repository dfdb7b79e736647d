package hostmem

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/kvctl/kvctl/core/kvmem"
)

// liveStaging counts the staging mappings of every mover of this package not released yet.
var liveStaging atomic.Int64

// LiveStaging returns how many staging allocations made by this package's movers are still
// live. Tests use it to check that Close releases everything.
func LiveStaging() int { return int(liveStaging.Load()) }

// SharedMemory is engine memory on a machine without a GPU: an anonymous memory file that an
// engine shares with kvctl by passing FD over the unix socket.
type SharedMemory struct {
	FD   int
	Data []byte
}

// NewSharedMemory creates size bytes of shared memory, mapped into this process. The memfd is
// sealed with F_SEAL_SHRINK and F_SEAL_GROW, as kvctl serve requires of engine memory. The caller
// owns FD and the mapping; Close releases both.
func NewSharedMemory(size int64) (*SharedMemory, error) {
	if size <= 0 {
		return nil, fmt.Errorf("shared memory: size must be positive, got %d", size)
	}
	fd, err := unix.MemfdCreate("kvctl-engine-kv", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("shared memory: memfd_create: %w", err)
	}
	if err = unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shared memory: resize to %d bytes: %w", size, err)
	}
	// kvctl serve refuses engine memory that could shrink: a file truncated under a mapping
	// faults (SIGBUS) in whoever touches the lost pages.
	if _, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shared memory: seal against shrinking: %w", err)
	}
	data, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shared memory: map %d bytes: %w", size, err)
	}
	return &SharedMemory{FD: fd, Data: data}, nil
}

// Close unmaps the memory and closes its file descriptor.
func (s *SharedMemory) Close() error {
	var errs []error
	if s.Data != nil {
		errs = append(errs, unix.Munmap(s.Data))
		s.Data = nil
	}
	if s.FD >= 0 {
		errs = append(errs, unix.Close(s.FD))
		s.FD = -1
	}
	return errors.Join(errs...)
}

// hostMapping is engine memory mapped from a shared-memory file, shared by a mover and its
// clones and unmapped when the last of them closes.
type hostMapping struct {
	data []byte
	refs atomic.Int32
}

func (m *hostMapping) release() error {
	if m.refs.Add(-1) == 0 {
		return unix.Munmap(m.data)
	}
	return nil
}

// hostMover is the Mover for engine memory in a shared-memory file.
type hostMover struct {
	mem    *hostMapping
	layout kvmem.Layout
	mu     sync.Mutex
	closed bool
}

// NewMover maps size bytes of the shared-memory file fd (as made by NewSharedMemory, or
// received from an engine) and returns a Mover over it for layout. The mover keeps its own
// mapping: the caller may close fd once it returns.
func NewMover(fd int, size int64, layout kvmem.Layout) (kvmem.Mover, error) {
	if size <= 0 {
		return nil, fmt.Errorf("host mover: size must be positive, got %d", size)
	}
	if err := layout.Validate(uint64(size)); err != nil {
		return nil, fmt.Errorf("host mover: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("host mover: engine memory fd %d: %w", fd, err)
	}
	if st.Size < size {
		return nil, fmt.Errorf("host mover: engine memory fd %d holds %d bytes, %d registered", fd, st.Size, size)
	}
	data, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("host mover: map engine memory: %w", err)
	}
	m := &hostMapping{data: data}
	m.refs.Store(1)
	return &hostMover{mem: m, layout: layout}, nil
}

func (h *hostMover) Layout() kvmem.Layout { return h.layout }

func (h *hostMover) check(ctx context.Context) error {
	if h.closed {
		return kvmem.ErrClosed
	}
	return ctx.Err()
}

func (h *hostMover) Gather(ctx context.Context, pages []kvmem.PageRef, dst [][]byte) (err error) {
	if err = h.check(ctx); err != nil {
		return err
	}
	defer kvmem.RecoverFault(&err, debug.SetPanicOnFault(true), ErrMemoryFault)
	mem := h.mem.data
	return kvmem.WalkPages(h.layout, pages, dst, func(p int, eo, vo, n uint64) {
		copy(dst[p][vo:vo+n], mem[eo:eo+n])
	})
}

func (h *hostMover) Scatter(ctx context.Context, src [][]byte, pages []kvmem.PageRef) (err error) {
	if err = h.check(ctx); err != nil {
		return err
	}
	defer kvmem.RecoverFault(&err, debug.SetPanicOnFault(true), ErrMemoryFault)
	mem := h.mem.data
	return kvmem.WalkPages(h.layout, pages, src, func(p int, eo, vo, n uint64) {
		copy(mem[eo:eo+n], src[p][vo:vo+n])
	})
}

// PageMemory returns the engine memory of ref's value when it is one contiguous piece
// (kvmem.HostPages), so a pool read lands there without staging. The memory is a sealed memfd
// (kvctl serve refuses one that could shrink), so writing it cannot fault.
func (h *hostMover) PageMemory(ref kvmem.PageRef) ([]byte, bool) {
	if h.closed {
		return nil, false
	}
	off, n, ok := h.layout.ContiguousValue(ref)
	if !ok || off+n > uint64(len(h.mem.data)) || off+n < off {
		return nil, false
	}
	return h.mem.data[off : off+n : off+n], true
}

// PageSegments returns the pieces of engine memory ref's value occupies, in value order
// (kvmem.HostPages), for a pool that copies a value into or out of several pieces.
func (h *hostMover) PageSegments(ref kvmem.PageRef, out [][]byte) ([][]byte, bool) {
	if h.closed {
		return out, false
	}
	var buf [8]kvmem.Span
	spans, err := h.layout.ValueSpans(ref, buf[:0])
	if err != nil {
		return out, false
	}
	for _, sp := range spans {
		end := sp.Offset + sp.Size
		if end > uint64(len(h.mem.data)) || end < sp.Offset {
			return out, false
		}
		out = append(out, h.mem.data[sp.Offset:end:end])
	}
	return out, true
}

// ErrMemoryFault is wrapped by a copy's error when touching engine memory faulted (SIGBUS: the
// file under the mapping lost pages). The copy fails; the process does not.
var ErrMemoryFault = errors.New("engine memory fault")

func (h *hostMover) NewStaging(slots int, slotBytes int) (kvmem.Staging, error) {
	if h.closed {
		return nil, kvmem.ErrClosed
	}
	return newHostStaging(slots, slotBytes)
}

func (h *hostMover) Clone() (kvmem.Mover, error) {
	if h.closed {
		return nil, kvmem.ErrClosed
	}
	h.mem.refs.Add(1)
	return &hostMover{mem: h.mem, layout: h.layout}, nil
}

func (h *hostMover) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	h.closed = true
	return h.mem.release()
}

// hostStaging is staging memory for the host backend: one anonymous mapping, page aligned.
type hostStaging struct {
	buf       []byte
	slots     int
	slotBytes int
}

func newHostStaging(slots, slotBytes int) (*hostStaging, error) {
	if err := kvmem.CheckStagingShape(slots, slotBytes); err != nil {
		return nil, err
	}
	buf, err := unix.Mmap(-1, 0, slots*slotBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("staging: map %d bytes: %w", slots*slotBytes, err)
	}
	liveStaging.Add(1)
	return &hostStaging{buf: buf, slots: slots, slotBytes: slotBytes}, nil
}

func (s *hostStaging) Slots() int     { return s.slots }
func (s *hostStaging) SlotBytes() int { return s.slotBytes }

func (s *hostStaging) Slot(i int) []byte {
	o := i * s.slotBytes
	return s.buf[o : o+s.slotBytes : o+s.slotBytes]
}

func (s *hostStaging) Close() error {
	if s.buf == nil {
		return nil
	}
	err := unix.Munmap(s.buf)
	s.buf = nil
	liveStaging.Add(-1)
	return err
}
