"""The TensorRT-LLM shim on a GPU, over CUDA IPC, with a V1-style pool (GPU host only).

KVCacheManagerV1 hands ``register_kv_caches`` one tensor over a raw ``cudaMalloc`` pool that
torch did not allocate (``for_blob``), so torch cannot share it: the shim exports the allocation
with ``cudaIpcGetMemHandle`` and registers CUDA stream ordering (interprocess events), so no call
synchronises the device. The stand-in driver calls the shim in TensorRT-LLM's order with the
reference transformers engine computing on the GPU (tests/trtllm_hf.py, ``v1=True``):

- cold then warm: the warm server restores the cold one's pages byte for byte, its first-token
  logits agree within 1e-5 and its tokens equal the model computing everything;
- the negative control: one value of the last restored page changed gives other logits;
- TP=2 (two ranks in threads on one device): the same tokens as cold;
- a V2-style pool (one ``cuMemCreate`` chunk with the POSIX file-descriptor handle type,
  registered as a KvCacheLayout) exported as a descriptor: cold then warm, token-exact; a chunk
  created without an exportable handle type is refused at registration, naming the setting.

Skipped without a CUDA device (CI has none); the GPU host runs it.
"""

from __future__ import annotations

import random
import uuid
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from kvctl_engine.hf import engine as hfengine  # noqa: E402
from kvctl_engine.trtllm import connector, driver  # noqa: E402

from .hf_support import tiny_spec  # noqa: E402
from .trtllm_hf import HFEngine  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the GPU host runs it)")

T = 16
NEW = 6


def prompt(seed: int, blocks: float) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(512) for _ in range(int(blocks * T))]


class Server:
    def __init__(
        self,
        socket: str,
        model_key: str,
        *,
        world: int = 1,
        v2: bool = False,
        exportable: bool = True,
    ) -> None:
        self.engine = HFEngine(
            tiny_spec(),
            world,
            T,
            device="cuda",
            v1=not v2,
            v2=v2,
            exportable=exportable,
        )
        args = SimpleNamespace(
            kv_connector_config=SimpleNamespace(server_url=f"unix://{socket}?model_key={model_key}"),
            tensor_parallel_size=world,
            enable_attention_dp=False,
            speculative_config=None,
            kv_cache_config=SimpleNamespace(tokens_per_block=T),
        )
        self.workers = [connector.KvctlConnectorWorker(args, rank=r) for r in range(world)]
        ranks = [
            driver.StandinRank(w, connector.KvctlConnectorScheduler(args, rank=0) if r == 0 else None)
            for r, w in enumerate(self.workers)
        ]
        self.manager = driver.StandinConnectorManager(self.engine, ranks)
        self.manager.start()

    def generate(self, rid: int, tokens: list[int]) -> driver.StandinLlmRequest:
        req = driver.StandinLlmRequest(rid, tokens, max_new_tokens=NEW)
        self.manager.submit(req)
        self.manager.run()
        return req

    def close(self) -> None:
        for w in self.workers:
            w.close()
        self.engine.close()


@pytest.fixture
def model_key() -> str:
    return f"trtllm-gpu-{uuid.uuid4().hex[:12]}"


def test_v1_pool_over_cuda_ipc_is_token_exact(daemon, model_key):
    toks = prompt(11, 5.5)
    ref = hfengine.Engine(
        hfengine.EngineOptions(spec=tiny_spec(), device="cuda", tokens_per_block=T, use_cache=False)
    ).generate(toks, NEW)
    cold = Server(daemon.socket, model_key)
    try:
        reg = cold.workers[0].registration
        assert reg is not None and reg.kind == "cuda-ipc", "a for_blob pool is shared by cudaIpcGetMemHandle"
        assert cold.workers[0]._rank.stream_order is not None, "the shim registers CUDA stream ordering"
        a = cold.generate(1, toks)
        pool = cold.engine.pools[0]
        cold_pages = [pool.page_bytes_of(s) for s in cold.engine.allocated[1][:5]]
        cold_logits = cold.engine.first_logits[1]
        assert cold.engine.restored == {1: 0}
    finally:
        cold.close()
    warm = Server(daemon.socket, model_key)
    try:
        b = warm.generate(2, toks)
        assert warm.engine.restored == {2: 5 * T}, "the warm server should restore the five whole blocks"
        assert warm.engine.restored_pages[2] == cold_pages, "restored pages differ from the bytes the cold server saved"
        warm_logits = warm.engine.first_logits[2]
    finally:
        warm.close()
    assert a.generated == ref.tokens
    assert b.generated == ref.tokens
    assert torch.allclose(warm_logits, cold_logits, atol=1e-5, rtol=0), (warm_logits - cold_logits).abs().max()

    # The negative control: the same warm run with one restored value changed must differ.
    bad = Server(daemon.socket, model_key)
    try:
        bad.engine.alter_restored.add(3)
        bad.generate(3, toks)
        assert bad.engine.restored == {3: 5 * T}
        bad_logits = bad.engine.first_logits[3]
    finally:
        bad.close()
    assert not torch.equal(bad_logits, warm_logits), "a changed restored page left the logits as they were"


def test_v1_pool_tensor_parallel_two_ranks_is_token_exact(daemon, model_key):
    toks = prompt(12, 4.25)
    cold = Server(daemon.socket, model_key, world=2)
    try:
        a = cold.generate(1, toks)
    finally:
        cold.close()
    warm = Server(daemon.socket, model_key, world=2)
    try:
        b = warm.generate(2, toks)
        assert warm.engine.restored == {2: 4 * T}
        assert [w._rank.shard for w in warm.workers] == ["w2r0", "w2r1"]
    finally:
        warm.close()
    assert b.generated == a.generated and len(a.generated) == NEW


def test_v2_pool_over_a_vmm_descriptor_is_token_exact(daemon, model_key):
    toks = prompt(13, 4.5)
    ref = hfengine.Engine(
        hfengine.EngineOptions(spec=tiny_spec(), device="cuda", tokens_per_block=T, use_cache=False)
    ).generate(toks, NEW)
    cold = Server(daemon.socket, model_key, v2=True)
    try:
        reg = cold.workers[0].registration
        assert reg is not None and reg.kind == "cuda-fd", "a cuMemCreate pool is shared as a descriptor"
        assert cold.workers[0]._rank.stream_order is not None, "the shim registers CUDA stream ordering"
        a = cold.generate(1, toks)
        pool = cold.engine.pools[0]
        cold_pages = [pool.page_bytes_of(s) for s in cold.engine.allocated[1][:4]]
    finally:
        cold.close()
    warm = Server(daemon.socket, model_key, v2=True)
    try:
        b = warm.generate(2, toks)
        assert warm.engine.restored == {2: 4 * T}, "the warm server should restore the four whole blocks"
        assert warm.engine.restored_pages[2] == cold_pages, "restored pages differ from the bytes the cold server saved"
    finally:
        warm.close()
    assert a.generated == ref.tokens
    assert b.generated == ref.tokens


def test_v2_pool_without_an_exportable_handle_is_refused(daemon, model_key):
    from kvctl_engine.trtllm import memory as kvmemory

    with pytest.raises(kvmemory.MemoryError_) as e:
        Server(daemon.socket, model_key, v2=True, exportable=False)
    assert "without a POSIX file-descriptor handle type" in str(e.value)
    assert kvmemory.EXPORTABLE_SETTING in str(e.value)
