"""GPU KV memory for kvctl serve: legacy CUDA IPC handles and CUDA VMM file descriptors.

Three ways to hand device memory to the daemon (RegisterRequest.memory):

* :func:`ipc_handle_from_tensor`: a PyTorch CUDA tensor's storage, through torch's own
  ``_share_cuda_`` (a 66-byte handle; the daemon accepts PyTorch's and CUDA's 64-byte form). The
  offset accounts for where the tensor starts inside the caching allocator's block.
* :func:`ipc_handle_from_pointer`: a raw ``cudaMalloc`` allocation, through libcudart's
  ``cudaIpcGetMemHandle`` (torch cannot share ``from_blob`` memory). The pointer must be the base
  of its allocation or inside it; the offset is taken from ``cuMemGetAddressRange``.
* :class:`VmmAllocation`: memory made with ``cuMemCreate`` (POSIX-descriptor shareable) and mapped
  here, exported with ``cuMemExportToShareableHandle`` as a file descriptor for
  ``Client.register_cuda_fd``.

The driver calls go through :class:`CudaRuntime` and :class:`CudaDriver` (ctypes over libcudart
and libcuda). Everything around them (argument checks, offsets, handle sizes, the order of the
VMM calls, error messages) is plain Python that takes the library object as a parameter, so the
CPU tests drive it with a stand-in library; only the ctypes calls themselves need a GPU.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass
from typing import Any, Protocol

from .errors import InvalidArgument, KvctlError

__all__ = [
    "IPC_HANDLE_SIZES",
    "CudaDriver",
    "CudaError",
    "CudaIpcMemory",
    "CudaRuntime",
    "VmmAllocation",
    "check_ipc_handle",
    "ipc_handle_from_pointer",
    "ipc_handle_from_tensor",
]

# IPC_HANDLE_SIZES are the handle lengths the daemon accepts: cudaIpcMemHandle_t (64 bytes) and
# PyTorch's serialised form (66).
IPC_HANDLE_SIZES = (64, 66)
CUDA_IPC_HANDLE_BYTES = 64


class CudaError(KvctlError):
    """A CUDA call failed; the message names the call and CUDA's error."""


def check_ipc_handle(handle: bytes) -> None:
    """Raises InvalidArgument unless handle is 64 or 66 bytes."""
    if not isinstance(handle, (bytes, bytearray, memoryview)):
        raise InvalidArgument("CUDA IPC handle: want bytes, got %s" % type(handle).__name__)
    if len(handle) not in IPC_HANDLE_SIZES:
        raise InvalidArgument(
            "CUDA IPC handle of %d bytes: want 64 (cudaIpcMemHandle_t) or 66 (PyTorch's _share_cuda_)" % len(handle)
        )


@dataclass(frozen=True)
class CudaIpcMemory:
    """Device memory as the daemon takes it over CUDA IPC: the allocation's handle, the KV's
    offset in the allocation, its size and the device ordinal."""

    handle: bytes
    offset: int
    size: int
    device: int

    def __post_init__(self) -> None:
        check_ipc_handle(self.handle)
        if self.offset < 0 or self.size <= 0:
            raise InvalidArgument("CUDA IPC memory: offset %d and size %d" % (self.offset, self.size))


def ipc_handle_from_tensor(tensor: Any) -> CudaIpcMemory:
    """The CUDA IPC memory of a contiguous CUDA tensor: its whole bytes, as registered KV."""
    if not getattr(tensor, "is_cuda", False):
        raise InvalidArgument("ipc_handle_from_tensor: the tensor is on %s, not a CUDA device" % tensor.device)
    if not tensor.is_contiguous():
        raise InvalidArgument("ipc_handle_from_tensor: the tensor is not contiguous")
    shared = tensor.untyped_storage()._share_cuda_()
    # (device, handle, storage size, storage offset in the block, ...)
    handle, storage_offset = shared[1], shared[3]
    offset = storage_offset + tensor.storage_offset() * tensor.element_size()
    return CudaIpcMemory(
        handle=bytes(handle), offset=offset, size=tensor.numel() * tensor.element_size(), device=tensor.device.index
    )


class RuntimeLib(Protocol):
    """What ipc_handle_from_pointer needs of libcudart and libcuda (CudaRuntime is the real one)."""

    def ipc_get_mem_handle(self, ptr: int) -> bytes: ...

    def address_range(self, ptr: int) -> tuple[int, int]: ...

    def pointer_device(self, ptr: int) -> int: ...


def ipc_handle_from_pointer(ptr: int, size: int, lib: RuntimeLib | None = None) -> CudaIpcMemory:
    """The CUDA IPC memory of size bytes at device pointer ptr, inside a cudaMalloc allocation.
    The handle names the whole allocation; the offset is ptr's distance from its base."""
    if ptr <= 0 or size <= 0:
        raise InvalidArgument("ipc_handle_from_pointer: pointer %#x and size %d" % (ptr, size))
    lib = lib or CudaRuntime()
    base, length = lib.address_range(ptr)
    if ptr + size > base + length:
        raise InvalidArgument(
            "ipc_handle_from_pointer: %d bytes at %#x run past the end of their allocation (%d bytes at %#x)"
            % (size, ptr, length, base)
        )
    handle = lib.ipc_get_mem_handle(base)
    if len(handle) != CUDA_IPC_HANDLE_BYTES:
        raise CudaError("cudaIpcGetMemHandle gave %d bytes, want %d" % (len(handle), CUDA_IPC_HANDLE_BYTES))
    return CudaIpcMemory(handle=handle, offset=ptr - base, size=size, device=lib.pointer_device(ptr))


def _load(names: tuple[str, ...], what: str) -> ctypes.CDLL:
    tried = []
    for n in names:
        path = ctypes.util.find_library(n) if "/" not in n and not n.startswith("lib") else n
        for cand in filter(None, [path, n]):
            try:
                return ctypes.CDLL(cand)
            except OSError as e:
                tried.append("%s (%s)" % (cand, e))
    raise CudaError("cannot load %s: tried %s" % (what, "; ".join(tried) or ", ".join(names)))


def _torch_lib_dirs() -> list[str]:
    """Where a pip-installed PyTorch keeps the CUDA runtime (nvidia-cuda-runtime wheels)."""
    out = []
    try:
        import nvidia  # type: ignore[import-not-found]

        for root in getattr(nvidia, "__path__", []):
            for dirpath, _, files in os.walk(root):
                out.extend(os.path.join(dirpath, f) for f in files if f.startswith("libcudart.so"))
    except ImportError:
        pass
    return out


class CudaRuntime:
    """libcudart and libcuda through ctypes: the calls ipc_handle_from_pointer makes."""

    def __init__(self, cudart: ctypes.CDLL | None = None, cuda: ctypes.CDLL | None = None) -> None:
        names = ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "cudart", *_torch_lib_dirs())
        self.rt = cudart or _load(names, "the CUDA runtime (libcudart)")
        self.drv = cuda or _load(("libcuda.so.1", "libcuda.so", "cuda"), "the CUDA driver (libcuda)")

    def _check_rt(self, call: str, rc: int) -> None:
        if rc != 0:
            self.rt.cudaGetErrorString.restype = ctypes.c_char_p
            msg = self.rt.cudaGetErrorString(rc) or b"?"
            raise CudaError("%s: CUDA error %d: %s" % (call, rc, msg.decode()))

    def ipc_get_mem_handle(self, ptr: int) -> bytes:
        buf = (ctypes.c_char * CUDA_IPC_HANDLE_BYTES)()
        self._check_rt("cudaIpcGetMemHandle", self.rt.cudaIpcGetMemHandle(buf, ctypes.c_void_p(ptr)))
        return bytes(buf)

    def address_range(self, ptr: int) -> tuple[int, int]:
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        rc = self.drv.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
        _check_drv(self.drv, "cuMemGetAddressRange", rc)
        return base.value, size.value

    def pointer_device(self, ptr: int) -> int:
        dev = ctypes.c_int()
        # CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
        rc = self.drv.cuPointerGetAttribute(ctypes.byref(dev), 9, ctypes.c_uint64(ptr))
        _check_drv(self.drv, "cuPointerGetAttribute", rc)
        return dev.value


def _check_drv(drv: Any, call: str, rc: int) -> None:
    if rc != 0:
        s = ctypes.c_char_p()
        try:
            drv.cuGetErrorString(rc, ctypes.byref(s))
        except Exception:  # noqa: BLE001 - only the message is at stake
            pass
        raise CudaError("%s: CUDA error %d: %s" % (call, rc, (s.value or b"?").decode()))


# CUmemAllocationProp (cuda.h), for pinned device memory shareable as a POSIX descriptor.
class _AllocProp(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),  # CU_MEM_ALLOCATION_TYPE_PINNED = 1
        ("requestedHandleTypes", ctypes.c_int),  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
        ("locType", ctypes.c_int),  # CU_MEM_LOCATION_TYPE_DEVICE = 1
        ("locId", ctypes.c_int),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("locType", ctypes.c_int), ("locId", ctypes.c_int), ("flags", ctypes.c_int)]


class DriverLib(Protocol):
    """The CUDA driver calls VmmAllocation makes (CudaDriver is the real one)."""

    def granularity(self, device: int) -> int: ...

    def create(self, size: int, device: int) -> int: ...

    def export_fd(self, handle: int) -> int: ...

    def reserve(self, size: int, alignment: int) -> int: ...

    def map(self, ptr: int, size: int, handle: int) -> None: ...

    def set_access(self, ptr: int, size: int, device: int) -> None: ...

    def unmap(self, ptr: int, size: int) -> None: ...

    def free_address(self, ptr: int, size: int) -> None: ...

    def release(self, handle: int) -> None: ...


class CudaDriver:
    """libcuda's virtual memory management calls through ctypes."""

    def __init__(self, cuda: ctypes.CDLL | None = None) -> None:
        self.drv = cuda or _load(("libcuda.so.1", "libcuda.so", "cuda"), "the CUDA driver (libcuda)")
        _check_drv(self.drv, "cuInit", self.drv.cuInit(0))

    @staticmethod
    def _prop(device: int) -> _AllocProp:
        p = _AllocProp()
        p.type, p.requestedHandleTypes, p.locType, p.locId = 1, 1, 1, device
        return p

    def granularity(self, device: int) -> int:
        g = ctypes.c_size_t()
        prop = self._prop(device)
        # CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0
        _check_drv(
            self.drv,
            "cuMemGetAllocationGranularity",
            self.drv.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(prop), 0),
        )
        return g.value

    def create(self, size: int, device: int) -> int:
        h = ctypes.c_uint64()
        prop = self._prop(device)
        _check_drv(
            self.drv,
            "cuMemCreate",
            self.drv.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(prop), ctypes.c_uint64(0)),
        )
        return h.value

    def export_fd(self, handle: int) -> int:
        fd = ctypes.c_int(-1)
        # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
        rc = self.drv.cuMemExportToShareableHandle(ctypes.byref(fd), ctypes.c_uint64(handle), 1, ctypes.c_uint64(0))
        _check_drv(self.drv, "cuMemExportToShareableHandle", rc)
        return fd.value

    def reserve(self, size: int, alignment: int) -> int:
        p = ctypes.c_uint64()
        rc = self.drv.cuMemAddressReserve(
            ctypes.byref(p), ctypes.c_size_t(size), ctypes.c_size_t(alignment), ctypes.c_uint64(0), ctypes.c_uint64(0)
        )
        _check_drv(self.drv, "cuMemAddressReserve", rc)
        return p.value

    def map(self, ptr: int, size: int, handle: int) -> None:
        rc = self.drv.cuMemMap(
            ctypes.c_uint64(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_uint64(handle), ctypes.c_uint64(0)
        )
        _check_drv(self.drv, "cuMemMap", rc)

    def set_access(self, ptr: int, size: int, device: int) -> None:
        # CU_MEM_LOCATION_TYPE_DEVICE = 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
        d = _AccessDesc(1, device, 3)
        _check_drv(
            self.drv,
            "cuMemSetAccess",
            self.drv.cuMemSetAccess(ctypes.c_uint64(ptr), ctypes.c_size_t(size), ctypes.byref(d), ctypes.c_size_t(1)),
        )

    def unmap(self, ptr: int, size: int) -> None:
        _check_drv(self.drv, "cuMemUnmap", self.drv.cuMemUnmap(ctypes.c_uint64(ptr), ctypes.c_size_t(size)))

    def free_address(self, ptr: int, size: int) -> None:
        _check_drv(self.drv, "cuMemAddressFree", self.drv.cuMemAddressFree(ctypes.c_uint64(ptr), ctypes.c_size_t(size)))

    def release(self, handle: int) -> None:
        _check_drv(self.drv, "cuMemRelease", self.drv.cuMemRelease(ctypes.c_uint64(handle)))


class VmmAllocation:
    """Device memory made with cuMemCreate (shareable as a POSIX descriptor), mapped read-write
    at ``ptr`` in this process and exported as ``fd`` for Client.register_cuda_fd. size is
    rounded up to the allocation granularity. The current CUDA context must be on device (torch
    makes one with ``torch.cuda.init()``). Close unmaps, releases and closes the descriptor."""

    def __init__(self, size: int, device: int = 0, lib: DriverLib | None = None) -> None:
        if size <= 0:
            raise InvalidArgument("VmmAllocation: size must be positive, got %d" % size)
        self.lib: DriverLib = lib or CudaDriver()
        g = self.lib.granularity(device)
        if g <= 0:
            raise CudaError("cuMemGetAllocationGranularity gave %d" % g)
        self.size = (size + g - 1) // g * g
        self.device = device
        self.handle = self.lib.create(self.size, device)
        self.ptr = 0
        self.fd = -1
        try:
            self.fd = self.lib.export_fd(self.handle)
            self.ptr = self.lib.reserve(self.size, g)
            self.lib.map(self.ptr, self.size, self.handle)
            self.lib.set_access(self.ptr, self.size, device)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.ptr:
            try:
                self.lib.unmap(self.ptr, self.size)
            except CudaError:
                pass  # not mapped yet: reserve succeeded, map did not
            self.lib.free_address(self.ptr, self.size)
            self.ptr = 0
        if self.handle:
            self.lib.release(self.handle)
            self.handle = 0
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
