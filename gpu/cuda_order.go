//go:build cgo && linux

package gpu

/*
#include <stdint.h>
#include <stdlib.h>
typedef int CUresult;
int kvHasIpcEvents(void);
CUresult kvIpcEventCreate(uintptr_t *e, void *handle);
CUresult kvIpcEventOpen(uintptr_t *e, const void *handle);
CUresult kvEventCapture(uintptr_t s, uintptr_t src, uintptr_t *dst);
CUresult kvStreamsWaitEvent(const uintptr_t *streams, int n, uintptr_t e);
CUresult kvEventRecord(uintptr_t e, uintptr_t s);
CUresult kvEventDestroy(uintptr_t e);
CUresult kvEventQuery(uintptr_t e);
CUresult kvStreamCreate(uintptr_t *s);
CUresult kvStreamDestroy(uintptr_t s);
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/kvctl/kvctl/core/kvmem"
)

// cudaNotReady is CUDA_ERROR_NOT_READY: cuEventQuery's answer for work not yet done.
const cudaNotReady = 600

// cudaStreamOrder is an engine's interprocess event opened in this process, kvctl's own
// interprocess event, and a stream of its own on which fences are captured and kvctl's event is
// recorded.
type cudaStreamOrder struct {
	d      *CUDADevice
	t      *cudaCaller
	stream uintptr
	engine uintptr // the engine's event, opened from its handle
	own    uintptr // kvctl's event
	handle []byte

	mu     sync.Mutex
	closed bool
}

// OpenStreamOrder implements kvmem.EventOpener: it opens the engine's interprocess event on
// device and creates kvctl's.
func (c CUDA) OpenStreamOrder(device int, engineEvent []byte) (kvmem.StreamOrder, error) {
	return openStreamOrder(device, engineEvent)
}

var _ kvmem.EventOpener = CUDA{}

func openStreamOrder(device int, engineEvent []byte) (kvmem.StreamOrder, error) {
	if err := kvmem.CheckEventHandle(engineEvent); err != nil {
		return nil, err
	}
	d, err := OpenCUDA(device)
	if err != nil {
		return nil, err
	}
	if C.kvHasIpcEvents() == 0 {
		_ = d.Close()
		return nil, fmt.Errorf("%w: the driver has no interprocess events (cuIpcOpenEventHandle)", ErrNoCUDA)
	}
	t, err := newCUDACaller(d.ctx)
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	o := &cudaStreamOrder{d: d, t: t, handle: make([]byte, kvmem.EngineEventBytes)}
	t.do(func() {
		var s, eng, own C.uintptr_t
		if err = cuErr("cuStreamCreate", C.kvStreamCreate(&s)); err != nil {
			return
		}
		o.stream = uintptr(s)
		in := C.CBytes(engineEvent)
		defer C.free(in)
		if err = cuErr("cuIpcOpenEventHandle", C.kvIpcEventOpen(&eng, in)); err != nil {
			err = fmt.Errorf("%w: open the engine's event: %w", kvmem.ErrBadEvent, err)
			return
		}
		o.engine = uintptr(eng)
		if err = cuErr("cuIpcGetEventHandle", C.kvIpcEventCreate(&own, unsafe.Pointer(&o.handle[0]))); err != nil {
			return
		}
		o.own = uintptr(own)
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("stream order: %w", err), o.Close())
	}
	return o, nil
}

func (o *cudaStreamOrder) Handle() []byte { return o.handle }

// Fence implements kvmem.StreamOrder: kvctl's stream waits for the engine's event as recorded
// now, and a new event recorded behind that wait is the fence.
func (o *cudaStreamOrder) Fence() (kvmem.DeviceFence, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil, errors.New("stream order: closed")
	}
	var err error
	f := &cudaFence{o: o}
	o.t.do(func() {
		var ev C.uintptr_t
		err = cuErr("cuStreamWaitEvent", C.kvEventCapture(C.uintptr_t(o.stream), C.uintptr_t(o.engine), &ev))
		f.ev = uintptr(ev)
	})
	if err != nil {
		return nil, fmt.Errorf("capture the engine's event: %w", err)
	}
	return f, nil
}

// Signal implements kvmem.StreamOrder. The copies the caller saw complete are done on the
// device, so a record on kvctl's own stream, which holds only fence captures, follows them.
func (o *cudaStreamOrder) Signal() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return errors.New("stream order: closed")
	}
	var err error
	o.t.do(func() { err = cuErr("cuEventRecord", C.kvEventRecord(C.uintptr_t(o.own), C.uintptr_t(o.stream))) })
	return err
}

func (o *cudaStreamOrder) Close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil
	}
	o.closed = true
	var errs []error
	o.t.do(func() {
		// Destroying an event a stream still waits for is allowed: the driver releases it once
		// the wait is done.
		for _, e := range []uintptr{o.engine, o.own} {
			if e != 0 {
				errs = append(errs, cuErr("cuEventDestroy", C.kvEventDestroy(C.uintptr_t(e))))
			}
		}
		if o.stream != 0 {
			errs = append(errs, cuErr("cuStreamDestroy", C.kvStreamDestroy(C.uintptr_t(o.stream))))
		}
	})
	errs = append(errs, o.d.Close())
	return errors.Join(errs...)
}

// cudaFence is one capture of the engine's event: an event of kvctl's recorded behind the
// wait for it.
type cudaFence struct {
	o    *cudaStreamOrder
	ev   uintptr
	once sync.Once
}

// Wait implements kvmem.DeviceFence by polling the event from the host, for consumers that
// cannot wait on the device.
func (f *cudaFence) Wait(ctx context.Context) error {
	defer f.Release()
	pause := 20 * time.Microsecond
	for {
		var r C.CUresult
		f.o.t.do(func() { r = C.kvEventQuery(C.uintptr_t(f.ev)) })
		switch r {
		case 0:
			return nil
		case cudaNotReady:
		default:
			return fmt.Errorf("wait for the engine's event: %w", cuErr("cuEventQuery", r))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Millisecond)
	}
}

// Release implements kvmem.DeviceFence.
func (f *cudaFence) Release() {
	f.once.Do(func() { f.o.t.do(func() { C.kvEventDestroy(C.uintptr_t(f.ev)) }) })
}

// waitOn queues a wait for the fence on every stream and releases it. It runs inside a CUDA
// call of a caller whose context is the fence's (the device's primary context).
func (f *cudaFence) waitOn(streams []uintptr) error {
	var err error
	f.once.Do(func() {
		err = cuErr("cuStreamWaitEvent", C.kvStreamsWaitEvent((*C.uintptr_t)(unsafe.Pointer(&streams[0])), C.int(len(streams)), C.uintptr_t(f.ev)))
		C.kvEventDestroy(C.uintptr_t(f.ev))
	})
	return err
}

// WaitFence implements kvmem.FenceWaiter.
func (m *cudaMover) WaitFence(f kvmem.DeviceFence) error {
	cf, ok := f.(*cudaFence)
	if !ok || cf.o.d.ctx != m.d.ctx {
		return fmt.Errorf("cuda mover: %w: a fence of another device or backend", kvmem.ErrBadEvent)
	}
	if old := m.fence; old != nil {
		// Captures on one stream pass in order: the newer fence implies the older.
		old.Release()
	}
	m.fence = cf
	return nil
}

// WaitFence passes the wrapped mover's FenceWaiter through.
func (o *ownedMover) WaitFence(f kvmem.DeviceFence) error {
	fw, ok := o.Mover.(kvmem.FenceWaiter)
	if !ok {
		return errors.New("the mover cannot wait for fences on the device")
	}
	return fw.WaitFence(f)
}

var (
	_ kvmem.FenceWaiter = (*cudaMover)(nil)
	_ kvmem.FenceWaiter = (*ownedMover)(nil)
)
