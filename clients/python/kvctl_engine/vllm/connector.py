"""``KvctlConnector``: vLLM's KV connector (``KVConnectorBase_V1``) over kvctl serve.

vLLM builds the connector twice: with role WORKER in every worker process (one per tensor
parallel rank), with role SCHEDULER in the engine core, another process. The two halves talk to
kvctl serve over connections of their own:

* The worker registers its rank when vLLM hands it the KV caches (``register_kv_caches``): its
  memory, one layer group whose page is a vLLM block (``memory``), the key scheme and key
  inputs. Rank 0 registers with the scheduler adapter and gets the scheduler token.
* The token reaches the scheduler through vLLM's own worker-to-scheduler channel: the worker
  returns it from ``get_handshake_metadata``, vLLM gathers it from every worker after the KV
  caches are registered and hands it to the scheduler's ``set_xfer_handshake_metadata``, which
  attaches to rank 0's scheduler adapter (``SchedulerRank.attach``: same uid and the token).
  Nothing is written to disk. vLLM does this before it schedules anything.
* Scheduler calls: Lookup (``get_num_new_matched_tokens``), UpdateStateAfterAlloc,
  TakeSubmittedSaves and BuildMeta (``build_connector_meta``), RequestFinished, RequestReset
  (preemptions, failed loads). Worker calls: BindMeta, StartLoad and TakeFailedLoads
  (``start_load_kv``), WaitForSave, GetFinished and TakeFailedAsyncLoads (``get_finished``).

Load failures: kvctl serve names the requests whose load failed; the worker reports the blocks
those requests were loading (``get_block_ids_with_load_errors``), and vLLM applies
``kv_load_failure_policy`` (recompute, or fail the requests). The failed request ids also go back
to the scheduler half (worker metadata), which resets the request in the daemon so that the
blocks vLLM recomputes are saved again.

Async saves: ``request_finished`` returns True while the daemon still saves a request's pages;
the worker reports it in ``finished_sending`` once the daemon's GetFinished does. A preempted
request's blocks go back to vLLM at once, so before the step that may reuse them
(``handle_preemptions``) the worker waits for that request's saves.

Requests with prompt embeddings are neither looked up nor saved.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)

import kvctl_engine as kv
from kvctl_engine._pb import engine_pb2 as pb

from . import memory as kvmemory
from . import settings as kvsettings

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = logging.getLogger("kvctl_engine.vllm")

# Numbers the workers of this process: two engines in one process register apart.
_instances = itertools.count()


@dataclass
class KvctlHandshakeMetadata(KVConnectorHandshakeMetadata):
    """What a worker rank hands the scheduler process: its engine name and, on the rank with the
    scheduler adapter, the scheduler token."""

    engine: str
    scheduler_token: str
    socket: str
    daemon_uid: int = 0


class KvctlConnectorMetadata(KVConnectorMetadata):
    """One step's metadata: kvctl serve's BuildMeta answer (serialised), the requests whose saves
    the worker is to report in finished_sending, and the requests vLLM preempted."""

    def __init__(self, meta: bytes = b"", saving: Iterable[str] = (), preempted: Iterable[str] = ()) -> None:
        self.meta = meta
        self.saving = list(saving)
        self.preempted = list(preempted)

    def message(self) -> pb.Metadata:
        return pb.Metadata.FromString(self.meta)

    def __repr__(self) -> str:
        return "KvctlConnectorMetadata(%r, saving=%d, preempted=%d)" % (
            kv.Metadata(self.message()),
            len(self.saving),
            len(self.preempted),
        )


@dataclass
class KvctlWorkerMetadata(KVConnectorWorkerMetadata):
    """Worker to scheduler: requests whose loads failed this step."""

    failed_loads: set[str] = field(default_factory=set)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        if isinstance(other, KvctlWorkerMetadata):
            return KvctlWorkerMetadata(self.failed_loads | other.failed_loads)
        return self


def _tp() -> tuple[int, int]:
    """This worker's tensor-parallel rank and size (0 of 1 before vLLM's groups exist)."""
    from vllm.distributed import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return 0, 1
    return ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()


def _none_hash_default() -> str | None:
    try:
        from vllm.v1.core import kv_cache_utils
    except ImportError:  # pragma: no cover - every vLLM with KVConnectorBase_V1 has it
        return None
    return getattr(kv_cache_utils, "DEFAULT_NONE_HASH_SEED", None)


def _extra_keys_style() -> str:
    """How the installed vLLM writes a block's extra keys: "tagged" when its
    generate_block_hash_extra_keys puts a cache salt in a tuple led by its kind (vLLM 0.33),
    "untagged" when it puts the bare salt. Asked of vLLM's own function, so a vLLM that changes
    the form again is caught, not guessed."""
    from types import SimpleNamespace

    from vllm.v1.core import kv_cache_utils

    probe = SimpleNamespace(mm_features=None, lora_request=None, cache_salt="s", prompt_embeds=None)
    extra, _ = kv_cache_utils.generate_block_hash_extra_keys(probe, 0, 1, 0)
    if extra == (("cache_salt", "s"),):
        return "tagged"
    if extra == ("s",):
        return "untagged"
    raise ValueError(
        f"vLLM writes a cache salt's extra key as {extra!r}: kvctl knows ('s',) and (('cache_salt', 's'),)"
    )


class KvctlConnector(KVConnectorBase_V1):
    """kvctl serve as vLLM's KV cache connector (docs/vllm.md). Load it with
    ``--kv-transfer-config '{"kv_connector": "KvctlConnector", "kv_connector_module_path":
    "kvctl_engine.vllm", "kv_role": "kv_both"}'``; ``kv_connector_extra_config`` carries the
    settings of ``kvctl_engine.vllm.settings``."""

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: Any) -> bool:
        # Sleep remaps the KV cache under a registered rank; not supported yet.
        return False

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig | None = None):
        if kv_cache_config is None:
            raise ValueError("KvctlConnector needs the KV cache config (vLLM passes it to connectors since 0.11)")
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        mc = vllm_config.model_config
        pc = vllm_config.parallel_config
        hash_algo = str(vllm_config.cache_config.prefix_caching_hash_algo)
        self.settings = kvsettings.resolve(
            ktc.kv_connector_extra_config,
            kv_role=ktc.kv_role,
            hash_algo=hash_algo,
            model=str(mc.model) if mc is not None else "",
            engine_id=str(ktc.engine_id),
        )
        unsupported = []
        for what, n in (
            ("pipeline parallel size", pc.pipeline_parallel_size),
            ("prefill context parallel size", getattr(pc, "prefill_context_parallel_size", 1)),
            ("decode context parallel size", getattr(pc, "decode_context_parallel_size", 1)),
        ):
            if n != 1:
                unsupported.append(f"{what} {n}")
        groups = kv_cache_config.kv_cache_groups
        if len(groups) != 1:
            unsupported.append(f"{len(groups)} KV cache groups (kvctl serve takes models with one)")
        if unsupported:
            raise ValueError("KvctlConnector does not support " + "; ".join(unsupported))
        self.key_params: kv.KeyParams | None = None
        if self.settings.vllm_format:
            self.key_params = kv.KeyParams(
                python_hash_seed=kvsettings.python_hash_seed(hash_algo, default_seed=_none_hash_default()),
                model=str(mc.model),
                cache_prefix=self.settings.cache_prefix,
                num_kv_heads=int(mc.get_total_num_kv_heads()),
                mla=bool(getattr(mc, "use_mla", False)),
                extra_keys=_extra_keys_style(),
            )
        self.block_size = int(vllm_config.cache_config.block_size)
        self._scheduler: _SchedulerSide | None = None
        self._worker: _WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = _SchedulerSide(self)
        else:
            self._worker = _WorkerSide(self, vllm_config, kv_cache_config)

    # -- worker ------------------------------------------------------------------------------

    @property
    def worker(self) -> _WorkerSide:
        if self._worker is None:
            raise RuntimeError("a worker call on the scheduler's KvctlConnector")
        return self._worker

    @property
    def scheduler(self) -> _SchedulerSide:
        if self._scheduler is None:
            raise RuntimeError("a scheduler call on a worker's KvctlConnector")
        return self._scheduler

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        self.worker.register(kv_caches)

    def get_handshake_metadata(self) -> KvctlHandshakeMetadata | None:
        return self.worker.handshake()

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        if isinstance(kv_connector_metadata, KvctlConnectorMetadata) and kv_connector_metadata.preempted:
            self.worker.drain_saves(kv_connector_metadata.preempted)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if not isinstance(connector_metadata, KvctlConnectorMetadata):
            raise TypeError(f"KvctlConnector was given {type(connector_metadata).__name__} metadata")
        self.worker.bind(connector_metadata)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self.worker.start_load()

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        self.worker.wait_for_save()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return self.worker.finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker.take_error_blocks()

    def build_connector_worker_meta(self) -> KvctlWorkerMetadata | None:
        return self.worker.take_worker_meta()

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.close()
        if self._scheduler is not None:
            self._scheduler.close()

    # -- scheduler ---------------------------------------------------------------------------

    def set_xfer_handshake_metadata(self, metadata: dict[int, KVConnectorHandshakeMetadata]) -> None:
        self.scheduler.attach(metadata)

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return self.scheduler.lookup(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        self.scheduler.allocated(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KvctlConnectorMetadata:
        return self.scheduler.build(scheduler_output)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self.scheduler.finished(request), None

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        meta = getattr(connector_output, "kv_connector_worker_meta", None)
        if isinstance(meta, KvctlWorkerMetadata) and meta.failed_loads:
            self.scheduler.load_failed(meta.failed_loads)


# -- the scheduler half ---------------------------------------------------------------------


@dataclass
class _Tracked:
    """A request the scheduler half looked up in kvctl serve."""

    request: Any
    # Tokens of the synchronous load UpdateStateAfterAlloc honoured, until the build that emits
    # it: vLLM counts them in num_computed_tokens, kvctl serve adds them itself.
    external: int = 0
    # The lookup offered an asynchronous load.
    async_offer: bool = False
    # The daemon forgot the request (a failed load): look it up and report all of its blocks
    # again at its next build.
    rebuild: bool = False


class _SchedulerSide:
    def __init__(self, c: KvctlConnector) -> None:
        self.c = c
        self.s = c.settings
        # Tagged extra keys hash the LoRA adapter's path with its name.
        self.tagged = c.key_params is not None and c.key_params.extra_keys == "tagged"
        self.client: kv.Client | None = None
        self.rank: kv.SchedulerRank | None = None
        self.reqs: dict[str, _Tracked] = {}
        self.saving: set[str] = set()
        self.async_pending = False

    def attach(self, metadata: dict[int, KVConnectorHandshakeMetadata]) -> None:
        found = [m for m in metadata.values() if isinstance(m, KvctlHandshakeMetadata) and m.scheduler_token]
        if len(found) != 1:
            raise kv.FailedPrecondition(
                f"KvctlConnector: {len(found)} of {len(metadata)} workers report a kvctl scheduler token, want one "
                "(tensor-parallel rank 0's)"
            )
        hs = found[0]
        self.close()
        client = kv.connect(hs.socket, timeout=self.s.timeout, daemon_uid=hs.daemon_uid)
        try:
            self.rank = kv.SchedulerRank.attach(client, hs.engine, hs.scheduler_token)
        except BaseException:
            client.close()
            raise
        self.client = client
        log.info("kvctl: the scheduler attached to %s over %s", hs.engine, hs.socket)

    def _r(self) -> kv.SchedulerRank:
        if self.rank is None:
            raise kv.FailedPrecondition(
                "KvctlConnector: the scheduler has no kvctl rank yet: vLLM hands it the workers' handshake "
                "(set_xfer_handshake_metadata) once they registered their KV caches"
            )
        return self.rank

    def _request(self, request: Any) -> kv.Request | None:
        if getattr(request, "prompt_embeds", None) is not None:
            return None  # prompt embeddings: neither looked up nor saved
        tokens = list(request.all_token_ids)
        lora = getattr(request, "lora_request", None)
        mm = getattr(request, "mm_features", None) or []
        salt = getattr(request, "cache_salt", None)
        if self.s.vllm_format:
            return kv.Request(
                id=request.request_id,
                tokens=tokens,
                cache_salt=salt or None,
                lora_name=None if lora is None else str(lora.lora_name),
                lora_path=None if lora is None or not self.tagged else str(lora.lora_path),
                mm_features=[
                    kv.MMFeature(str(f.identifier), int(f.mm_position.offset), int(f.mm_position.length)) for f in mm
                ],
            )
        # TensorRT-LLM's schemes: the LoRA adapter by its integer id; a multimodal request carries
        # no digests of TensorRT-LLM's kind, so kvctl serve neither looks it up nor saves it.
        return kv.Request(
            id=request.request_id,
            tokens=tokens,
            cache_salt=salt or None,
            lora_task_id=None if lora is None else int(lora.lora_int_id),
            has_multimodal=bool(mm),
        )

    def lookup(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        req = self._request(request)
        if req is None:
            self.reqs.pop(request.request_id, None)
            return 0, False
        r = self._r()
        try:
            res = r.lookup(req, int(num_computed_tokens))
        except kv.RequestMustRestart:
            # The daemon holds a longer prompt under this id (vLLM reuses request ids across
            # restarts of a request): forget it and ask again.
            r.request_reset(req.id)
            res = r.lookup(req, int(num_computed_tokens))
        st = self.reqs.get(req.id)
        if st is None:
            self.reqs[req.id] = st = _Tracked(request)
        async_offer = bool(res.is_async and res.matched_tokens > 0)
        st.request, st.external, st.rebuild, st.async_offer = request, 0, False, async_offer
        return int(res.matched_tokens), async_offer

    def allocated(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        st = self.reqs.get(request.request_id)
        if st is None:
            return
        ids = list(blocks.get_block_ids()[0]) if num_external_tokens > 0 else []
        self._r().update_state_after_alloc(request.request_id, [ids], int(num_external_tokens))
        async_load = num_external_tokens > 0 and st.async_offer
        st.async_offer = False
        st.external = 0 if async_load else int(num_external_tokens)
        self.async_pending = self.async_pending or async_load

    def _rebuild(self, rid: str, st: _Tracked) -> list[int]:
        """Looks a request the daemon forgot up again, offering nothing; its whole block list."""
        r = self._r()
        req = self._request(st.request)
        assert req is not None
        r.lookup(req, 0)
        mgr = self.c._kv_cache_manager
        ids = list(mgr.get_block_ids(rid)[0]) if mgr is not None else []
        r.update_state_after_alloc(rid, [ids], 0)
        st.rebuild, st.external = False, 0
        return ids

    def build(self, out: Any) -> KvctlConnectorMetadata:
        r = self._r()
        for rid in out.finished_req_ids:
            self.reqs.pop(rid, None)
        preempted = sorted(out.preempted_req_ids or ())
        for rid in preempted:
            if self.reqs.pop(rid, None) is not None:
                r.request_reset(rid)
        new, cached = [], []
        for nr in out.scheduled_new_reqs:
            st = self.reqs.get(nr.req_id)
            if st is None:
                continue
            ids = self._rebuild(nr.req_id, st) if st.rebuild else list(nr.block_ids[0])
            new.append(
                kv.RequestData(
                    nr.req_id,
                    [ids],
                    computed_position=int(nr.num_computed_tokens) - st.external,
                    num_scheduled_tokens=int(out.num_scheduled_tokens[nr.req_id]),
                )
            )
            st.external = 0
        cr = out.scheduled_cached_reqs
        for i, rid in enumerate(cr.req_ids):
            st = self.reqs.get(rid)
            if st is None:
                continue
            delta = cr.new_block_ids[i]
            if st.rebuild:
                ids = self._rebuild(rid, st)
            else:
                ids = list(delta[0]) if delta else []
            cached.append(
                kv.RequestData(
                    rid,
                    [ids],
                    computed_position=int(cr.num_computed_tokens[i]) - st.external,
                    num_scheduled_tokens=int(out.num_scheduled_tokens[rid]),
                )
            )
            st.external = 0
        saving, self.saving = sorted(self.saving), set()
        if not new and not cached and not self.async_pending:
            return KvctlConnectorMetadata(b"", saving, preempted)
        self.async_pending = False
        meta = r.build_meta(new, cached, r.take_submitted_saves())
        return KvctlConnectorMetadata(meta.pb.SerializeToString(), saving, preempted)

    def finished(self, request: Any) -> bool:
        rid = request.request_id
        if self.reqs.pop(rid, None) is None:
            return False
        if self._r().request_finished(rid):
            self.saving.add(rid)
            return True
        return False

    def load_failed(self, ids: set[str]) -> None:
        r = self._r()
        for rid in sorted(ids):
            st = self.reqs.get(rid)
            if st is None:
                continue
            r.request_reset(rid)
            st.rebuild = True

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        self.client, self.rank = None, None


# -- the worker half ------------------------------------------------------------------------


class _WorkerSide:
    def __init__(self, c: KvctlConnector, vllm_config: Any, kv_cache_config: Any) -> None:
        self.c = c
        self.s = c.settings
        self.kv_cache_config = kv_cache_config
        self.num_blocks = int(kv_cache_config.num_blocks)
        self.layer_names = list(kv_cache_config.kv_cache_groups[0].layer_names)
        self.tp_rank, self.tp_size = _tp()
        dp = getattr(vllm_config.parallel_config, "data_parallel_size", 1)
        dp_rank = getattr(vllm_config.parallel_config, "data_parallel_index", 0)
        suffix = (f"/dp{dp_rank}" if dp > 1 else "") + f"/rank{self.tp_rank}"
        self.name = f"{self.s.engine_name}.{os.getpid()}.{next(_instances)}{suffix}"
        self.client: kv.Client | None = None
        self.rank: kv.Rank | None = None
        self.registration: kvmemory.Registration | None = None
        self.bound: pb.Metadata | None = None
        self.loads: dict[str, list[int]] = {}  # request -> blocks its synchronous load fills
        self.async_blocks: dict[str, list[int]] = {}  # parked request -> blocks of its async load
        self.announce: list[str] = []  # parked requests not yet reported to GetFinished
        self.loaded: set[str] = set()  # async loads GetFinished reported, not yet told to vLLM
        self.saved: set[str] = set()  # awaited saves GetFinished reported, not yet told to vLLM
        self.awaiting: set[str] = set()  # requests whose saves vLLM waits for (finished_sending)
        self.error_blocks: set[int] = set()
        self.failed: set[str] = set()

    def register(self, kv_caches: dict[str, Any]) -> None:
        if self.rank is not None:
            raise kv.AlreadyRegistered(f"KvctlConnector: {self.name} already registered its KV caches")
        reg = kvmemory.registration(kv_caches, self.layer_names, self.num_blocks, self.c.block_size)
        order = None
        if reg.kind == "cuda-ipc":
            from kvctl_engine.cuda_events import TorchStreamOrder

            order = TorchStreamOrder(reg.device)
        client = kv.connect(self.s.socket, timeout=self.s.timeout, daemon_uid=self.s.daemon_uid)
        try:
            rank = kv.Rank.register(
                client,
                self.name,
                reg.layout,
                reg.memory,
                model_key=self.s.model_key,
                namespace=self.s.namespace,
                world_size=self.tp_size,
                rank=self.tp_rank,
                role=self.s.role,
                format=self.s.format,
                scheduler=self.tp_rank == 0,
                options=kv.RankOptions(async_load=self.s.async_load, async_load_workers=self.s.async_load_workers),
                stream_order=order,
                key_params=self.c.key_params,
            )
        except BaseException:
            client.close()
            if order is not None:
                order.close()
            raise
        self.client, self.rank, self.registration = client, rank, reg
        log.info(
            "kvctl: registered %s (%s memory, %d blocks of %d bytes, format %s) with kvctl serve at %s",
            self.name,
            reg.kind,
            self.num_blocks,
            sum(r.size for r in reg.layout.groups[0].regions),
            self.s.format,
            self.s.socket,
        )

    def _r(self) -> kv.Rank:
        if self.rank is None:
            raise kv.NotRegistered("KvctlConnector: the worker's KV caches are not registered yet (register_kv_caches)")
        return self.rank

    def handshake(self) -> KvctlHandshakeMetadata | None:
        r = self._r()
        if not r.scheduler_token:
            return None
        return KvctlHandshakeMetadata(r.name, r.scheduler_token, self.s.socket, self.s.daemon_uid)

    def drain_saves(self, ids: list[str]) -> None:
        """Waits until the daemon saved what it was saving of ids (requests vLLM preempted, whose
        blocks it may hand to others from this step on)."""
        r = self._r()
        left = set(ids)
        gen = sorted(left)
        deadline = time.monotonic() + self.s.save_timeout
        while left:
            # The daemon answers as soon as a save is done (engine API 1.3); one that answers at
            # once with nothing (an older daemon) is polled every millisecond.
            asked = time.monotonic()
            fin = r.get_finished(finished_gen=gen, wait=min(kv.MAX_FINISHED_WAIT, max(0.0, deadline - asked)))
            self._take_async(r, fin)
            gen = []
            left -= set(fin.finished_saving)
            if not left:
                break
            if time.monotonic() > deadline:
                raise kv.CallTimeout(
                    f"KvctlConnector: the saves of preempted requests {sorted(left)[:4]} did not finish within "
                    f"{self.s.save_timeout:.0f} s; their blocks cannot be reused safely"
                )
            if time.monotonic() - asked < 0.001:
                time.sleep(0.001)

    def bind(self, m: KvctlConnectorMetadata) -> None:
        r = self._r()
        self.awaiting.update(m.saving)
        self.bound = m.message() if m.meta else None
        self.loads = {}
        if self.bound is None:
            return
        for t in self.bound.loads:
            self.loads[t.request_id] = [p.page for p in t.pages]
        for t in self.bound.async_loads:
            self.async_blocks[t.request_id] = [p.page for p in t.pages]
            self.announce.append(t.request_id)
        if self.bound.loads or self.bound.saves or self.bound.async_loads:
            r.bind_meta(kv.Metadata(self.bound))

    def start_load(self) -> None:
        if self.bound is None or not self.bound.loads:
            return
        r = self._r()
        r.start_load()
        failed = r.take_failed_loads()
        for rid in failed:
            self.error_blocks.update(self.loads.get(rid, ()))
        self.failed.update(failed)

    def wait_for_save(self) -> None:
        if self.bound is not None and self.bound.saves:
            self._r().wait_for_save()

    def _take_async(self, r: kv.Rank, fin: kv.Finished) -> None:
        failed = r.take_failed_async_loads()
        for rid in failed:
            self.error_blocks.update(self.async_blocks.get(rid, ()))
        self.failed.update(failed)
        for rid in fin.finished_loading:
            self.async_blocks.pop(rid, None)
        # A GetFinished made to drain a preempted request's saves may report loads done, and
        # saves vLLM waits for, too: both are kept for the next get_finished.
        self.loaded.update(fin.finished_loading)
        done = {rid for rid in fin.finished_saving if rid in self.awaiting}
        self.awaiting -= done
        self.saved |= done

    def finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if not (finished_req_ids or self.awaiting or self.async_blocks or self.loaded or self.saved):
            return None, None
        r = self._r()
        started, self.announce = self.announce, []
        fin = r.get_finished(finished_gen=sorted(finished_req_ids), started_loading=started)
        self._take_async(r, fin)
        sending, self.saved = self.saved, set()
        recving, self.loaded = self.loaded, set()
        return sending or None, recving or None

    def take_error_blocks(self) -> set[int]:
        out, self.error_blocks = self.error_blocks, set()
        return out

    def take_worker_meta(self) -> KvctlWorkerMetadata | None:
        if not self.failed:
            return None
        out, self.failed = self.failed, set()
        return KvctlWorkerMetadata(out)

    def close(self) -> None:
        rank, client = self.rank, self.client
        self.rank, self.client = None, None
        try:
            if rank is not None:
                rank.close(timeout=self.s.save_timeout)
        finally:
            if client is not None:
                client.close()
