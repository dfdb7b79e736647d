"""The stand-in driver calls a connector in TensorRT-LLM's order (kvctl_engine.trtllm.driver)."""

from __future__ import annotations

import pytest

from kvctl_engine.trtllm import driver, standin

T = 4


class Journal:
    def __init__(self):
        self.calls: list[tuple] = []


class RecordingScheduler(standin.KvCacheConnectorScheduler):
    """Offers one block for every request after the first; records what it is told."""

    supports_attention_dp = True

    def __init__(self, llm_args, journal, rank):
        super().__init__(llm_args)
        self.j, self.rank = journal, rank
        self.looked = 0

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        self.j.calls.append(("lookup", self.rank, request.request_id, num_computed_tokens))
        self.looked += 1
        return (T, False) if self.looked > 1 else (0, False)

    def update_state_after_alloc(self, request, block_ids):
        self.j.calls.append(
            ("alloc", self.rank, request.request_id, list(block_ids), request.py_num_connector_matched_tokens)
        )

    def build_connector_meta(self, scheduler_output):
        out = scheduler_output
        self.j.calls.append(
            (
                "build",
                self.rank,
                [
                    (d.request_id, d.computed_position, d.num_scheduled_tokens, list(d.new_tokens))
                    for d in out.new_requests
                ],
                [(d.request_id, d.computed_position) for d in out.cached_requests],
            )
        )
        return {"step": len([c for c in self.j.calls if c[0] == "build"])}

    def request_finished(self, request, cache_block_ids):
        self.j.calls.append(("finished", self.rank, request.request_id))
        return True

    def request_reset(self, request):
        self.j.calls.append(("reset", self.rank, request.request_id))


class RecordingWorker(standin.KvCacheConnectorWorker):
    supports_attention_dp = True
    reports_failed_loads = True

    def __init__(self, llm_args, journal, rank, fail_once=()):
        super().__init__(llm_args)
        self.j, self.rank = journal, rank
        self.fail = set(fail_once)
        self.failed: set = set()
        self.saving: set = set()

    def register_kv_caches(self, kv_cache_tensor):
        self.j.calls.append(("register", self.rank))

    def bind_connector_meta(self, metadata):
        super().bind_connector_meta(metadata)
        self.j.calls.append(("bind", self.rank, metadata["step"]))

    def start_load_kv(self, stream):
        self.j.calls.append(("start_load", self.rank))
        self.failed, self.fail = self.fail, set()

    def take_failed_load_requests(self):
        out, self.failed = self.failed, set()
        self.j.calls.append(("take_failed", self.rank, sorted(out)))
        return out

    def drop_bound_saves(self, request_ids):
        self.j.calls.append(("drop_saves", self.rank, list(request_ids)))

    def wait_for_layer_load(self, layer_idx, stream):
        self.j.calls.append(("layer_load", self.rank, layer_idx))

    def save_kv_layer(self, layer_idx, stream):
        self.j.calls.append(("layer_save", self.rank, layer_idx))

    def wait_for_save(self, stream):
        self.j.calls.append(("wait_for_save", self.rank))

    def get_finished(self, finished_gen_req_ids, started_loading_req_ids):
        self.saving |= set(finished_gen_req_ids)
        done, self.saving = self.saving, set()
        self.j.calls.append(("get_finished", self.rank, sorted(finished_gen_req_ids)))
        return sorted(done), []


class ToyEngine:
    """Pages from a counter; the next token is the sum of the tokens so far, mod 97."""

    tokens_per_block = T

    def __init__(self, world_size=1):
        self.world_size = world_size
        self.next_page = 0
        self.released: list[int] = []

    def register(self, rank, worker):
        worker.register_kv_caches(None)

    def local_match(self, request):
        return 0

    def allocate(self, request, num_tokens):
        n = -(-num_tokens // T)
        pages = list(range(self.next_page, self.next_page + n))
        self.next_page += n
        return [pages]

    def num_layers(self):
        return 2

    def forward(self, rank, request, start, end):
        return sum(request.tokens[:end]) % 97

    def release(self, request):
        self.released.append(request.request_id)


def manager(world=1, fail_once=(), **kw):
    j = Journal()
    ranks = [
        driver.StandinRank(
            RecordingWorker(None, j, r, fail_once if r == 0 else ()),
            RecordingScheduler(None, j, r) if r == 0 or kw.get("attention_dp") else None,
        )
        for r in range(world)
    ]
    m = driver.StandinConnectorManager(ToyEngine(world), ranks, kv_cache_manager_v2=True, **kw)
    m.start()
    return m, j


def test_one_step_in_tensorrt_llm_order():
    m, j = manager()
    m.submit(driver.StandinLlmRequest(7, range(10), max_new_tokens=1))
    m.step()
    kinds = [c[0] for c in j.calls]
    assert kinds == [
        "register",
        "lookup",
        "alloc",
        "build",
        "bind",
        "start_load",
        "take_failed",
        "layer_load",
        "layer_save",
        "layer_load",
        "layer_save",
        "wait_for_save",
        "finished",
        "get_finished",
    ]
    assert j.calls[3] == ("build", 0, [(7, 0, 10, list(range(10)))], [])
    assert m.done and m.done[0].generated == [sum(range(10)) % 97]


def test_offer_is_left_out_of_the_first_computed_position_and_chunks_are_cached():
    m, j = manager(chunk=4)
    m.submit(driver.StandinLlmRequest(1, range(10), max_new_tokens=1))
    m.run()
    m.submit(driver.StandinLlmRequest(2, range(10), max_new_tokens=1))
    m.run()
    builds = [c for c in j.calls if c[0] == "build"]
    # Request 2 was offered one block: it starts computing at 4, but its first computed
    # position leaves the connector's tokens out, and its honoured count reaches the scheduler.
    second = next(b for b in builds if b[2] and b[2][0][0] == 2)
    assert second[2] == [(2, 0, 4, list(range(10)))]
    assert ("alloc", 0, 2, [3, 4, 5], T) in j.calls
    later = [b[3] for b in builds[builds.index(second) + 1 :] if b[3]]
    assert later[0] == [(2, 8)]


def test_failed_load_restarts_on_a_single_rank():
    m, j = manager(fail_once={3})
    m.submit(driver.StandinLlmRequest(3, range(8), max_new_tokens=1))
    log = m.step()
    assert log.restarted == [3]
    i = j.calls.index(("take_failed", 0, [3]))
    assert j.calls[i + 1 : i + 3] == [("drop_saves", 0, [3]), ("reset", 0, 3)]
    assert m.engine.released == [3]
    m.run()
    assert [c for c in j.calls if c[0] == "lookup"] == [("lookup", 0, 3, 0), ("lookup", 0, 3, 0)]
    assert m.done[0].request_id == 3


def test_tensor_parallel_scheduler_on_rank_0_and_failed_load_is_fatal():
    m, j = manager(world=2, fail_once={5})
    assert m.ranks[1].scheduler is None
    m.submit(driver.StandinLlmRequest(5, range(8), max_new_tokens=1))
    with pytest.raises(driver.ConnectorFailure, match="tensor-parallel"):
        m.step()
    assert [c for c in j.calls if c[0] == "bind"] == [("bind", 0, 1), ("bind", 1, 1)]


def test_declarations_are_checked():
    j = Journal()

    class NoHooks(standin.KvCacheConnectorWorker):
        reports_failed_loads = True
        register_kv_caches = start_load_kv = wait_for_save = lambda self, *a: None
        wait_for_layer_load = save_kv_layer = lambda self, *a: None

        def get_finished(self, a, b):
            return [], []

    with pytest.raises(ValueError, match="take_failed_load_requests"):
        driver.StandinConnectorManager(ToyEngine(), [driver.StandinRank(NoHooks(None), RecordingScheduler(None, j, 0))])

    class NoADP(RecordingWorker):
        supports_attention_dp = False

    with pytest.raises(NotImplementedError, match="supports_attention_dp"):
        driver.StandinConnectorManager(
            ToyEngine(2),
            [driver.StandinRank(NoADP(None, j, r), RecordingScheduler(None, j, r)) for r in range(2)],
            attention_dp=True,
        )
    with pytest.raises(ValueError, match="only on rank 0"):
        driver.StandinConnectorManager(
            ToyEngine(2),
            [driver.StandinRank(RecordingWorker(None, j, r), RecordingScheduler(None, j, r)) for r in range(2)],
        )
