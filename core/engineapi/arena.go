package engineapi

import (
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvctl/kvctl/core/kvmem"
)

// A prompt arena is shared memory an engine writes its prompts into, so that a Lookup names a
// range of it (Request.tokens_arena) instead of carrying 8 bytes a token through gRPC. The
// engine creates it (NewPromptArena), hands its descriptor to the daemon over the side channel
// and registers it for one engine rank (Client.RegisterPromptArena); the daemon maps it
// read-only, copies a named range out before using it, and releases it with the rank.

// DefaultPromptArenaBytes is the size of the arena RemoteRank creates: 8 MiB, room for one
// prompt of a million tokens or 32 concurrent 32k-token lookups. Pages are only used once
// written.
const DefaultPromptArenaBytes = 8 << 20

// DefaultMaxPromptArenaBytes is the largest arena the daemon maps for one engine rank unless
// configured otherwise: 64 MiB, eight million tokens.
const DefaultMaxPromptArenaBytes = 64 << 20

// ErrArenaRange is returned (wrapped, naming the problem) for a tokens_arena range that does not
// lie inside the arena or names more tokens than allowed.
var ErrArenaRange = errors.New("bad prompt arena range")

// ErrArenaFault is returned (wrapped) when reading the arena faulted: the memory under the
// mapping went away. The read fails; the process does not.
var ErrArenaFault = errors.New("prompt arena fault")

// CopyArenaTokens copies count tokens, in the tokens_packed encoding, starting at byte offset of
// arena into dst (reusing its backing array when large enough) and returns them. It checks the
// range before touching arena: count at most maxTokens, offset and offset+8*count inside arena,
// without overflow. The copy is taken once; the engine may change the arena during or after it
// without the result changing. A fault while reading arena (its file lost pages) is returned as
// ErrArenaFault instead of crashing the process.
func CopyArenaTokens(dst []int64, arena []byte, offset, count uint64, maxTokens int) (out []int64, err error) {
	if maxTokens < 0 {
		maxTokens = 0
	}
	if count > uint64(maxTokens) {
		return dst[:0], fmt.Errorf("%w: tokens_arena names %d tokens, more than the %d allowed", ErrArenaRange, count, maxTokens)
	}
	size := uint64(len(arena))
	if offset > size {
		return dst[:0], fmt.Errorf("%w: tokens_arena offset %d is past the end of the %d-byte arena", ErrArenaRange, offset, size)
	}
	// count ≤ maxTokens ≤ MaxInt, and the check below is done by subtraction so that a count
	// near 2^61 cannot overflow count*8.
	if count > (size-offset)/TokenBytes {
		return dst[:0], fmt.Errorf("%w: tokens_arena of %d tokens at offset %d ends past the end of the %d-byte arena", ErrArenaRange, count, offset, size)
	}
	n := int(count)
	if n == 0 {
		return dst[:0], nil
	}
	src := arena[offset : offset+count*TokenBytes]
	defer kvmem.RecoverFault(&err, debug.SetPanicOnFault(true), ErrArenaFault)
	if littleEndian && cap(dst) < n {
		// A new array filled by the copy itself: append to a nil slice allocates without
		// clearing first, where make would clear 8 bytes a token only to overwrite them.
		b := append([]byte(nil), src...)
		return unsafe.Slice((*int64)(unsafe.Pointer(unsafe.SliceData(b))), n), nil
	}
	if cap(dst) < n {
		dst = make([]int64, n)
	}
	dst = dst[:n]
	if littleEndian {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), len(src)), src)
		return dst, nil
	}
	return UnpackTokens(dst, src)
}

// PromptArena is an engine's side of a prompt arena: a memfd sealed against shrinking and
// growing, mapped read-write, and an allocator of byte ranges in it. Alloc, Write, Free and
// HeldBytes are safe for concurrent use, and with Close: a Write after Close reports false.
type PromptArena struct {
	fd   int
	data []byte

	mu     sync.Mutex // guards held and closed
	held   []arenaSpan
	closed bool
	// mapMu is held shared while a prompt is written into data and exclusively while Close
	// unmaps it.
	mapMu sync.RWMutex
}

type arenaSpan struct{ off, end uint64 }

// NewPromptArena creates a prompt arena of size bytes (rounded up to whole pages), sealed with
// F_SEAL_SHRINK and F_SEAL_GROW as the daemon requires. Close releases it.
func NewPromptArena(size int64) (*PromptArena, error) {
	if size <= 0 {
		return nil, fmt.Errorf("prompt arena: size must be positive, got %d", size)
	}
	page := int64(unix.Getpagesize())
	size = (size + page - 1) / page * page
	fd, err := unix.MemfdCreate("kvctl-prompt-arena", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("prompt arena: memfd_create: %w", err)
	}
	if err = unix.Ftruncate(fd, size); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("prompt arena: resize to %d bytes: %w", size, err)
	}
	if _, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("prompt arena: seal: %w", err)
	}
	data, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("prompt arena: map %d bytes: %w", size, err)
	}
	return &PromptArena{fd: fd, data: data}, nil
}

// FD is the arena's descriptor, to send to the daemon. It stays the arena's.
func (a *PromptArena) FD() int { return a.fd }

// Size is the arena's size in bytes.
func (a *PromptArena) Size() uint64 { return uint64(len(a.data)) }

// Alloc reserves n bytes (n > 0) at an 8-byte aligned offset and returns the offset; ok is false
// when no free range is large enough or the arena is closed. The range stays reserved until
// Free.
func (a *PromptArena) Alloc(n uint64) (off uint64, ok bool) {
	if n == 0 {
		return 0, false
	}
	n = (n + TokenBytes - 1) / TokenBytes * TokenBytes
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed || n > uint64(len(a.data)) {
		return 0, false
	}
	// First fit over the held spans, kept sorted by offset.
	var at uint64
	i := 0
	for ; i < len(a.held); i++ {
		if a.held[i].off-at >= n {
			break
		}
		at = a.held[i].end
	}
	if i == len(a.held) && uint64(len(a.data))-at < n {
		return 0, false
	}
	a.held = slices.Insert(a.held, i, arenaSpan{at, at + n})
	return at, true
}

// Free releases the range Alloc returned at off.
func (a *PromptArena) Free(off uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, s := range a.held {
		if s.off == off {
			a.held = slices.Delete(a.held, i, i+1)
			return
		}
	}
}

// HeldBytes is the number of bytes reserved and not freed.
func (a *PromptArena) HeldBytes() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var n uint64
	for _, s := range a.held {
		n += s.end - s.off
	}
	return n
}

// Write stores tokens at off (a range from Alloc large enough for them) in the tokens_packed
// encoding. It reports false when the arena was closed.
func (a *PromptArena) Write(off uint64, tokens []int64) bool {
	a.mapMu.RLock()
	defer a.mapMu.RUnlock()
	if a.data == nil {
		return false
	}
	n := uint64(len(tokens)) * TokenBytes
	PackTokens(a.data[off:off:off+n], tokens)
	return true
}

// Bytes is the arena's mapping, for tests that play an engine writing into it directly. It is
// invalid after Close.
func (a *PromptArena) Bytes() []byte { return a.data }

// Close unmaps the arena and closes its descriptor. The daemon's mapping, if it has one, stays
// valid until the daemon releases it.
func (a *PromptArena) Close() error {
	a.mu.Lock()
	a.closed = true
	a.held = nil
	a.mu.Unlock()
	a.mapMu.Lock()
	defer a.mapMu.Unlock()
	var errs []error
	if a.data != nil {
		errs = append(errs, unix.Munmap(a.data))
		a.data = nil
	}
	if a.fd >= 0 {
		errs = append(errs, unix.Close(a.fd))
		a.fd = -1
	}
	return errors.Join(errs...)
}
