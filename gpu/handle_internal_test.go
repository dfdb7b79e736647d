package gpu

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/kvctl/kvctl/core/kvmem"
)

// registrarMover is a mover that can register host memory and does not check pages, as the
// CUDA mover looks to the connector for a layout it cannot check.
type registrarMover struct {
	kvmem.Mover
	registered int
}

func (m *registrarMover) RegisterHost([]byte) (io.Closer, error) {
	m.registered++
	return io.NopCloser(nil), nil
}

func (m *registrarMover) Close() error { return nil }

// TestOwnedMoverPassesCapabilitiesThrough: the wrapper OpenMover puts around a CUDA mover must
// not hide what the connector looks for (registering pool memory, checking pages), or loads
// through kvctl serve silently fall back to staging and host checks.
func TestOwnedMoverPassesCapabilitiesThrough(t *testing.T) {
	inner := &registrarMover{}
	released := false
	var m kvmem.Mover = newOwnedMover(inner, func() error { released = true; return nil })
	r, ok := m.(kvmem.HostRegistrar)
	if !ok {
		t.Fatal("ownedMover hides HostRegistrar")
	}
	if _, err := r.RegisterHost(make([]byte, 4096)); err != nil || inner.registered != 1 {
		t.Fatalf("register through the wrapper: %v, %d registrations reached the mover", err, inner.registered)
	}
	pc, ok := m.(kvmem.PageChecker)
	if !ok {
		t.Fatal("ownedMover hides PageChecker")
	}
	// The inner mover does not check pages: the wrapper says so rather than pretend.
	if err := pc.PageCheckError(); !errors.Is(err, errNotCheckable) {
		t.Fatalf("PageCheckError over a mover that does not check = %v", err)
	}
	if _, err := pc.ScatterChecked(context.Background(), nil, nil, nil); err == nil {
		t.Fatal("ScatterChecked over a mover that does not check succeeded")
	}
	if err := m.Close(); err != nil || !released {
		t.Fatalf("close: %v, released %v", err, released)
	}
}

// wakingMover counts the times its device is woken.
type wakingMover struct {
	registrarMover
	woken int
}

func (m *wakingMover) WakeDevice() error { m.woken++; return nil }

// TestOwnedMoverPassesWakeThrough: loads through kvctl serve wake the device through the wrapper
// OpenMover puts around a CUDA mover; over a mover with no device to wake, waking does nothing.
func TestOwnedMoverPassesWakeThrough(t *testing.T) {
	inner := &wakingMover{}
	var m kvmem.Mover = newOwnedMover(inner, func() error { return nil })
	w, ok := m.(kvmem.DeviceWaker)
	if !ok {
		t.Fatal("ownedMover hides DeviceWaker")
	}
	if err := w.WakeDevice(); err != nil || inner.woken != 1 {
		t.Fatalf("wake through the wrapper: %v, %d wakes reached the mover", err, inner.woken)
	}
	plain := newOwnedMover(&registrarMover{}, func() error { return nil })
	if err := plain.WakeDevice(); err != nil {
		t.Fatalf("wake over a mover with no device to wake: %v", err)
	}
}
