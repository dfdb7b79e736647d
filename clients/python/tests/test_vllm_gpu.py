"""The vLLM connector's memory on a GPU (GPU host only; CI has none): layer views laid out as vLLM
0.33.0 lays out its KV cache on a CUDA device (one int8 buffer, a ``[B, H, N, C]`` view per layer,
FlashAttention's default layout LBNHC), registered through ``kvctl_engine.vllm.memory`` (the
buffer's storage over CUDA IPC, ordered with CUDA interprocess events) with a vLLM key scheme.
Rank A saves blocks of random KV; rank B, another buffer, is offered the prefix and loads it:
every layer of every loaded block holds A's bytes, with no device-wide synchronisation around
the daemon's calls. vLLM itself is not needed (and not installed on the GPU host): the views
are built with the strides vLLM's ``create_kv_cache_views`` gives LBNHC."""

from __future__ import annotations

import random
import time
import uuid

import pytest

torch = pytest.importorskip("torch")

import kvctl_engine as kv  # noqa: E402
from kvctl_engine.cuda_events import TorchStreamOrder  # noqa: E402
from kvctl_engine.vllm import memory as kvmemory  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the GPU host runs it)")

T, LAYERS, HEADS, HEAD, BLOCKS = 16, 3, 4, 64, 32
DTYPE = torch.bfloat16


def lbnhc_views(buf: torch.Tensor) -> dict[str, torch.Tensor]:
    """vLLM's per-layer views in LBNHC: logical [B, H, N, C], physical [L, B, N, H, C]."""
    c = 2 * HEAD  # K then V of a head's token
    flat = buf.view(DTYPE)
    per_layer = BLOCKS * T * HEADS * c
    return {
        "model.layers.%d.self_attn.attn" % layer: torch.as_strided(
            flat, (BLOCKS, HEADS, T, c), (T * HEADS * c, c, HEADS * c, 1), layer * per_layer
        )
        for layer in range(LAYERS)
    }


class Rank:
    def __init__(self, socket: str, name: str) -> None:
        size = LAYERS * BLOCKS * T * HEADS * 2 * HEAD * 2
        self.buf = torch.zeros(size, dtype=torch.int8, device="cuda")
        self.views = lbnhc_views(self.buf)
        self.names = list(self.views)
        self.reg = kvmemory.registration(self.views, self.names, BLOCKS, T)
        assert self.reg.kind == "cuda-ipc"
        self.client = kv.connect(socket)
        self.rank = kv.Rank.register(
            self.client,
            name,
            self.reg.layout,
            self.reg.memory,
            model_key="vllm-gpu",
            format="vllm",
            key_params=kv.KeyParams(python_hash_seed="0", model="vllm-gpu-test", num_kv_heads=HEADS),
            stream_order=TorchStreamOrder(self.reg.device),
        )

    def close(self) -> None:
        self.rank.close()
        self.client.close()


def run(r: Rank, rid: str, tokens: list[int], blocks: list[int], fill: bool) -> int:
    hit = r.rank.lookup(kv.Request(rid, tokens))
    r.rank.update_state_after_alloc(rid, [blocks], hit.matched_tokens)
    meta = r.rank.build_meta(
        [kv.RequestData(rid, [blocks], 0, len(tokens) - hit.matched_tokens)], [], r.rank.take_submitted_saves()
    )
    r.rank.bind_meta(meta)
    r.rank.start_load()
    assert r.rank.take_failed_loads() == []
    if fill:
        g = torch.Generator(device="cuda").manual_seed(7)
        for name in r.names:
            v = r.views[name]
            for b in blocks[: len(tokens) // T]:
                v[b].copy_(torch.randn(v[b].shape, generator=g, device="cuda", dtype=torch.float32).to(DTYPE))
    saving = r.rank.request_finished(rid)
    r.rank.wait_for_save()
    gen = [rid]
    end = time.monotonic() + 60
    while saving and rid not in r.rank.get_finished(gen).finished_saving:
        gen = []
        assert time.monotonic() < end, "saves did not finish"
        time.sleep(0.002)
    return hit.matched_tokens


def test_vllm_views_on_cuda_round_trip(daemon) -> None:
    rng = random.Random(3)
    tokens = [rng.randrange(30000) for _ in range(5 * T + 9)]
    a = Rank(daemon.socket, "vllm-gpu-%s-a/rank0" % uuid.uuid4().hex[:6])
    b = Rank(daemon.socket, "vllm-gpu-%s-b/rank0" % uuid.uuid4().hex[:6])
    try:
        a_blocks, b_blocks = list(range(1, 7)), list(range(20, 26))
        assert run(a, "a", tokens, a_blocks, fill=True) == 0
        assert run(b, "b", tokens, b_blocks, fill=False) == 5 * T
        torch.cuda.current_stream().synchronize()  # only to compare here
        for name in a.names:
            for ba, bb in zip(a_blocks[:5], b_blocks[:5], strict=True):
                assert torch.equal(a.views[name][ba], b.views[name][bb]), (name, ba, bb)
            assert not torch.equal(a.views[name][a_blocks[0]], a.views[name][a_blocks[1]])
            # Block 6 of B was not loaded (the prompt's last, partial block).
            assert not torch.any(b.views[name][b_blocks[5]] != 0)
    finally:
        a.close()
        b.close()
