"""A stand-in of TensorRT-LLM's connector driver: calls a connector in the order its executor does.

This is not TensorRT-LLM. It follows, step by step, what ``KvCacheConnectorManager`` (in
``tensorrt_llm/_torch/pyexecutor/connectors/kv_cache_connector.py`` at 035ab91c) and the
executor around it call on the two connector halves, plus the seed PR's additions, so that a
connector can be exercised where TensorRT-LLM cannot be installed:

* construction: a worker on every rank, the scheduler on rank 0 under tensor parallelism or on
  every rank under attention DP (which both classes must declare, ``supports_attention_dp``);
  a worker declaring ``reports_failed_loads`` must override the seed's hooks.
* ``wait_for_initialization`` on every scheduler; the engine registers its pool on every worker
  (``register_kv_cache_layout`` for KVCacheManagerV2, ``register_kv_caches`` for V1).
* per step, for each request admitted: ``get_num_new_matched_tokens`` on the leader, its answer
  broadcast (pickled) to every rank; ``(0, True)`` is refused; an offer the engine honours only
  in part is trimmed with ``cancel_load`` (V2, where the scheduler overrides it); the honoured
  count goes to ``request.py_num_connector_matched_tokens``; after allocation
  ``update_state_after_alloc`` (or the ``_by_layer_group`` form) on the schedulers only.
* an asynchronous offer parks the request outside the batch.
* ``build_connector_meta`` over the step's SchedulerOutput (new requests the first time, cached
  afterwards; a request's first ``computed_position`` leaves the connector's tokens out; parked
  requests left out) on the leader, pickled to every rank's ``bind_connector_meta``.
* ``start_load_kv`` on every worker, then (seed) ``take_failed_load_requests``: each reported
  request has its bound saves dropped (``drop_bound_saves``), its allocation freed, the
  scheduler told (``request_reset``) and is admitted again; under tensor parallelism a report is
  fatal.
* the forward pass: ``wait_for_layer_load`` / ``save_kv_layer`` around every layer, then
  ``wait_for_save``.
* ``request_finished`` (``_by_layer_group`` where the engine reports groups) when a request
  ends, on the leader, broadcast; True keeps its pages.
* ``get_finished`` on every worker; the ids every rank reported (the intersection, an
  all-gather under tensor parallelism) take effect: a finished save frees the pages, a finished
  load puts the request back into the batch without a new lookup; then (seed)
  ``take_failed_async_load_requests``.

What an engine does is behind :class:`Engine`: allocation, the forward pass, and the memory it
registers. Ranks live in this process; every value that crosses ranks in TensorRT-LLM crosses
them here through ``pickle``.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import base

# Request states the driver uses (TensorRT-LLM's LlmRequestState names).
CONTEXT_INIT = "CONTEXT_INIT"
GENERATION_IN_PROGRESS = "GENERATION_IN_PROGRESS"
DISAGG_GENERATION_TRANS_IN_PROGRESS = "DISAGG_GENERATION_TRANS_IN_PROGRESS"  # parked load
DISAGG_CONTEXT_TRANS_IN_PROGRESS = "DISAGG_CONTEXT_TRANS_IN_PROGRESS"  # saving after the end
GENERATION_COMPLETE = "GENERATION_COMPLETE"


class StandinLlmRequest:
    """The attributes of TensorRT-LLM's LlmRequest that a connector reads, under the same names."""

    def __init__(
        self,
        request_id: int,
        prompt: Sequence[int],
        *,
        max_new_tokens: int = 0,
        cache_salt: str | None = None,
        lora_task_id: int | None = None,
        multimodal_hashes: list[list[int]] | None = None,
        multimodal_positions: list[int] | None = None,
        multimodal_lengths: list[int] | None = None,
        is_context_only_request: bool = False,
        is_dummy_request: bool = False,
    ) -> None:
        self.request_id = request_id
        self.py_request_id = request_id
        self.prompt = list(prompt)
        self.tokens = list(prompt)
        self.max_new_tokens = max_new_tokens
        self.cache_salt = cache_salt
        self.lora_task_id = lora_task_id
        self.multimodal_hashes = multimodal_hashes
        self.multimodal_positions = multimodal_positions
        self.multimodal_lengths = multimodal_lengths
        self.is_context_only_request = is_context_only_request
        self.is_generation_only_request = False
        self.is_dummy_request = is_dummy_request
        self.is_attention_dp_dummy = is_dummy_request
        self.py_num_connector_matched_tokens = 0
        self.state = CONTEXT_INIT
        self.context_current_position = 0

    def get_tokens(self, beam: int) -> list[int]:
        if beam != 0:
            raise ValueError("only beam 0 exists")
        return self.tokens

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def generated(self) -> list[int]:
        return self.tokens[len(self.prompt) :]


class Engine(Protocol):
    """What the driver needs from an engine: its KV cache manager and its forward pass."""

    tokens_per_block: int
    world_size: int

    def register(self, rank: int, worker: Any) -> None:
        """Hand the rank's KV pool to the worker (register_kv_cache_layout or register_kv_caches)."""

    def local_match(self, request: StandinLlmRequest) -> int:
        """Prompt tokens the engine's own cache already holds (num_computed_tokens)."""

    def allocate(self, request: StandinLlmRequest, num_tokens: int) -> list[list[int]]:
        """Pages for num_tokens tokens, per layer group (identical on every rank); appends to earlier ones."""

    def forward(self, rank: int, request: StandinLlmRequest, start: int, end: int) -> int | None:
        """Compute tokens [start, end) on the rank; at the prompt's end (or decoding), the next token.
        An engine whose ranks meet in collectives defines forward_all(request, start, end) instead,
        returning every rank's answer."""

    def num_layers(self) -> int:
        """Layers the forward pass runs (the per-layer hooks are called around each)."""

    def release(self, request: StandinLlmRequest) -> None:
        """Free the request's pages."""


@dataclass
class StandinRank:
    worker: Any
    scheduler: Any = None


@dataclass
class _Tracked:
    request: StandinLlmRequest
    pages: list[list[int]] = field(default_factory=list)
    reported_pages: list[int] = field(default_factory=list)  # per group, pages already reported
    reported_tokens: int = 0
    external: int | None = None  # honoured connector tokens, until the first scheduler output
    new: bool = True
    restarts: int = 0
    parked: bool = False
    next_token: int | None = None


@dataclass
class StepLog:
    """What happened in one step, for tests to assert on."""

    step: int
    calls: list[str] = field(default_factory=list)
    restarted: list[int] = field(default_factory=list)


class ConnectorFailure(RuntimeError):
    """The stand-in executor stopped, as TensorRT-LLM's _kv_connector_fail would."""


def _overrides(obj: Any, name: str) -> bool:
    fn = getattr(type(obj), name, None)
    if fn is None:
        return False
    for klass in (base.KvCacheConnectorScheduler, base.KvCacheConnectorWorker):
        if getattr(klass, name, None) is fn:
            return False
    return True


class StandinConnectorManager:
    """Drives one connector (a worker per rank, its schedulers) over an :class:`Engine`."""

    def __init__(
        self,
        engine: Engine,
        ranks: list[StandinRank],
        *,
        attention_dp: bool = False,
        kv_cache_manager_v2: bool = True,
        chunk: int = 0,
        seed: bool = True,
        before_start_load: Callable[[int], None] | None = None,
        trace: Callable[[str], None] | None = None,
    ) -> None:
        if len(ranks) != engine.world_size:
            raise ValueError(f"{len(ranks)} ranks for an engine of world size {engine.world_size}")
        for i, r in enumerate(ranks):
            want = attention_dp or i == 0
            if (r.scheduler is not None) != want:
                raise ValueError(
                    "a scheduler is required on every attention-DP owner, or only on rank 0 under tensor parallelism"
                )
        if attention_dp:
            for r in ranks:
                for half in (r.worker, r.scheduler):
                    if getattr(type(half), "supports_attention_dp", False) is not True:
                        raise NotImplementedError("the connector must declare supports_attention_dp=True")
        w = ranks[0].worker
        # seed=False stands in for a release without the seed PR: no declaration is read, no
        # failed load is asked for.
        self.reports_failed_loads = seed and getattr(type(w), "reports_failed_loads", False) is True
        if self.reports_failed_loads:
            for hook in ("take_failed_load_requests", "drop_bound_saves"):
                if not _overrides(w, hook):
                    raise ValueError(f"a worker declaring reports_failed_loads must implement {hook}")
            if not kv_cache_manager_v2:
                raise NotImplementedError("reports_failed_loads needs KVCacheManagerV2, which can restart a request")
        self.engine = engine
        self.ranks = ranks
        self.attention_dp = attention_dp
        self.v2 = kv_cache_manager_v2
        self.chunk = chunk
        # Called with the step number after the metadata is bound and before start_load_kv: where
        # a test makes the pool lose a page it offered.
        self.before_start_load = before_start_load
        self.trace = trace or (lambda s: None)
        self.waiting: list[StandinLlmRequest] = []
        self.active: dict[int, _Tracked] = {}
        self.saving: dict[int, _Tracked] = {}
        self.done: list[StandinLlmRequest] = []
        self.log: list[StepLog] = []
        self._pending_loading: set[int] = set()  # announced to get_finished, not yet reported by all
        self._new_loading: set[int] = set()
        self._new_saving: set[int] = set()
        self._pending_saving: set[int] = set()
        self._finished_local: list[tuple[set, set]] = [(set(), set()) for _ in ranks]
        self.steps = 0

    # --- collectives -------------------------------------------------------------------------

    def _on_leader(self, rank: int, f: Callable[[Any], Any]) -> Any:
        """Run on the scheduler that owns the call and hand every rank a pickled copy."""
        if self.attention_dp:
            return f(self.ranks[rank].scheduler)
        return pickle.loads(pickle.dumps(f(self.ranks[0].scheduler)))

    def _schedulers(self) -> list[Any]:
        return [r.scheduler for r in self.ranks if r.scheduler is not None]

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        for i, r in enumerate(self.ranks):
            self.engine.register(i, r.worker)
        for s in self._schedulers():
            s.wait_for_initialization()

    def submit(self, request: StandinLlmRequest) -> None:
        self.waiting.append(request)

    def run(self, max_steps: int = 1000) -> list[StandinLlmRequest]:
        while self.waiting or self.active or self.saving:
            if self.steps >= max_steps:
                raise ConnectorFailure(f"not done after {max_steps} steps")
            self.step()
        return self.done

    # --- one executor iteration --------------------------------------------------------------

    def step(self) -> StepLog:
        self.steps += 1
        log = StepLog(self.steps)
        self.log.append(log)
        owner = 0  # under attention DP every request here is owned by rank 0's scheduler

        # Admission: lookup, honour, allocation.
        admitted, self.waiting = self.waiting, []
        for req in admitted:
            t = _Tracked(req, restarts=getattr(req, "_restarts", 0))
            num_computed = self.engine.local_match(req)
            tokens, is_async = self._on_leader(
                owner, lambda s, req=req, n=num_computed: s.get_num_new_matched_tokens(req, n)
            )
            log.calls.append(f"get_num_new_matched_tokens({req.request_id}, {num_computed}) = ({tokens}, {is_async})")
            if tokens == 0 and is_async:
                raise ConnectorFailure("load_kv_async must be False when num_tokens is 0")
            honoured = self._honour(req, num_computed, tokens)
            if honoured < tokens and self.v2:
                start, end = num_computed + honoured, num_computed + tokens
                self._on_leader(
                    owner, lambda s, req=req, a=start, b=end: _overrides(s, "cancel_load") and s.cancel_load(req, a, b)
                )
                log.calls.append(f"cancel_load({req.request_id}, {start}, {end})")
            req.py_num_connector_matched_tokens = honoured
            t.external = honoured
            req.context_current_position = num_computed + honoured
            t.pages = self.engine.allocate(req, len(req.prompt))
            for s in self._schedulers()[:1] if not self.attention_dp else [self.ranks[owner].scheduler]:
                if self.v2:
                    s.update_state_after_alloc_by_layer_group(req, [list(g) for g in t.pages])
                else:
                    s.update_state_after_alloc(req, list(t.pages[0]))
            log.calls.append(f"update_state_after_alloc({req.request_id})")
            if is_async:
                t.parked = True
                req.state = DISAGG_GENERATION_TRANS_IN_PROGRESS
                self._new_loading.add(req.request_id)
            self.active[req.request_id] = t

        # Scheduler output, metadata, loads.
        batch = [t for t in self.active.values() if not t.parked]
        out = base.SchedulerOutput()
        plans = {}
        for t in batch:
            req = t.request
            start = req.context_current_position
            if req.state == CONTEXT_INIT:
                end = len(req.prompt) if not self.chunk else min(len(req.prompt), start + self.chunk)
                computed_position = start - (t.external or 0)
                scheduled = end - start
            else:
                start, end = len(req.tokens) - 1, len(req.tokens)
                computed_position, scheduled = start, 1
            plans[req.request_id] = (start, end)
            data = self._request_data(t, computed_position, scheduled)
            (out.new_requests if t.new else out.cached_requests).append(data)
            t.new = False
            t.external = None
        if self.attention_dp:
            # Every owner builds its own metadata; the owners other than rank 0 have no requests
            # here and are handed an empty output.
            out.attention_dp_rank = owner
            for i, r in enumerate(self.ranks):
                own = out if i == owner else base.SchedulerOutput(attention_dp_rank=i)
                r.worker.bind_connector_meta(r.scheduler.build_connector_meta(own))
        else:
            meta = self._on_leader(owner, lambda s: s.build_connector_meta(out))
            for r in self.ranks:
                r.worker.bind_connector_meta(pickle.loads(pickle.dumps(meta)))
        log.calls.append("build_connector_meta")
        if self.before_start_load is not None:
            self.before_start_load(self.steps)
        stream = None
        for r in self.ranks:
            r.worker.start_load_kv(stream)
        log.calls.append("start_load_kv")
        if self.reports_failed_loads:
            failed = [set(r.worker.take_failed_load_requests()) for r in self.ranks]
            if any(failed):
                if not self.attention_dp and len(self.ranks) > 1:
                    raise ConnectorFailure(
                        f"a tensor-parallel rank reported failed loads {sorted(set().union(*failed))}"
                    )
                ids = sorted(set().union(*failed))
                for r in self.ranks:
                    r.worker.drop_bound_saves(ids)
                for rid in ids:
                    if rid not in plans:
                        raise ConnectorFailure(f"failed load reported for request {rid}, which is not in the batch")
                    self._restart(self.active.pop(rid), log)
                    plans.pop(rid)
                batch = [t for t in batch if t.request.request_id in plans]

        # The forward pass.
        for layer in range(self.engine.num_layers()):
            for r in self.ranks:
                r.worker.wait_for_layer_load(layer, stream)
            # The engine computes every layer at once below; the hooks keep TensorRT-LLM's order.
            for r in self.ranks:
                r.worker.save_kv_layer(layer, stream)
        for t in batch:
            req = t.request
            start, end = plans[req.request_id]
            forward_all = getattr(self.engine, "forward_all", None)
            if forward_all is not None:  # ranks that meet in collectives run together
                got = forward_all(req, start, end)
            else:
                got = [self.engine.forward(rank, req, start, end) for rank in range(len(self.ranks))]
            nxt = got[0]
            if any(g != nxt for g in got):
                raise ConnectorFailure(f"ranks disagree on request {req.request_id}'s next token: {got}")
            if req.state == CONTEXT_INIT:
                req.context_current_position = end
                if end == len(req.prompt):
                    req.state = GENERATION_IN_PROGRESS
                    self._emit(t, nxt)
            else:
                self._emit(t, nxt)
        for r in self.ranks:
            r.worker.wait_for_save(stream)
        log.calls.append("wait_for_save")

        # Requests that ended.
        for t in list(batch):
            req = t.request
            if req.state == GENERATION_IN_PROGRESS and len(req.generated) >= max(1, req.max_new_tokens):
                self._finish(t, owner, log)

        self._get_finished(log)
        return log

    def _honour(self, req: StandinLlmRequest, num_computed: int, tokens: int) -> int:
        honour = getattr(self.engine, "honour", None)
        return tokens if honour is None else honour(req, num_computed, tokens)

    def _request_data(self, t: _Tracked, computed_position: int, scheduled: int):
        req = t.request
        new_tokens = req.tokens[t.reported_tokens :]
        t.reported_tokens = len(req.tokens)
        by_group = []
        while len(t.reported_pages) < len(t.pages):
            t.reported_pages.append(0)
        for g, pages in enumerate(t.pages):
            by_group.append(list(pages[t.reported_pages[g] :]))
            t.reported_pages[g] = len(pages)
        flat = by_group[0] if len(by_group) == 1 else []
        kwargs = {
            "request_id": req.request_id,
            "new_tokens": list(new_tokens),
            "new_block_ids": list(flat),
            "computed_position": computed_position,
            "num_scheduled_tokens": scheduled,
        }
        fields = getattr(base.RequestData, "__dataclass_fields__", {})
        if "cache_salt" in fields:
            kwargs["cache_salt"] = req.cache_salt
        if "new_block_ids_by_layer_group" in fields and self.v2:
            kwargs["new_block_ids_by_layer_group"] = by_group
        return base.RequestData(**kwargs)

    def _emit(self, t: _Tracked, token: int | None) -> None:
        if token is None:
            raise ConnectorFailure(f"the engine produced no token for request {t.request.request_id}")
        t.request.tokens.append(int(token))
        grow = getattr(self.engine, "grow", None)
        if grow is not None:
            t.pages = grow(t.request, t.pages)

    def _finish(self, t: _Tracked, owner: int, log: StepLog) -> None:
        req = t.request
        req.state = GENERATION_COMPLETE
        pages = [list(g) for g in t.pages]
        if self.v2:
            saving = self._on_leader(owner, lambda s: s.request_finished_by_layer_group(req, pages))
        else:
            saving = self._on_leader(owner, lambda s: s.request_finished(req, pages[0]))
        log.calls.append(f"request_finished({req.request_id}) = {saving}")
        del self.active[req.request_id]
        if saving:
            req.state = DISAGG_CONTEXT_TRANS_IN_PROGRESS
            self.saving[req.request_id] = t
            self._new_saving.add(req.request_id)
        else:
            self.engine.release(req)
            self.done.append(req)

    def _restart(self, t: _Tracked, log: StepLog) -> None:
        req = t.request
        self.engine.release(req)
        for s in self._schedulers():
            if _overrides(s, "request_reset"):
                s.request_reset(req)
        log.calls.append(f"request_reset({req.request_id})")
        log.restarted.append(req.request_id)
        req.state = CONTEXT_INIT
        req.context_current_position = 0
        req.py_num_connector_matched_tokens = 0
        req._restarts = t.restarts + 1
        self.waiting.append(req)

    def _get_finished(self, log: StepLog) -> None:
        started_loading = sorted(self._new_loading)
        finished_gen = sorted(self._new_saving)
        self._pending_loading |= self._new_loading
        self._pending_saving |= self._new_saving
        self._new_loading, self._new_saving = set(), set()
        for i, r in enumerate(self.ranks):
            saved, loaded = r.worker.get_finished(list(finished_gen), list(started_loading))
            saved, loaded = set(saved), set(loaded)
            if not saved <= self._pending_saving or not loaded <= self._pending_loading:
                raise ConnectorFailure(
                    f"rank {i} reported ids it was never given: saving {sorted(saved - self._pending_saving)}, loading {sorted(loaded - self._pending_loading)}"
                )
            self._finished_local[i][0].update(saved)
            self._finished_local[i][1].update(loaded)
        # All-gather (tensor parallelism) or local (attention DP: rank 0 owns every request here).
        group = self._finished_local if not self.attention_dp else self._finished_local[:1]
        all_saved = set.intersection(*[s for s, _ in group])
        all_loaded = set.intersection(*[lo for _, lo in group])
        for s, lo in self._finished_local:
            s -= all_saved
            lo -= all_loaded
        self._pending_saving -= all_saved
        self._pending_loading -= all_loaded
        log.calls.append(f"get_finished -> saved {sorted(all_saved)} loaded {sorted(all_loaded)}")
        for rid in sorted(all_loaded):
            t = self.active[rid]
            t.parked = False
            t.request.state = CONTEXT_INIT
        for rid in sorted(all_saved):
            t = self.saving.pop(rid)
            self.engine.release(t.request)
            self.done.append(t.request)
        if self.reports_failed_loads:
            failed = set()
            for r in self.ranks:
                take = getattr(r.worker, "take_failed_async_load_requests", None)
                if take is not None:
                    failed |= set(take())
            if failed:
                if not self.attention_dp and len(self.ranks) > 1:
                    raise ConnectorFailure(
                        f"a tensor-parallel rank reported failed asynchronous loads {sorted(failed)}"
                    )
                for rid in sorted(failed):
                    if rid not in all_loaded:
                        raise ConnectorFailure(
                            f"failed asynchronous load reported for request {rid}, whose load was not reported finished"
                        )
                    for r in self.ranks:
                        r.worker.drop_bound_saves([rid])
                    self._restart(self.active.pop(rid), log)
