"""The bytes kvctl serve moves for a vLLM block are the value vLLM's own Mooncake store connector
stores for it: for every KV cache layout vLLM 0.33.0 resolves for full attention, the layer views
vLLM itself builds (``get_kv_cache_config_from_groups``, ``create_kv_cache_views``) over a kvctl
shared-memory buffer of random bytes, read through the registered regions, against
``RankLocalStoreLayout.register_kv_caches`` and ``prepare_value_for_block`` from vLLM's
MooncakeStoreConnector, block by block."""

from __future__ import annotations

import ctypes

import pytest
import torch

from .hf_support import require_vllm, tiny_spec

vllm = require_vllm()

from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data import (  # noqa: E402
    KeyMetadata,
    RankLocalStoreLayout,
)
from vllm.v1.kv_cache_interface import group_kernel_blocks  # noqa: E402
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402

from kvctl_engine.vllm import memory as kvmemory  # noqa: E402

from .vllm_cpu_engine import T, allocate, attention_spec, layer_names, vllm_config  # noqa: E402

pytestmark = pytest.mark.vllm

BLOCKS = 9


def _dense_parts(block: torch.Tensor) -> list[torch.Tensor]:
    """A layer's block as dense byte ranges: the block, or each head's block."""
    if kvmemory._dense(block):
        return [block]
    return [block[h] for h in range(block.shape[0])]


@pytest.mark.parametrize("layout", [x.name for x in KVCacheLayout])
def test_block_value_is_vllm_mooncake_store_value(layout: str) -> None:
    spec = tiny_spec()
    vc = vllm_config(spec, "layout-" + layout, {"format": "trtllm"}, layout=layout)
    try:
        kvc, shm, views = allocate(vc, spec, BLOCKS)
    except (ValueError, AssertionError) as e:
        pytest.skip("vLLM refuses the %s layout for full attention: %s" % (layout, e))
    try:
        buf = torch.frombuffer(shm.buf, dtype=torch.uint8, count=shm.size)
        g = torch.Generator().manual_seed(sum(map(ord, layout)))
        buf.copy_(torch.randint(0, 256, (shm.size,), dtype=torch.uint8, generator=g))

        names = layer_names(spec)
        reg = kvmemory.registration(views, names, kvc.num_blocks, T)
        regions = reg.layout.groups[0].regions
        page = attention_spec(spec).page_size_bytes

        ref = RankLocalStoreLayout(KeyMetadata(model_name="m", tp_rank=0, pcp_rank=0, dcp_rank=0, pp_rank=0), T, T)
        ref.register_kv_caches([group_kernel_blocks(views[n], kvc.num_blocks) for n in names], kvc.num_blocks)

        seen: dict[bytes, int] = {}
        end = reg.base + shm.size
        for b in range(kvc.num_blocks):
            addrs, sizes = ref.prepare_value_for_block(b)
            got = b"".join(bytes(shm.buf[r.offset + b * r.stride : r.offset + b * r.stride + r.size]) for r in regions)
            assert [reg.base + r.offset + b * r.stride for r in regions] == addrs, (layout, b)
            if layout == "BHLNC":
                # vLLM's value reads a whole block's length from each head (into the other heads
                # and layers, past the buffer at the last block); kvctl's page takes the head's own
                # bytes from the same addresses.
                assert any(a + n > end for a, n in zip(addrs, sizes, strict=True)) == (b == kvc.num_blocks - 1)
                assert all(r.size < n for r, n in zip(regions, sizes, strict=True))
            else:
                want = b"".join(ctypes.string_at(a, n) for a, n in zip(addrs, sizes, strict=True))
                assert got == want, "%s, block %d: kvctl's page is not vLLM's Mooncake store value" % (layout, b)
            # The value holds every layer's K and V of the block, and no other block's.
            assert len(got) == spec.layers * page
            for i, name in enumerate(names):
                for part in _dense_parts(views[name][b]):
                    raw = ctypes.string_at(part.data_ptr(), part.numel() * part.element_size())
                    assert raw in got, "%s, block %d: layer %d's KV is not in the value" % (layout, b, i)
            assert got not in seen, "blocks %d and %d share a value" % (seen.get(got, -1), b)
            seen[got] = b
    finally:
        kvmemory.release_host_kv_buffer(shm)


def test_host_memory_outside_kvctl_shared_memory_is_refused() -> None:
    spec = tiny_spec()
    vc = vllm_config(spec, "layout-plain", {"format": "trtllm"})
    kvc, shm, views = allocate(vc, spec, BLOCKS)
    kvmemory.release_host_kv_buffer(shm)
    plain = {n: torch.zeros_like(v) for n, v in views.items()}  # vLLM's own CPU allocation
    with pytest.raises(kvmemory.KVMemoryError, match="not kvctl shared memory"):
        kvmemory.registration(plain, layer_names(spec), kvc.num_blocks, T)
    with pytest.raises(kvmemory.KVMemoryError, match="no KV cache for the layers"):
        kvmemory.registration({}, layer_names(spec), kvc.num_blocks, T)
    with pytest.raises(kvmemory.KVMemoryError, match="does not hold 10 blocks"):
        kvmemory.block_regions(plain, layer_names(spec), kvc.num_blocks + 1)
