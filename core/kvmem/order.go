package kvmem

import (
	"context"
	"errors"
	"fmt"
)

// Stream ordering: an engine on a GPU computes into its KV pages on its own stream, and kvctl
// copies into and out of them on its own. Without a host-wide synchronisation between the two,
// each side must make its device work wait for the other's:
//
//   - a load's copies wait for the engine's work recorded before StartLoad (a kernel may still
//     be reading or writing the destination pages: the allocation fence);
//   - a save's reads wait for the engine's work recorded before WaitForSave (the kernel that
//     writes the KV);
//   - the engine's reads of loaded pages wait for the daemon's event, recorded once a load's
//     copies are done.
//
// The engine hands over a CUDA interprocess event (EngineEventBytes long) it records on its
// compute stream before those calls; the device backend opens it as a StreamOrder.

// EngineEventBytes is the size of a CUDA interprocess event handle (cudaIpcEventHandle_t).
const EngineEventBytes = 64

// ErrBadEvent is wrapped by the errors for an engine event handle that cannot be used.
var ErrBadEvent = errors.New("bad engine event")

// CheckEventHandle refuses an event handle that is not a CUDA interprocess event handle's size.
func CheckEventHandle(h []byte) error {
	if len(h) != EngineEventBytes {
		return fmt.Errorf("%w: handle is %d bytes, a CUDA interprocess event handle (cudaIpcEventHandle_t) is %d", ErrBadEvent, len(h), EngineEventBytes)
	}
	return nil
}

// EventOpener is implemented by device backends (a DeviceOpener) that can order kvctl's copies
// against an engine's device work with interprocess events. OpenStreamOrder is safe for
// concurrent use.
type EventOpener interface {
	// OpenStreamOrder opens the engine's interprocess event handle engineEvent on device and
	// creates the daemon's own interprocess event there. The handle is checked with
	// CheckEventHandle first.
	OpenStreamOrder(device int, engineEvent []byte) (StreamOrder, error)
}

// StreamOrder is an engine's event opened in kvctl, with kvctl's own event for the engine. Its
// methods are safe for concurrent use; Close must come after every fence it made is done with.
type StreamOrder interface {
	// Fence captures the engine's event as it was last recorded when Fence is called: the
	// returned fence is passed once the engine's work issued before that record is done, even
	// if the engine records the event again meanwhile. It queues device work only; the host
	// does not wait.
	Fence() (DeviceFence, error)
	// Signal records kvctl's event after every copy of the device's movers that the caller saw
	// complete. An engine stream that waits on the event after Signal returned (the engine's
	// call returned) runs after those copies.
	Signal() error
	// Handle is kvctl's event as an interprocess handle (EngineEventBytes) for the engine.
	Handle() []byte
	// Close releases both events.
	Close() error
}

// DeviceFence is a point in an engine's device work, captured by StreamOrder.Fence. A Mover
// that implements FenceWaiter makes its copies wait for it on the device; anything else calls
// Wait, which blocks the host until the point is passed (or ctx ends). A fence is released
// after Wait returns or a FenceWaiter took it, and otherwise by Release; each is idempotent.
type DeviceFence interface {
	// Wait returns once the engine's work before the fence is done, or with ctx's error.
	Wait(ctx context.Context) error
	// Release frees the fence without waiting for it.
	Release()
}

// FenceWaiter is implemented by movers that can order their copies after a DeviceFence on the
// device, without the host waiting.
type FenceWaiter interface {
	// WaitFence makes every copy of the mover's next transfer (Gather, Scatter and the checked
	// scatters), and so every later one, start only once f is passed. It takes f over (releases
	// it once its wait is queued). A fence of another backend is refused.
	WaitFence(f DeviceFence) error
}
