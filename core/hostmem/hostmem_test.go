package hostmem_test

import (
	"fmt"
	"testing"

	"github.com/kvctl/kvctl/core/hostmem"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/core/kvmem/movertest"
)

// hostEngine is engine memory in a shared-memory file, as an engine without a GPU hands it over.
type hostEngine struct{ shm *hostmem.SharedMemory }

func (e hostEngine) Size() int { return len(e.shm.Data) }

func (e hostEngine) Write(off int, p []byte) error {
	if off < 0 || off+len(p) > len(e.shm.Data) {
		return fmt.Errorf("write of %d bytes at %d outside %d", len(p), off, len(e.shm.Data))
	}
	copy(e.shm.Data[off:], p)
	return nil
}

func (e hostEngine) Read(off int, p []byte) error {
	if off < 0 || off+len(p) > len(e.shm.Data) {
		return fmt.Errorf("read of %d bytes at %d outside %d", len(p), off, len(e.shm.Data))
	}
	copy(p, e.shm.Data[off:])
	return nil
}

func (e hostEngine) NewMover(l kvmem.Layout) (kvmem.Mover, error) {
	return hostmem.NewMover(e.shm.FD, int64(len(e.shm.Data)), l)
}

func (e hostEngine) Close() error { return e.shm.Close() }

func newHostEngine(t *testing.T, size int) movertest.Engine {
	shm, err := hostmem.NewSharedMemory(int64(size))
	if err != nil {
		t.Fatal(err)
	}
	return hostEngine{shm}
}

func TestHostMover(t *testing.T) {
	movertest.Run(t, movertest.Backend{Name: "host", NewEngine: newHostEngine, LiveAllocations: hostmem.LiveStaging})
}

func TestHostMoverRejectsShortFile(t *testing.T) {
	shm, err := hostmem.NewSharedMemory(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer shm.Close()
	l := kvmem.Layout{TokensPerBlock: 1, Groups: []kvmem.GroupLayout{{ID: 0, Slots: 1, Regions: []kvmem.Region{{Size: 8192}}}}}
	if m, err := hostmem.NewMover(shm.FD, 8192, l); err == nil {
		m.Close()
		t.Fatal("a mover over 8192 bytes of a 4096-byte file was created")
	}
	if m, err := hostmem.NewMover(-1, 4096, l); err == nil {
		m.Close()
		t.Fatal("a mover over fd -1 was created")
	}
}
