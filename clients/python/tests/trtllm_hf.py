"""The reference transformers engine (kvctl_engine.hf) under the stand-in TensorRT-LLM driver.

:class:`HFEngine` is the driver's Engine over kvctl_engine.hf's model and paged KV: one model
shard and one KVPool (a shared-memory file) per rank, registered with kvctl serve through the
connector as a KVCacheManagerV2 layout would be (one layer group, K and V of every layer as
regions). A request's first forward builds its transformers cache from the pages the connector
restored, and every computed token's K and V are written to its pages, so what the connector
saves is what the model computed. Tensor-parallel ranks run in threads of this process and sum
their attention outputs in rank order, as kvctl_engine.hf's TorchGroup does across processes.

On a GPU (``device="cuda"``, ``v1=True``) each rank's pool is what KVCacheManagerV1 hands
``register_kv_caches``: one raw ``cudaMalloc`` allocation (:class:`RawCudaAlloc`) viewed as a
tensor torch did not allocate (``for_blob`` in TensorRT-LLM; here ``__cuda_array_interface__``),
block i being ``tensor[i]``; torch cannot share it, so the shim exports it with
``cudaIpcGetMemHandle``.

With ``v2=True`` (GPU only) each rank's pool is what KVCacheManagerV2 registers with
``register_kv_cache_layout``: one ``cuMemCreate`` chunk (:class:`VmmAlloc`, made with the CUDA
driver through ctypes, its handle type a POSIX file descriptor or, with ``exportable=False``,
none), mapped and viewed as the same (layers, 2, slots, ...) pages as :class:`KVPool`; the shim
exports the chunk as a descriptor.
"""

from __future__ import annotations

import ctypes
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from kvctl_engine import cuda as kcuda
from kvctl_engine.hf import model as M
from kvctl_engine.hf.pages import KVPool
from kvctl_engine.trtllm import memory as kvmemory
from kvctl_engine.trtllm import standin


class ThreadGroup:
    """all_reduce over ranks that are threads of one process; sums in rank order."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.barrier = threading.Barrier(n)
        self.parts: list[torch.Tensor | None] = [None] * n

    def member(self, rank: int):
        def all_reduce(t: torch.Tensor) -> None:
            if self.n == 1:
                return
            self.parts[rank] = t.clone()
            self.barrier.wait()
            total = self.parts[0].clone()
            for p in self.parts[1:]:
                total += p
            self.barrier.wait()
            t.copy_(total)

        return all_reduce


class RawCudaAlloc:
    """device memory from ``cudaMalloc`` itself, outside PyTorch's caching allocator, exposed
    through ``__cuda_array_interface__`` so torch.as_tensor wraps it without owning it."""

    def __init__(self, size: int, device: int) -> None:
        self.rt = kcuda.CudaRuntime()
        torch.cuda.set_device(device)
        ptr = ctypes.c_void_p()
        rc = self.rt.rt.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(size))
        if rc != 0:
            raise RuntimeError(f"cudaMalloc({size}): CUDA error {rc}")
        self.ptr, self.size = int(ptr.value), size
        self.__cuda_array_interface__ = {
            "shape": (size,),
            "typestr": "|u1",
            "data": (self.ptr, False),
            "version": 3,
            "strides": None,
        }

    def free(self) -> None:
        if self.ptr:
            self.rt.rt.cudaFree(ctypes.c_void_p(self.ptr))
            self.ptr = 0


class V1CudaPool(KVPool):
    """A KVPool over one raw cudaMalloc allocation laid out as KVCacheManagerV1's primary pool:
    ``v1[block]`` holds every layer's K and V of the block (layer-major, K before V), the same
    bytes in the same order as the V2 regions of :class:`KVPool`. ``pages`` is the
    (layers, 2, slots, ...) view KVPool's methods use."""

    def __init__(
        self,
        layers: int,
        slots: int,
        kv_heads: int,
        T: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.layers, self.slots, self.kv_heads = layers, slots, kv_heads
        self.T, self.head_dim, self.dtype, self.device = T, head_dim, dtype, device
        elsize = torch.empty((), dtype=dtype).element_size()
        self.piece = kv_heads * T * head_dim * elsize
        self.size = 2 * layers * slots * self.piece
        self.page_bytes = 2 * layers * self.piece
        self.shm = None
        self.blob = RawCudaAlloc(self.size, device.index or 0)
        self.raw = torch.as_tensor(self.blob, device=device)
        self.v1 = self.raw.view(dtype).view(slots, layers, 2, kv_heads, T, head_dim)
        self.pages = self.v1.permute(1, 2, 0, 3, 4, 5)
        self.free = list(range(slots - 1, -1, -1))
        self.host_sync = True

    def close(self) -> None:
        self.sync()
        del self.pages, self.raw, self.v1
        self.blob.free()


class _Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Loc), ("flags", ctypes.c_int)]


class VmmAlloc:
    """device memory from ``cuMemCreate`` (the CUDA driver's virtual memory management, as
    KVCacheManagerV2 allocates its pool), reserved, mapped and made read-write on ``device``;
    its size rounded up to the allocation granularity. With ``exportable`` the chunk is created
    with the POSIX file-descriptor handle type, else with none (not exportable)."""

    _PINNED, _DEVICE, _POSIX_FD, _READWRITE = 1, 1, 0x1, 3

    def __init__(self, size: int, device: int, *, exportable: bool = True) -> None:
        torch.cuda.set_device(device)
        torch.cuda.init()
        torch.empty(1, device=f"cuda:{device}")  # the primary context, current on this thread
        self.lib = ctypes.CDLL("libcuda.so.1")
        prop = kvmemory._Prop()
        prop.type = self._PINNED
        prop.requestedHandleTypes = self._POSIX_FD if exportable else 0
        prop.location_type, prop.location_id = self._DEVICE, device
        gran = ctypes.c_size_t()
        self._check(
            "cuMemGetAllocationGranularity",
            self.lib.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0),
        )
        self.size = -(-size // gran.value) * gran.value
        self.handle = ctypes.c_uint64()
        self._check(
            "cuMemCreate",
            self.lib.cuMemCreate(
                ctypes.byref(self.handle),
                ctypes.c_size_t(self.size),
                ctypes.byref(prop),
                ctypes.c_uint64(0),
            ),
        )
        ptr = ctypes.c_uint64()
        self._check(
            "cuMemAddressReserve",
            self.lib.cuMemAddressReserve(
                ctypes.byref(ptr),
                ctypes.c_size_t(self.size),
                ctypes.c_size_t(0),
                ctypes.c_uint64(0),
                ctypes.c_uint64(0),
            ),
        )
        self.ptr = ptr.value
        self._check(
            "cuMemMap",
            self.lib.cuMemMap(
                ctypes.c_uint64(self.ptr),
                ctypes.c_size_t(self.size),
                ctypes.c_size_t(0),
                self.handle,
                ctypes.c_uint64(0),
            ),
        )
        desc = _AccessDesc(_Loc(self._DEVICE, device), self._READWRITE)
        self._check(
            "cuMemSetAccess",
            self.lib.cuMemSetAccess(
                ctypes.c_uint64(self.ptr),
                ctypes.c_size_t(self.size),
                ctypes.byref(desc),
                ctypes.c_size_t(1),
            ),
        )
        self.__cuda_array_interface__ = {
            "shape": (self.size,),
            "typestr": "|u1",
            "data": (self.ptr, False),
            "version": 3,
            "strides": None,
        }

    @staticmethod
    def _check(call: str, rc: int) -> None:
        if rc != 0:
            raise RuntimeError(f"{call}: CUresult {rc}")

    def free(self) -> None:
        if self.ptr:
            torch.cuda.synchronize()
            self.lib.cuMemUnmap(ctypes.c_uint64(self.ptr), ctypes.c_size_t(self.size))
            self.lib.cuMemRelease(self.handle)
            self.lib.cuMemAddressFree(ctypes.c_uint64(self.ptr), ctypes.c_size_t(self.size))
            self.ptr = 0


class V2CudaPool(KVPool):
    """A KVPool over one cuMemCreate chunk: the same (layers, 2, slots, ...) pages as
    :class:`KVPool`, registered as a KVCacheManagerV2 layout (one region a layer's K or V)."""

    def __init__(
        self,
        layers: int,
        slots: int,
        kv_heads: int,
        T: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        *,
        exportable: bool = True,
    ) -> None:
        self.layers, self.slots, self.kv_heads = layers, slots, kv_heads
        self.T, self.head_dim, self.dtype, self.device = T, head_dim, dtype, device
        elsize = torch.empty((), dtype=dtype).element_size()
        self.piece = kv_heads * T * head_dim * elsize
        self.size = 2 * layers * slots * self.piece
        self.page_bytes = 2 * layers * self.piece
        self.shm = None
        self.blob = VmmAlloc(self.size, device.index or 0, exportable=exportable)
        self.raw = torch.as_tensor(self.blob, device=device)[: self.size]
        self.pages = self.raw.view(dtype).view(layers, 2, slots, kv_heads, T, head_dim)
        self.free = list(range(slots - 1, -1, -1))
        self.host_sync = True

    def close(self) -> None:
        self.sync()
        del self.pages, self.raw
        self.blob.free()


class HFEngine:
    def __init__(
        self,
        spec: M.ModelSpec,
        world_size: int = 1,
        tokens_per_block: int = 16,
        slots: int = 64,
        *,
        device: str = "cpu",
        v1: bool = False,
        v2: bool = False,
        exportable: bool = True,
    ) -> None:
        self.spec, self.world_size, self.tokens_per_block = (
            spec,
            world_size,
            tokens_per_block,
        )
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if v1 and self.device.type != "cuda":
            raise ValueError("the V1 pool is a cudaMalloc allocation: it needs device cuda")
        if v2 and self.device.type != "cuda":
            raise ValueError("the V2 GPU pool is a cuMemCreate chunk: it needs device cuda")
        self.v1, self.v2 = v1, v2
        self.group = ThreadGroup(world_size)
        self.models, self.pools = [], []
        for r in range(world_size):
            m = M.build_model(spec, self.device)
            tp = M.TensorParallel(world_size, r, self.group.member(r))
            M.shard_model(m, spec, tp)
            self.models.append(m)
            shape = (
                spec.layers,
                slots,
                len(tp.kv_heads(spec)),
                tokens_per_block,
                spec.head_dim,
                spec.torch_dtype,
                self.device,
            )
            if v1:
                self.pools.append(V1CudaPool(*shape))
            elif v2:
                self.pools.append(V2CudaPool(*shape, exportable=exportable))
            else:
                self.pools.append(KVPool(*shape))
        self.slots: dict[int, list[int]] = {}
        self.caches: dict[tuple[int, int], object] = {}
        self.restored: dict[int, int] = {}  # request -> tokens its first forward took from the pages
        self.restored_pages: dict[int, list[bytes]] = {}  # request -> rank 0's restored pages, as loaded
        self.allocated: dict[int, list[int]] = {}  # request -> its pages, kept after release
        self.first_logits: dict[int, torch.Tensor] = {}  # request -> rank 0's logits of its first token
        self.alter_restored: set[int] = set()  # negative control: change a restored page of these
        self.pool_threads = ThreadPoolExecutor(max_workers=world_size) if world_size > 1 else None

    def close(self) -> None:
        if self.pool_threads is not None:
            self.pool_threads.shutdown()
        for p in self.pools:
            if p.shm is not None:
                kvmemory.remove_host_pool(p.shm)
            else:
                p.close()

    # --- Engine ---------------------------------------------------------------------------

    def register(self, rank: int, worker) -> None:
        p = self.pools[rank]
        if self.v1:
            worker.register_kv_caches(p.v1)
            # Ordered by CUDA events when the shim registered them: no device syncs around calls.
            p.host_sync = worker._rank.stream_order is None
            return
        base = p.blob.ptr if self.v2 else kvmemory.add_host_pool(p.shm)
        regions = tuple(
            standin.KvCacheRegion(
                base=base + i * p.slots * p.piece,
                size=p.piece,
                stride=p.piece,
                num_slots=p.slots,
                buffers=(standin.KvCacheBufferRef(i // 2, "key" if i % 2 == 0 else "value"),),
            )
            for i in range(2 * p.layers)
        )
        group = standin.KvCacheLayerGroupLayout(0, tuple(range(p.layers)), None, regions)
        worker.register_kv_cache_layout(standin.KvCacheLayout(self.tokens_per_block, (group,)))
        if self.v2:
            p.host_sync = worker._rank.stream_order is None

    def local_match(self, request) -> int:
        return 0

    def allocate(self, request, num_tokens: int) -> list[list[int]]:
        n = -(-(num_tokens + request.max_new_tokens) // self.tokens_per_block)
        got = [p.alloc(n) for p in self.pools]
        if any(g != got[0] for g in got):
            raise AssertionError(f"ranks allocated different pages: {got}")
        self.slots[request.request_id] = got[0]
        self.allocated[request.request_id] = list(got[0])
        return [list(got[0])]

    def release(self, request) -> None:
        slots = self.slots.pop(request.request_id, None)
        if slots is not None:
            for p in self.pools:
                p.release(slots)
        for r in range(self.world_size):
            self.caches.pop((request.request_id, r), None)

    def num_layers(self) -> int:
        return self.spec.layers

    def forward_all(self, request, start: int, end: int) -> list[int | None]:
        if self.pool_threads is None:
            return [self._forward(0, request, start, end)]
        futs = [self.pool_threads.submit(self._forward, r, request, start, end) for r in range(self.world_size)]
        return [f.result() for f in futs]

    def _forward(self, rank: int, request, start: int, end: int) -> int | None:
        T, pool, model = self.tokens_per_block, self.pools[rank], self.models[rank]
        slots = self.slots[request.request_id]
        key = (request.request_id, rank)
        cache = self.caches.get(key)
        if cache is None:
            if start and request.request_id in self.alter_restored:
                pool.alter(slots[start // T - 1])  # the last restored block
            if start % T:
                raise AssertionError(f"request {request.request_id} starts at {start}, inside a block")
            cache = M.cache_from_kv(model, pool.read_blocks(slots[: start // T])) if start else M.new_cache(model)
            self.caches[key] = cache
            if rank == 0:
                self.restored[request.request_id] = start
                self.restored_pages[request.request_id] = [pool.page_bytes_of(s) for s in slots[: start // T]]
            restored = pool.pages[:, :, slots[: start // T]]
            if torch.isnan(restored).any():
                raise AssertionError(f"request {request.request_id}: a restored page still holds the pool's poison")

        def store(begin: int, stop: int) -> None:
            for b in range(begin // T, -(-stop // T)):
                lo, hi = max(begin, b * T), min(stop, (b + 1) * T)
                for layer in range(self.spec.layers):
                    k, v = M.layer_kv(cache, layer, lo, hi)
                    pool.pages[layer, 0, slots[b], :, lo - b * T : hi - b * T].copy_(k)
                    pool.pages[layer, 1, slots[b], :, lo - b * T : hi - b * T].copy_(v)

        tokens = request.tokens
        if end <= request.prompt_len:
            logits = M.prefill(model, cache, tokens[:end], start, T, on_chunk=store)
            if end != request.prompt_len:
                return None
            if rank == 0:
                self.first_logits[request.request_id] = logits.float().cpu()
            return int(torch.argmax(logits).item())
        with torch.no_grad():
            out = model(
                input_ids=torch.tensor([tokens[start:end]], dtype=torch.long, device=self.device),
                past_key_values=cache,
                use_cache=True,
            )
        store(start, end)
        return int(torch.argmax(out.logits[0, -1].float()).item())
