"""Engines for the stand-in driver in the TensorRT-LLM connector tests.

:class:`PageEngine` keeps each rank's KV pool in a shared-memory file, registered with kvctl
serve through the connector exactly as a GPU pool would be (a V2 ``KvCacheLayout`` or a V1 pool
tensor). The KV of a token is 16 bytes derived from the rank, the token's position and every
token up to it, so a page holds the right bytes only if it was computed from the same prefix or
restored from a page that was. Before computing, the forward pass checks every page it reads and
fails on any wrong byte; the next token is then derived from the prefix, so a run with restored
pages produces the same tokens as a cold run only if every restored byte was right.
"""

from __future__ import annotations

import hashlib

import torch

import kvctl_engine as kv
from kvctl_engine.trtllm import memory as kvmemory
from kvctl_engine.trtllm import standin

TOKEN_BYTES = 16


class KVMismatch(AssertionError):
    pass


def token_kv(rank: int, tokens: list[int], pos: int) -> bytes:
    h = hashlib.blake2b(digest_size=TOKEN_BYTES)
    h.update(rank.to_bytes(4, "little"))
    h.update(pos.to_bytes(8, "little"))
    for t in tokens[: pos + 1]:
        h.update(int(t).to_bytes(8, "little", signed=True))
    return h.digest()


class PageEngine:
    def __init__(
        self,
        world_size: int = 1,
        tokens_per_block: int = 4,
        slots: int = 64,
        *,
        v2: bool = True,
        token_bytes: int = TOKEN_BYTES,
    ) -> None:
        self.world_size = world_size
        self.tokens_per_block = tokens_per_block
        self.slots = slots
        self.v2 = v2
        self.token_bytes = token_bytes  # the first TOKEN_BYTES carry the KV; the rest pads pages to size
        self.page_bytes = tokens_per_block * token_bytes
        self.pools = [kv.SharedMemory(slots * self.page_bytes, name=f"trtllm-test-r{r}") for r in range(world_size)]
        self.free = list(range(slots))
        self.pages: dict[int, list[int]] = {}
        self.restored_tokens: dict[int, int] = {}
        self.computed_tokens: dict[int, int] = {}
        self.checked_bytes = 0

    def close(self) -> None:
        for p in self.pools:
            kvmemory.remove_host_pool(p)

    # --- Engine ---------------------------------------------------------------------------

    def register(self, rank: int, worker) -> None:
        shm = self.pools[rank]
        base = kvmemory.add_host_pool(shm)
        if self.v2:
            region = standin.KvCacheRegion(
                base=base,
                size=self.page_bytes,
                stride=self.page_bytes,
                num_slots=self.slots,
                buffers=(standin.KvCacheBufferRef(0, "key"),),
            )
            layout = standin.KvCacheLayout(
                self.tokens_per_block, (standin.KvCacheLayerGroupLayout(0, (0,), None, (region,)),)
            )
            worker.register_kv_cache_layout(layout)
        else:
            t = torch.frombuffer(shm.buf, dtype=torch.uint8).view(self.slots, self.page_bytes)
            worker.register_kv_caches(t)

    def local_match(self, request) -> int:
        return 0

    def allocate(self, request, num_tokens: int) -> list[list[int]]:
        need = -(-(num_tokens + request.max_new_tokens) // self.tokens_per_block)
        if need > len(self.free):
            raise RuntimeError(f"pool exhausted: {need} pages wanted, {len(self.free)} free")
        pages, self.free = self.free[:need], self.free[need:]
        self.pages[request.request_id] = pages
        return [pages]

    def release(self, request) -> None:
        self.free.extend(self.pages.pop(request.request_id, []))

    def num_layers(self) -> int:
        return 2

    def _at(self, rank: int, rid: int, pos: int) -> int:
        page = self.pages[rid][pos // self.tokens_per_block]
        return page * self.page_bytes + (pos % self.tokens_per_block) * self.token_bytes

    def forward(self, rank: int, request, start: int, end: int) -> int:
        buf = self.pools[rank].buf
        tokens = request.tokens
        for pos in range(start):
            off = self._at(rank, request.request_id, pos)
            got = bytes(buf[off : off + TOKEN_BYTES])
            if got != token_kv(rank, tokens, pos):
                raise KVMismatch(
                    f"rank {rank} request {request.request_id}: token {pos}'s KV is wrong before computing [{start}, {end})"
                )
            self.checked_bytes += TOKEN_BYTES
        for pos in range(start, end):
            off = self._at(rank, request.request_id, pos)
            buf[off : off + TOKEN_BYTES] = token_kv(rank, tokens, pos)
        if rank == 0:
            if request.state == "CONTEXT_INIT" and start > 0 and request.request_id not in self.restored_tokens:
                self.restored_tokens[request.request_id] = start
            self.computed_tokens[request.request_id] = self.computed_tokens.get(request.request_id, 0) + end - start
        return int.from_bytes(hashlib.blake2b(repr(tokens[:end]).encode(), digest_size=4).digest(), "little") % 32000

    def corrupt(self, rank: int, rid: int, pos: int) -> None:
        off = self._at(rank, rid, pos)
        self.pools[rank].buf[off] ^= 0xFF
