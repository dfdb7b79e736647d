"""The reference transformers engine (kvctl_engine.hf) under the stand-in TensorRT-LLM driver.

:class:`HFEngine` is the driver's Engine over kvctl_engine.hf's model and paged KV: one model
shard and one KVPool (a shared-memory file) per rank, registered with kvctl serve through the
connector as a KVCacheManagerV2 layout would be (one layer group, K and V of every layer as
regions). A request's first forward builds its transformers cache from the pages the connector
restored, and every computed token's K and V are written to its pages, so what the connector
saves is what the model computed. Tensor-parallel ranks run in threads of this process and sum
their attention outputs in rank order, as kvctl_engine.hf's TorchGroup does across processes.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import torch

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


class HFEngine:
    def __init__(self, spec: M.ModelSpec, world_size: int = 1, tokens_per_block: int = 16, slots: int = 64) -> None:
        self.spec, self.world_size, self.tokens_per_block = spec, world_size, tokens_per_block
        self.group = ThreadGroup(world_size)
        self.models, self.pools = [], []
        for r in range(world_size):
            m = M.build_model(spec, "cpu")
            tp = M.TensorParallel(world_size, r, self.group.member(r))
            M.shard_model(m, spec, tp)
            self.models.append(m)
            self.pools.append(
                KVPool(
                    spec.layers,
                    slots,
                    len(tp.kv_heads(spec)),
                    tokens_per_block,
                    spec.head_dim,
                    spec.torch_dtype,
                    torch.device("cpu"),
                )
            )
        self.slots: dict[int, list[int]] = {}
        self.caches: dict[tuple[int, int], object] = {}
        self.restored: dict[int, int] = {}  # request -> tokens its first forward took from the pages
        self.restored_pages: dict[int, list[bytes]] = {}  # request -> rank 0's restored pages, as loaded
        self.pool_threads = ThreadPoolExecutor(max_workers=world_size) if world_size > 1 else None

    def close(self) -> None:
        if self.pool_threads is not None:
            self.pool_threads.shutdown()
        for p in self.pools:
            kvmemory.remove_host_pool(p.shm)

    # --- Engine ---------------------------------------------------------------------------

    def register(self, rank: int, worker) -> None:
        p = self.pools[rank]
        base = kvmemory.add_host_pool(p.shm)
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

    def local_match(self, request) -> int:
        return 0

    def allocate(self, request, num_tokens: int) -> list[list[int]]:
        n = -(-(num_tokens + request.max_new_tokens) // self.tokens_per_block)
        got = [p.alloc(n) for p in self.pools]
        if any(g != got[0] for g in got):
            raise AssertionError(f"ranks allocated different pages: {got}")
        self.slots[request.request_id] = got[0]
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
            return int(torch.argmax(logits).item()) if end == request.prompt_len else None
        with torch.no_grad():
            out = model(
                input_ids=torch.tensor([tokens[start:end]], dtype=torch.long), past_key_values=cache, use_cache=True
            )
        store(start, end)
        return int(torch.argmax(out.logits[0, -1].float()).item())
