"""``KvctlConnectorScheduler`` and ``KvctlConnectorWorker``: TensorRT-LLM's connector over kvctl serve.

TensorRT-LLM builds the worker on every rank and the scheduler on rank 0 (every owner under
attention DP), both with ``llm_args``, from threads of the same process. Each rank opens one
connection and registers once, when its KV pool is registered; the scheduler on that rank waits
for the registration and uses the same :class:`kvctl_engine.Rank` (``_RankState``). Request ids
are TensorRT-LLM's integers, sent as decimal strings.

The class declarations are what kvctl serve declares for the role (core/connector/
declarations.go) and are checked against the RegisterResponse: a mismatch stops the rank at
registration, before TensorRT-LLM acts on a promise the daemon does not keep.

Stream order: a pool on a CUDA device registers a CUDA interprocess event
(``kvctl_engine.cuda_events``; TensorRT-LLM always has PyTorch, so ``TorchStreamOrder``).
``start_load_kv(stream)`` records it on TensorRT-LLM's stream before the daemon's copies, which
wait for it, and makes that stream wait for the daemon's event after them; ``wait_for_save(stream)``
records it before the saves, which read the KV only once the forward pass that wrote it is done.
Neither call blocks the host on the device, and nothing synchronises the whole device. A pool in
host memory is ordered by the host: ``wait_for_save`` synchronises the given stream only.
"""

from __future__ import annotations

import itertools
import os
import struct
import threading
from typing import Any, ClassVar

import kvctl_engine as kv

from . import base, settings
from . import memory as kvmemory

#: How long a scheduler waits for its rank's worker to register.
REGISTRATION_TIMEOUT = 600.0


class DeclarationMismatch(kv.FailedPrecondition):
    """The connector's class declarations differ from what kvctl serve declared at registration."""


def _mpi_rank() -> int:
    try:
        from tensorrt_llm._utils import mpi_rank  # type: ignore[import-not-found]

        return int(mpi_rank())
    except ImportError:
        pass
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def _attr(obj: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        cur = obj
        for part in n.split("."):
            cur = getattr(cur, part, None)
            if cur is None:
                break
        if cur is not None:
            return cur
    return default


def prompt_lookahead(spec: Any) -> int:
    """Prompt tokens past a position a one-model draft reads (seed commit 14): max_draft_len for
    vanilla MTP, 1 for MTP-Eagle and EAGLE3 run as one model, else 0."""
    if spec is None:
        return 0
    kind = str(_attr(spec, "decoding_type", default="")).lower()
    if kind == "mtp":
        if _attr(spec, "use_mtp_vanilla", default=False):
            n = _attr(spec, "max_draft_len", "num_nextn_predict_layers", default=0)
            return int(n)
        return 1 if _attr(spec, "mtp_eagle_one_model", default=True) else 0
    if kind == "eagle3":
        return 1 if _attr(spec, "eagle3_one_model", default=True) else 0
    return 0


def drafter_kind(spec: Any) -> str:
    """The drafter kind Register carries (RegisterRequest.drafter): "mtp" or "eagle3" when run
    as one model, "<kind>-two-model" when not, else TensorRT-LLM's decoding_type lowered ("" with
    no speculative decoding). kvctl serve refuses speculative prefill with any but the first two,
    as TensorRT-LLM does."""
    if spec is None:
        return ""
    kind = str(_attr(spec, "decoding_type", default="")).lower()
    if kind == "mtp":
        one = _attr(spec, "use_mtp_vanilla", default=False) or _attr(spec, "mtp_eagle_one_model", default=True)
        return "mtp" if one else "mtp-two-model"
    if kind == "eagle3":
        return "eagle3" if _attr(spec, "eagle3_one_model", default=True) else "eagle3-two-model"
    return kind


def _is_dummy(request: Any) -> bool:
    return getattr(request, "is_dummy_request", False) is True or getattr(request, "is_dummy", False) is True


def multimodal_digests(request: Any) -> tuple[list[bytes], bool]:
    """One 32-byte digest per multimodal item (8 int32 chunks, each big-endian signed, as
    KVCacheManagerV2 and the built-in connector read ``multimodal_hashes``), and whether the
    request has multimodal positions or lengths at all."""
    hashes = getattr(request, "multimodal_hashes", None) or []
    digests = []
    for item in hashes:
        chunks = list(item)
        if len(chunks) != 8:
            raise kv.InvalidArgument(
                f"request {request.request_id}: a multimodal hash has {len(chunks)} chunks, want 8"
            )
        digests.append(b"".join(struct.pack(">i", int(c)) for c in chunks))
    has = (
        bool(digests)
        or bool(getattr(request, "multimodal_positions", None))
        or bool(getattr(request, "multimodal_lengths", None))
    )
    return digests, has


def _stream_order(reg: kvmemory.Registration) -> Any:
    """The CUDA stream ordering a pool on a device registers; None for a host pool."""
    if reg.kind == "host":
        return None
    from kvctl_engine.cuda_events import TorchStreamOrder

    return TorchStreamOrder(int(reg.memory.device))


def _rid(request_id: Any) -> str:
    return str(int(request_id))


class _RankState:
    """One rank's connection: registered by the worker, used by the scheduler of the same rank."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.rank: kv.Rank | None = None
        self.error: BaseException | None = None

    def wait(self, timeout: float = REGISTRATION_TIMEOUT) -> kv.Rank:
        if not self.ready.wait(timeout):
            raise kv.CallTimeout(
                f"the connector worker of this rank did not register its KV cache within {timeout:.0f} s"
            )
        if self.error is not None:
            raise kv.FailedPrecondition(
                f"the connector worker of this rank failed to register: {self.error}"
            ) from self.error
        assert self.rank is not None
        return self.rank


# Numbers the connectors of this process, so that two servers built in one process register
# under different engine names.
_instances = itertools.count()

_states_lock = threading.Lock()
_states: dict[tuple[int, int, int], _RankState] = {}


def _state(rank: int, llm_args: Any) -> _RankState:
    # TensorRT-LLM builds both halves of a rank with the same llm_args object; keying on it as
    # well keeps two servers built in one process (the tests) apart.
    with _states_lock:
        return _states.setdefault((os.getpid(), rank, id(llm_args)), _RankState())


def _only_state(rank: int) -> _RankState | None:
    """The one registered state of rank in this process, if there is exactly one."""
    with _states_lock:
        found = [st for (pid, r, _), st in _states.items() if pid == os.getpid() and r == rank and st.ready.is_set()]
    return found[0] if len(found) == 1 else None


def forget_rank(rank: int, llm_args: Any) -> None:
    """Drop this process's state for rank (a server that shut its connector down)."""
    with _states_lock:
        _states.pop((os.getpid(), rank, id(llm_args)), None)


class _Common:
    """What both halves read from llm_args."""

    def _setup(self, llm_args: Any, rank: int | None) -> None:
        kvc = _attr(llm_args, "kv_connector_config")
        self._settings = settings.resolve(_attr(kvc, "server_url"))
        if self._settings.role != self._role_family and not (
            self._role_family == "both" and self._settings.role == "consumer"
        ):
            want = (
                "KvctlProducerConnectorScheduler and KvctlProducerConnectorWorker"
                if self._settings.role == "producer"
                else "KvctlConnectorScheduler and KvctlConnectorWorker"
            )
            raise DeclarationMismatch(
                f"{type(self).__name__} declares for roles {self._roles}, not {self._settings.role}; use {want}"
                if self._settings.role != "capacity"
                else "role capacity moves no KV; an engine has nothing to register with kvctl serve"
            )
        self._rank_index = _mpi_rank() if rank is None else rank
        self._attention_dp = bool(
            _attr(llm_args, "enable_attention_dp", "parallel_config.enable_attention_dp", default=False)
        )
        tp = int(_attr(llm_args, "tensor_parallel_size", "parallel_config.tp_size", default=1))
        self._world = 1 if self._attention_dp else tp
        self._lookahead = prompt_lookahead(_attr(llm_args, "speculative_config"))
        self._drafter = drafter_kind(_attr(llm_args, "speculative_config"))
        self._tokens_per_block = int(_attr(llm_args, "kv_cache_config.tokens_per_block", default=32))
        self._llm_args_key = llm_args
        self._state = _state(self._rank_index, llm_args)


class KvctlConnectorWorker(base.KvCacheConnectorWorker, _Common):
    """The worker half: registers the rank's KV pool and moves its pages through kvctl serve."""

    supports_attention_dp = True
    reports_failed_loads = True
    requires_block_aligned_reuse = True
    drops_reuse_match_backoff = True
    requires_completion_reservation = True
    supports_speculative_prefill = True

    _role_family: ClassVar[str] = "both"
    _roles: ClassVar[str] = "both and consumer"
    _DECLARES: ClassVar[tuple[str, ...]] = (
        "supports_attention_dp",
        "reports_failed_loads",
        "requires_block_aligned_reuse",
        "drops_reuse_match_backoff",
        "requires_completion_reservation",
        "supports_speculative_prefill",
    )

    def __init__(self, llm_args: Any, *, rank: int | None = None, cuda: Any = None) -> None:
        super().__init__(llm_args)
        self._setup(llm_args, rank)
        self._cuda = cuda
        self._rank: kv.Rank | None = None
        self._failed: set[int] = set()
        self._restartable = base.has_seed_hooks() and (self._attention_dp or self._world == 1)
        self.registration: kvmemory.Registration | None = None

    # -- registration -------------------------------------------------------------------------

    def register_kv_caches(self, kv_cache_tensor: Any) -> None:
        # KVCacheManagerV1 cannot restart a request (the seed refuses reports_failed_loads on it),
        # so a page lost between lookup and load fails the step.
        self._restartable = False
        self._register(lambda: kvmemory.from_tensor(kv_cache_tensor, self._tokens_per_block, cuda=self._cuda))

    def register_kv_cache_layout(self, layout: Any) -> None:
        self._register(lambda: kvmemory.from_layout(layout, cuda=self._cuda))

    def _register(self, build) -> None:
        if self._rank is not None:
            raise kv.AlreadyRegistered("the KV cache of this rank is already registered")
        st = self._state
        client = rank = None
        try:
            reg = build()
            s = self._settings
            order = _stream_order(reg)
            client = kv.connect(s.socket)
            name = f"trtllm/{s.model_key}/{os.getpid()}.{next(_instances)}/rank{self._rank_index}"
            opts = kv.RankOptions(
                async_load=s.async_load,
                async_load_workers=s.async_load_workers,
                prompt_lookahead=self._lookahead,
                speculative_prefill=self._lookahead > 0,
                drafter=self._drafter,
            )
            rank = kv.Rank.register(
                client,
                name,
                reg.layout,
                reg.memory,
                model_key=s.model_key,
                namespace=s.namespace,
                world_size=self._world,
                rank=0 if self._attention_dp else self._rank_index,
                attention_dp=self._attention_dp,
                role=s.role,
                scheduler=self._attention_dp or self._rank_index == 0,
                options=opts,
                stream_order=order,
            )
            self._check_declarations(rank.declarations)
        except BaseException as e:
            st.error = e
            st.ready.set()
            if rank is not None:
                rank.unregister()
            if client is not None:
                client.close()
            raise
        self.registration = reg
        self._rank = rank
        st.rank = rank
        st.ready.set()

    def _check_declarations(self, got: dict[str, bool]) -> None:
        sched = KvctlProducerConnectorScheduler if self._role_family == "producer" else KvctlConnectorScheduler
        mine = {n: getattr(type(self), n) is True for n in self._DECLARES}
        mine["supports_admission_query"] = sched.supports_admission_query is True
        theirs = {n: got.get(n, False) is True for n in mine}
        if mine != theirs:
            diff = ", ".join(
                f"{n}: class {mine[n]}, kvctl serve {theirs[n]}" for n in sorted(mine) if mine[n] != theirs[n]
            )
            raise DeclarationMismatch(
                f"the connector's declarations differ from kvctl serve's for role {self._settings.role} ({diff})"
            )

    def _need(self) -> kv.Rank:
        if self._rank is None:
            raise kv.NotRegistered(
                "the KV cache of this rank is not registered yet (register_kv_caches or register_kv_cache_layout)"
            )
        return self._rank

    # -- the forward pass ---------------------------------------------------------------------

    def bind_connector_meta(self, metadata: Any) -> None:
        super().bind_connector_meta(metadata)
        if metadata is not None:
            self._need().bind_meta(kv.Metadata(_meta_pb(metadata)))

    def start_load_kv(self, stream: Any) -> None:
        r = self._need()
        r.start_load(stream=stream)
        failed = {int(i) for i in r.take_failed_loads()}
        if failed and not self._restartable:
            raise kv.LoadFailed(
                f"requests {sorted(failed)} lost pages between lookup and load, and this server cannot "
                "restart them (tensor parallelism, or a TensorRT-LLM without take_failed_load_requests)"
            )
        self._failed |= failed

    def take_failed_load_requests(self) -> set[int]:
        out, self._failed = self._failed, set()
        return out

    def drop_bound_saves(self, request_ids: Any) -> None:
        ids = [_rid(i) for i in request_ids]
        if ids:
            self._need().drop_bound_saves(ids)

    def wait_for_layer_load(self, layer_idx: int, stream: Any) -> None:
        return None

    def save_kv_layer(self, layer_idx: int, stream: Any) -> None:
        return None

    def wait_for_save(self, stream: Any) -> None:
        r = self._need()
        if r.stream_order is not None:
            r.wait_for_save(stream=stream)  # the saves wait on the device for the forward pass
            return
        sync = getattr(stream, "synchronize", None)
        if sync is not None:
            sync()  # this stream only: the forward pass's writes are done before the daemon reads
        r.wait_for_save()

    def get_finished(self, finished_gen_req_ids: Any, started_loading_req_ids: Any) -> tuple[list[int], list[int]]:
        f = self._need().get_finished(
            [_rid(i) for i in finished_gen_req_ids], [_rid(i) for i in started_loading_req_ids]
        )
        return [int(i) for i in f.finished_saving], [int(i) for i in f.finished_loading]

    def take_failed_async_load_requests(self) -> set[int]:
        failed = {int(i) for i in self._need().take_failed_async_loads()}
        if failed and not self._restartable:
            raise kv.LoadFailed(
                f"asynchronous loads of requests {sorted(failed)} lost pages, and this server cannot restart them"
            )
        return failed

    def close(self) -> None:
        if self._rank is not None:
            self._rank.unregister()
            self._rank.client.close()
            self._rank = None
        forget_rank(self._rank_index, self._llm_args_key)


def _meta_pb(metadata: Any) -> Any:
    if isinstance(metadata, ConnectorMetadata):
        return metadata.pb()
    raise kv.InvalidArgument(
        f"bind_connector_meta got {type(metadata).__name__}, not the metadata KvctlConnectorScheduler builds"
    )


class ConnectorMetadata:
    """build_connector_meta's answer: the daemon's metadata as bytes, which TensorRT-LLM pickles to every rank."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def pb(self) -> Any:
        m = kv.Metadata().pb
        m.ParseFromString(self.data)
        return m

    def __reduce__(self):
        return (ConnectorMetadata, (self.data,))

    def __repr__(self) -> str:
        return repr(kv.Metadata(self.pb()))


class KvctlConnectorScheduler(base.KvCacheConnectorScheduler, _Common):
    """The scheduler half: lookups, allocations and each step's metadata, on its rank's connection."""

    supports_attention_dp = True
    supports_admission_query = True
    supports_speculative_prefill = True

    _role_family: ClassVar[str] = "both"
    _roles: ClassVar[str] = "both and consumer"

    def __init__(self, llm_args: Any, *, rank: int | None = None) -> None:
        super().__init__(llm_args)
        self._setup(llm_args, rank)
        self._rank: kv.Rank | None = None

    def _r(self) -> kv.Rank:
        if self._rank is None:
            st = self._state
            if not st.ready.is_set():
                # Built with another llm_args object than the worker: the rank's one registration.
                st = _only_state(self._rank_index) or st
            self._rank = st.wait()
        return self._rank

    def wait_for_initialization(self) -> None:
        # TensorRT-LLM may call this before the KV cache exists; the first real call waits instead.
        return None

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        digests, has_mm = multimodal_digests(request)
        salt = getattr(request, "cache_salt", None)
        lora = getattr(request, "lora_task_id", None)
        req = kv.Request(
            id=_rid(request.request_id),
            tokens=list(request.get_tokens(0)),
            cache_salt=None if salt is None else str(salt),
            lora_task_id=None if lora is None else int(lora),
            multimodal_digests=digests,
            has_multimodal=has_mm,
            dummy=getattr(request, "is_dummy_request", False) is True,
            context_only=getattr(request, "is_context_only_request", False) is True,
        )
        res = self._r().lookup(req, int(num_computed_tokens))
        return int(res.matched_tokens), bool(res.is_async)

    def cancel_load(self, request: Any, start: int, end: int) -> None:
        self._r().cancel_load(_rid(request.request_id), int(start), int(end))

    def update_state_after_alloc(self, request: Any, block_ids: Any) -> None:
        self.update_state_after_alloc_by_layer_group(request, [list(block_ids)])

    def update_state_after_alloc_by_layer_group(self, request: Any, block_ids_by_layer_group: Any) -> None:
        honoured = int(getattr(request, "py_num_connector_matched_tokens", 0) or 0)
        self._r().update_state_after_alloc(
            _rid(request.request_id),
            [list(g) for g in block_ids_by_layer_group],
            honoured,
            dummy=_is_dummy(request),
        )

    def build_connector_meta(self, scheduler_output: Any) -> ConnectorMetadata:
        r = self._r()

        def data(d: Any) -> kv.RequestData:
            groups = getattr(d, "new_block_ids_by_layer_group", None) or [list(d.new_block_ids)]
            return kv.RequestData(
                id=_rid(d.request_id),
                new_block_ids_by_group=[list(g) for g in groups],
                computed_position=int(d.computed_position),
                num_scheduled_tokens=int(d.num_scheduled_tokens),
                new_tokens=list(d.new_tokens),
            )

        submitted = r.take_submitted_saves()
        meta = r.build_meta(
            [data(d) for d in scheduler_output.new_requests],
            [data(d) for d in scheduler_output.cached_requests],
            submitted,
        )
        return ConnectorMetadata(meta.pb.SerializeToString())

    def request_finished(self, request: Any, cache_block_ids: Any) -> bool:
        return self._r().request_finished(_rid(request.request_id), dummy=_is_dummy(request))

    def request_finished_by_layer_group(self, request: Any, cache_block_ids_by_layer_group: Any) -> bool:
        return self._r().request_finished(_rid(request.request_id), dummy=_is_dummy(request))

    def request_reset(self, request: Any) -> None:
        self._r().request_reset(_rid(request.request_id), dummy=_is_dummy(request))


class KvctlProducerConnectorWorker(KvctlConnectorWorker):
    """The worker for role producer: it never offers a prefix, so it keeps the engine's own reuse."""

    requires_block_aligned_reuse = False
    drops_reuse_match_backoff = False
    _role_family: ClassVar[str] = "producer"
    _roles: ClassVar[str] = "producer"


class KvctlProducerConnectorScheduler(KvctlConnectorScheduler):
    """The scheduler for role producer."""

    _role_family: ClassVar[str] = "producer"
    _roles: ClassVar[str] = "producer"
