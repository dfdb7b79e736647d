"""The high-level engine API: a registered engine rank with the methods of connector.Rank.

:func:`connect` opens a :class:`~kvctl_engine.client.Client`; ``Client``'s registration helpers
or :meth:`Rank.register` register a rank and return a :class:`Rank`, whose methods are the calls
of connector.Rank (core/connector/rank.go) and the Go RemoteRank (core/engineapi/rank.go), with
typed results and the exceptions of errors.py. docs/ENGINE_API.md gives the order an engine
calls them in, per scheduler step and per worker step.

A Rank is bound to the Client that registered it: only that connection may name it. Lookups and
admission queries write their prompt into a prompt arena (shared memory the daemon reads) and
send only its range, as the Go RemoteRank does; a daemon that refuses the arena turns it off and
prompts go in tokens_packed.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ._pb import engine_pb2 as pb
from .client import API_VERSION, MAX_FINISHED_WAIT, Client, api_version_message
from .cuda import CudaIpcMemory
from .errors import CallTimeout, Cancelled, InvalidArgument, KvctlError
from .memory import DEFAULT_PROMPT_ARENA_BYTES, PromptArena, SharedMemory
from .tokens import TOKEN_BYTES, pack_tokens

__all__ = [
    "CudaFdMemory",
    "Finished",
    "KeyParams",
    "LayerGroup",
    "Layout",
    "LookupResult",
    "MMFeature",
    "Metadata",
    "PageTransfer",
    "Rank",
    "RankOptions",
    "Region",
    "Request",
    "RequestData",
    "RequestTransfers",
    "SchedulerRank",
    "SharedMemoryFd",
    "connect",
]


# -- layout --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Region:
    """One region of a page: the bytes [offset + page * stride, + size) of the registered memory."""

    offset: int
    stride: int
    size: int

    def to_pb(self) -> pb.Region:
        return pb.Region(offset=self.offset, stride=self.stride, size=self.size)


@dataclass(frozen=True)
class LayerGroup:
    """A layer group: slots pages, each made of regions (saved per rank) and replicated_regions
    (the same on every tensor-parallel rank, saved once)."""

    id: int
    slots: int
    regions: Sequence[Region]
    replicated_regions: Sequence[Region] = ()

    def to_pb(self) -> pb.LayerGroup:
        return pb.LayerGroup(
            id=self.id,
            slots=self.slots,
            regions=[r.to_pb() for r in self.regions],
            replicated_regions=[r.to_pb() for r in self.replicated_regions],
        )


@dataclass(frozen=True)
class Layout:
    """The KV layout: tokens per block and the layer groups."""

    tokens_per_block: int
    groups: Sequence[LayerGroup]

    def to_pb(self) -> pb.Layout:
        return pb.Layout(tokens_per_block=self.tokens_per_block, groups=[g.to_pb() for g in self.groups])


# -- memory kinds that need no object of their own ------------------------------------------


@dataclass(frozen=True)
class SharedMemoryFd:
    """Engine memory in a memfd the caller made (sealed with F_SEAL_SHRINK, at least size bytes)."""

    fd: int
    size: int


@dataclass(frozen=True)
class CudaFdMemory:
    """Engine memory made with cuMemCreate and exported as a descriptor (cuda.VmmAllocation)."""

    fd: int
    size: int
    device: int


Memory = SharedMemory | SharedMemoryFd | CudaIpcMemory | CudaFdMemory | Any


# -- requests and results --------------------------------------------------------------------


@dataclass(frozen=True)
class MMFeature:
    """One multimodal item of a vLLM request (vLLM's ``MultiModalFeatureSpec``): the identifier vLLM
    hashes and its placeholder range [offset, offset + length) in the prompt. A request's items go
    sorted by offset, as vLLM keeps them."""

    identifier: str
    offset: int
    length: int

    def to_pb(self) -> pb.MMFeature:
        return pb.MMFeature(identifier=self.identifier, offset=self.offset, length=self.length)


@dataclass
class Request:
    """A prompt to look up: its id and tokens, and what else names its KV.

    cache_salt is shared by every key scheme; lora_task_id and multimodal_digests are
    TensorRT-LLM's (``trtllm…`` formats), lora_name, lora_path and mm_features vLLM's (``vllm…``
    formats, engine API 1.2; lora_path only with tagged extra keys, see KeyParams)."""

    id: str
    tokens: Sequence[int]
    cache_salt: str | None = None
    lora_task_id: int | None = None
    multimodal_digests: Sequence[bytes] = ()
    has_multimodal: bool = False
    dummy: bool = False
    context_only: bool = False
    lora_name: str | None = None
    mm_features: Sequence[MMFeature] = ()
    lora_path: str | None = None

    def to_pb(self) -> pb.Request:
        r = pb.Request(
            id=self.id,
            multimodal_digests=list(self.multimodal_digests),
            has_multimodal=self.has_multimodal,
            dummy=self.dummy,
            context_only=self.context_only,
            mm_features=[f.to_pb() for f in self.mm_features],
        )
        if self.cache_salt is not None:
            r.cache_salt = self.cache_salt
        if self.lora_task_id is not None:
            r.lora_task_id = self.lora_task_id
        if self.lora_name is not None:
            r.lora_name = self.lora_name
        if self.lora_path is not None:
            r.lora_path = self.lora_path
        return r


@dataclass(frozen=True)
class KeyParams:
    """The registration-wide key inputs of a vLLM key scheme (RegisterRequest.key_params, engine
    API 1.2): what vLLM's MooncakeStoreConnector puts in a pool key besides the block hash.

    python_hash_seed is the PYTHONHASHSEED string vLLM seeds its block hashes with (NONE_HASH);
    model is vLLM's model name (the key holds its last path element); cache_prefix and
    store_namespace are the connector's; hash_block_size is vLLM's hash block size when it
    differs from the block size (0: the block size); num_kv_heads and mla decide which TP ranks
    share a key rank; the pipeline, prefill-context and decode-context ranks and sizes (a size
    of 0 reads as 1) complete the key. The TP rank and size are the registration's. extra_keys
    is how the engine's vLLM writes a block's extra keys: "untagged" (bare values; "" reads so)
    or "tagged" (vLLM 0.33: ("cache_salt", salt), ("lora", name, path), ("mm", id, offset))."""

    python_hash_seed: str | None
    model: str
    cache_prefix: str = ""
    store_namespace: str = ""
    hash_block_size: int = 0
    num_kv_heads: int = 0
    mla: bool = False
    pp_rank: int = 0
    pp_size: int = 0
    pcp_rank: int = 0
    pcp_size: int = 0
    dcp_rank: int = 0
    dcp_size: int = 0
    extra_keys: str = ""

    def to_pb(self) -> pb.KeyParams:
        k = pb.KeyParams(
            model=self.model,
            cache_prefix=self.cache_prefix,
            store_namespace=self.store_namespace,
            hash_block_size=self.hash_block_size,
            num_kv_heads=self.num_kv_heads,
            mla=self.mla,
            pp_rank=self.pp_rank,
            pp_size=self.pp_size,
            pcp_rank=self.pcp_rank,
            pcp_size=self.pcp_size,
            dcp_rank=self.dcp_rank,
            dcp_size=self.dcp_size,
            extra_keys=self.extra_keys,
        )
        if self.python_hash_seed is not None:
            k.python_hash_seed = self.python_hash_seed
        return k


@dataclass(frozen=True)
class LookupResult:
    """matched_tokens the pool can restore (a multiple of the block size); is_async when the
    load runs in the background (the request waits for GetFinished's finished_loading)."""

    matched_tokens: int
    is_async: bool


@dataclass
class RequestData:
    """One request of a scheduler step (SchedulerOutput): its new tokens and block ids, where its
    computation stands and how many tokens this step computes."""

    id: str
    new_block_ids_by_group: Sequence[Sequence[int]] = ()
    computed_position: int = 0
    num_scheduled_tokens: int = 0
    new_tokens: Sequence[int] = ()
    dummy: bool = False

    def to_pb(self) -> pb.RequestData:
        return pb.RequestData(
            id=self.id,
            new_tokens=list(self.new_tokens),
            new_block_ids_by_group=[pb.BlockIDs(ids=list(g)) for g in self.new_block_ids_by_group],
            computed_position=self.computed_position,
            num_scheduled_tokens=self.num_scheduled_tokens,
            dummy=self.dummy,
        )


@dataclass(frozen=True)
class PageTransfer:
    """One page to load or save: its pool hash, layer group and page slot."""

    hash: bytes
    group: int
    page: int


@dataclass(frozen=True)
class RequestTransfers:
    request_id: str
    pages: tuple[PageTransfer, ...]


def _transfers(rts: Any) -> list[RequestTransfers]:
    return [
        RequestTransfers(rt.request_id, tuple(PageTransfer(p.hash, p.group, p.page) for p in rt.pages)) for rt in rts
    ]


class Metadata:
    """A step's connector metadata (BuildMeta's answer), handed to BindMeta on every rank. The
    message is kept as the daemon sent it (``pb``); loads, saves, async_loads and early_loads
    read it."""

    __slots__ = ("pb",)

    def __init__(self, message: pb.Metadata | None = None) -> None:
        self.pb = message if message is not None else pb.Metadata()

    @property
    def loads(self) -> list[RequestTransfers]:
        return _transfers(self.pb.loads)

    @property
    def saves(self) -> list[RequestTransfers]:
        return _transfers(self.pb.saves)

    @property
    def async_loads(self) -> list[RequestTransfers]:
        return _transfers(self.pb.async_loads)

    @property
    def early_loads(self) -> list[str]:
        """The requests whose load began at their allocation report (RankOptions.early_loads,
        API 1.4): start_load waits for them as for loads."""
        return list(self.pb.early_loads)

    def page_count(self) -> tuple[int, int, int]:
        """Pages to load, save and load asynchronously."""
        return tuple(sum(len(rt.pages) for rt in x) for x in (self.pb.loads, self.pb.saves, self.pb.async_loads))  # type: ignore[return-value]

    def __repr__(self) -> str:
        return "Metadata(loads=%d, saves=%d, async_loads=%d pages)" % self.page_count()


@dataclass(frozen=True)
class Finished:
    """GetFinished's answer: requests whose saves finished, and whose async loads finished."""

    finished_saving: list[str] = field(default_factory=list)
    finished_loading: list[str] = field(default_factory=list)


@dataclass
class RankOptions:
    """Connector settings of a registration; zero values take the daemon's defaults."""

    transfer_batch_size: int = 0
    async_load: bool = False
    async_load_workers: int = 0
    soft_pin_ttl_ms: int = 0
    group_blocks: bool = False
    local_reuse_backoff: str = ""
    speculative_prefill: bool = False
    staging_buffer_bytes: int = 0
    prompt_lookahead: int = 0
    # The speculative drafter behind speculative_prefill: "mtp" or "eagle3" (one model, the
    # kinds kvctl serve accepts), or another kind ("mtp-two-model", "eagle3-two-model", "ngram",
    # ...), which it refuses with speculative_prefill. Empty: not declared.
    drafter: str = ""
    # The prompt arena's size (0: DEFAULT_PROMPT_ARENA_BYTES); prompt_arena=False sends every
    # prompt in tokens_packed.
    prompt_arena: bool = True
    prompt_arena_bytes: int = 0
    # Start a hit's load at its allocation report (update_state_after_alloc) instead of at
    # start_load, so the step's next admissions overlap it (API 1.4). Only for a single rank
    # that registers the scheduler and sends no stream_order; the engine promises that pages it
    # reports allocated are free of its own work from that report on.
    early_loads: bool = False


def connect(
    socket_path: str | None = None, *, timeout: float = 30.0, call_channel: bool = True, daemon_uid: int = 0
) -> Client:
    """Opens a Client to kvctl serve (see Client)."""
    return Client(socket_path, timeout=timeout, call_channel=call_channel, daemon_uid=daemon_uid)


class _SchedulerCalls:
    """The calls of a rank's scheduler adapter, shared by :class:`Rank` (the registering
    connection) and :class:`SchedulerRank` (a connection attached to the rank's scheduler)."""

    client: Client
    name: str
    via_arena: int
    via_packed: int

    def prompt_arena(self, timeout: float | None = None) -> PromptArena | None:
        raise NotImplementedError

    def _lookup(self, method: str, request: Request, num_computed_tokens: int, timeout: float | None) -> LookupResult:
        r = request.to_pb()
        n = len(request.tokens)
        held: int | None = None
        arena = self.prompt_arena(timeout) if n else None
        packed = pack_tokens(request.tokens)
        if arena is not None:
            held = arena.alloc(n * TOKEN_BYTES)
        if held is not None and arena is not None:
            arena.write(held, packed)
            r.tokens_arena.offset, r.tokens_arena.count = held, n
            self.via_arena += 1
        else:
            r.tokens_packed = packed
            self.via_packed += 1
        lr = pb.LookupRequest(engine=self.name, request=r, num_computed_tokens=num_computed_tokens)
        try:
            resp = self.client.call(method, lr, timeout)
        except (CallTimeout, Cancelled):
            # The daemon may still read the range: it stays reserved.
            raise
        except BaseException:
            if held is not None and arena is not None:
                arena.free(held)
            raise
        if held is not None and arena is not None:
            arena.free(held)
        return LookupResult(resp.matched_tokens, getattr(resp, "async"))

    def lookup(self, request: Request, num_computed_tokens: int = 0, timeout: float | None = None) -> LookupResult:
        """The prefix of request the pool can restore, past num_computed_tokens (the engine's own
        prefix-cache hit). Registers the request with the scheduler adapter."""
        return self._lookup("Lookup", request, num_computed_tokens, timeout)

    def admission_query(
        self, request: Request, num_computed_tokens: int = 0, timeout: float | None = None
    ) -> LookupResult:
        """Lookup without side effects: what Lookup would answer, for admission control."""
        return self._lookup("AdmissionQuery", request, num_computed_tokens, timeout)

    def cancel_load(self, request_id: str, start: int, end: int, timeout: float | None = None) -> None:
        """Gives up the load of tokens [start, end) of a looked-up request (the engine will
        compute them)."""
        self.client.call(
            "CancelLoad", pb.CancelLoadRequest(engine=self.name, request_id=request_id, start=start, end=end), timeout
        )

    def update_state_after_alloc(
        self,
        request_id: str,
        block_ids_by_group: Sequence[Sequence[int]],
        honoured_tokens: int,
        timeout: float | None = None,
        *,
        dummy: bool = False,
    ) -> None:
        """Reports the pages allocated to a request (per layer group) and how many of the
        matched tokens the engine honours (0 turns the load down). dummy marks a padding
        request: the daemon skips the report whatever request_id names."""
        self.client.call(
            "UpdateStateAfterAlloc",
            pb.AllocRequest(
                engine=self.name,
                request_id=request_id,
                block_ids_by_group=[pb.BlockIDs(ids=list(g)) for g in block_ids_by_group],
                honoured_tokens=honoured_tokens,
                dummy=dummy,
            ),
            timeout,
        )

    def build_meta(
        self,
        new_requests: Sequence[RequestData] = (),
        cached_requests: Sequence[RequestData] = (),
        submitted_saves: Sequence[str] = (),
        timeout: float | None = None,
    ) -> Metadata:
        """The step's metadata from the scheduler output: the loads and saves to make. Hand it
        to bind_meta on every rank."""
        m = self.client.call(
            "BuildMeta",
            pb.BuildMetaRequest(
                engine=self.name,
                new_requests=[r.to_pb() for r in new_requests],
                cached_requests=[r.to_pb() for r in cached_requests],
                submitted_saves=list(submitted_saves),
            ),
            timeout,
        )
        return Metadata(m)

    def request_finished(self, request_id: str, timeout: float | None = None, *, dummy: bool = False) -> bool:
        """The request's prompt is done; True when its saves are still in flight (keep its pages
        until get_finished reports it in finished_saving). dummy: a padding request, skipped."""
        ref = pb.RequestRef(engine=self.name, request_id=request_id, dummy=dummy)
        r = self.client.call("RequestFinished", ref, timeout)
        return bool(r.async_saving)

    def request_reset(self, request_id: str, timeout: float | None = None, *, dummy: bool = False) -> None:
        """Forgets a request the engine restarts (a failed load, a preemption); look it up again
        afterwards. dummy: a padding request, skipped."""
        ref = pb.RequestRef(engine=self.name, request_id=request_id, dummy=dummy)
        self.client.call("RequestReset", ref, timeout)

    def take_submitted_saves(self, timeout: float | None = None) -> list[str]:
        """Requests whose saves the worker submitted since the last call; hand them to the next
        build_meta (submitted_saves)."""
        return list(self.client.call("TakeSubmittedSaves", pb.EngineRef(engine=self.name), timeout).ids)


class Rank(_SchedulerCalls):
    """A registered engine rank: the methods of connector.Rank over the engine API.

    Make one with :meth:`Rank.register`. Every method takes an optional ``timeout`` (seconds;
    default the client's) and raises a KvctlError subclass on failure; none hangs past its
    deadline. A Rank is safe to share between threads (calls that find the call channel busy
    go over gRPC)."""

    def __init__(
        self,
        client: Client,
        response: pb.RegisterResponse,
        options: RankOptions | None = None,
        stream_order: Any = None,
    ) -> None:
        self.client = client
        # The CUDA stream ordering (kvctl_engine.cuda_events) this rank registered, or None when
        # the host orders (shared memory, or an engine that synchronises itself).
        self.stream_order = stream_order
        self.name: str = response.engine
        self.shard: str = response.shard
        self.declarations: dict[str, bool] = dict(response.declarations)
        # The secret a scheduler in another process of this uid presents to attach to this
        # rank's scheduler adapter (SchedulerRank.attach); "" unless registered with scheduler.
        self.scheduler_token: str = response.scheduler_token
        v = response.api_version if response.HasField("api_version") else None
        # The daemon's engine API version; (1, 0) from a daemon older than the field.
        self.daemon_api_version: tuple[int, int] = (v.major, v.minor) if v is not None else (1, 0)
        self.options = options or RankOptions()
        self._ref = pb.EngineRef(engine=self.name)
        self._arena_mu = threading.Lock()
        self._arena: PromptArena | None = None
        self._arena_off: KvctlError | None = (
            None if self.options.prompt_arena else KvctlError("prompt arena turned off")
        )
        self.via_arena = 0
        self.via_packed = 0
        self._closed = False

    # -- registration ------------------------------------------------------------------------

    @classmethod
    def register(
        cls,
        client: Client,
        engine: str,
        layout: Layout,
        memory: Memory | None,
        *,
        model_key: str = "",
        namespace: str = "",
        world_size: int = 1,
        rank: int = 0,
        attention_dp: bool = False,
        role: str = "both",
        format: str = "",
        scheduler: bool = True,
        options: RankOptions | None = None,
        api_version: tuple[int, int] = API_VERSION,
        stream_order: Any = None,
        key_params: KeyParams | None = None,
        timeout: float | None = None,
    ) -> Rank:
        """Registers the engine rank engine with layout over client and returns it.

        memory is the rank's KV memory: a SharedMemory (or SharedMemoryFd), a CudaIpcMemory
        (cuda.ipc_handle_from_tensor / ipc_handle_from_pointer), a CudaFdMemory (a
        cuda.VmmAllocation's fd), or None for a role that moves no KV (capacity). scheduler: this
        rank runs the scheduler adapter (rank 0 under tensor parallelism, every owner under
        attention DP). api_version is declared in Register (the SDK's own by default).

        format is the key scheme (``kvctl hash --help`` lists them; empty: the daemon's default,
        trtllm); a vLLM scheme (``vllm``, ``vllm-sha256-cbor``, ``vllm-xxhash``,
        ``vllm-xxhash-cbor``) takes its further inputs from key_params. A rank registered with
        scheduler=True gets a ``scheduler_token`` that a scheduler in another process of the same
        uid presents to :meth:`SchedulerRank.attach`.

        stream_order (a kvctl_engine.cuda_events StreamOrder, CUDA memory only) registers the
        engine's interprocess event and opens the daemon's: bind_meta, start_load and
        wait_for_save then take the engine's stream, record the engine event on it before the
        call, and start_load makes the stream wait for the daemon's copies after it, so no call
        needs a device-wide synchronisation (docs/ENGINE_API.md, "Stream ordering")."""
        o = options or RankOptions()
        req = pb.RegisterRequest(
            engine=engine,
            model_key=model_key,
            namespace=namespace,
            world_size=world_size,
            rank=rank,
            attention_dp=attention_dp,
            role=role,
            format=format,
            prompt_lookahead=o.prompt_lookahead,
            scheduler=scheduler,
            layout=layout.to_pb(),
            transfer_batch_size=o.transfer_batch_size,
            async_load=o.async_load,
            async_load_workers=o.async_load_workers,
            soft_pin_ttl_ms=o.soft_pin_ttl_ms,
            group_blocks=o.group_blocks,
            local_reuse_backoff=o.local_reuse_backoff,
            speculative_prefill=o.speculative_prefill,
            drafter=o.drafter,
            staging_buffer_bytes=o.staging_buffer_bytes,
            early_loads=o.early_loads,
            api_version=api_version_message(api_version),
        )
        if key_params is not None:
            req.key_params.CopyFrom(key_params.to_pb())
        if stream_order is not None:
            from .cuda_events import engine_event_message

            req.engine_event.CopyFrom(engine_event_message(stream_order))
        if isinstance(memory, SharedMemory):
            resp = client.register_shared_memory(req, memory.fd, memory.size, timeout)
        elif isinstance(memory, SharedMemoryFd):
            resp = client.register_shared_memory(req, memory.fd, memory.size, timeout)
        elif isinstance(memory, CudaIpcMemory):
            resp = client.register_cuda_ipc(req, memory.handle, memory.offset, memory.size, memory.device, timeout)
        elif isinstance(memory, CudaFdMemory):
            resp = client.register_cuda_fd(req, memory.fd, memory.size, memory.device, timeout)
        elif memory is not None and hasattr(memory, "fd") and hasattr(memory, "device") and hasattr(memory, "ptr"):
            resp = client.register_cuda_fd(req, memory.fd, memory.size, memory.device, timeout)  # a VmmAllocation
        elif memory is None:
            resp = client.register(req, timeout)
        else:
            raise InvalidArgument(
                "register: memory of type %s is none of the kinds kvctl serve takes" % type(memory).__name__
            )
        if stream_order is not None:
            from .cuda_events import StreamOrderError, daemon_event_handle

            try:
                stream_order.open_daemon_event(daemon_event_handle(resp))
            except StreamOrderError:
                client.call("Unregister", pb.EngineRef(engine=resp.engine), timeout)
                raise
        return cls(client, resp, o, stream_order)

    def unregister(self, timeout: float | None = None) -> None:
        """Drains the rank's saves (within the deadline) and forgets it. The prompt arena goes
        with it."""
        if self._closed:
            return
        self.client.call("Unregister", self._ref, timeout)
        self._closed = True
        with self._arena_mu:
            arena, self._arena = self._arena, None
        if arena is not None and arena in self.client._arenas:
            self.client._arenas.remove(arena)
            arena.close()

    def close(self, timeout: float | None = None) -> None:
        """Unregisters (see unregister) and releases the rank's stream ordering events."""
        try:
            self.unregister(timeout)
        finally:
            if self.stream_order is not None:
                self.stream_order.close()

    def __enter__(self) -> Rank:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- prompt arena ------------------------------------------------------------------------

    def prompt_arena(self, timeout: float | None = None) -> PromptArena | None:
        """The rank's prompt arena, registering one on first use; None when it is off (options,
        or the daemon refused it: prompts then go packed)."""
        with self._arena_mu:
            if self._arena is not None or self._arena_off is not None:
                return self._arena
            arena = PromptArena(self.options.prompt_arena_bytes or DEFAULT_PROMPT_ARENA_BYTES)
            try:
                self.client.register_prompt_arena(self.name, arena, timeout)
            except (CallTimeout, Cancelled):
                arena.close()
                raise  # cut short: tried again next time
            except KvctlError as e:
                arena.close()
                self._arena_off = e
                return None
            self._arena = arena
            return arena

    @property
    def prompt_arena_error(self) -> KvctlError | None:
        """Why the rank sends its prompts packed, None while it uses (or may use) an arena."""
        return self._arena_off

    def register_prompt_arena(self, arena: PromptArena, timeout: float | None = None) -> None:
        """Registers arena as this rank's prompt arena (replacing any earlier one)."""
        self.client.register_prompt_arena(self.name, arena, timeout)
        with self._arena_mu:
            self._arena, self._arena_off = arena, None

    # -- worker ------------------------------------------------------------------------------

    def bind_meta(self, metadata: Metadata, timeout: float | None = None, *, stream: Any = None) -> None:
        """Binds the step's metadata on this rank (every rank, before start_load). With stream
        ordering, the engine event is recorded on stream first (default: the current stream), so
        asynchronous loads the metadata starts wait for the engine's work queued before it."""
        if self.stream_order is not None:
            self.stream_order.record(stream)
        self.client.call("BindMeta", pb.BindMetaRequest(engine=self.name, metadata=metadata.pb), timeout)

    def start_load(self, timeout: float | None = None, *, stream: Any = None) -> None:
        """Makes the step's synchronous loads into the engine's pages; returns when they landed.
        Call take_failed_loads right after.

        With stream ordering, the daemon's copies wait for the engine's work queued on stream
        (default: the current stream) before the call, and stream waits for the copies after
        it: kernels queued on stream afterwards read the loaded pages. Without it, the engine
        must have finished its work on those pages before calling."""
        order = self.stream_order
        if order is not None:
            order.record(stream)
        self.client.call("StartLoad", self._ref, timeout)
        if order is not None:
            order.wait_daemon(stream)

    def wait_for_save(self, timeout: float | None = None, *, stream: Any = None) -> None:
        """Starts the step's saves (after the forward pass wrote the KV). With stream ordering,
        the saves read the KV only once the work queued on stream (default: the current stream)
        before the call is done, and the call returns without waiting for it; without, the
        engine must have finished writing that KV before calling."""
        if self.stream_order is not None:
            self.stream_order.record(stream)
        self.client.call("WaitForSave", self._ref, timeout)

    def get_finished(
        self,
        finished_gen: Sequence[str] = (),
        started_loading: Sequence[str] = (),
        timeout: float | None = None,
        wait: float = 0.0,
    ) -> Finished:
        """Reports requests finished generating (whose saves may be in flight) and requests that
        started an async load; returns those whose saves and async loads finished.

        wait (seconds, at most MAX_FINISHED_WAIT; engine API 1.3) is for an engine with nothing
        else to run: when nothing is finished yet but saves or announced async loads are in
        flight, the daemon answers as soon as one finishes, or with nothing once wait has passed.
        With nothing in flight it answers at once. A daemon older than 1.3 answers at once."""
        if not 0.0 <= wait <= MAX_FINISHED_WAIT:
            raise ValueError(f"get_finished: wait {wait!r} s is outside [0, {MAX_FINISHED_WAIT}]")
        if timeout is not None and wait > 0 and timeout <= wait:
            raise ValueError(f"get_finished: timeout {timeout!r} s must be longer than wait {wait!r} s")
        r = self.client.call(
            "GetFinished",
            pb.GetFinishedRequest(
                engine=self.name,
                finished_gen=list(finished_gen),
                started_loading=list(started_loading),
                wait_ms=math.ceil(wait * 1000),
            ),
            timeout,
        )
        return Finished(list(r.finished_saving), list(r.finished_loading))

    def take_failed_loads(self, timeout: float | None = None) -> list[str]:
        """Requests whose synchronous load failed this step: request_reset each and recompute
        (or look up again). Must follow every start_load on a rank that reports failed loads."""
        return list(self.client.call("TakeFailedLoads", self._ref, timeout).ids)

    def take_failed_async_loads(self, timeout: float | None = None) -> list[str]:
        """Requests whose asynchronous load failed: restart them. Must follow every
        get_finished on a rank that reports failed loads."""
        return list(self.client.call("TakeFailedAsyncLoads", self._ref, timeout).ids)

    def drop_bound_saves(self, request_ids: Sequence[str], timeout: float | None = None) -> None:
        """Drops the bound step's saves of requests the engine aborted before its forward pass."""
        self.client.call("DropBoundSaves", pb.DropRequest(engine=self.name, request_ids=list(request_ids)), timeout)


class SchedulerRank(_SchedulerCalls):
    """The scheduler adapter of a rank another connection registered, driven from this one.

    An engine whose scheduler runs in another process than its workers (vLLM: the engine core
    schedules, the tensor-parallel workers register their KV memory) registers the rank in the
    worker with ``scheduler=True`` and hands the :attr:`Rank.scheduler_token` to its scheduler
    process, which attaches with :meth:`attach` (AttachScheduler: the same uid and the token).
    The handle then makes the scheduler calls of that rank: lookup, admission_query,
    cancel_load, update_state_after_alloc, build_meta, request_finished, request_reset and
    take_submitted_saves. Worker calls and Unregister stay with the registering connection
    (NotOwner from here).

    The attachment ends with either connection: closing the client, the daemon closing the
    registering connection, or the rank unregistering (NotRegistered afterwards). Prompts go
    packed in the request (the prompt arena belongs to the registering connection)."""

    def __init__(self, client: Client, response: pb.AttachSchedulerResponse) -> None:
        self.client = client
        self.name: str = response.engine
        self.shard: str = response.shard
        self.declarations: dict[str, bool] = dict(response.declarations)
        self.via_arena = 0
        self.via_packed = 0

    @classmethod
    def attach(cls, client: Client, engine: str, scheduler_token: str, timeout: float | None = None) -> SchedulerRank:
        """Attaches client's connection to the scheduler adapter of the registered rank engine.

        Raises NotOwner for a wrong token or a caller of another uid, NotRegistered when no rank
        engine is registered, FailedPrecondition for a rank registered without the scheduler
        adapter or when client is the registering connection, ResourceExhausted past the
        daemon's limit of attached schedulers per rank."""
        if not engine:
            raise InvalidArgument("attach scheduler: no engine named")
        if not scheduler_token:
            raise InvalidArgument(
                "attach scheduler: engine %r: no scheduler token (the RegisterResponse of its scheduler rank "
                "carries it)" % engine
            )
        return cls(client, client.attach_scheduler(engine, scheduler_token, timeout))

    def prompt_arena(self, timeout: float | None = None) -> PromptArena | None:
        """None: an attached scheduler sends its prompts packed in the request."""
        return None
