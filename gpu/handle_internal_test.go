package gpu

import (
	"context"
	"errors"
	"testing"

	"github.com/kvctl/kvctl/core/kvmem"
)

// TestOwnedMoverPassesCapabilitiesThrough: the wrapper OpenMover puts around a CUDA mover must
// not hide what the connector looks for (registering pool memory, checking pages), or loads
// through kvctl serve silently fall back to staging and host checks.
func TestOwnedMoverPassesCapabilitiesThrough(t *testing.T) {
	l := kvmem.Layout{TokensPerBlock: 32, Groups: []kvmem.GroupLayout{{ID: 0, Slots: 2, Regions: []kvmem.Region{{Stride: 4096, Size: 4096}}}}}
	shm, err := NewSharedMemory(8192)
	if err != nil {
		t.Fatal(err)
	}
	defer shm.Close()
	inner, err := NewHostMover(shm.FD, 8192, l)
	if err != nil {
		t.Fatal(err)
	}
	released := false
	var m kvmem.Mover = newOwnedMover(inner, func() error { released = true; return nil })
	r, ok := m.(kvmem.HostRegistrar)
	if !ok {
		t.Fatal("ownedMover hides HostRegistrar")
	}
	c, err := r.RegisterHost(make([]byte, 4096))
	if err != nil {
		t.Fatalf("register through the wrapper: %v", err)
	}
	c.Close()
	pc, ok := m.(kvmem.PageChecker)
	if !ok {
		t.Fatal("ownedMover hides PageChecker")
	}
	// The host mover does not check pages: the wrapper says so rather than pretend.
	if err := pc.PageCheckError(); !errors.Is(err, errNotCheckable) {
		t.Fatalf("PageCheckError over a host mover = %v", err)
	}
	if _, err := pc.ScatterChecked(context.Background(), nil, nil, nil); err == nil {
		t.Fatal("ScatterChecked over a host mover succeeded")
	}
	if err := m.Close(); err != nil || !released {
		t.Fatalf("close: %v, released %v", err, released)
	}
}
