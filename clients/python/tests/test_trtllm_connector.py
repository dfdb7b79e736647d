"""kvctl_engine.trtllm's connector over a real kvctl serve, driven in TensorRT-LLM's call order by
the stand-in driver, with PageEngine's shared-memory pools underneath."""

from __future__ import annotations

import pickle
import time
import uuid
from types import SimpleNamespace

import pytest

import kvctl_engine as kv
from kvctl_engine.trtllm import connector, driver, settings

from .conftest import start_daemon
from .trtllm_engines import PageEngine

T = 4
LEASE_TTL = 10.0  # mooncake.DefaultLeaseTTL: an existence probe's read lease in the embedded pool


def llm_args(
    socket: str, *, world: int = 1, query: str = "model_key=trtllm-test", attention_dp: bool = False, spec=None
):
    return SimpleNamespace(
        kv_connector_config=SimpleNamespace(server_url=f"unix://{socket}?{query}"),
        tensor_parallel_size=world,
        enable_attention_dp=attention_dp,
        speculative_config=spec,
        kv_cache_config=SimpleNamespace(tokens_per_block=T),
    )


class Server:
    """One TensorRT-LLM server of the stand-in kind: an engine, a connector per rank, the driver."""

    def __init__(
        self,
        socket: str,
        *,
        world: int = 1,
        v2: bool = True,
        query: str = "model_key=trtllm-test",
        worker=connector.KvctlConnectorWorker,
        scheduler=connector.KvctlConnectorScheduler,
        token_bytes: int = 16,
        slots: int = 64,
        before_start_load=None,
    ) -> None:
        self.engine = PageEngine(world, T, slots, v2=v2, token_bytes=token_bytes)
        args = llm_args(socket, world=world, query=query)
        self.workers = [worker(args, rank=r) for r in range(world)]
        ranks = [driver.StandinRank(w, scheduler(args, rank=r) if r == 0 else None) for r, w in enumerate(self.workers)]
        # A TensorRT-LLM with the seed PR refuses reports_failed_loads on V1; V1 runs on a release without it.
        self.manager = driver.StandinConnectorManager(
            self.engine, ranks, kv_cache_manager_v2=v2, seed=v2, before_start_load=before_start_load
        )
        self.manager.start()

    def generate(self, rid: int, prompt: list[int], n: int = 3) -> driver.StandinLlmRequest:
        req = driver.StandinLlmRequest(rid, prompt, max_new_tokens=n)
        self.manager.submit(req)
        self.manager.run()
        return req

    def close(self) -> None:
        for w in self.workers:
            w.close()
        self.engine.close()


@pytest.fixture
def servers(daemon):
    """Servers of one model, whose key no other test uses (the daemon is shared)."""
    made: list[Server] = []
    model = f"trtllm-test-{uuid.uuid4().hex[:12]}"

    def make(**kw) -> Server:
        kw["query"] = kw.get("query", "model_key=trtllm-test").replace("model_key=trtllm-test", "model_key=" + model)
        s = Server(daemon.socket, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


PROMPT = list(range(100, 118))  # 4.5 blocks of 4


@pytest.mark.parametrize("v2", [True, False], ids=["V2 layout", "V1 pool tensor"])
def test_cold_then_warm_restores_the_same_bytes(servers, v2):
    cold = servers(v2=v2)
    a = cold.generate(1, PROMPT)
    assert cold.engine.restored_tokens == {}
    cold.close()
    warm = servers(v2=v2)
    b = warm.generate(2, PROMPT)
    # Four whole blocks come from the pool; the last prompt token is always computed.
    assert warm.engine.restored_tokens == {2: 16}
    assert b.generated == a.generated and len(a.generated) == 3
    assert warm.engine.checked_bytes >= 16 * 16
    assert b.py_num_connector_matched_tokens == 16


def test_salt_and_lora_keep_keys_apart(servers):
    s = servers()
    s.generate(1, PROMPT)
    salted = driver.StandinLlmRequest(2, PROMPT, max_new_tokens=1, cache_salt="tenant-a")
    s.manager.submit(salted)
    lora = driver.StandinLlmRequest(3, PROMPT, max_new_tokens=1, lora_task_id=7)
    s.manager.submit(lora)
    s.manager.run()
    assert 2 not in s.engine.restored_tokens and 3 not in s.engine.restored_tokens
    again = driver.StandinLlmRequest(4, PROMPT, max_new_tokens=1, cache_salt="tenant-a")
    s.manager.submit(again)
    s.manager.run()
    assert s.engine.restored_tokens.get(4) == 16


def test_tensor_parallel_ranks_restore_their_own_shards(servers):
    cold = servers(world=2)
    a = cold.generate(1, PROMPT)
    cold.close()
    warm = servers(world=2)
    b = warm.generate(2, PROMPT)
    assert warm.engine.restored_tokens == {2: 16} and b.generated == a.generated


def test_metadata_pickles_and_names_its_pages(servers):
    s = servers()
    sched = s.manager.ranks[0].scheduler
    req = driver.StandinLlmRequest(9, PROMPT, max_new_tokens=1)
    assert sched.get_num_new_matched_tokens(req, 0) == (0, False)
    sched.update_state_after_alloc(req, [0, 1, 2, 3, 4])
    out = driver.base.SchedulerOutput(
        new_requests=[driver.base.RequestData(9, list(PROMPT), [0, 1, 2, 3, 4], 0, len(PROMPT))]
    )
    meta = sched.build_connector_meta(out)
    copy = pickle.loads(pickle.dumps(meta))
    assert isinstance(copy, connector.ConnectorMetadata) and copy.data == meta.data
    assert "saves=4" in repr(copy)


def test_declarations_must_match_the_role(daemon, servers):
    with pytest.raises(connector.DeclarationMismatch, match="KvctlProducerConnectorScheduler"):
        Server(daemon.socket, query="model_key=trtllm-test&role=producer")
    p = servers(
        query="model_key=trtllm-test&role=producer",
        worker=connector.KvctlProducerConnectorWorker,
        scheduler=connector.KvctlProducerConnectorScheduler,
    )
    assert p.workers[0]._rank.declarations["requires_block_aligned_reuse"] is False
    with pytest.raises(connector.DeclarationMismatch, match="capacity"):
        connector.KvctlConnectorWorker(llm_args(daemon.socket, query="model_key=m&role=capacity"))


def test_settings_errors_name_the_fix(daemon):
    with pytest.raises(settings.SettingsError, match="model_key is required"):
        connector.KvctlConnectorWorker(llm_args(daemon.socket, query=""), rank=0)
    with pytest.raises(settings.SettingsError, match="unix socket"):
        connector.KvctlConnectorWorker(
            SimpleNamespace(kv_connector_config=SimpleNamespace(server_url="tcp://h:1")), rank=0
        )


def test_ids_are_strings_on_the_wire_and_ints_back(servers):
    s = servers()
    req = s.generate(123456789012, PROMPT, n=1)
    assert req.generated and s.manager.done[0].request_id == 123456789012


def test_prompt_lookahead_and_multimodal_digests():
    assert connector.prompt_lookahead(None) == 0
    assert (
        connector.prompt_lookahead(
            SimpleNamespace(decoding_type="MTP", num_nextn_predict_layers=3, use_mtp_vanilla=True)
        )
        == 3
    )
    assert connector.prompt_lookahead(SimpleNamespace(decoding_type="MTP")) == 1
    assert connector.prompt_lookahead(SimpleNamespace(decoding_type="Eagle3", max_draft_len=3)) == 1
    assert (
        connector.prompt_lookahead(SimpleNamespace(decoding_type="Eagle3", max_draft_len=3, eagle3_one_model=False))
        == 0
    )
    req = SimpleNamespace(request_id=1, multimodal_hashes=[[1, -1, 0, 0, 0, 0, 0, 2**31 - 1]])
    digests, has = connector.multimodal_digests(req)
    assert has and digests == [bytes.fromhex("00000001ffffffff" + "00" * 20 + "7fffffff")]
    assert connector.multimodal_digests(SimpleNamespace(request_id=2, multimodal_positions=[3])) == ([], True)
    with pytest.raises(kv.InvalidArgument, match="8"):
        connector.multimodal_digests(SimpleNamespace(request_id=3, multimodal_hashes=[[1, 2]]))


def test_a_page_lost_between_lookup_and_load_restarts_the_request(kvctl_bin):
    """A 16 MiB pool holds 16 pages of 1 MiB. The warm server's offer is looked up; before
    start_load_kv the read lease the lookup's existence probe granted runs out (the embedded
    pool's 10 s, mooncake.DefaultLeaseTTL) and another server floods the pool, evicting the
    offered pages. The worker hands the request back through take_failed_load_requests, its
    second lookup finds nothing, and it computes the prompt into the cold run's tokens."""
    d = start_daemon(kvctl_bin, "16MiB")
    made = []
    try:

        def make(**kw):
            s = Server(d.socket, token_bytes=256 << 10, slots=24, **kw)
            made.append(s)
            return s

        cold = make()
        a = cold.generate(1, PROMPT)
        flood = make(query="model_key=trtllm-flood")

        def evict(step):
            if step == 1:
                time.sleep(LEASE_TTL + 0.5)
                for i in range(6):
                    flood.generate(100 + i, [1000 * (i + 1) + t for t in range(4 * T + 1)], n=1)

        warm = make(before_start_load=evict)
        b = warm.generate(2, PROMPT)
        log = warm.manager.log
        assert log[0].restarted == [2], log[0].calls
        assert "request_reset(2)" in log[0].calls
        lookups = [c for step in log for c in step.calls if c.startswith("get_num_new_matched_tokens(2,")]
        assert lookups[0].endswith("= (16, False)") and lookups[1].endswith("= (0, False)"), lookups
        assert b.generated == a.generated
        assert 2 not in warm.engine.restored_tokens
    finally:
        for s in made:
            s.close()
        d.stop()


def test_declarations_are_asserted_against_register(daemon):
    class Quiet(connector.KvctlConnectorWorker):
        reports_failed_loads = False

    engine = PageEngine(1, T)
    w = Quiet(llm_args(daemon.socket, query=f"model_key=trtllm-decl-{uuid.uuid4().hex[:8]}"), rank=0)
    try:
        with pytest.raises(connector.DeclarationMismatch, match="reports_failed_loads: class False, kvctl serve True"):
            engine.register(0, w)
        # The scheduler of the rank hears of the failure instead of waiting for a registration.
        s = connector.KvctlConnectorScheduler(w._llm_args_key, rank=0)
        with pytest.raises(kv.FailedPrecondition, match="failed to register"):
            s.get_num_new_matched_tokens(driver.StandinLlmRequest(1, PROMPT), 0)
    finally:
        connector.forget_rank(0, w._llm_args_key)
        engine.close()


def test_drafter_kind_as_register_carries_it():
    assert connector.drafter_kind(None) == ""
    assert connector.drafter_kind(SimpleNamespace(decoding_type="MTP")) == "mtp"
    assert connector.drafter_kind(SimpleNamespace(decoding_type="MTP", mtp_eagle_one_model=False)) == "mtp-two-model"
    assert connector.drafter_kind(SimpleNamespace(decoding_type="MTP", use_mtp_vanilla=True)) == "mtp"
    assert connector.drafter_kind(SimpleNamespace(decoding_type="Eagle3")) == "eagle3"
    assert connector.drafter_kind(SimpleNamespace(decoding_type="Eagle3", eagle3_one_model=False)) == "eagle3-two-model"
    assert connector.drafter_kind(SimpleNamespace(decoding_type="NGram")) == "ngram"
