"""The token-exact proofs through the TensorRT-LLM connector: kvctl_engine.trtllm's two classes,
called in TensorRT-LLM's order by the stand-in driver, over a real kvctl serve, with the
reference transformers engine (kvctl_engine.hf) computing underneath.

- cold then warm: a second server restores the first one's pages and produces the same tokens
  as the model computing everything (kvctl_engine.hf's own uncached generate);
- a page lost between lookup and load: the request comes back through take_failed_load_requests,
  is looked up again and recomputed, with the same tokens;
- TP=2: two ranks, each registering and restoring its own shard, same tokens as cold.
"""

from __future__ import annotations

import random
import time
import uuid
from types import SimpleNamespace

import pytest

from kvctl_engine.hf import engine as hfengine
from kvctl_engine.trtllm import connector, driver

from .conftest import start_daemon
from .hf_support import tiny_spec
from .trtllm_engines import PageEngine
from .trtllm_hf import HFEngine

T = 16
NEW = 6
LEASE_TTL = 10.0  # mooncake.DefaultLeaseTTL: the read lease a lookup's existence probe grants


def prompt(seed: int, blocks: float) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(512) for _ in range(int(blocks * T))]


def reference(tokens: list[int], pages: bool = False):
    """The model computing every token, no kvctl: kvctl_engine.hf's uncached generate (and, with
    pages, every full block's KV as a page holds it)."""
    e = hfengine.Engine(hfengine.EngineOptions(spec=tiny_spec(), tokens_per_block=T, use_cache=False))
    r = e.generate(tokens, NEW, hooks=hfengine.Hooks(keep_pages=pages))
    return (r.tokens, r.pages) if pages else r.tokens


class Server:
    def __init__(self, socket: str, model_key: str, *, world: int = 1, before_start_load=None) -> None:
        self.engine = HFEngine(tiny_spec(), world, T)
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
        self.manager = driver.StandinConnectorManager(self.engine, ranks, before_start_load=before_start_load)
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
    return f"trtllm-hf-{uuid.uuid4().hex[:12]}"


def test_cold_then_warm_is_token_exact(daemon, model_key):
    toks = prompt(1, 5.5)
    want, want_pages = reference(toks, pages=True)
    cold = Server(daemon.socket, model_key)
    try:
        a = cold.generate(1, toks)
        assert cold.engine.restored == {1: 0}
    finally:
        cold.close()
    warm = Server(daemon.socket, model_key)
    try:
        b = warm.generate(2, toks)
        assert warm.engine.restored == {2: 5 * T}, "the warm server should restore the five whole blocks"
        # Byte for byte the KV the model computes for those blocks, before anything used it.
        assert warm.engine.restored_pages[2] == [want_pages[b] for b in range(5)]
    finally:
        warm.close()
    assert a.generated == want
    assert b.generated == want


def test_tensor_parallel_two_ranks_is_token_exact(daemon, model_key):
    toks = prompt(2, 4.25)
    cold = Server(daemon.socket, model_key, world=2)
    try:
        a = cold.generate(1, toks)
    finally:
        cold.close()
    warm = Server(daemon.socket, model_key, world=2)
    try:
        b = warm.generate(2, toks)
        assert warm.engine.restored == {2: 4 * T}
        ranks = [w._rank.shard for w in warm.workers]
        assert ranks == ["w2r0", "w2r1"]
    finally:
        warm.close()
    assert b.generated == a.generated and len(a.generated) == NEW


def test_a_page_lost_between_lookup_and_load_is_recomputed_token_exact(kvctl_bin, model_key):
    """The warm server's lookup offers the prompt; before start_load_kv its lease runs out and
    another server floods the 16 MiB pool with 1 MiB pages, evicting the offered ones. The worker
    hands the request back through take_failed_load_requests; the stand-in driver drops its
    bound saves, frees it, calls request_reset and admits it again; the second lookup offers
    nothing and the model computes the prompt into the reference tokens."""
    toks = prompt(3, 4.5)
    want = reference(toks)
    d = start_daemon(kvctl_bin, "16MiB")
    made = []
    try:
        cold = Server(d.socket, model_key)
        made.append(cold)
        cold.generate(1, toks)
        flood_engine = PageEngine(1, 4, 24, token_bytes=256 << 10)
        flood_args = SimpleNamespace(
            kv_connector_config=SimpleNamespace(server_url=f"unix://{d.socket}?model_key=flood"),
            tensor_parallel_size=1,
            enable_attention_dp=False,
            speculative_config=None,
            kv_cache_config=SimpleNamespace(tokens_per_block=4),
        )
        fw = connector.KvctlConnectorWorker(flood_args, rank=0)
        flood = driver.StandinConnectorManager(
            flood_engine, [driver.StandinRank(fw, connector.KvctlConnectorScheduler(flood_args, rank=0))]
        )
        flood.start()
        made.append(SimpleNamespace(close=lambda: (fw.close(), flood_engine.close())))

        def evict(step: int) -> None:
            if step == 1:
                time.sleep(LEASE_TTL + 0.5)
                for i in range(6):
                    flood.submit(
                        driver.StandinLlmRequest(100 + i, [1000 * (i + 1) + t for t in range(17)], max_new_tokens=1)
                    )
                    flood.run()

        warm = Server(d.socket, model_key, before_start_load=evict)
        made.append(warm)
        b = warm.generate(2, toks)
        first = warm.manager.log[0]
        assert first.restarted == [2], first.calls
        assert first.calls[0] == "get_num_new_matched_tokens(2, 0) = (64, False)"
        relook = [c for s in warm.manager.log[1:] for c in s.calls if c.startswith("get_num_new_matched_tokens(2,")]
        assert relook == ["get_num_new_matched_tokens(2, 0) = (0, False)"]
        assert warm.engine.restored == {2: 0}
        assert b.generated == want
    finally:
        for s in made:
            s.close()
        d.stop()
