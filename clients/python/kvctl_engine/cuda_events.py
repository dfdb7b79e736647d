"""Stream ordering between an engine's GPU work and `kvctl serve`'s copies, without a host sync.

An engine that registers CUDA memory (cuda_ipc or cuda_fd) may also register a CUDA
interprocess event (RegisterRequest.engine_event). The contract (docs/ENGINE_API.md, "Stream
ordering"):

1. The engine records its event on its compute stream right before each of StartLoad,
   WaitForSave, and a BindMeta whose metadata carries asynchronous loads.
2. The daemon captures the event as recorded at that call: a load's copies start only after
   the engine's work before StartLoad (or that BindMeta) is done, however late the daemon runs
   them, and a save reads the KV only after the engine's work before WaitForSave is done.
3. The daemon hands back its own interprocess event (RegisterResponse.daemon_event) and
   records it once a StartLoad's copies are done. After StartLoad returns, the engine makes its
   compute stream wait on that event before any kernel reads the loaded pages.

No call needs ``torch.cuda.synchronize()``. Asynchronous loads are reported by GetFinished once
their copies are done, so work the engine queues after that report is ordered after them.

Two implementations with one interface:

- :class:`TorchStreamOrder` uses PyTorch's ``torch.cuda.Event(interprocess=True)``.
- :class:`CudartStreamOrder` uses the CUDA runtime (``libcudart``) through ctypes, for engines
  that manage raw streams themselves; streams are passed as integer ``cudaStream_t`` values.

Both create the event with ``cudaEventInterprocess | cudaEventDisableTiming`` on the device of
the KV memory, export its 64-byte ``cudaIpcEventHandle_t``, and open the daemon's handle. An
interprocess handle cannot be opened in the process that created it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any, Protocol

#: Size of a CUDA interprocess event handle (``cudaIpcEventHandle_t``); the daemon refuses any other.
IPC_EVENT_HANDLE_BYTES = 64

# cudaEventDisableTiming | cudaEventInterprocess
_EVENT_FLAGS = 0x2 | 0x4


class StreamOrderError(RuntimeError):
    """A CUDA event could not be created, exported, opened, recorded or waited on."""


def check_event_handle(handle: bytes) -> bytes:
    """Returns ``handle`` as bytes if it is a CUDA interprocess event handle's size, else raises
    ValueError naming the size (the daemon's own check, made before the call)."""
    b = bytes(handle)
    if len(b) != IPC_EVENT_HANDLE_BYTES:
        raise ValueError(
            f"CUDA event handle is {len(b)} bytes, a CUDA interprocess event handle (cudaIpcEventHandle_t) is {IPC_EVENT_HANDLE_BYTES}"
        )
    return b


class StreamOrder(Protocol):
    """What an engine needs from either implementation."""

    device: int

    def handle(self) -> bytes:
        """The engine event's 64-byte interprocess handle, for RegisterRequest.engine_event."""
        ...

    def register_fields(self) -> dict:
        """``{"handle": ..., "device": ...}``: the fields of the CudaEvent message."""
        ...

    def record(self, stream: Any = None) -> None:
        """Records the engine event on ``stream`` (default: the current stream). Call it right
        before StartLoad, WaitForSave and a BindMeta that carries asynchronous loads."""
        ...

    def open_daemon_event(self, handle: bytes) -> None:
        """Opens RegisterResponse.daemon_event.handle."""
        ...

    def wait_daemon(self, stream: Any = None) -> None:
        """Makes ``stream`` (default: the current stream) wait, on the device, for the daemon's
        event as last recorded: call it after StartLoad returns, before reading loaded pages."""
        ...

    def close(self) -> None:
        """Releases the events (the torch implementation leaves that to PyTorch)."""
        ...


class TorchStreamOrder:
    """Stream ordering with PyTorch events.

    >>> order = TorchStreamOrder(kv.device.index)
    >>> engine_event = api.msg("CudaEvent", **order.register_fields())   # in RegisterRequest
    >>> order.open_daemon_event(resp.daemon_event.handle)
    >>> order.record(); client.start_load(); order.wait_daemon()
    """

    def __init__(self, device: int | None = None, torch_module: Any = None) -> None:
        torch = torch_module
        if torch is None:
            try:
                import torch
            except ImportError as e:  # pragma: no cover - depends on the environment
                raise StreamOrderError(f"TorchStreamOrder needs PyTorch: {e}") from e
        if not torch.cuda.is_available():
            raise StreamOrderError(
                "TorchStreamOrder needs a CUDA device; PyTorch sees none (use shared memory and host ordering)"
            )
        self._torch = torch
        self.device = torch.cuda.current_device() if device is None else int(device)
        with torch.cuda.device(self.device):
            self._event = torch.cuda.Event(enable_timing=False, blocking=False, interprocess=True)
            # ipc_handle creates the event on the current device if it does not exist yet.
            self._handle = check_event_handle(self._event.ipc_handle())
        self._daemon = None

    @property
    def event(self) -> Any:
        """The engine's ``torch.cuda.Event``."""
        return self._event

    def handle(self) -> bytes:
        return self._handle

    def register_fields(self) -> dict:
        return {"handle": self._handle, "device": self.device}

    def _stream(self, stream: Any) -> Any:
        return self._torch.cuda.current_stream(self.device) if stream is None else stream

    def record(self, stream: Any = None) -> None:
        self._event.record(self._stream(stream))

    def open_daemon_event(self, handle: bytes) -> None:
        h = check_event_handle(handle)
        try:
            self._daemon = self._torch.cuda.Event.from_ipc_handle(self.device, h)
        except RuntimeError as e:
            raise StreamOrderError(f"open the daemon's CUDA event: {e}") from e

    def wait_daemon(self, stream: Any = None) -> None:
        if self._daemon is None:
            raise StreamOrderError(
                "the daemon's event is not open: call open_daemon_event with RegisterResponse.daemon_event.handle"
            )
        self._stream(stream).wait_event(self._daemon)

    def engine_work_pending(self) -> bool:
        """True while work recorded before the engine event is still running (a query, no wait)."""
        return not self._event.query()

    def close(self) -> None:
        self._daemon = None


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_EVENT_HANDLE_BYTES)]


def _load_cudart(path: str | None) -> ctypes.CDLL:
    if path:
        names = [path]
    else:
        found = ctypes.util.find_library("cudart")
        names = ([found] if found else []) + [
            "libcudart.so",
            "libcudart.so.13",
            "libcudart.so.12",
        ]
    errors = []
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError as e:
            errors.append(f"{n}: {e}")
    raise StreamOrderError("CudartStreamOrder needs the CUDA runtime library (libcudart): " + "; ".join(errors))


class CudartStreamOrder:
    """Stream ordering through the CUDA runtime API with ctypes, for raw ``cudaStream_t`` values
    (0 is the legacy default stream). The runtime must be the one the engine's own work uses, so
    that the event lives in the same (primary) context."""

    def __init__(self, device: int = 0, library: str | None = None) -> None:
        self._rt = _load_cudart(library)
        self.device = int(device)
        self._check(self._rt.cudaSetDevice(ctypes.c_int(self.device)), "cudaSetDevice")
        ev = ctypes.c_void_p()
        self._check(
            self._rt.cudaEventCreateWithFlags(ctypes.byref(ev), ctypes.c_uint(_EVENT_FLAGS)),
            "cudaEventCreateWithFlags",
        )
        self._event = ev
        h = _Handle()
        self._check(self._rt.cudaIpcGetEventHandle(ctypes.byref(h), ev), "cudaIpcGetEventHandle")
        self._handle = check_event_handle(ctypes.string_at(ctypes.byref(h), IPC_EVENT_HANDLE_BYTES))
        self._daemon: ctypes.c_void_p | None = None

    def _check(self, code: int, call: str) -> None:
        if code != 0:
            self._rt.cudaGetErrorString.restype = ctypes.c_char_p
            msg = self._rt.cudaGetErrorString(ctypes.c_int(code))
            raise StreamOrderError(f"{call}: error {code}: {msg.decode() if msg else 'unknown'}")

    def handle(self) -> bytes:
        return self._handle

    def register_fields(self) -> dict:
        return {"handle": self._handle, "device": self.device}

    def record(self, stream: Any = None) -> None:
        self._check(
            self._rt.cudaEventRecord(self._event, ctypes.c_void_p(stream or 0)),
            "cudaEventRecord",
        )

    def open_daemon_event(self, handle: bytes) -> None:
        h = _Handle()
        ctypes.memmove(ctypes.byref(h), check_event_handle(handle), IPC_EVENT_HANDLE_BYTES)
        ev = ctypes.c_void_p()
        self._check(
            self._rt.cudaIpcOpenEventHandle(ctypes.byref(ev), h),
            "cudaIpcOpenEventHandle",
        )
        self._daemon = ev

    def wait_daemon(self, stream: Any = None) -> None:
        if self._daemon is None:
            raise StreamOrderError(
                "the daemon's event is not open: call open_daemon_event with RegisterResponse.daemon_event.handle"
            )
        self._check(
            self._rt.cudaStreamWaitEvent(ctypes.c_void_p(stream or 0), self._daemon, ctypes.c_uint(0)),
            "cudaStreamWaitEvent",
        )

    def engine_work_pending(self) -> bool:
        """True while work recorded before the engine event is still running (a query, no wait)."""
        r = self._rt.cudaEventQuery(self._event)
        if r == 600:  # cudaErrorNotReady
            return True
        self._check(r, "cudaEventQuery")
        return False

    def close(self) -> None:
        for ev in (self._daemon, self._event):
            if ev is not None and ev.value:
                self._rt.cudaEventDestroy(ev)
        self._daemon = None
        self._event = ctypes.c_void_p()


def engine_event_message(order: StreamOrder) -> Any:
    """``order``'s event as the ``CudaEvent`` message for ``RegisterRequest.engine_event``."""
    from ._pb import engine_pb2 as pb

    return pb.CudaEvent(**order.register_fields())


def daemon_event_handle(response: Any) -> bytes:
    """The daemon's event handle from a ``RegisterResponse``. A daemon that answers without one
    did not take the engine's event (one older than stream ordering): raises StreamOrderError,
    and the engine must then order by the host (synchronise before its calls)."""
    if not response.HasField("daemon_event"):
        raise StreamOrderError(
            "the daemon answered Register without daemon_event: it does not order by events; "
            "synchronise before StartLoad, WaitForSave and BindMeta instead"
        )
    return check_event_handle(response.daemon_event.handle)
