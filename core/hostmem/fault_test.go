package hostmem

import (
	"context"
	"errors"
	"runtime/debug"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvctl/kvctl/core/kvmem"
)

// TestHostMoverFaultIsAnError truncates the file under a host mover's mapping (what an engine
// with unsealed memory could do) and copies from it: the copy fails with ErrMemoryFault and the
// process carries on. kvctl serve refuses such memory at Register; this is the second line.
func TestHostMoverFaultIsAnError(t *testing.T) {
	const page = 4096
	fd, err := unix.MemfdCreate("fault", unix.MFD_CLOEXEC)
	if err != nil {
		t.Skip(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 4*page); err != nil {
		t.Fatal(err)
	}
	l := kvmem.Layout{TokensPerBlock: 16, Groups: []kvmem.GroupLayout{{Slots: 4, Regions: []kvmem.Region{{Size: page, Stride: page}}}}}
	m, err := NewMover(fd, 4*page, l)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := unix.Ftruncate(fd, 0); err != nil {
		t.Fatal(err)
	}
	dst := [][]byte{make([]byte, page)}
	err = m.Gather(context.Background(), []kvmem.PageRef{{Group: 0, Slot: 3}}, dst)
	if !errors.Is(err, ErrMemoryFault) {
		t.Fatalf("gather from truncated memory: %v, want ErrMemoryFault", err)
	}
	err = m.Scatter(context.Background(), dst, []kvmem.PageRef{{Group: 0, Slot: 1}})
	if !errors.Is(err, ErrMemoryFault) {
		t.Fatalf("scatter into truncated memory: %v, want ErrMemoryFault", err)
	}
}

// BenchmarkFaultGuard measures what guarding one Gather or Scatter against memory faults costs:
// the same 64 KiB copy with and without the deferred guard, in the same run.
func BenchmarkFaultGuard(b *testing.B) {
	src, dst := make([]byte, 64<<10), make([]byte, 64<<10)
	plain := func() error { copy(dst, src); return nil }
	guarded := func() (err error) {
		defer kvmem.RecoverFault(&err, debug.SetPanicOnFault(true), ErrMemoryFault)
		copy(dst, src)
		return nil
	}
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			_ = plain()
		}
	})
	b.Run("guarded-copy", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			_ = guarded()
		}
	})
}
