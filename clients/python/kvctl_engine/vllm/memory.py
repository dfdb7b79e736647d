"""vLLM's KV cache as memory and a layout kvctl serve takes.

vLLM (0.33) allocates the KV cache of a worker as one flat byte buffer and hands the connector
one view per attention layer (``register_kv_caches``): a 4-D tensor ``[B, H, N, C]`` (blocks,
KV heads, tokens of a block, and the content of a (head, token) cell: K then V, ``head_size +
head_size_v`` elements), whose strides follow the resolved ``--kv-cache-layout``
(``vllm.v1.kv_cache_layout.KVCacheLayout``: LBNHC, LBHNC, BLNHC, BLHNC, LHBNC, ...). FlashAttention
takes the default, LBNHC; vLLM's CPU backend LBHNC.

A kvctl page is one vLLM block: one layer group whose page is the regions vLLM's own Mooncake
store connector (``RankLocalStoreLayout.register_kv_caches`` and ``prepare_value_for_block``)
puts in the value of that block, in its order: per layer, in the order of the cache dict, the
layer's block when ``cache[b]`` is one dense range of bytes (its start every ``stride(0)``
bytes; the whole buffer's share of a block when a block holds every layer), else one region
per KV head; a region whose address an earlier layer already gave is not repeated. A region's
stride and size are both that block length, as in vLLM's value. So the bytes kvctl serve stores
for a block are the bytes vLLM's Mooncake store connector stores for the same chunk. One
exception: in BHLNC (heads outside layers inside a block) vLLM's value takes a whole block's
length from each head, reading into the other heads and, at the last block, past the buffer;
kvctl's page takes each head's own bytes there.

Memory: on a CUDA device the buffer's storage goes to the daemon as a CUDA IPC handle
(``kvctl_engine.ipc_handle_from_tensor``). On the host (tests, CI, machines without a GPU) the
buffer must lie in kvctl shared memory: :func:`host_kv_buffer` makes one (a sealed memfd the
daemon maps) and records it; vLLM's own CPU allocation is not shared memory and is refused.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

import kvctl_engine as kv


class KVMemoryError(kv.InvalidArgument):
    """The KV cache cannot be handed to kvctl serve."""


@dataclass
class _HostBuffer:
    shm: kv.SharedMemory
    base: int
    size: int


_host_lock = threading.Lock()
_host_buffers: list[_HostBuffer] = []


def host_kv_buffer(size: int, name: str = "kvctl-vllm-kv") -> tuple[kv.SharedMemory, torch.Tensor]:
    """A KV buffer of size bytes in kvctl shared memory, as a flat int8 tensor over its mapping
    (what vLLM's ``allocate_kv_cache`` allocates with ``torch.zeros``), recorded so that layer
    views into it register as that shared memory. Release it with :func:`release_host_kv_buffer`."""
    shm = kv.SharedMemory(size, name=name)
    buf = torch.frombuffer(shm.buf, dtype=torch.int8, count=size)
    base = ctypes.addressof(ctypes.c_char.from_buffer(shm.buf))
    with _host_lock:
        _host_buffers.append(_HostBuffer(shm, base, size))
    return shm, buf


def release_host_kv_buffer(shm: kv.SharedMemory) -> None:
    """Forgets a buffer host_kv_buffer made and closes its shared memory (no view of it may be used
    afterwards)."""
    with _host_lock:
        _host_buffers[:] = [b for b in _host_buffers if b.shm is not shm]
    shm.close()


def _host_buffer_for(start: int, end: int) -> _HostBuffer | None:
    with _host_lock:
        for b in _host_buffers:
            if b.base <= start and end <= b.base + b.size:
                return b
    return None


def _dense(t: torch.Tensor) -> bool:
    """Whether t's elements cover one gapless byte range in some dimension order."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride(), strict=True), key=lambda p: p[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def _by_block(cache: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """A layer view with vLLM's blocks as dimension 0 (kernel blocks grouped per block)."""
    if cache.dim() < 1 or cache.shape[0] < num_blocks or cache.shape[0] % num_blocks:
        raise KVMemoryError(
            f"a KV cache view of shape {tuple(cache.shape)} does not hold {num_blocks} blocks along dimension 0"
        )
    if cache.shape[0] == num_blocks:
        return cache
    return cache.unflatten(0, (num_blocks, -1))


def block_regions(
    kv_caches: Mapping[str, torch.Tensor], layer_names: Sequence[str], num_blocks: int
) -> list[tuple[int, int, int]]:
    """The (address, stride, size) of each region of a block's value, in order, as vLLM's
    RankLocalStoreLayout computes them for the layers of layer_names: block b's bytes of region i
    are [address + b * stride, + size). stride and size are vLLM's block length, except for a
    head's region in a layout whose heads are outside its layers (BHLNC), where size is the
    head's own bytes."""
    wanted = set(layer_names)
    seen: set[int] = set()
    out: list[tuple[int, int]] = []
    for name, value in kv_caches.items():
        if name not in wanted:
            continue
        t = value if isinstance(value, torch.Tensor) else value[0]
        cache = _by_block(t, num_blocks)
        storage = cache.untyped_storage()
        el = cache.element_size()
        if not _dense(cache[0]):
            if cache.dim() < 2:
                raise KVMemoryError(f"layer {name}: a block of its KV cache is not one range of bytes")
            cand = []
            for h in range(cache.shape[1]):
                head = cache[:, h]
                if not _dense(head[0]):
                    raise KVMemoryError(
                        f"layer {name}: neither a block nor a head's block of its KV cache (strides "
                        f"{tuple(cache.stride())}) is one range of bytes"
                    )
                # vLLM's value takes stride(0) bytes from each head; where heads are not
                # outside the blocks (BHLNC) that runs into the other heads and layers, and past
                # the buffer at the last block: kvctl takes the head's own bytes there.
                cand.append((head.data_ptr(), head.stride(0) * el, head[0].numel() * el))
        elif cache.stride(0) * el * num_blocks == storage.nbytes():
            n = storage.nbytes() // num_blocks
            cand = [(storage.data_ptr(), n, n)]
        else:
            n = cache.stride(0) * el
            cand = [(cache.data_ptr(), n, n)]
        for addr, stride, size in cand:
            if addr in seen:
                continue
            seen.add(addr)
            out.append((addr, stride, size))
    missing = [n for n in layer_names if n not in kv_caches]
    if missing:
        raise KVMemoryError(f"no KV cache for the layers {missing[:4]} of the KV cache group")
    if not out:
        raise KVMemoryError("the KV cache group has no layers")
    return out


@dataclass
class Registration:
    """What Rank.register takes: the layout (offsets from ``base``), the memory and its kind."""

    layout: kv.Layout
    memory: Any
    base: int
    size: int
    kind: str  # "host" or "cuda-ipc"
    device: int = -1


def registration(
    kv_caches: Mapping[str, torch.Tensor], layer_names: Sequence[str], num_blocks: int, tokens_per_block: int
) -> Registration:
    """The kvctl registration of a worker's KV caches: one layer group of num_blocks pages."""
    if num_blocks < 1 or tokens_per_block < 1:
        raise KVMemoryError(f"{num_blocks} blocks of {tokens_per_block} tokens")
    regions = block_regions(kv_caches, layer_names, num_blocks)
    first = next(v for n, v in kv_caches.items() if n in set(layer_names))
    t = first if isinstance(first, torch.Tensor) else first[0]
    lo = min(a for a, _, _ in regions)
    hi = max(a + (num_blocks - 1) * st + n for a, st, n in regions)
    if t.is_cuda:
        storage = t.untyped_storage()
        base, size = storage.data_ptr(), storage.nbytes()
        if lo < base or hi > base + size:
            raise KVMemoryError(
                "the KV caches of the group lie in more than one allocation; kvctl serve takes one "
                "(vLLM allocates one buffer per worker)"
            )
        flat = torch.empty(0, dtype=torch.uint8, device=t.device)
        flat.set_(storage, 0, (size,), (1,))
        memory: Any = kv.ipc_handle_from_tensor(flat)
        kind, device = "cuda-ipc", t.device.index
    elif t.device.type == "cpu":
        host = _host_buffer_for(lo, hi)
        if host is None:
            raise KVMemoryError(
                "the KV cache is in host memory that is not kvctl shared memory: kvctl serve maps an engine's "
                "host KV from a sealed memfd, which kvctl_engine.vllm.memory.host_kv_buffer makes"
            )
        base, size, memory, kind, device = host.base, host.size, host.shm, "host", -1
    else:
        raise KVMemoryError(f"the KV cache is on {t.device}; kvctl serve takes CUDA devices and host shared memory")
    layout = kv.Layout(
        tokens_per_block,
        [kv.LayerGroup(0, num_blocks, [kv.Region(a - base, st, n) for a, st, n in regions])],
    )
    return Registration(layout, memory, base, size, kind, device)


def block_bytes(regions: Sequence[tuple[int, int, int]], block: int) -> bytes:
    """Block's value as the regions give it (host memory only): what kvctl serve moves for it."""
    return b"".join(ctypes.string_at(a + block * st, n) for a, st, n in regions)
