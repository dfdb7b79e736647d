"""The reference engine's paged KV: the memory kvctl serve loads into and saves from.

The pool is one buffer of ``2 * layers * slots`` pieces, a piece being one layer's K (or V) of one
block: ``kv_heads x tokens_per_block x head_dim`` elements, token-major within a head, exactly
the slice of a transformers cache for that block. Seen as a tensor it is
``(layers, 2, slots, kv_heads, tokens_per_block, head_dim)``. It is registered as one layer group
whose page (slot) s is, for every layer l, the K piece at ``((2l) * slots + s) * piece`` and the V
piece at ``((2l + 1) * slots + s) * piece``: 2 x layers regions of stride and size ``piece``.
kvctl serve moves a page as the concatenation of its regions, in region order.

On the CPU the buffer is a sealed memfd (kvctl_engine's SharedMemory) viewed with
torch.frombuffer; on a GPU it is one CUDA tensor, registered through a CUDA IPC handle.
"""

from __future__ import annotations

from typing import Any

import torch

from kvctl_engine._pb import engine_pb2 as pb


class KVPool:
    """slots pages of KV for one rank. kv_heads is the heads this rank holds."""

    def __init__(
        self,
        layers: int,
        slots: int,
        kv_heads: int,
        tokens_per_block: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if min(layers, slots, kv_heads, tokens_per_block, head_dim) < 1:
            raise ValueError(
                "KV pool: layers %d, slots %d, kv_heads %d, tokens_per_block %d, head_dim %d: all must be positive"
                % (layers, slots, kv_heads, tokens_per_block, head_dim)
            )
        self.layers, self.slots, self.kv_heads = layers, slots, kv_heads
        self.T, self.head_dim, self.dtype, self.device = tokens_per_block, head_dim, dtype, device
        elsize = torch.empty((), dtype=dtype).element_size()
        self.piece = kv_heads * tokens_per_block * head_dim * elsize
        self.size = 2 * layers * slots * self.piece
        self.page_bytes = 2 * layers * self.piece
        self.shm: Any = None
        if device.type == "cpu":
            from kvctl_engine.memory import SharedMemory

            self.shm = SharedMemory(self.size, name="kvctl-hf-kv")
            self.raw = torch.frombuffer(self.shm.buf, dtype=torch.uint8, count=self.size)
        elif device.type == "cuda":
            self.raw = torch.empty(self.size, dtype=torch.uint8, device=device)
        else:
            raise ValueError("KV pool: device %s: want cpu or cuda" % device)
        self.pages = self.raw.view(dtype).view(layers, 2, slots, kv_heads, tokens_per_block, head_dim)
        self.free = list(range(slots - 1, -1, -1))
        # True while the daemon's copies are ordered by the host: the engine synchronises its
        # device around them. The engine clears it when it registers CUDA stream ordering.
        self.host_sync = True

    def layout(self) -> pb.Layout:
        """The Register layout: one layer group, 2 x layers regions (K then V of each layer)."""
        regions = [
            pb.Region(offset=r * self.slots * self.piece, stride=self.piece, size=self.piece)
            for r in range(2 * self.layers)
        ]
        return pb.Layout(tokens_per_block=self.T, groups=[pb.LayerGroup(id=0, slots=self.slots, regions=regions)])

    def alloc(self, n: int) -> list[int]:
        """n free slots; the pages are poisoned (NaN) so that a load that writes nothing, or a
        read of a page never written, cannot pass for KV."""
        if n > len(self.free):
            raise RuntimeError(
                "KV pool: %d pages needed, %d free of %d (raise --slots)" % (n, len(self.free), self.slots)
            )
        got = [self.free.pop() for _ in range(n)]
        idx = torch.tensor(got, dtype=torch.long, device=self.device)
        self.pages[:, :, idx] = float("nan")
        # Without stream ordering, the daemon's copies into these pages would race the fill.
        self.sync_for_daemon()
        return got

    def release(self, slots: list[int]) -> None:
        self.free.extend(reversed(slots))

    def read_blocks(self, slots: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, K and V of the blocks in slots, in order: each (kv_heads, len(slots) * T, head_dim)."""
        idx = torch.tensor(slots, dtype=torch.long, device=self.device)
        out = []
        for layer in range(self.layers):
            kv = self.pages[layer][:, idx]  # (2, blocks, kv_heads, T, head_dim)
            kv = kv.permute(0, 2, 1, 3, 4).reshape(2, self.kv_heads, len(slots) * self.T, self.head_dim)
            out.append((kv[0].contiguous(), kv[1].contiguous()))
        return out

    def page_bytes_of(self, slot: int) -> bytes:
        """Slot's page as kvctl serve moves it: its regions' bytes in region order."""
        parts = self.pages[:, :, slot].contiguous().view(torch.uint8).cpu()
        return parts.numpy().tobytes()

    def alter(self, slot: int) -> None:
        """Changes one value of slot's page (layer 0, K, head 0, token 0, element 0): the
        negative control's wrong KV."""
        self.pages[0, 0, slot, 0, 0, 0] += 1.0

    def sync_for_daemon(self) -> None:
        """Synchronises the device when the daemon's copies are ordered by the host."""
        if self.host_sync:
            self.sync()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        self.sync()
        del self.pages, self.raw
        if self.shm is not None:
            self.shm.close()
