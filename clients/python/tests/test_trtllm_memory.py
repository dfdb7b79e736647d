"""How the connector hands TensorRT-LLM's KV pools to kvctl serve (kvctl_engine.trtllm.memory).

The CUDA paths run here against stand-in driver libraries (no GPU on the CI machines); the
host path against a real shared-memory file."""

from __future__ import annotations

import pytest

import kvctl_engine as kv
from kvctl_engine.trtllm import memory, standin

MiB = 1 << 20


def layout(base, *, slots=8, page=4096, groups=1, window=None):
    gs = []
    for g in range(groups):
        r = standin.KvCacheRegion(base=base + g * slots * page, size=page, stride=page, num_slots=slots)
        gs.append(standin.KvCacheLayerGroupLayout(g, (g,), window, (r,)))
    return standin.KvCacheLayout(16, tuple(gs))


class FakeVmm:
    def __init__(self, base, length, types):
        self.base, self.length, self.types = base, length, types
        self.released = []

    def address_range(self, ptr):
        return self.base, self.length

    def retain(self, ptr):
        return 77

    def handle_types(self, h):
        return self.types

    def export_fd(self, h):
        return 5

    def release(self, h):
        self.released.append(h)

    def device(self, ptr):
        return 3


def test_v2_exportable_pool_registers_as_a_descriptor():
    drv = FakeVmm(0x7F0000000000, 64 * MiB, 1)
    reg = memory.from_layout(layout(0x7F0000000000, groups=2), cuda=drv)
    assert reg.kind == "cuda-fd" and reg.memory == kv.CudaFdMemory(fd=5, size=64 * MiB, device=3)
    assert [g.regions[0].offset for g in reg.layout.groups] == [0, 8 * 4096]
    assert drv.released == [77]


def test_v2_pool_without_a_descriptor_handle_type_names_the_setting():
    drv = FakeVmm(0x7F0000000000, 64 * MiB, 0)
    with pytest.raises(memory.MemoryError_, match="use_kv_cache_manager_v2: false"):
        memory.from_layout(layout(0x7F0000000000), cuda=drv)
    assert drv.released == [77]


def test_v2_pool_over_several_chunks_names_the_setting():
    drv = FakeVmm(0x7F0000000000, 16 * 1024, 1)
    with pytest.raises(memory.MemoryError_, match="first cuMemCreate chunk maps only 16384"):
        memory.from_layout(layout(0x7F0000000000, groups=2), cuda=drv)


def test_sliding_window_groups_are_refused():
    with pytest.raises(memory.MemoryError_, match="sliding window"):
        memory.from_layout(layout(0x1000, window=128), cuda=FakeVmm(0x1000, MiB, 1))


class FakeRuntime:
    def __init__(self, base, length):
        self.base, self.length = base, length

    def ipc_get_mem_handle(self, ptr):
        assert ptr == self.base
        return b"\x01" * 64

    def address_range(self, ptr):
        return self.base, self.length

    def pointer_device(self, ptr):
        return 1


class FakeCudaTensor:
    """What register_kv_caches receives on V1: a for_blob view over a cudaMalloc pool."""

    is_cuda = True
    device = "cuda:1"

    def __init__(self, ptr, blocks, block_bytes):
        self.ptr, self.shape, self.block_bytes = ptr, (blocks, block_bytes), block_bytes

    def dim(self):
        return 2

    def is_contiguous(self):
        return True

    def data_ptr(self):
        return self.ptr

    def element_size(self):
        return 1

    def __getitem__(self, i):
        return type("Row", (), {"numel": lambda _s: self.block_bytes})()


def test_v1_pool_is_shared_by_ipc_of_its_allocation_base():
    t = FakeCudaTensor(0x7F0000001000, 10, 8192)
    reg = memory.from_tensor(t, 32, cuda=FakeRuntime(0x7F0000000000, 4 * MiB))
    assert reg.kind == "cuda-ipc"
    assert reg.memory.offset == 0x1000 and reg.memory.size == 10 * 8192 and reg.memory.device == 1
    g = reg.layout.groups[0]
    assert (reg.layout.tokens_per_block, g.slots, g.regions[0].stride, g.regions[0].size) == (32, 10, 8192, 8192)


def test_host_pool_registers_as_shared_memory():
    import torch

    shm = kv.SharedMemory(8 * 4096)
    try:
        base = memory.add_host_pool(shm)
        reg = memory.from_layout(layout(base))
        assert reg.kind == "host" and reg.memory is shm and reg.span == 8 * 4096
        t = torch.frombuffer(shm.buf, dtype=torch.uint8).view(8, 4096)
        assert memory.from_tensor(t, 16).memory is shm
        with pytest.raises(memory.MemoryError_, match="from the start"):
            memory.from_layout(layout(base + 4096, slots=4))
        memory.remove_host_pool(shm)
        with pytest.raises(memory.MemoryError_, match="neither a CUDA device nor host memory"):
            memory.from_tensor(t, 16)
    finally:
        memory.remove_host_pool(shm)
        del t


def test_v2_pool_inside_its_chunk_is_refused_before_any_export():
    drv = FakeVmm(0x7F0000000000, 64 * MiB, 1)
    with pytest.raises(memory.MemoryError_, match="starts 4096 bytes into its cuMemCreate chunk"):
        memory.from_layout(layout(0x7F0000000000 + 4096), cuda=drv)
    assert drv.released == [], "nothing was retained, so nothing is exported or leaked"
