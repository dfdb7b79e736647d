"""The KV pool TensorRT-LLM hands a connector, as memory and a layout kvctl serve takes.

* KVCacheManagerV1 hands ``register_kv_caches`` one tensor over its pool: a ``cudaMalloc``
  allocation wrapped by ``for_blob``, which torch cannot share, so the pool goes to the daemon as
  a CUDA IPC handle of the allocation's base (``kvctl_engine.ipc_handle_from_pointer``). Block
  ``i`` is ``tensor[i]``: one layer group, one region per slot.
* KVCacheManagerV2 hands ``register_kv_cache_layout`` a ``KvCacheLayout``: groups of regions,
  each at ``base + stride * slot`` for ``size`` bytes. Its pools are ``cuMemCreate`` chunks; one
  whose handle type allows it is exported with ``cuMemExportToShareableHandle`` as a file
  descriptor, and any other pool is refused with an error that names the setting giving an
  exportable one (``use_kv_cache_manager_v2: false``).
* Host memory: an engine without a GPU (the stand-in driver's engines, the CPU tests) keeps its
  pool in a :class:`kvctl_engine.SharedMemory` and records it with :func:`add_host_pool`;
  addresses inside it register as that shared memory.

Region offsets in the kvctl layout are taken from the lowest address any region starts at,
which is where the registered memory begins.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any

import kvctl_engine as kv

#: The TensorRT-LLM setting that gives a pool kvctl serve can share when V2's cannot be exported.
EXPORTABLE_SETTING = "use_kv_cache_manager_v2: false (KVCacheManagerV1's cudaMalloc pool is shared by CUDA IPC)"


class MemoryError_(kv.InvalidArgument):
    """The KV pool cannot be handed to kvctl serve."""


@dataclass
class _HostPool:
    shm: Any
    base: int
    size: int


_host_lock = threading.Lock()
_host_pools: list[_HostPool] = []


def address_of(shm: Any) -> int:
    """The address of a SharedMemory's mapping in this process."""
    return ctypes.addressof(ctypes.c_char.from_buffer(shm.buf))


def add_host_pool(shm: Any) -> int:
    """Record a SharedMemory that holds a KV pool; returns its address."""
    base = address_of(shm)
    with _host_lock:
        _host_pools.append(_HostPool(shm, base, shm.size))
    return base


def remove_host_pool(shm: Any) -> None:
    with _host_lock:
        _host_pools[:] = [p for p in _host_pools if p.shm is not shm]


def _host_pool_for(start: int, end: int) -> _HostPool | None:
    with _host_lock:
        for p in _host_pools:
            if p.base <= start and end <= p.base + p.size:
                return p
    return None


@dataclass
class Registration:
    """What Rank.register takes: the layout (offsets from ``base``) and the memory."""

    layout: kv.Layout
    memory: Any
    base: int
    span: int
    kind: str  # "host", "cuda-ipc" or "cuda-fd"


def _span(groups) -> tuple[int, int]:
    start, end = None, 0
    for g in groups:
        for r in tuple(g.regions) + tuple(getattr(g, "replicated_regions", ())):
            if r.num_slots < 1 or r.size < 1 or r.stride < r.size:
                raise MemoryError_(
                    f"layer group {g.layer_group_id}: region of {r.size} bytes every {r.stride} over {r.num_slots} slots"
                )
            lo, hi = r.base, r.base + r.stride * (r.num_slots - 1) + r.size
            start = lo if start is None else min(start, lo)
            end = max(end, hi)
    if start is None:
        raise MemoryError_("the KV cache layout has no regions")
    return start, end


def from_layout(layout: Any, *, cuda: Any = None) -> Registration:
    """A V2 KvCacheLayout as a kvctl layout and memory."""
    if not layout.groups:
        raise MemoryError_("the KV cache layout has no layer groups")
    for g in layout.groups:
        if getattr(g, "window_size", None) is not None:
            raise MemoryError_(
                f"layer group {g.layer_group_id} has a sliding window of {g.window_size} tokens; "
                "kvctl serve refuses sliding-window layers (a page the window passed holds no KV)"
            )
    start, end = _span(layout.groups)
    groups = []
    for g in sorted(layout.groups, key=lambda g: g.layer_group_id):
        slots = {r.num_slots for r in tuple(g.regions) + tuple(g.replicated_regions)}
        if len(slots) != 1:
            raise MemoryError_(f"layer group {g.layer_group_id}: regions disagree on the slot count {sorted(slots)}")
        groups.append(
            kv.LayerGroup(
                g.layer_group_id,
                slots.pop(),
                [kv.Region(r.base - start, r.stride, r.size) for r in g.regions],
                [kv.Region(r.base - start, r.stride, r.size) for r in g.replicated_regions],
            )
        )
    mem, kind = _memory(start, end - start, cuda, v2=True)
    return Registration(kv.Layout(layout.tokens_per_block, groups), mem, start, end - start, kind)


def from_tensor(tensor: Any, tokens_per_block: int, *, cuda: Any = None) -> Registration:
    """A V1 pool tensor (block i is tensor[i]) as a kvctl layout and memory."""
    if tensor.dim() < 1 or tensor.shape[0] < 1:
        raise MemoryError_(f"the KV pool tensor has shape {tuple(tensor.shape)}; want blocks along dimension 0")
    if not tensor.is_contiguous():
        raise MemoryError_("the KV pool tensor is not contiguous")
    slots = int(tensor.shape[0])
    page = tensor[0].numel() * tensor.element_size()
    start = tensor.data_ptr()
    layout = kv.Layout(tokens_per_block, [kv.LayerGroup(0, slots, [kv.Region(0, page, page)])])
    mem, kind = _memory(start, slots * page, cuda, v2=False, tensor=tensor)
    return Registration(layout, mem, start, slots * page, kind)


def _memory(start: int, size: int, cuda: Any, *, v2: bool, tensor: Any = None) -> tuple[Any, str]:
    host = _host_pool_for(start, start + size)
    if host is not None:
        if start != host.base:
            # The daemon maps the whole shared-memory file; the layout's offsets count from its start.
            raise MemoryError_(
                f"the KV pool starts {start - host.base} bytes into its shared memory; "
                "register the pool from the start of the file"
            )
        return host.shm, "host"
    if tensor is not None and not getattr(tensor, "is_cuda", False):
        raise MemoryError_(
            f"the KV pool tensor is on {tensor.device}, which is neither a CUDA device nor "
            "host memory recorded with kvctl_engine.trtllm.memory.add_host_pool"
        )
    if not v2:
        return kv.ipc_handle_from_pointer(start, size, cuda), "cuda-ipc"
    return _vmm_fd(start, size, cuda), "cuda-fd"


# CUDA driver constants (cuda.h).
_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1


class _Prop(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location_type", ctypes.c_int),
        ("location_id", ctypes.c_int),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class VmmDriver:
    """The libcuda calls exporting a V2 pool (retain its handle, read its handle types, export)."""

    def __init__(self, lib: Any = None) -> None:
        self.lib = lib or ctypes.CDLL("libcuda.so.1")

    def _check(self, call: str, rc: int) -> None:
        if rc != 0:
            raise MemoryError_(f"{call} failed with CUresult {rc}")

    def address_range(self, ptr: int) -> tuple[int, int]:
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        self._check(
            "cuMemGetAddressRange",
            self.lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr)),
        )
        return base.value, size.value

    def retain(self, ptr: int) -> int:
        h = ctypes.c_uint64()
        self._check(
            "cuMemRetainAllocationHandle", self.lib.cuMemRetainAllocationHandle(ctypes.byref(h), ctypes.c_void_p(ptr))
        )
        return h.value

    def handle_types(self, handle: int) -> int:
        p = _Prop()
        self._check(
            "cuMemGetAllocationPropertiesFromHandle",
            self.lib.cuMemGetAllocationPropertiesFromHandle(ctypes.byref(p), ctypes.c_uint64(handle)),
        )
        return p.requestedHandleTypes

    def export_fd(self, handle: int) -> int:
        fd = ctypes.c_int()
        self._check(
            "cuMemExportToShareableHandle",
            self.lib.cuMemExportToShareableHandle(
                ctypes.byref(fd), ctypes.c_uint64(handle), _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, ctypes.c_uint64(0)
            ),
        )
        return fd.value

    def release(self, handle: int) -> None:
        self.lib.cuMemRelease(ctypes.c_uint64(handle))

    def device(self, ptr: int) -> int:
        import torch

        return torch.cuda.current_device()


def _vmm_fd(start: int, size: int, drv: Any) -> Any:
    drv = drv if drv is not None and hasattr(drv, "retain") else VmmDriver()
    base, length = drv.address_range(start)
    if start + size > base + length:
        raise MemoryError_(
            f"the KVCacheManagerV2 pool spans {size} bytes from {start:#x}, but its first cuMemCreate chunk maps only "
            f"{base + length - start} of them; kvctl serve takes one exportable allocation. Set {EXPORTABLE_SETTING}"
        )
    if start != base:
        raise MemoryError_(
            f"the KVCacheManagerV2 pool starts {start - base} bytes into its cuMemCreate chunk; "
            f"kvctl serve maps the chunk from its start. Set {EXPORTABLE_SETTING}"
        )
    handle = drv.retain(start)
    try:
        if not drv.handle_types(handle) & _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR:
            raise MemoryError_(
                "the KVCacheManagerV2 pool was created without a POSIX file-descriptor handle type, so it cannot be "
                f"exported to kvctl serve. Set {EXPORTABLE_SETTING}"
            )
        fd = drv.export_fd(handle)
    finally:
        drv.release(handle)
    # The daemon imports and maps the whole chunk: cuMemCreate sizes are multiples of the
    # allocation granularity, which cuMemMap requires; the layout's regions lie inside it.
    return kv.CudaFdMemory(fd=fd, size=length, device=drv.device(start))
